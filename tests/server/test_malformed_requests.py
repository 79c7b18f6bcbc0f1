"""Malformed requests get a 4xx OpenAI error object naming the field, and the server keeps serving."""

from __future__ import annotations

import base64
import io
import json
import wave
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.server.conftest import MAX_BODY_BYTES, ServerProcess

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
TRANSCRIBE = "/v1/audio/transcriptions"
USER = [{"role": "user", "content": "hello"}]


def chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "toy", "messages": USER}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not ...}


def speech(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "toy", "input": "hello", "voice": "default"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not ...}


def audio_part(data: str = base64.b64encode(b"RIFF....WAVE").decode(), fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


@dataclass
class Case:
    name: str
    status: int
    param: str | None  # the field the error must name (param and message); None: only the error's shape
    path: str = CHAT
    json_body: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"
    files: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    auth: bool = True


CASES = [
    Case("body is not json", 400, None, content=b"{not json", headers={"content-type": "application/json"}),
    Case("body is a list", 400, "body", json_body=[1, 2]),
    Case("model missing", 400, "model", json_body=chat(model=...)),
    Case("model wrong type", 400, "model", json_body=chat(model=3)),
    Case("model unknown", 404, "model", json_body=chat(model="gpt-4o")),
    Case("messages missing", 400, "messages", json_body=chat(messages=...)),
    Case("messages empty", 400, "messages", json_body=chat(messages=[])),
    Case("messages not a list", 400, "messages", json_body=chat(messages="hi")),
    Case("role unknown", 400, "messages[0].role", json_body=chat(messages=[{"role": "robot", "content": "x"}])),
    Case("role missing", 400, "messages[0].role", json_body=chat(messages=[{"content": "x"}])),
    Case("content wrong type", 400, "messages[0].content", json_body=chat(messages=[{"role": "user", "content": 5}])),
    Case("content part type unknown", 400, "messages[0].content[0]",
         json_body=chat(messages=[{"role": "user", "content": [{"type": "video", "video": "x"}]}])),
    Case("text part without text", 400, "messages[0].content[0].text",
         json_body=chat(messages=[{"role": "user", "content": [{"type": "text"}]}])),
    Case("input_audio invalid base64", 400, "messages[0].content[0].input_audio.data",
         json_body=chat(messages=[{"role": "user", "content": [audio_part("@@not base64@@")]}])),
    Case("input_audio format unknown", 400, "messages[0].content[0].input_audio.format",
         json_body=chat(messages=[{"role": "user", "content": [audio_part(fmt="aac")]}])),
    Case("input_audio on a text-only pipeline", 400, "messages[0].content[0].input_audio",
         json_body=chat(messages=[{"role": "user", "content": [audio_part()]}])),
    Case("image_url not taken", 400, "messages[0].content[1].image_url",
         json_body=chat(messages=[{"role": "user", "content": [
             {"type": "text", "text": "what is this"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])),
    Case("no user message", 400, "messages", json_body=chat(messages=[{"role": "system", "content": "be nice"}])),
    Case("empty user message", 400, "messages[0].content",
         json_body=chat(messages=[{"role": "user", "content": "   "}])),
    Case("text with a lone surrogate", 400, "messages",
         json_body=chat(messages=[{"role": "user", "content": "a\ud800b"}])),
    Case("stop string with a lone surrogate", 400, "stop", json_body=chat(stop=["\udfff"])),
    Case("temperature wrong type", 400, "temperature", json_body=chat(temperature="hot")),
    Case("temperature out of range", 400, "temperature", json_body=chat(temperature=5)),
    Case("top_p zero", 400, "top_p", json_body=chat(top_p=0)),
    Case("max_tokens negative", 400, "max_tokens", json_body=chat(max_tokens=-5)),
    Case("max_tokens as string", 400, "max_tokens", json_body=chat(max_tokens="10")),
    Case("max_completion_tokens zero", 400, "max_completion_tokens", json_body=chat(max_completion_tokens=0)),
    Case("seed not an integer", 400, "seed", json_body=chat(seed=1.5)),
    Case("seed negative", 400, "seed", json_body=chat(seed=-7)),
    Case("seed too large for torch", 400, "seed", json_body=chat(seed=2**64)),
    Case("max_tokens beyond any context", 400, "max_tokens", json_body=chat(max_tokens=10**6)),
    Case("stop wrong type", 400, "stop", json_body=chat(stop=7)),
    Case("too many stop strings", 400, "stop", json_body=chat(stop=[f"s{i}" for i in range(20)])),
    Case("presence_penalty out of range", 400, "presence_penalty", json_body=chat(presence_penalty=3)),
    Case("frequency_penalty out of range", 400, "frequency_penalty", json_body=chat(frequency_penalty=-3)),
    Case("modality unknown", 400, "modalities[0]", json_body=chat(modalities=["video"])),
    Case("modalities empty", 400, "modalities", json_body=chat(modalities=[])),
    Case("voice unknown", 400, "audio.voice",
         json_body=chat(modalities=["text", "audio"], audio={"voice": "nova", "format": "wav"})),
    Case("audio format unknown", 400, "audio.format",
         json_body=chat(modalities=["text", "audio"], audio={"voice": "default", "format": "aac"})),
    Case("streamed audio not pcm16", 400, "audio.format",
         json_body=chat(modalities=["text", "audio"], audio={"voice": "default", "format": "wav"}, stream=True)),
    Case("audio without the audio modality", 400, "audio", json_body=chat(audio={"voice": "default"})),
    Case("stream wrong type", 400, "stream", json_body=chat(stream="yes")),
    Case("stream_options without stream", 400, "stream_options",
         json_body=chat(stream_options={"include_usage": True})),
    Case("n above 1", 400, "n", json_body=chat(n=2)),
    Case("extension: unknown stage", 400, "omnipipe.sampling_params.vocoder",
         json_body=chat(omnipipe={"sampling_params": {"vocoder": {"temperature": 0.5}}})),
    Case("extension: bad stage value", 400, "omnipipe.sampling_params.thinker.temperature",
         json_body=chat(omnipipe={"sampling_params": {"thinker": {"temperature": -1}}})),
    Case("extension: unknown sampling field", 400, "omnipipe.sampling_params.talker.warmth",
         json_body=chat(omnipipe={"sampling_params": {"talker": {"warmth": 1}}})),
    Case("extension: stage knob out of range", 400, "omnipipe.sampling_params.talker.extra.speed",
         json_body=chat(omnipipe={"sampling_params": {"talker": {"extra": {"speed": 100}}}})),
    Case("extension: stage knob wrong type", 400, "omnipipe.sampling_params.talker.extra.speed",
         json_body=chat(modalities=["text", "audio"], omnipipe={"sampling_params": {"talker": {"extra": {"speed": "x"}}}})),
    Case("extension: unknown stage knob too big for the wire", 400, "omnipipe.sampling_params.thinker.extra.x",
         json_body=chat(omnipipe={"sampling_params": {"thinker": {"extra": {"x": 2**70}}}})),
    Case("extension: knob for a stage that takes none", 400, "omnipipe.sampling_params.code2wav.extra.speed",
         json_body=chat(omnipipe={"sampling_params": {"code2wav": {"extra": {"speed": 1.0}}}})),
    Case("extension: chunk frames zero", 400, "omnipipe.initial_codec_chunk_frames",
         json_body=chat(omnipipe={"initial_codec_chunk_frames": 0})),
    Case("extension: unknown key", 400, "omnipipe.turbo", json_body=chat(omnipipe={"turbo": True})),
    Case("wrong content type", 415, "content-type", content=b"hello", headers={"content-type": "text/plain"}),
    Case("form body to a json endpoint", 415, "content-type", data={"model": "toy"}),
    Case("body over the limit", 413, None,
         json_body=chat(messages=[{"role": "user", "content": "x" * (MAX_BODY_BYTES + 10)}])),
    Case("api key missing", 401, None, json_body=chat(), auth=False),
    Case("api key wrong", 401, None, json_body=chat(), headers={"Authorization": "Bearer nope"}),
    Case("unknown route", 404, None, path="/v1/completions/legacy", json_body={}),
    Case("wrong method", 405, None, method="GET", path=CHAT),
    Case("speech: input missing", 400, "input", path=SPEECH, json_body=speech(input=...)),
    Case("speech: input empty", 400, "input", path=SPEECH, json_body=speech(input="")),
    Case("speech: input too long", 400, "input", path=SPEECH, json_body=speech(input="x" * 5000)),
    Case("speech: input with a lone surrogate", 400, "input", path=SPEECH, json_body=speech(input="hi \ud83d")),
    Case("speech: voice unknown", 400, "voice", path=SPEECH, json_body=speech(voice="alloy")),
    Case("speech: response_format unknown", 400, "response_format", path=SPEECH,
         json_body=speech(response_format="aac")),
    Case("speech: speed too high", 400, "speed", path=SPEECH, json_body=speech(speed=10)),
    Case("speech: speed wrong type", 400, "speed", path=SPEECH, json_body=speech(speed="fast")),
    Case("speech: stream_format unknown", 400, "stream_format", path=SPEECH, json_body=speech(stream_format="x")),
    Case("speech: model unknown", 404, "model", path=SPEECH, json_body=speech(model="tts-1")),
    Case("transcription: json body", 415, "content-type", path=TRANSCRIBE, json_body={"model": "toy"}),
    Case("transcription: file missing", 400, "file", path=TRANSCRIBE, data={"model": "toy"},
         files={"other": ("a.txt", b"x", "text/plain")}),
    Case("transcription: model missing", 400, "model", path=TRANSCRIBE,
         files={"file": ("a.wav", b"RIFF", "audio/wav")}),
    Case("transcription: response_format unknown", 400, "response_format", path=TRANSCRIBE,
         data={"model": "toy", "response_format": "srt"}, files={"file": ("a.wav", b"RIFF", "audio/wav")}),
]


def send(server: ServerProcess, case: Case) -> httpx.Response:
    headers = dict(server.headers) if case.auth else {}
    headers.update(case.headers)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        if case.json_body is not None:
            content = json.dumps(case.json_body).encode()
            headers.setdefault("content-type", "application/json")
            return http.request(case.method, case.path, content=content, headers=headers)
        return http.request(case.method, case.path, content=case.content, headers=headers, data=case.data,
                            files=case.files)


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
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


def test_server_keeps_serving_after_malformed_requests(toy_server: ServerProcess) -> None:
    for case in CASES:
        send(toy_server, case)
    with toy_server.client() as http:
        response = http.post(CHAT, json=chat(max_tokens=50))
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "HELLO"
        assert http.get("/health").status_code == 200
    assert toy_server.process.poll() is None
    from tests.server.conftest import engines_idle

    assert engines_idle(toy_server.wait_idle())


# ---------------------------------------------------------------------------------------------- default pipeline
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
