"""One request of ``omnipipe bench serve`` per endpoint, timed from the client's side.

Every request function returns a ``RequestResult``; a request that fails (an HTTP error status, an error event, a
dropped connection, a timeout) is a result with ``ok=False`` and its error, never an exception and never dropped.

- ``/v1/chat/completions``: a streamed chat completion (text, or text + pcm16 audio); the prompt is the question's
  text, or with the spoken dataset the question's audio as an ``input_audio`` part (WAV). TTFT is the first text
  delta (content, or the audio's transcript), ITL the gaps between text deltas, TPOT the time per output token
  after the first (token count from the stream's usage), TTFP the first audio delta, RTF E2EL / seconds of audio.
- ``/v1/audio/speech``: the question's text read aloud as streamed 24 kHz pcm16; TTFP is the first audio byte, RTF
  E2EL / seconds of audio received.
- ``/v1/audio/transcriptions``: the spoken question uploaded as WAV with ``stream=true``; TTFT is the first
  ``transcript.text.delta``, E2EL the ``transcript.text.done``; the transcript's word error rate is scored against
  the question's text (``util/audio.py``).
- ``/v1/realtime``: one WebSocket session per request with one spoken turn: ``session.update`` (no server VAD: the
  client commits), the question's audio appended, then ``input_audio_buffer.commit`` + ``response.create``. The
  clock starts at the commit (the moment a speaker stops); TTFT is the first text / audio transcript delta, TTFP
  the first ``response.output_audio.delta``, E2EL ``response.done`` (status ``completed``; any other status or an
  ``error`` event fails the request).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from omnipipe.bench.serve_datasets import BenchPrompt
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.realtime import ClientEvent, ServerEvent
from omnipipe.protocol.worker import CHAT_PATH, REALTIME_PATH, SPEECH_PATH, TRANSCRIPTION_PATH
from omnipipe.util.audio import word_error_rate

REALTIME_APPEND_S = 0.5
"""Seconds of audio per ``input_audio_buffer.append``."""


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None
    start_s: float = 0.0  # perf_counter when the request was sent (the realtime commit)
    queue_s: float = 0.0  # from its arrival to its send (waiting for a free concurrency slot)
    e2el_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    ttfp_s: float | None = None
    audio_s: float = 0.0  # seconds of audio received
    rtf: float | None = None
    input_tokens: int = 0  # as the server's usage reports them (0 where it reports none)
    output_tokens: int = 0
    text: str = ""  # the words received
    wer: float | None = None
    input_audio_s: float = 0.0  # seconds of audio sent


@dataclass(frozen=True)
class RequestOptions:
    model: str
    max_tokens: int
    audio: bool  # ask for spoken answers (chat, realtime)
    headers: dict[str, str]
    base_url: str
    timeout_s: float | None  # per request; None: no limit


def _failed(start: float, error: str) -> RequestResult:
    return RequestResult(False, error=error, start_s=start)


def _finish(result: RequestResult, start: float, end: float, text_times: list[float], first_audio: float | None,
            audio_bytes: int) -> RequestResult:
    """Fill in the times from the moments the text deltas and the first audio arrived."""
    result.start_s, result.e2el_s = start, end - start
    if text_times:
        result.ttft_s = text_times[0] - start
        result.itl_s = [b - a for a, b in itertools.pairwise(text_times)]
        result.output_tokens = result.output_tokens or len(text_times)
        if result.output_tokens > 1:
            result.tpot_s = (text_times[-1] - text_times[0]) / (result.output_tokens - 1)
    if first_audio is not None:
        result.ttfp_s = first_audio - start
    result.audio_s = audio_bytes / PCM16_SAMPLE_BYTES / PCM16_RATE_HZ
    if result.audio_s > 0:
        result.rtf = result.e2el_s / result.audio_s
    return result


async def _http_error(response: httpx.Response) -> str:
    detail = (await response.aread()).decode(errors="replace")[:300]
    return f"HTTP {response.status_code}: {detail}"


class StreamEventError(Exception):
    """An error the server reported inside a stream (an SSE ``error`` or a realtime ``error`` event)."""


class EndOfStream(Exception):
    """An SSE body's ``data: [DONE]``."""


def sse_event(line: str) -> dict[str, Any] | None:
    """One line of an SSE body: the JSON event it carries, or None (a blank line, a comment, another field).
    Raises ``EndOfStream`` at ``[DONE]`` and ``StreamEventError`` for an event carrying an ``error``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        raise EndOfStream
    event = json.loads(data)
    if "error" in event:
        raise StreamEventError(f"stream error: {event['error'].get('message')}")
    return event


async def _sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an SSE body until ``[DONE]`` (``sse_event``)."""
    try:
        async for line in response.aiter_lines():
            if (event := sse_event(line)) is not None:
                yield event
    except EndOfStream:
        return


async def send_chat(client: httpx.AsyncClient, prompt: BenchPrompt, options: RequestOptions) -> RequestResult:
    content: Any = prompt.text
    if prompt.pcm16 is not None:
        content = [{"type": "input_audio",
                    "input_audio": {"data": base64.b64encode(prompt.wav()).decode(), "format": "wav"}}]
    body: dict[str, Any] = {"model": options.model, "messages": [{"role": "user", "content": content}],
                            "stream": True, "max_tokens": options.max_tokens,
                            "stream_options": {"include_usage": True}}
    if options.audio:
        body["modalities"] = ["text", "audio"]
        body["audio"] = {"voice": "default", "format": "pcm16"}
    text_times: list[float] = []
    words: list[str] = []
    first_audio: float | None = None
    audio_bytes = 0
    result = RequestResult(True, input_audio_s=prompt.audio_s)
    start = time.perf_counter()
    async with client.stream("POST", CHAT_PATH, json=body) as response:
        if response.status_code != 200:
            return _failed(start, await _http_error(response))
        try:
            async for event in _sse_events(response):
                if event.get("usage"):
                    result.input_tokens = int(event["usage"].get("prompt_tokens") or 0)
                    result.output_tokens = int(event["usage"].get("completion_tokens") or 0)
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    now = time.perf_counter()
                    # the words: content, or (with audio, as OpenAI sends them) the audio's transcript
                    piece = delta.get("content") or (delta.get("audio") or {}).get("transcript")
                    if piece:
                        text_times.append(now)
                        words.append(piece)
                    chunk = (delta.get("audio") or {}).get("data")
                    if chunk:
                        first_audio = now if first_audio is None else first_audio
                        audio_bytes += len(base64.b64decode(chunk))
        except StreamEventError as exc:
            return _failed(start, str(exc))
    result.text = "".join(words)
    return _finish(result, start, time.perf_counter(), text_times, first_audio, audio_bytes)


async def send_speech(client: httpx.AsyncClient, prompt: BenchPrompt, options: RequestOptions) -> RequestResult:
    body = {"model": options.model, "input": prompt.text, "voice": "default", "response_format": "pcm"}
    first_audio: float | None = None
    audio_bytes = 0
    start = time.perf_counter()
    async with client.stream("POST", SPEECH_PATH, json=body) as response:
        if response.status_code != 200:
            return _failed(start, await _http_error(response))
        async for piece in response.aiter_bytes():
            if piece:
                first_audio = time.perf_counter() if first_audio is None else first_audio
                audio_bytes += len(piece)
    if not audio_bytes:
        return _failed(start, "the response held no audio")
    return _finish(RequestResult(True), start, time.perf_counter(), [], first_audio, audio_bytes)


async def send_transcription(client: httpx.AsyncClient, prompt: BenchPrompt,
                             options: RequestOptions) -> RequestResult:
    files = {"file": ("question.wav", prompt.wav(), "audio/wav")}
    form = {"model": options.model, "stream": "true", "response_format": "json"}
    text_times: list[float] = []
    text: str | None = None
    result = RequestResult(True, input_audio_s=prompt.audio_s)
    start = time.perf_counter()
    async with client.stream("POST", TRANSCRIPTION_PATH, files=files, data=form) as response:
        if response.status_code != 200:
            return _failed(start, await _http_error(response))
        try:
            async for event in _sse_events(response):
                if event.get("type") == "transcript.text.delta":
                    text_times.append(time.perf_counter())
                elif event.get("type") == "transcript.text.done":
                    text = str(event.get("text") or "")
                    usage = event.get("usage") or {}
                    result.input_tokens = int(usage.get("input_tokens") or 0)
                    result.output_tokens = int(usage.get("output_tokens") or 0)
        except StreamEventError as exc:
            return _failed(start, str(exc))
    end = time.perf_counter()
    if text is None:
        return _failed(start, "the stream ended without transcript.text.done")
    result.text = text
    result.wer = word_error_rate(prompt.text, text)
    _finish(result, start, end, text_times, None, 0)
    result.tpot_s = None  # segments, not tokens: no time per output token
    return result


def _ws_url(base_url: str) -> str:
    if base_url.startswith("https://"):
        return "wss://" + base_url.removeprefix("https://") + REALTIME_PATH
    return "ws://" + base_url.removeprefix("http://") + REALTIME_PATH




async def _next_event(ws: Any) -> dict[str, Any]:
    event = json.loads(await ws.recv())
    if event.get("type") == ServerEvent.ERROR:
        error = event.get("error") or {}
        raise StreamEventError(f"error event ({error.get('code')}): {error.get('message')}")
    return event


async def _wait_for(ws: Any, event_type: str) -> dict[str, Any]:
    while True:
        event = await _next_event(ws)
        if event.get("type") == event_type:
            return event


async def send_realtime(client: httpx.AsyncClient, prompt: BenchPrompt, options: RequestOptions) -> RequestResult:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    if prompt.pcm16 is None:
        raise ValueError("the realtime endpoint takes spoken questions")
    step = int(REALTIME_APPEND_S * PCM16_RATE_HZ) * PCM16_SAMPLE_BYTES
    modalities = ["text", "audio"] if options.audio else ["text"]
    start = time.perf_counter()
    result = RequestResult(True, input_audio_s=prompt.audio_s)
    text_times: list[float] = []
    words: list[str] = []
    first_audio: float | None = None
    audio_bytes = 0
    try:
        async with connect(_ws_url(options.base_url), additional_headers=options.headers, max_size=None,
                           open_timeout=options.timeout_s) as ws:
            await _wait_for(ws, ServerEvent.SESSION_CREATED)
            await ws.send(json.dumps({"type": ClientEvent.SESSION_UPDATE, "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": None}},
                "output_modalities": ["audio"] if "audio" in modalities else ["text"],
                "max_output_tokens": options.max_tokens}}))
            await _wait_for(ws, ServerEvent.SESSION_UPDATED)
            for offset in range(0, len(prompt.pcm16), step):
                chunk = base64.b64encode(prompt.pcm16[offset:offset + step]).decode()
                await ws.send(json.dumps({"type": ClientEvent.INPUT_AUDIO_BUFFER_APPEND, "audio": chunk}))
            start = time.perf_counter()
            await ws.send(json.dumps({"type": ClientEvent.INPUT_AUDIO_BUFFER_COMMIT}))
            await ws.send(json.dumps({"type": ClientEvent.RESPONSE_CREATE}))
            while True:
                event = await _next_event(ws)
                kind = event.get("type")
                if kind in (ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA, ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA):
                    if event.get("delta"):
                        text_times.append(time.perf_counter())
                        words.append(str(event["delta"]))
                elif kind == ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA and event.get("delta"):
                    first_audio = time.perf_counter() if first_audio is None else first_audio
                    audio_bytes += len(base64.b64decode(event["delta"]))
                elif kind == ServerEvent.RESPONSE_DONE:
                    response = event.get("response") or {}
                    if response.get("status") != "completed":
                        return _failed(start, f"response.done status {response.get('status')!r}: "
                                              f"{response.get('status_details')}")
                    usage = response.get("usage") or {}
                    result.input_tokens = int(usage.get("input_tokens") or 0)
                    result.output_tokens = int(usage.get("output_tokens") or 0)
                    break
    except InvalidStatus as exc:
        return _failed(start, f"HTTP {exc.response.status_code}: the WebSocket handshake was refused")
    except (StreamEventError, WebSocketException, OSError, json.JSONDecodeError) as exc:
        return _failed(start, f"{type(exc).__name__}: {exc}" if not isinstance(exc, StreamEventError) else str(exc))
    result.text = "".join(words)
    return _finish(result, start, time.perf_counter(), text_times, first_audio, audio_bytes)


Sender = Callable[[httpx.AsyncClient, BenchPrompt, RequestOptions], Awaitable[RequestResult]]


@dataclass(frozen=True)
class Endpoint:
    path: str
    backend: str  # the name ``vllm bench serve --backend`` gives such an endpoint (omnipipe-... where it has none)
    send: Sender
    measures: tuple[str, ...]  # percentile metrics it measures (with audio answers, where it speaks)
    default_metrics: tuple[str, ...]
    spoken: bool  # sends spoken questions
    audio_metrics: tuple[str, ...] = ()  # what it measures only when the answers are spoken


ENDPOINTS = {e.path: e for e in (
    Endpoint(CHAT_PATH, "openai-chat", send_chat, ("ttft", "tpot", "itl", "e2el"), ("ttft", "tpot", "itl"),
             spoken=False, audio_metrics=("ttfp", "rtf")),
    Endpoint(SPEECH_PATH, "omnipipe-speech", send_speech, ("ttfp", "rtf", "e2el"), ("ttfp", "rtf", "e2el"),
             spoken=False),
    Endpoint(TRANSCRIPTION_PATH, "openai-audio", send_transcription, ("ttft", "itl", "e2el"),
             ("ttft", "itl", "e2el"), spoken=True),
    Endpoint(REALTIME_PATH, "omnipipe-realtime", send_realtime, ("ttft", "tpot", "itl", "e2el"),
             ("ttft", "tpot", "itl"), spoken=True, audio_metrics=("ttfp", "rtf")),
)}


def measured(endpoint: Endpoint, audio: bool) -> tuple[str, ...]:
    return endpoint.measures + (endpoint.audio_metrics if audio else ())


def default_metrics(endpoint: Endpoint, audio: bool) -> tuple[str, ...]:
    """As ``vllm bench serve`` (``ttft,tpot,itl``) plus ``ttfp`` when the answers are spoken."""
    return endpoint.default_metrics + (("ttfp",) if audio and endpoint.audio_metrics else ())


async def send(endpoint: Endpoint, client: httpx.AsyncClient, prompt: BenchPrompt,
               options: RequestOptions) -> RequestResult:
    """One request; whatever goes wrong is the failed result's error."""
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(endpoint.send(client, prompt, options), options.timeout_s)
    except TimeoutError:
        return _failed(start, f"timed out after {options.timeout_s:g} s")
    except (httpx.HTTPError, json.JSONDecodeError, ValueError, OSError) as exc:
        return _failed(start, f"{type(exc).__name__}: {exc}")
