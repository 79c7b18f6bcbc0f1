"""Moshi through a real ``omnipipe serve --pipeline moshi --model DIR`` process and a websocket client, on a tiny
checkpoint written by ``omnipipe tiny-checkpoint moshi``: a ``/v1/realtime`` session is full duplex.

- ``session.created`` says there is no turn detection; asking for one, committing, clearing, ``response.create``,
  ``response.cancel``, a conversation item and a pause are refused by name, and the session goes on;
- the first append starts one response: the model's speech streams back as ``response.output_audio.delta`` while the
  user's audio is still coming, one 80 ms frame per 80 ms heard, and its inner-monologue text as the transcript;
- greedy (the beta dialect's ``temperature`` 0), the transcript is the reference loop's text for the audio the
  server heard (the client's pcm16 resampled to 16 kHz as the server does), and the audio Mimi's decode of its frames;
- four sessions at once each get their audio at the frame rate: 12.5 frames a second of the user's audio;
- ``/v1/models`` lists it as audio in, text and audio out; ``/v1/audio/speech`` on it is refused naming ``model``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch

from omnipipe.models.moshi.modeling.user_audio import upsample
from omnipipe.stage.text_stream import TextStream
from tests.models import media_files
from tests.models.test_moshi import FRAME_24K, reference, speech, user_codes
from tests.server.conftest import API_KEY, ServerProcess, running_server
from tests.server.test_realtime import RATE, Conn, of, pcm16_b64, session

pytestmark = pytest.mark.slow  # a server process with two stage processes

APPEND_SAMPLES = RATE // 10  # 100 ms appends at 24 kHz, as a microphone would send


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("moshi-server") / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "moshi", str(directory)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    return directory


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    deploy = {"stages": {"duplex": {"threads": 1}, "mimi": {"threads": 1}}}
    with running_server("moshi", deploy, tmp_path_factory.mktemp("moshi-serve"), 300,
                        extra_args=("--model", str(checkpoint))) as running:
        yield running


def _clip(seconds: float, seed: int) -> np.ndarray:
    """A voiced-like clip at 24 kHz, as the client sends it (pcm16)."""
    import soxr

    heard = speech(seconds, seed)  # 16 kHz
    clip = np.asarray(soxr.resample(heard, 16000, RATE), np.float32)
    return np.frombuffer(base64.b64decode(pcm16_b64(clip)), "<i2").astype(np.float32) / 32768.0


def _as_heard(clip: np.ndarray) -> np.ndarray:
    """What the server hears of ``clip`` appended in 100 ms pieces: each resampled to 16 kHz as it comes."""
    import soxr

    stream = soxr.ResampleStream(RATE, 16000, 1, dtype="float32")
    pieces = [stream.resample_chunk(clip[start:start + APPEND_SAMPLES]) for start in range(0, len(clip),
                                                                                              APPEND_SAMPLES)]
    return np.concatenate(pieces).astype(np.float32)


def _frames_heard(clip: np.ndarray) -> int:
    """The whole 80 ms frames the model has heard of ``clip`` while the session goes on (the resampler holds its last
    few samples back until the stream ends)."""
    return len(upsample(_as_heard(clip))) // FRAME_24K


def _frames_said(clip: np.ndarray) -> int:
    """The frames of speech the model has sent back for them: one fewer (a frame's acoustic codes come with the
    next frame's step, Moshi's one-frame delay)."""
    return _frames_heard(clip) - 1


def _pushed(runner: Any, ids: list[int]) -> str:
    """The text the stage has sent for ``ids`` (a token's partial characters held back)."""
    stream = TextStream(runner._decode_ids)
    return "".join(stream.push(t)[0] for t in ids if t not in runner.silent_ids)


def _speak(conn: Conn, clip: np.ndarray) -> None:
    for start in range(0, len(clip), APPEND_SAMPLES):
        conn.send("input_audio_buffer.append", audio=pcm16_b64(clip[start:start + APPEND_SAMPLES]))


def _audio_and_text(conn: Conn, samples: int, beta: bool) -> tuple[list[dict[str, Any]], np.ndarray, str]:
    """Read until ``samples`` of the model's audio (24 kHz) came: the events, the audio and the transcript so far."""
    audio_type = "response.audio.delta" if beta else "response.output_audio.delta"
    text_type = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    events, got = [], 0
    while got < samples:
        event = conn.recv()
        assert event["type"] != "error", event
        events.append(event)
        if event["type"] == audio_type:
            got += len(base64.b64decode(event["delta"])) // 2
    audio = np.concatenate([np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in of(events, audio_type)])
    return events, audio.astype(np.float32) / 32768.0, "".join(e["delta"] for e in of(events, text_type))


def test_a_duplex_session_refuses_turns_and_streams_speech_while_the_user_speaks(server: ServerProcess) -> None:
    clip = _clip(2.0, seed=3)
    with session(server) as conn:
        conn.send("session.update", session={"type": "realtime"})
        _, updated = conn.until("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        refused = conn.update(audio={"input": {"turn_detection": {"type": "server_vad"}}})
        assert refused["type"] == "error", refused
        assert refused["error"]["param"] == "session.audio.input.turn_detection", refused
        for kind, fields in (("input_audio_buffer.commit", {}), ("input_audio_buffer.clear", {}),
                             ("response.create", {}), ("response.cancel", {}), ("session.pause", {}),
                             ("conversation.item.create", {"item": {"type": "message", "role": "user", "content": [
                                 {"type": "input_text", "text": "hi"}]}})):
            conn.send(kind, **fields)
            _, error = conn.until("error")
            assert error["error"]["param"] == "type" and kind in error["error"]["message"], error
        started = time.perf_counter()
        _speak(conn, clip[:len(clip) // 2])
        # the model speaks while the user's second half has not been sent
        events, first_half, _ = _audio_and_text(conn, FRAME_24K, beta=False)
        assert [e["type"] for e in events][:2] == ["response.created", "response.output_item.added"], events[:3]
        _speak(conn, clip[len(clip) // 2:])
        said = _frames_said(clip)
        _, rest, _ = _audio_and_text(conn, said * FRAME_24K - first_half.size, beta=False)
        # one 80 ms frame out per 80 ms heard: 2 s in, 24 whole frames heard (the 25th completes with what comes
        # next), 23 frames said (the 24th completes with the next frame heard)
        assert first_half.size + rest.size == said * FRAME_24K and said == 23
        refused = conn.update(output_modalities=["text"])  # nothing more comes until the user says more
        assert refused["type"] == "error" and refused["error"]["param"] == "session.output_modalities", refused
        assert time.perf_counter() - started < 120
    state = httpx.get(f"{server.url}/debug/state", headers=server.headers, timeout=30).json()
    assert state["engines"]["moshi"]["status"] == "ready"


@dataclass
class Greedy:
    """A clip, the frames of speech the server sends back for it, and the reference loop's greedy text tokens and
    Mimi frames for the audio the server heard of it (``runner``: a duplex runner, to decode text as the stage)."""

    clip: np.ndarray
    frames: int
    tokens: list[int]
    codes: np.ndarray
    runner: Any


@pytest.fixture(scope="module")
def greedy(checkpoint: Path) -> Greedy:
    from transformers import MoshiForConditionalGeneration

    from omnipipe.models.moshi.runners.duplex import MoshiDuplexRunner
    from omnipipe.stage.runner import RunnerContext

    clip = _clip(1.6, seed=5)
    model = MoshiForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    tokens, codes = reference(model, user_codes(model, _as_heard(clip)))
    runner = MoshiDuplexRunner(RunnerContext("duplex", "cpu", 1, 8, {"model": str(checkpoint)}))
    runner.load()
    return Greedy(clip, _frames_said(clip), tokens, codes, runner)


def test_greedy_transcript_and_speech_equal_the_reference_loop(checkpoint: Path, server: ServerProcess,
                                                               greedy: Greedy) -> None:
    from transformers import MoshiForConditionalGeneration

    frames, runner = greedy.frames, greedy.runner
    with session(server, beta=True) as conn:
        updated = conn.update(temperature=0.0)
        assert updated["type"] == "session.updated" and updated["session"]["turn_detection"] is None, updated
        _speak(conn, greedy.clip)
        _, audio, text = _audio_and_text(conn, frames * FRAME_24K, beta=True)
    model = MoshiForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    # the text of the frames heard (a token a frame, and the first before any): frames + 2 tokens, the audio of the
    # last frame said coming after its text, or with it
    assert text.startswith(_pushed(runner, greedy.tokens[:frames])), text
    assert _pushed(runner, greedy.tokens[:frames + 2]).startswith(text), text
    with torch.inference_mode():  # Mimi is causal: the frames heard so far decode to the start of the whole
        want_audio = model.audio_encoder.decode(torch.from_numpy(greedy.codes[:, :frames])[None]).audio_values[0, 0]
    want_audio = want_audio.numpy()
    assert audio.size == want_audio.size == frames * FRAME_24K
    assert np.abs(audio - np.clip(want_audio, -1, 1)).max() <= 2e-4 + 1e-4 * float(np.abs(want_audio).max())


def test_four_sessions_at_once_each_speak_at_the_frame_rate(server: ServerProcess) -> None:
    """Each session appends 3 s of audio at real-time pace; its audio comes at 12.5 frames a second of that audio:
    the whole 3 s back by the time the last append is heard, give or take the 2-core box's lag."""
    seconds, results = 3.0, {}

    def run(index: int) -> None:
        clip = _clip(seconds, seed=10 + index)
        with session(server) as conn:
            sent_at = time.perf_counter()
            arrivals: list[tuple[float, int]] = []
            sender = threading.Thread(target=_paced, args=(conn, clip, sent_at))
            sender.start()
            got, want = 0, _frames_said(clip) * FRAME_24K
            while got < want:
                event = conn.recv()
                assert event["type"] != "error", event
                if event["type"] == "response.output_audio.delta":
                    got += len(base64.b64decode(event["delta"])) // 2
                    arrivals.append((time.perf_counter() - sent_at, got))
            sender.join()
            results[index] = arrivals

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(results) == [0, 1, 2, 3]
    for arrivals in results.values():
        (first_t, _), (last_t, total) = arrivals[0], arrivals[-1]
        assert total == 36 * FRAME_24K  # 3 s: 37.5 frames, 37 heard whole while the stream goes on, 36 said
        # 75 frames came over the 3 s the audio took to send: a frame rate of 12.5 a second of the user's audio
        # (paced by the input, not a burst at the end)
        rate = (total - FRAME_24K) / RATE / max(last_t - first_t, 1e-6)
        assert first_t < seconds, arrivals[:3]

        assert 0.5 < rate < 2.0, (rate, arrivals[:3], arrivals[-3:])


def _paced(conn: Conn, clip: np.ndarray, start: float) -> None:
    for index, begin in enumerate(range(0, len(clip), APPEND_SAMPLES)):
        time.sleep(max(0.0, start + index * APPEND_SAMPLES / RATE - time.perf_counter()))
        conn.send("input_audio_buffer.append", audio=pcm16_b64(clip[begin:begin + APPEND_SAMPLES]))


def test_models_lists_moshi_and_speech_on_it_is_refused(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    listed = {model.id: model for model in client.models.list().data}
    assert "moshi" in listed, listed
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.speech.create(model="moshi", voice="alloy", input="hello")
    assert missing.value.body["param"] == "model"  # type: ignore[index]



def test_a_text_only_session_streams_the_greedy_text_and_no_audio(server: ServerProcess, greedy: Greedy) -> None:
    """``output_modalities: ["text"]`` is taken (Moshi's inner monologue is text): the session streams the reference
    loop's text for the audio heard, and no audio at all."""
    with session(server) as conn:  # GA takes it before the audio starts
        updated = conn.update(output_modalities=["text"])
        assert updated["type"] == "session.updated" and updated["session"]["output_modalities"] == ["text"], updated
    frames, runner = greedy.frames, greedy.runner
    whole = _pushed(runner, greedy.tokens[:frames + 2])  # every token of the frames heard (see the greedy test)
    with session(server, beta=True) as conn:
        updated = conn.update(temperature=0.0, modalities=["text"])
        assert updated["type"] == "session.updated" and updated["session"]["modalities"] == ["text"], updated
        _speak(conn, greedy.clip)
        events: list[dict[str, Any]] = []
        text = ""
        while text != whole:  # the last token's characters may be held back: then the wait for more ends it
            try:
                event = json.loads(conn.ws.recv(timeout=10))
            except TimeoutError:
                break
            assert event["type"] != "error", event
            events.append(event)
            text += event["delta"] if event["type"] == "response.text.delta" else ""
    assert [e["type"] for e in events][:2] == ["response.created", "response.output_item.added"], events[:3]
    assert not [e for e in events if "audio" in e["type"]], [e["type"] for e in events]
    assert text.startswith(_pushed(runner, greedy.tokens[:frames])) and whole.startswith(text), (text, whole)


def test_bad_appends_are_refused_by_name_and_the_session_goes_on(server: ServerProcess) -> None:
    """Audio that is not base64, or pcm16 of an odd number of bytes, is refused naming ``audio`` (before the
    response starts, and while it runs); the session hears the good audio around it as if nothing came between."""
    clip = _clip(2.0, seed=3)
    bad = (("not base64!", "invalid_base64"), (base64.b64encode(b"\x00\x01\x02").decode(), "invalid_audio"))
    with session(server) as conn:
        for audio, code in bad:
            conn.send("input_audio_buffer.append", audio=audio)
            _, error = conn.until("error")
            assert (error["error"]["param"], error["error"]["code"]) == ("audio", code), error
        _speak(conn, clip[:len(clip) // 2])
        events, first_half, _ = _audio_and_text(conn, FRAME_24K, beta=False)
        assert [e["type"] for e in events][:2] == ["response.created", "response.output_item.added"], events[:3]
        for audio, _ in bad:
            conn.send("input_audio_buffer.append", audio=audio)
        _speak(conn, clip[len(clip) // 2:])
        rest, got, want = [], first_half.size, _frames_said(clip) * FRAME_24K
        while got < want:  # every frame of the good audio is said, as if nothing came between
            rest.append(conn.recv())
            if rest[-1]["type"] == "response.output_audio.delta":
                got += len(base64.b64decode(rest[-1]["delta"])) // 2
        assert got == want
        refused = [e["error"] for e in rest if e["type"] == "error"]
        assert [(e["param"], e["code"]) for e in refused] == [("audio", code) for _, code in bad], refused
        assert not [e for e in rest if e["type"] == "response.done"], rest  # the response goes on
    state = httpx.get(f"{server.url}/debug/state", headers=server.headers, timeout=30).json()
    assert state["engines"]["moshi"]["status"] == "ready"


def test_what_moshi_lacks_is_refused_by_name_and_a_session_still_speaks(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as caught:  # Moshi hears audio only
        client.chat.completions.create(model="moshi", messages=[{"role": "user", "content": "hello there"}])
    assert caught.value.body["param"] == "messages[0].content", caught.value.body  # type: ignore[index]
    assert "does not take text input" in caught.value.body["message"]  # type: ignore[index]
    not_audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"hello " * 100).decode(),
                                                        "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="moshi", messages=[{"role": "user", "content": [not_audio]}])
    assert caught.value.body["param"] == "messages[0].content[0].input_audio.data", caught.value.body  # type: ignore[index]
    assert "is not audio" in caught.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.transcriptions.create(model="moshi", file=("clip.wav", b"RIFF" + b"\x00" * 100))
    assert missing.value.body["param"] == "model", missing.value.body  # type: ignore[index]
    assert missing.value.body["code"] == "endpoint_not_available"  # type: ignore[index]
    for beta, field, value, param in (
            (False, "audio", {"input": {"transcription": {"model": "whisper-1"}}}, "session.audio.input.transcription"),
            (True, "input_audio_transcription", {"model": "whisper-1"}, "session.input_audio_transcription")):
        with session(server, beta=beta) as conn:
            refused = conn.update(**{field: value})
            assert refused["type"] == "error" and refused["error"]["param"] == param, refused
            assert "does not transcribe" in refused["error"]["message"], refused
            clip = _clip(1.0, seed=7)
            _speak(conn, clip)
            _audio_and_text(conn, _frames_said(clip) * FRAME_24K, beta=beta)
    # a spoken question over HTTP (a clip heard as if it streamed in, then its end) is answered
    import soxr

    heard = np.asarray(soxr.resample(_clip(1.0, seed=7), RATE, 16000), np.float32)
    spoken = {"type": "input_audio", "input_audio": {"data": base64.b64encode(media_files.wav(heard)).decode(),
                                                     "format": "wav"}}
    reply = client.chat.completions.create(model="moshi", messages=[{"role": "user", "content": [spoken]}])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content, reply
