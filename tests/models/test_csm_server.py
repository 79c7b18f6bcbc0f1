"""CSM through a real ``omnipipe serve --pipeline csm --model DIR`` process (one for the module) and the real
``openai`` client, on a tiny checkpoint written by ``omnipipe tiny-checkpoint csm`` without its generation config (so
the backbone decodes greedily, as ``generate(do_sample=False)``): ``/v1/audio/speech`` in a speaker id's voice
returns a WAV of the frames the backbone may write (``max_new_tokens``, 1920 samples each at 24 kHz), the voices
listed are the speaker ids, and a voice made from an uploaded clip with its transcript (``text``) says what
transformers' ``generate`` says after hearing that clip and those words. Bad input is refused naming its field, and
the server answers a good request after each: an unknown voice, ``instructions`` and ``speed`` (CSM takes neither),
an upload that is not audio, a clip too long for the model's positions, a transcript too long, text too long to say,
and chat (CSM says the text it is given and answers nothing: ``model``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch

from omnipipe.server.voice_registry import decode_clip
from omnipipe.util.audio import to_int16
from tests.models import media_files
from tests.server.conftest import API_KEY, ServerProcess, running_server

pytestmark = pytest.mark.slow  # a server process with two stage processes

FRAMES = 10
WAV_HEADER = 44
TEXT = "hello from sesame."
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("csm") / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "csm", str(directory)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    (directory / "generation_config.json").unlink()  # greedy throughout, backbone and depth decoder
    return directory


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("csm-server")
    deploy = {"stages": {"backbone": {"threads": 1, "options": {"max_new_tokens": FRAMES}}, "mimi": {"threads": 1}}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNIPIPE_CACHE", str(workdir / "cache"))  # the voices made from clips
        with running_server("csm", deploy, workdir, 300, extra_args=("--model", str(checkpoint))) as started:
            yield started


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=240)


def speech(client: openai.OpenAI, voice: str, text: str = TEXT, **extra: Any) -> bytes:
    return client.audio.speech.create(model="csm", voice=voice, input=text, response_format="wav",
                                      **extra).content


def upload(server: ServerProcess, name: str, clip: bytes, **fields: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/voices", data={"name": name, **fields},
                      files={"audio": ("clip.wav", clip)}, headers=HEADERS, timeout=120)


def tone(seconds: float, hz: float) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    return media_files.wav((0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 24000)


def refused(call: Any) -> tuple[int, dict[str, Any]]:
    """The status and error body of an openai call the server refuses."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict)
    return caught.value.status_code, body


def test_speech_in_a_speaker_id_and_in_a_voice_made_from_a_clip(server: ServerProcess,
                                                                client: openai.OpenAI) -> None:
    said = speech(client, "0")
    assert said[:4] == b"RIFF" and len(said) == WAV_HEADER + FRAMES * 1920 * 2  # int16 at 24 kHz
    assert np.abs(np.frombuffer(said[WAV_HEADER:], np.int16)).max() > 0
    listed = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "csm"}, headers=HEADERS, timeout=30)
    assert [voice["id"] for voice in listed.json()["voices"]][:11] == ["default", *map(str, range(10))]
    made = upload(server, "mine", tone(1.5, 180), base_voice="1")
    assert made.status_code == 201 and made.json()["base_voice"] == "1", made.text
    assert len(speech(client, "mine")) == len(said)  # heard first, then the text said in speaker 1's turn


def test_a_voice_with_its_transcript_says_what_generate_says_after_that_turn(
        server: ServerProcess, client: openai.OpenAI, checkpoint: Path) -> None:
    from transformers import AutoProcessor, CsmForConditionalGeneration

    clip, words = tone(1.5, 220), "one two three"
    made = upload(server, "told", clip, base_voice="1", text=f"  {words} ")
    assert made.status_code == 201, made.text
    again = upload(server, "told", clip, base_voice="1", text=words)  # the same voice: the card kept
    assert again.status_code == 200, again.text
    other = upload(server, "told", clip, base_voice="1", text="four five six")
    assert other.status_code == 409 and other.json()["error"]["param"] == "name", other.text
    assert upload(server, "untold", clip, base_voice="1").status_code == 201

    model = CsmForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    processor = AutoProcessor.from_pretrained(checkpoint, local_files_only=True)
    heard = decode_clip(clip, "audio")  # the clip as the server decodes it (24 kHz float32)

    def generated(text: str) -> np.ndarray:
        conversation = [{"role": "1", "content": [{"type": "text", "text": text}, {"type": "audio", "audio": heard}]},
                        {"role": "1", "content": [{"type": "text", "text": TEXT}]}]
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=FRAMES, do_sample=False, depth_decoder_do_sample=False,
                                 output_audio=True)
        return to_int16(out[0].numpy()).astype(np.int32)

    def spoken(voice: str) -> np.ndarray:
        return np.frombuffer(speech(client, voice)[WAV_HEADER:], "<i2").astype(np.int32)

    told, untold = spoken("told"), spoken("untold")
    want = generated(words)
    assert told.shape == want.shape == (FRAMES * 1920,)
    # float32 streamed Mimi against generate's one decode (6.3e-6 of an absmax near 10: 2 int16 steps at most)
    assert np.abs(told - want).max() <= 3
    assert np.abs(untold - generated("")).max() <= 3
    assert np.abs(told - untold).max() > 1000  # the words change what is said


def test_bad_input_is_refused_naming_its_field(server: ServerProcess, client: openai.OpenAI) -> None:
    status, body = refused(lambda: speech(client, "nobody"))
    assert status == 400 and body["param"] == "voice" and "0, 1, 2" in body["message"]
    status, body = refused(lambda: speech(client, "0", instructions="cheerfully"))
    assert status == 400 and body["param"] == "instructions"
    status, body = refused(lambda: speech(client, "0", speed=1.5))
    assert status == 400 and body["param"] == "speed"
    status, body = refused(lambda: speech(client, "0", text="say more " * 200))  # past the model's 256 positions
    assert status == 400 and body["param"] == "input" and "256" in body["message"]

    garbage = upload(server, "garbage", np.random.default_rng(0).bytes(6000))
    assert garbage.status_code == 400 and garbage.json()["error"]["param"] == "audio", garbage.text
    # the tiny model has 256 positions: 20 s (250 frames) leave none for the text; refused when made, not kept
    long = upload(server, "long", tone(20.0, 200))
    assert long.status_code == 400 and long.json()["error"]["param"] == "audio", long.text
    assert "shorter clip" in long.json()["error"]["message"]
    wordy = upload(server, "wordy", tone(1.5, 200), text="x" * 2001)
    assert wordy.status_code == 400 and wordy.json()["error"]["param"] == "text", wordy.text
    listed = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "csm"}, headers=HEADERS, timeout=30)
    assert not {"garbage", "long", "wordy"} & {voice["id"] for voice in listed.json()["voices"]}

    def chat(**extra: Any) -> Any:
        return client.chat.completions.create(model="csm", messages=[{"role": "user", "content": "hi"}], **extra)

    # CSM would read the user's words back: it does not chat, whatever the modalities asked for
    for asked in ({}, {"modalities": ["audio"], "audio": {"voice": "0", "format": "wav"}}):
        status, body = refused(lambda: chat(**asked))  # noqa: B023 - called at once
        assert status == 404 and body["param"] == "model" and "serves speech" in body["message"], body
    status, body = refused(lambda: client.responses.create(model="csm", input="hi"))
    assert status == 404 and body["param"] == "model"

    assert len(speech(client, "0")) == WAV_HEADER + FRAMES * 1920 * 2  # still serving
