"""Malformed requests: mistakes a client can send to the chat, speech and transcription endpoints, each with what
a server of the ``toy`` pipeline answers (the status and the API field its error names).

``tests/server/test_malformed_requests.py`` holds a toy server to these answers; ``omnipipe bench soak --malformed``
sends the same list to any server while it is under load and counts 4xx against 5xx. A few cases are tolerated
(status 200: a huge question, and the off values of features omnipipe lacks, which clients send by default) rather
than refused.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
TRANSCRIBE = "/v1/audio/transcriptions"
USER = [{"role": "user", "content": "hello"}]
HUGE_STRING_CHARS = 1_000_000


@dataclass(frozen=True)
class Case:
    """One request and the toy server's answer to it."""

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
    auth: bool = True  # send the server's API key (if it has one)
    # refused by the toy for a feature it lacks (tools, logprobs, JSON output); a pipeline that has it serves it
    feature: bool = False

    def request_args(self, auth_headers: dict[str, str]) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client.request`` / ``httpx.AsyncClient.request`` (sync or async alike)."""
        headers = dict(auth_headers) if self.auth else {}
        headers.update(self.headers)
        if self.json_body is not None:
            headers.setdefault("content-type", "application/json")
            return {"method": self.method, "url": self.path, "content": json.dumps(self.json_body).encode(),
                    "headers": headers}
        return {"method": self.method, "url": self.path, "content": self.content, "headers": headers,
                "data": self.data, "files": self.files}


def malformed_cases(model: str, max_body_bytes: int) -> list[Case]:
    """The whole list for a server serving ``model`` that refuses bodies over ``max_body_bytes``."""

    def chat(**fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": USER}
        body.update(fields)
        return {k: v for k, v in body.items() if v is not ...}

    def speech(**fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "input": "hello", "voice": "default"}
        body.update(fields)
        return {k: v for k, v in body.items() if v is not ...}

    def audio_part(data: str = base64.b64encode(b"RIFF....WAVE").decode(), fmt: str = "wav") -> dict[str, Any]:
        return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}

    def per_stage(stage: str, **params: Any) -> dict[str, Any]:
        return chat(omnipipe={"sampling_params": {stage: params}})

    def talker_speed(speed: Any) -> dict[str, Any]:
        return chat(modalities=["text", "audio"], audio={"voice": "default", "format": "wav"},
                    omnipipe={"sampling_params": {"talker": {"extra": {"speed": speed}}}})

    huge = "x" * HUGE_STRING_CHARS
    wav = ("a.wav", b"RIFF", "audio/wav")
    return [
        Case("body is not json", 400, None, content=b"{not json", headers={"content-type": "application/json"}),
        Case("body is a list", 400, "body", json_body=[1, 2]),
        Case("body is a number", 400, "body", json_body=7),
        Case("model missing", 400, "model", json_body=chat(model=...)),
        Case("model wrong type", 400, "model", json_body=chat(model=3)),
        Case("model unknown", 404, "model", json_body=chat(model="gpt-4o")),
        Case("model huge", 404, "model", json_body=chat(model=huge)),
        Case("messages missing", 400, "messages", json_body=chat(messages=...)),
        Case("messages empty", 400, "messages", json_body=chat(messages=[])),
        Case("messages not a list", 400, "messages", json_body=chat(messages="hi")),
        Case("message not an object", 400, "messages[0]", json_body=chat(messages=["hello"])),
        Case("role unknown", 400, "messages[0].role", json_body=chat(messages=[{"role": "robot", "content": "x"}])),
        Case("role missing", 400, "messages[0].role", json_body=chat(messages=[{"content": "x"}])),
        Case("content wrong type", 400, "messages[0].content",
             json_body=chat(messages=[{"role": "user", "content": 5}])),
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
        Case("last message is not the user's", 400, "messages[0].role",
             json_body=chat(messages=[{"role": "system", "content": "be nice"}])),
        Case("empty user message", 400, "messages[0].content",
             json_body=chat(messages=[{"role": "user", "content": "   "}])),
        Case("empty user message list", 400, "messages[0].content",
             json_body=chat(messages=[{"role": "user", "content": []}])),
        Case("text with a lone surrogate", 400, "messages",
             json_body=chat(messages=[{"role": "user", "content": "a\ud800b"}])),
        Case("stop string with a lone surrogate", 400, "stop", json_body=chat(stop=["\udfff"])),
        Case("temperature wrong type", 400, "temperature", json_body=chat(temperature="hot")),
        Case("temperature out of range", 400, "temperature", json_body=chat(temperature=5)),
        Case("top_p zero", 400, "top_p", json_body=chat(top_p=0)),
        Case("max_tokens negative", 400, "max_tokens", json_body=chat(max_tokens=-5)),
        Case("max_tokens as string", 400, "max_tokens", json_body=chat(max_tokens="10")),
        Case("max_tokens huge float", 400, "max_tokens", json_body=chat(max_tokens=1e25)),
        Case("max_completion_tokens zero", 400, "max_completion_tokens", json_body=chat(max_completion_tokens=0)),
        Case("seed not an integer", 400, "seed", json_body=chat(seed=1.5)),
        Case("seed negative", 400, "seed", json_body=chat(seed=-5)),
        Case("seed too large for torch", 400, "seed", json_body=chat(seed=2**64)),
        Case("max_tokens beyond any context", 400, "max_tokens", json_body=chat(max_tokens=10**6)),
        Case("stop wrong type", 400, "stop", json_body=chat(stop=7)),
        Case("too many stop strings", 400, "stop", json_body=chat(stop=[f"s{i}" for i in range(20)])),
        Case("presence_penalty out of range", 400, "presence_penalty", json_body=chat(presence_penalty=3)),
        Case("frequency_penalty out of range", 400, "frequency_penalty", json_body=chat(frequency_penalty=-3)),
        Case("modality unknown", 400, "modalities[0]", json_body=chat(modalities=["video"])),
        Case("modalities empty", 400, "modalities", json_body=chat(modalities=[])),
        Case("voice unknown", 400, "audio.voice",
             json_body=chat(modalities=["text", "audio"], audio={"voice": "nobody", "format": "wav"})),
        Case("voice huge", 400, "audio.voice",
             json_body=chat(modalities=["text", "audio"], audio={"voice": huge, "format": "wav"})),
        Case("audio format unknown", 400, "audio.format",
             json_body=chat(modalities=["text", "audio"], audio={"voice": "default", "format": "ogg"})),
        Case("streamed audio not pcm16", 400, "audio.format",
             json_body=chat(modalities=["text", "audio"], audio={"voice": "default", "format": "wav"}, stream=True)),
        Case("audio without the audio modality", 400, "audio", json_body=chat(audio={"voice": "default"})),
        Case("stream wrong type", 400, "stream", json_body=chat(stream="yes")),
        Case("stream_options without stream", 400, "stream_options",
             json_body=chat(stream_options={"include_usage": True})),
        Case("n above 1", 400, "n", json_body=chat(n=2)),
        Case("prompt huge", 200, None, json_body=chat(max_tokens=4, messages=[{"role": "user", "content": huge}])),
        Case("unknown top-level field", 400, "frobnicate", json_body=chat(max_tokens=4, frobnicate=1)),
        Case("unknown top-level field with a huge name", 400, "k" * 1000, json_body=chat(**{"k" * 1000: [1, 2]})),
        Case("tools given", 400, "tools", json_body=chat(tools=[{"type": "function", "function": {"name": "f"}}]),
             feature=True),
        Case("logprobs asked for", 400, "logprobs", json_body=chat(logprobs=True), feature=True),
        Case("json response_format", 400, "response_format", json_body=chat(response_format={"type": "json_object"}),
             feature=True),
        Case("off values of missing features are accepted", 200, None,
             json_body=chat(max_tokens=4, logprobs=False, tools=[], tool_choice="none", user="u1", store=False,
                            response_format={"type": "text"}, logit_bias={}, parallel_tool_calls=True)),
        Case("extension: not an object", 400, "omnipipe", json_body=chat(omnipipe=[1])),
        Case("extension: unknown stage", 400, "omnipipe.sampling_params.vocoder",
             json_body=per_stage("vocoder", temperature=0.5)),
        Case("extension: bad stage value", 400, "omnipipe.sampling_params.thinker.temperature",
             json_body=per_stage("thinker", temperature=-1)),
        Case("extension: unknown sampling field", 400, "omnipipe.sampling_params.talker.warmth",
             json_body=per_stage("talker", warmth=1)),
        Case("extension: thinker seed huge", 400, "omnipipe.sampling_params.thinker.seed",
             json_body=per_stage("thinker", seed=1e25)),
        Case("extension: thinker seed negative", 400, "omnipipe.sampling_params.thinker.seed",
             json_body=per_stage("thinker", seed=-5)),
        Case("extension: thinker top_k huge", 400, "omnipipe.sampling_params.thinker.top_k",
             json_body=per_stage("thinker", top_k=1e30)),
        Case("extension: thinker max_tokens huge", 400, "omnipipe.sampling_params.thinker.max_tokens",
             json_body=per_stage("thinker", max_tokens=1e25)),
        Case("extension: talker speed as a sampling field", 400, "omnipipe.sampling_params.talker.speed",
             json_body=per_stage("talker", speed="fast")),
        Case("extension: talker speed not a number", 400, "omnipipe.sampling_params.talker.extra.speed",
             json_body=talker_speed("fast")),
        Case("extension: talker speed zero", 400, "omnipipe.sampling_params.talker.extra.speed",
             json_body=talker_speed(0)),
        Case("extension: talker speed huge", 400, "omnipipe.sampling_params.talker.extra.speed",
             json_body=talker_speed(1e308)),
        Case("extension: stage knob out of range", 400, "omnipipe.sampling_params.talker.extra.speed",
             json_body=talker_speed(100)),
        Case("extension: unknown stage knob too big for the wire", 400, "omnipipe.sampling_params.thinker.extra.x",
             json_body=per_stage("thinker", extra={"x": 2**70})),
        Case("extension: knob for a stage that takes none", 400, "omnipipe.sampling_params.code2wav.extra.speed",
             json_body=per_stage("code2wav", extra={"speed": 1.0})),
        Case("extension: chunk frames zero", 400, "omnipipe.initial_codec_chunk_frames",
             json_body=chat(omnipipe={"initial_codec_chunk_frames": 0})),
        Case("extension: chunk frames huge", 400, "omnipipe.initial_codec_chunk_frames",
             json_body=chat(omnipipe={"initial_codec_chunk_frames": 1e25})),
        Case("extension: unknown key", 400, "omnipipe.turbo", json_body=chat(omnipipe={"turbo": True})),
        Case("wrong content type", 415, "content-type", content=b"hello", headers={"content-type": "text/plain"}),
        Case("form body to a json endpoint", 415, "content-type", data={"model": model}),
        Case("body over the limit", 413, None,
             json_body=chat(messages=[{"role": "user", "content": "x" * (max_body_bytes + 10)}])),
        Case("api key missing", 401, None, json_body=chat(), auth=False),
        Case("api key wrong", 401, None, json_body=chat(), headers={"Authorization": "Bearer nope"}),
        Case("unknown route", 404, None, path="/v1/completions/legacy", json_body={}),
        Case("wrong method", 405, None, method="GET", path=CHAT),
        Case("speech: input missing", 400, "input", path=SPEECH, json_body=speech(input=...)),
        Case("speech: input empty", 400, "input", path=SPEECH, json_body=speech(input="")),
        Case("speech: input too long", 400, "input", path=SPEECH, json_body=speech(input="x" * 5000)),
        Case("speech: input with a lone surrogate", 400, "input", path=SPEECH, json_body=speech(input="hi \ud83d")),
        Case("speech: input huge", 400, "input", path=SPEECH, json_body=speech(input=huge)),
        Case("speech: input wrong type", 400, "input", path=SPEECH, json_body=speech(input=["hello"])),
        Case("speech: voice unknown", 400, "voice", path=SPEECH, json_body=speech(voice="nobody")),
        Case("speech: response_format unknown", 400, "response_format", path=SPEECH,
             json_body=speech(response_format="ogg")),
        Case("speech: speed too high", 400, "speed", path=SPEECH, json_body=speech(speed=10)),
        Case("speech: speed zero", 400, "speed", path=SPEECH, json_body=speech(speed=0)),
        Case("speech: speed huge", 400, "speed", path=SPEECH, json_body=speech(speed=1e308)),
        Case("speech: speed wrong type", 400, "speed", path=SPEECH, json_body=speech(speed="fast")),
        Case("speech: stream_format unknown", 400, "stream_format", path=SPEECH,
             json_body=speech(stream_format="x")),
        Case("speech: model unknown", 404, "model", path=SPEECH, json_body=speech(model="tts-1")),
        Case("speech: body is not json", 400, None, path=SPEECH, content=b"{not json",
             headers={"content-type": "application/json"}),
        Case("transcription: json body", 415, "content-type", path=TRANSCRIBE, json_body={"model": model}),
        Case("transcription: file missing", 400, "file", path=TRANSCRIBE, data={"model": model},
             files={"other": ("a.txt", b"x", "text/plain")}),
        Case("transcription: model missing", 400, "model", path=TRANSCRIBE, files={"file": wav}),
        Case("transcription: on a pipeline without it", 404, None, path=TRANSCRIBE, data={"model": model},
             files={"file": ("a.wav", b"@@ not audio @@", "audio/wav")}),
        Case("transcription: response_format unknown", 400, "response_format", path=TRANSCRIBE,
             data={"model": model, "response_format": "xml"}, files={"file": wav}),
        Case("transcription: stream of a subtitle format", 400, "response_format", path=TRANSCRIBE,
             data={"model": model, "response_format": "srt", "stream": "true"}, files={"file": wav}),
        Case("transcription: word timestamps without verbose_json", 400, "timestamp_granularities",
             path=TRANSCRIBE, data={"model": model, "timestamp_granularities[]": "word"}, files={"file": wav}),
        Case("transcription: field not implemented", 400, "chunking_strategy", path=TRANSCRIBE,
             data={"model": model, "chunking_strategy": "auto"}, files={"file": wav}),
    ]
