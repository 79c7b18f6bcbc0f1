"""Voices made from a clip on a tiny Qwen2.5-Omni checkpoint.

The token2wav stage: with a clip's reference mel in ``extra`` the same codes give another waveform than the base voice
gives, and the one transformers' own token2wav gives with that mel (computed from the clip directly, and checked
against transformers' independent STFT) and the base voice's x-vector.

Through the OpenAI server (one server for the module): an upload is refused naming its field (not audio, too short,
too long, a bad or taken name, an unknown base voice or form field, a name kept with another clip); a voice made from
a clip is listed with its base voice, kept on disk, spoken in chat (unlike its base voice, and as the base voice with
the clip's mel given to the token2wav by hand) and in a realtime session (``session.voice``), and deleted (then
unknown)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile
import torch
from websockets.sync.client import connect

from omnipipe.models.qwen2_5_omni.reference_voice import reference_from_clip, reference_mel
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext
from tests.models.media_files import wav
from tests.models.server_voices import speak
from tests.server.conftest import API_KEY, running_server, spoken

pytestmark = pytest.mark.slow  # a tiny Qwen2.5-Omni checkpoint written, decoded and served

SEED = 3
CODES = 40
# the stage's decode of one window against transformers' whole decode (same noise and voice): measured 0
AUDIO_TOLERANCE = 1e-6
# the clip's mel against the base voice's own: measured 9.8e-4 of absmax (the tiny random DiT reads its reference
# weakly), a hundred times the tolerance above
DIFFERENT_AT_LEAST = 1e-4
MAX_CODES = 30
SAMPLING = {"talker": {"temperature": 0, "max_tokens": MAX_CODES}, "token2wav": {"seed": SEED}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

    torch.set_num_threads(1)
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5_reference_voice"), seed=0)


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """Two seconds and more of real speech at 24 kHz."""
    return spoken("This is the voice I would like you to speak with, please.", 24_000, steady=True)


def _decode(runner, speaker: str, extra: dict) -> np.ndarray:
    codes = torch.randint(0, 96, (CODES,), generator=torch.Generator().manual_seed(7)).numpy()
    request = StageRequest("r", {"seed": SEED, "extra": extra}, True, False, [])
    request.inputs.append({"frames": codes.reshape(1, -1), "start_frame": 0, "context_frames": 0,
                           "lookahead_frames": 0, "speaker": speaker})
    assert runner.validate(request.params) is None
    return runner.execute([request])[0].audio


def test_a_reference_mel_changes_the_voice_and_equals_transformers_token2wav(checkpoint, clip) -> None:
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    from omnipipe.models.qwen2_5_omni.runners.token2wav import Qwen25Token2WavRunner
    from omnipipe.models.qwen2_5_omni.weights.load import load_speakers

    runner = Qwen25Token2WavRunner(RunnerContext("token2wav", "cpu", 1, 8, {"model": str(checkpoint)}))
    runner.load()
    mel = reference_from_clip({"model": str(checkpoint)}, clip, 24_000)
    # the framing is the vocoder's: one frame per 240 samples, 80 bands; the STFT agrees with transformers' numpy one
    assert len(mel) == len(clip) // 240 and len(mel[0]) == 80
    padded = np.pad(clip, (392, 392), mode="reflect")
    filters = mel_filter_bank(513, 80, 0.0, 12_000, 24_000, norm="slaney", mel_scale="slaney")
    theirs = spectrogram(padded, window_function(1024, "hann", periodic=True), 1024, 240, power=1.0, center=False,
                         mel_filters=filters, mel_floor=1e-5, log_mel="log").T
    assert np.abs(theirs - np.asarray(mel)).max() < 1e-3
    base = _decode(runner, "Ethan", {})
    voiced = _decode(runner, "Ethan", {"reference_mel": mel})
    assert base.shape == voiced.shape
    assert np.abs(voiced - base).max() > DIFFERENT_AT_LEAST * np.abs(base).max()
    # transformers' token2wav, the noise drawn from the global generator seeded alike, the mel made here
    ethan = load_speakers(checkpoint)["Ethan"]
    codes = torch.randint(0, 96, (CODES,), generator=torch.Generator().manual_seed(7))
    direct = torch.from_numpy(reference_mel(clip, 240, 80))[None]
    torch.manual_seed(SEED)
    with torch.no_grad():
        want = runner.model(codes[None], ethan["cond"].float(), direct).float().numpy()
    assert np.abs(voiced - want).max() <= AUDIO_TOLERANCE * np.abs(want).max()
    with pytest.raises(Exception, match="reference_mel"):
        runner.validate({"extra": {"reference_mel": [[0.0] * 79]}})


def _upload(client: httpx.Client, name: str, clip: bytes, **fields: str) -> httpx.Response:
    return client.post("/v1/audio/voices", data={"name": name, **fields}, files={"audio": ("clip.wav", clip)})


def _refused(response: httpx.Response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def _realtime_audio(url: str, voice: str) -> int:
    """Bytes of audio a realtime session with ``voice`` answers a typed question with (an error fails)."""
    with connect(url.replace("http://", "ws://") + "/v1/realtime", open_timeout=60, max_size=None,
                 additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        def until(*types: str) -> dict:
            while True:
                event = json.loads(ws.recv(timeout=120))
                assert event["type"] != "error", event
                if event["type"] in types:
                    return event

        until("session.created")
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "output": {"voice": voice}, "input": {"turn_detection": None}}}}))
        assert until("session.updated")["session"]["audio"]["output"]["voice"] == voice
        ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
        audio = 0
        while (event := until("response.output_audio.delta", "response.done"))["type"] != "response.done":
            audio += len(base64.b64decode(event["delta"]))
        assert event["response"]["status"] == "completed", event
        return audio


def test_voices_made_from_clips_through_the_server(checkpoint, clip, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path / "cache"))
    stages = {name: {"options": {"model": str(checkpoint)}} for name in ("thinker", "talker", "token2wav")}
    stages["talker"]["options"]["max_new_tokens"] = MAX_CODES  # realtime answers set no talker bound of their own
    data = wav(clip, 24_000)
    with running_server("qwen2_5_omni", {"stages": stages}, tmp_path, 300) as server, server.client() as client:
        assert "decode" in _refused(_upload(client, "mine", b"not audio at all"), 400, "audio")
        assert "0.50 s" in _refused(_upload(client, "mine", wav(clip[:12_000], 24_000)), 400, "audio")
        assert "1 to 30 s" in _refused(_upload(client, "mine", wav(np.tile(clip, 12)[: 24_000 * 31], 24_000)),
                                       400, "audio")
        _refused(_upload(client, "my voice", data), 400, "name")
        _refused(_upload(client, "ethan", data), 400, "name")
        _refused(_upload(client, "mine", data, base_voice="nobody"), 400, "base_voice")
        _refused(_upload(client, "mine", data, consent="yes"), 400, "consent")
        made = _upload(client, "mine", data, base_voice="Ethan")
        assert made.status_code == 201 and made.json()["base_voice"] == "Ethan", made.text
        assert _upload(client, "mine", data, base_voice="Ethan").status_code == 200  # the same again: kept
        _refused(_upload(client, "MINE", wav(clip[: 24_000 * 2], 24_000), base_voice="Ethan"), 409, "name")
        listed = client.get("/v1/audio/voices", params={"model": "qwen2_5_omni"}).json()["voices"]
        assert [(v["id"], v["base_voice"]) for v in listed] == [("default", None), ("Chelsie", None),
                                                                 ("Ethan", None), ("mine", "Ethan")]
        kept = tmp_path / "cache" / "voices" / "qwen2_5_omni" / "mine"
        assert (kept / "clip").read_bytes() == data and json.loads((kept / "voice.json").read_text())["base_voice"] \
            == "Ethan"

        openai_client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        said = speak(openai_client, "qwen2_5_omni", "mine", SAMPLING)
        assert speak(openai_client, "qwen2_5_omni", "MINE", SAMPLING) == said
        assert speak(openai_client, "qwen2_5_omni", "Ethan", SAMPLING) != said
        uploaded, rate = soundfile.read(io.BytesIO(data), dtype="float32")  # the clip as the WAV holds it (16 bit)
        by_hand = {**SAMPLING, "token2wav": {**SAMPLING["token2wav"], "extra": {
            "reference_mel": reference_from_clip({"model": str(checkpoint)}, uploaded, rate)}}}
        assert speak(openai_client, "qwen2_5_omni", "Ethan", by_hand) == said

        assert _realtime_audio(server.url, "mine") > 0

        assert client.delete("/v1/audio/voices/mine").json() == {"id": "mine", "object": "audio.voice",
                                                                 "deleted": True}
        assert not kept.exists()
        _refused(client.delete("/v1/audio/voices/mine"), 404, "name")
        with pytest.raises(openai.BadRequestError) as caught:
            speak(openai_client, "qwen2_5_omni", "mine", SAMPLING)
        assert caught.value.body["param"] == "audio.voice"
