"""One realtime session of ``omnipipe bench voice``: spoken questions streamed over ``WS /v1/realtime`` at real-time
pace, as a microphone would send them, and each answer timed and played on a virtual clock.

- Pace: 40 ms pcm16 chunks (24 kHz), each sent once its 40 ms have passed since the stream began, so the wall clock
  matches the audio's.
- Turns: with ``commit`` the client sends ``input_audio_buffer.commit`` + ``response.create`` right after the last
  speech chunk, then waits for the answer (push to talk: nothing more is streamed). With ``server_vad`` the client
  streams half a second of silence before the first question and then never stops: after each question it keeps
  sending silence until the answer's ``response.done``, and the server's VAD ends the turn.
- Camera (a variant's ``camera_fps``): a 640x480 JPEG frame (a gradient with noise, 25 KiB) sent as
  ``input_video_frame.append`` that often beside the audio, whenever audio is sent, captured at the session's wall
  clock.
- Latency: end of speech (the wall time the chunk holding the last speech sample was sent) -> the answer's first
  ``response.output_audio.delta``.
- Underruns: from the first audio delta on, the answer is played at real-time pace; each time the next audio comes
  more than 20 ms after what was received has played out (playback ran dry) before ``response.done`` is one.
- Cut turns: a question the server took as more than one turn (``input_audio_buffer.committed`` more than once
  while it was asked, or an answer begun before its speech ended), as a VAD does at a thinking pause. A cut turn
  fails, and so ends its session.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from omnipipe.bench.voice_questions import SpokenQuestion
from omnipipe.bench.voice_variants import COMMIT
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.realtime import ClientEvent, ServerEvent
from omnipipe.util.playback_clock import PlaybackClock

CHUNK_S = 0.04
CHUNK_BYTES = int(CHUNK_S * PCM16_RATE_HZ) * PCM16_SAMPLE_BYTES
SILENCE_CHUNK = bytes(CHUNK_BYTES)
LEAD_SILENCE_S = 0.5  # server VAD: silence before the first question


def audio_seconds(pcm16: bytes | bytearray | int) -> float:
    size = pcm16 if isinstance(pcm16, int) else len(pcm16)
    return size / PCM16_SAMPLE_BYTES / PCM16_RATE_HZ


@dataclass
class Turn:
    """One question and what came back for it (times are ``perf_counter``)."""

    question: SpokenQuestion
    speech_end: float | None = None
    first_audio: float | None = None
    done: float | None = None
    audio: bytearray = field(default_factory=bytearray)
    playback: PlaybackClock = field(default_factory=PlaybackClock)
    error: str | None = None
    heard: str | None = None  # the answer's audio, transcribed
    commits: int = 0  # input_audio_buffer.committed events while it was asked and answered
    talked_over: bool = False  # an answer cancelled because the rest of the question was heard (turn_detected)

    @property
    def early(self) -> bool:
        return self.first_audio is not None and self.speech_end is not None and self.first_audio < self.speech_end

    @property
    def cut(self) -> bool:
        """The server ended the turn before the question did (a pause taken for its end)."""
        return self.commits > 1 or self.early or self.talked_over

    @property
    def ok(self) -> bool:
        return self.error is None and None not in (self.speech_end, self.first_audio, self.done)

    @property
    def latency_s(self) -> float | None:
        """End of speech -> first answer audio, for a turn that completed."""
        if not self.ok:
            return None
        assert self.first_audio is not None and self.speech_end is not None
        return self.first_audio - self.speech_end

    def add_audio(self, now: float, data: bytes) -> None:
        self.first_audio = now if self.first_audio is None else self.first_audio
        self.audio += data
        self.playback.feed(now, audio_seconds(data))

    def check(self) -> None:
        """A turn the server cut (answered before its speech ended, or committed more than once) is an error."""
        if self.cut:
            self.error = (f"the question was cut: {self.commits} commit(s)"
                          f"{', an answer begun before the end of speech' if self.early else ''}"
                          f"{', an answer cancelled as the question went on' if self.talked_over else ''}")


@dataclass(frozen=True)
class SessionPlan:
    """What every session of one run sends: where, the ``session.update`` and how a turn ends."""

    ws_url: str
    headers: dict[str, str]
    update: dict[str, Any]
    mode: str
    turn_timeout_s: float
    camera_fps: float = 0.0


@functools.cache
def camera_frame() -> str:
    """A webcam-like frame: a 640x480 JPEG data URL (a colour gradient with noise, quality 70)."""
    import io

    import numpy as np
    from PIL import Image

    rows, cols = np.mgrid[0:480, 0:640]
    pixels = np.stack([rows * 255 // 480, cols * 255 // 640, np.full_like(rows, 120)], axis=-1)
    pixels = pixels + np.random.default_rng(0).integers(-12, 12, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=70)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


class Pacer:
    """Sends audio at real-time pace: each chunk once its audio time has passed since the stream (re)started; and
    camera frames beside it, ``camera_fps`` a second."""

    def __init__(self, ws: Any, camera_fps: float = 0.0) -> None:
        self.ws = ws
        self.camera_fps = camera_fps
        self.camera_origin = time.perf_counter()
        self.next_frame = self.camera_origin
        self.restart()

    def restart(self) -> None:
        self.origin, self.sent_s = time.perf_counter(), 0.0

    async def send(self, chunk: bytes) -> float:
        """Send ``chunk`` when its time comes; returns when it was sent."""
        self.sent_s += audio_seconds(chunk)
        delay = self.origin + self.sent_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await self.ws.send(json.dumps({"type": ClientEvent.INPUT_AUDIO_BUFFER_APPEND,
                                       "audio": base64.b64encode(chunk).decode()}))
        sent = time.perf_counter()
        if self.camera_fps and sent >= self.next_frame:
            self.next_frame = sent + 1 / self.camera_fps
            await self.ws.send(json.dumps({"type": ClientEvent.INPUT_VIDEO_FRAME_APPEND, "image": camera_frame(),
                                           "captured_at_ms": round((sent - self.camera_origin) * 1000, 1)}))
        return sent

    async def stream(self, pcm16: bytes) -> float:
        """Send ``pcm16`` in 40 ms chunks; returns when its last chunk was sent."""
        sent = time.perf_counter()
        for offset in range(0, len(pcm16), CHUNK_BYTES):
            sent = await self.send(pcm16[offset:offset + CHUNK_BYTES])
        return sent


class Listener:
    """Reads the session's events and hands the answer's audio and end to the turn being asked."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.turn: Turn | None = None
        self.answered = asyncio.Event()

    def begin(self, turn: Turn) -> None:
        self.turn = turn
        self.answered.clear()

    async def run(self) -> None:
        try:
            async for message in self.ws:
                self.on_event(json.loads(message), time.perf_counter())
        finally:
            self._fail("the connection closed")

    def _fail(self, error: str) -> None:
        turn = self.turn
        if turn is not None and turn.done is None and turn.error is None:
            turn.error = error
        self.answered.set()

    def on_event(self, event: dict[str, Any], now: float) -> None:
        turn, kind = self.turn, event.get("type")
        if turn is not None and kind == ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED:
            turn.commits += 1  # counted after the answer too: a question cut in two is committed twice
            return
        if turn is None or turn.done is not None:
            return
        if kind == ServerEvent.ERROR:
            error = event.get("error") or {}
            self._fail(f"error event ({error.get('code')}): {error.get('message')}")
        elif kind == ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA and event.get("delta"):
            turn.add_audio(now, base64.b64decode(event["delta"]))
        elif kind == ServerEvent.RESPONSE_DONE:
            response = event.get("response") or {}
            details = response.get("status_details") or {}
            turn.talked_over = response.get("status") == "cancelled" and details.get("reason") == "turn_detected"
            if response.get("status") != "completed":
                self._fail(f"response.done status {response.get('status')!r}: {response.get('status_details')}")
            turn.done = now
            self.answered.set()


async def _next_of(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        event = json.loads(await ws.recv())
        if event.get("type") == ServerEvent.ERROR:
            raise RuntimeError(f"error event: {event.get('error')}")
        if event.get("type") == kind:
            return event


async def _ask(plan: SessionPlan, pacer: Pacer, listener: Listener, turn: Turn) -> None:
    """Speak ``turn``'s question and wait for its answer (streaming silence meanwhile under server VAD)."""
    listener.begin(turn)
    if plan.mode == COMMIT:
        pacer.restart()
    turn.speech_end = await pacer.stream(turn.question.pcm16)
    deadline = time.perf_counter() + plan.turn_timeout_s
    if plan.mode == COMMIT:
        await pacer.ws.send(json.dumps({"type": ClientEvent.INPUT_AUDIO_BUFFER_COMMIT}))
        await pacer.ws.send(json.dumps({"type": ClientEvent.RESPONSE_CREATE}))
        try:
            await asyncio.wait_for(listener.answered.wait(), plan.turn_timeout_s)
        except TimeoutError:
            turn.error = f"no response.done within {plan.turn_timeout_s:g} s"
    else:
        while not listener.answered.is_set():
            if time.perf_counter() > deadline:
                turn.error = f"no response.done within {plan.turn_timeout_s:g} s"
                break
            await pacer.send(SILENCE_CHUNK)
    turn.check()


async def run_session(plan: SessionPlan, questions: list[SpokenQuestion], delay_s: float = 0.0) -> list[Turn]:
    """After ``delay_s``, one session asking ``questions`` in turn; a turn that fails ends the session (the turns
    after it fail with the same error)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    await asyncio.sleep(delay_s)
    turns = [Turn(q) for q in questions]
    listening: asyncio.Task[None] | None = None
    try:
        async with connect(plan.ws_url, additional_headers=plan.headers, max_size=None,
                           open_timeout=plan.turn_timeout_s) as ws:
            await _next_of(ws, ServerEvent.SESSION_CREATED)
            await ws.send(json.dumps(plan.update))
            await _next_of(ws, ServerEvent.SESSION_UPDATED)
            listener = Listener(ws)
            listening = asyncio.create_task(listener.run())
            pacer = Pacer(ws, plan.camera_fps)
            if plan.mode != COMMIT:
                for _ in range(round(LEAD_SILENCE_S / CHUNK_S)):
                    await pacer.send(SILENCE_CHUNK)
            for turn in turns:
                await _ask(plan, pacer, listener, turn)
                if turn.error is not None:
                    break
    except InvalidStatus as exc:
        _fail_rest(turns, f"HTTP {exc.response.status_code}: the WebSocket handshake was refused")
    except (WebSocketException, OSError, RuntimeError, json.JSONDecodeError) as exc:
        _fail_rest(turns, f"{type(exc).__name__}: {exc}")
    finally:
        if listening is not None:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
    _fail_rest(turns, next((t.error for t in turns if t.error), "not asked"))
    return turns


def _fail_rest(turns: list[Turn], error: str) -> None:
    """Every turn not answered gets ``error``."""
    for turn in turns:
        if turn.done is None and turn.error is None:
            turn.error = error
