"""Malformed requests get a 4xx OpenAI error object naming the field, and the server keeps serving.

The cases live in ``omnipipe.bench.malformed`` (``omnipipe bench soak --malformed`` sends the same list)."""

from __future__ import annotations

import base64
import io
import threading
import wave
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from omnipipe.bench.malformed import CHAT, SPEECH, USER, Case, malformed_cases
from tests.server.conftest import MAX_BODY_BYTES, ServerProcess, engines_idle

CASES = malformed_cases("toy", MAX_BODY_BYTES)
REFUSED = [c for c in CASES if c.status >= 400]
TOLERATED = [c for c in CASES if c.status < 400]


def params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.name) for c in cases]


def send(server: ServerProcess, case: Case) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        return http.request(**case.request_args(server.headers))


def test_there_are_enough_cases() -> None:
    assert len(REFUSED) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", params(REFUSED))
def test_malformed_request_is_refused_naming_the_field(toy_server: ServerProcess, case: Case) -> None:
    response = send(toy_server, case)
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if case.param is not None:
        assert error["param"] == case.param, error
        assert case.param in error["message"], error
    if case.status == 401:
        assert response.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize("case", params(TOLERATED))
def test_tolerated_request_is_served(toy_server: ServerProcess, case: Case) -> None:
    response = send(toy_server, case)
    assert response.status_code == case.status, response.text
    assert response.json()["choices"][0]["finish_reason"]


def test_server_keeps_serving_after_malformed_requests(toy_server: ServerProcess) -> None:
    for case in CASES:
        send(toy_server, case)
    with toy_server.client() as http:
        response = http.post(CHAT, json={"model": "toy", "messages": USER, "max_tokens": 50})
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "HELLO"
        assert http.get("/health").status_code == 200
    assert toy_server.process.poll() is None
    assert engines_idle(toy_server.wait_idle())


def test_malformed_requests_under_streaming_load_are_refused_alike(toy_server: ServerProcess) -> None:
    """Every case sent at once, four at a time, while eight clients stream spoken answers and leave mid-stream:
    the same answers as one by one, no 5xx, and nothing left in any stage."""
    stop = threading.Event()
    streamed: list[int] = []

    def stream_and_leave(index: int) -> None:
        body = {"model": "toy", "messages": [{"role": "user", "content": " ".join(f"word{i}" for i in range(60))}],
                "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}, "stream": True}
        with toy_server.client() as http:
            while not stop.is_set():
                with http.stream("POST", CHAT, json=body) as response:
                    assert response.status_code == 200, response.read()
                    for n, _ in enumerate(response.iter_lines()):
                        if n >= 5 + 7 * index:  # a different point each
                            break
                streamed.append(index)

    with ThreadPoolExecutor(8) as loaders, ThreadPoolExecutor(4) as senders:
        load = [loaders.submit(stream_and_leave, i) for i in range(8)]
        try:
            answers = list(senders.map(lambda case: (case, send(toy_server, case)), CASES))
        finally:
            stop.set()
        for future in load:
            future.result()
    assert len(streamed) >= 8
    wrong = [(case.name, r.status_code, r.text[:200]) for case, r in answers if r.status_code != case.status]
    assert not wrong, wrong
    assert engines_idle(toy_server.wait_idle(timeout_s=30))


# ---------------------------------------------------------------------------------------------- default pipeline
def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "default", "messages": USER, **fields}


def speech(**fields: Any) -> dict[str, Any]:
    return {"model": "tts", "input": "hello", "voice": "default", **fields}


def audio_part(data: str, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def silent_wav(seconds: float = 1.0, rate: int = 16_000) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(int(seconds * rate) * 2))
    return base64.b64encode(buffer.getvalue()).decode()


def silent_flac(seconds: float, rate: int = 8000) -> str:
    import numpy as np
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="FLAC", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


DEFAULT_CASES = [
    # found by the stages, after the request started: the thinker's prompt limit, whisper hearing nothing
    Case("question longer than the thinker's prompt limit", 400, "messages",
         json_body=chat(model="default", messages=[{"role": "user", "content": "word " * 3000}])),
    # refused before it is tokenised: a megabyte used to hold the thinker in one step for seconds (under load,
    # past its stall_restart_s, so the watchdog killed it)
    Case("a megabyte question", 400, "messages",
         json_body=chat(model="default", messages=[{"role": "user", "content": "x" * 1_000_000}])),
    Case("spoken question with no speech in it", 400, "messages[0].content[0].input_audio.data",
         json_body=chat(model="default", messages=[{"role": "user", "content": [audio_part(silent_wav())]}])),
    Case("spoken question with no speech in it, streamed", 400, "messages[0].content[0].input_audio.data",
         json_body=chat(model="default", stream=True, modalities=["text", "audio"],
                        audio={"voice": "default", "format": "pcm16"},
                        messages=[{"role": "user", "content": [audio_part(silent_wav())]}])),
    # decoded (and resampled) in full before the length limit was checked: 38 GB of samples, hours of audio
    Case("spoken question: 1.2 MB of wav at 1 Hz", 400, "messages[0].content[0].input_audio.data",
         json_body=chat(model="default", messages=[{"role": "user", "content": [audio_part(silent_wav(600_000, 1))]}])),
    Case("spoken question: an hour of flac silence in 90 kB", 400, "messages[0].content[0].input_audio.data",
         json_body=chat(model="default", messages=[{"role": "user", "content": [
             audio_part(silent_flac(3600), fmt="flac")]}])),
    Case("speech: a nul character", 200, None, path=SPEECH,
         json_body=speech(model="tts", input="Hello\u0000 there.", response_format="pcm")),
]


@pytest.mark.models
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=[c.name for c in DEFAULT_CASES])
def test_input_only_the_stages_can_judge_is_refused_naming_the_field(default_server: ServerProcess,
                                                                    case: Case) -> None:
    """These used to fail inside a stage with a 500 (request_failed): a stage now says the caller's input is at
    fault and in which field (``RunnerOutput.error_field``)."""
    response = send(default_server, case)
    assert response.status_code == case.status, response.text
    if case.status == 200:
        assert response.content
        return
    error = response.json()["error"]
    assert error["param"] == case.param and error["type"] == "invalid_request_error", error
    assert case.param in error["message"], error
