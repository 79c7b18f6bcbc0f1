"""A realtime session's input audio buffer: ``input_audio_buffer.append`` (pcm16 at 24 kHz; dropped unread while
the session is paused), ``.commit`` (the buffer becomes a spoken user item) and ``.clear``, and the server VAD that
hears the appended audio: speech that starts cancels a running response (barge-in), speech that stops commits the
buffer and starts a response (each as the session's turn detection says). A commit notes when the user's speech
ended (the commit itself, or the arrival of the audio where the VAD heard it stop), for the turn's latency metric.

Where the pipeline can, the speech is transcribed while it arrives (``live_transcript.py``) and a commit gives the
item its words; under server VAD a pause in the speech starts the answer tentatively (``speculative_start.py``),
which the turn adopts when the VAD ends it, or which is dropped when the user goes on.

Server VAD's ``idle_timeout_ms``: counted in the appended audio from where the last answer's audio will have
played out (``answer_played``); when that much audio has come with no speech heard and no answer running, the
buffer sends ``input_audio_buffer.timeout_triggered``, commits the silence as the user's turn and answers it, so
the model may prompt a user who went quiet. Speech restarts nothing until the next answer ends."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.realtime import COMMIT_EMPTY, SEMANTIC_TURN_END_MS, InputAudioBufferAppend, ServerEvent
from omnipipe.server.end_of_turn import EndOfTurnModel
from omnipipe.server.errors import APIError
from omnipipe.server.routes.realtime.checks import check_takes_audio, decode_pcm16
from omnipipe.server.routes.realtime.conversation import ConversationItem
from omnipipe.server.routes.realtime.core import SessionCore
from omnipipe.server.routes.realtime.events import EventError, new_item_id
from omnipipe.server.routes.realtime.live_transcript import LiveTranscript
from omnipipe.server.routes.realtime.speculative_start import PAUSE_MS, SpeculativeStart, TentativeAnswer
from omnipipe.server.vad import SileroVAD, TurnEnd

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.conversation import Conversation
    from omnipipe.server.routes.realtime.frames import CameraFrames
    from omnipipe.server.routes.realtime.idle import IdleWatch
    from omnipipe.server.routes.realtime.pause import SessionPause
    from omnipipe.server.routes.realtime.response import Responses

logger = logging.getLogger(__name__)


def vad_for(turn_detection: dict[str, Any] | None) -> SileroVAD | None:
    """The server VAD a session's ``turn_detection`` asks for (``None``: the client commits; ``semantic_vad``: with
    the end-of-turn model, its windows by ``eagerness``)."""
    if turn_detection is None:
        return None
    turn_end = None
    if turn_detection.get("type") == "semantic_vad":
        complete_ms, unfinished_ms = SEMANTIC_TURN_END_MS[turn_detection.get("eagerness", "auto")]
        turn_end = TurnEnd(EndOfTurnModel(), complete_ms, unfinished_ms)
    return SileroVAD(turn_detection["threshold"], turn_detection["silence_duration_ms"],
                     turn_detection["prefix_padding_ms"], PCM16_RATE_HZ,
                     pause_ms=PAUSE_MS if turn_detection.get("speculative_start", True) else None, turn_end=turn_end)


class AudioSession(SessionCore, Protocol):
    """What the input audio buffer uses of its session: the pause (appended audio is dropped), the idle watch
    (speech is activity), the camera frames and the conversation (a commit makes a user item), the responses
    (barge-in, respond), and all a tentative answer uses."""

    pause: SessionPause
    idle: IdleWatch
    frames: CameraFrames
    conversation: Conversation
    responses: Responses


class InputAudioBuffer:
    """The audio appended since the last commit or clear (at most the server's body size), and its VAD."""

    def __init__(self, session: AudioSession) -> None:
        self.session = session
        self.chunks: list[np.ndarray] = []
        self.size_bytes = 0
        self.max_bytes = session.pool.config.max_body_bytes
        self.vad = vad_for(session.settings.turn_detection)
        self._pending_item_id: str | None = None  # the item the audio being appended will become
        self._arrivals: list[tuple[int, float]] = []  # (samples in the buffer after a chunk, when it arrived)
        self.speech_end: tuple[float, str] | None = None  # the last commit's end of speech (perf_counter) and cause
        self.live = LiveTranscript(session)
        self.speculation = SpeculativeStart(session, self.live)
        self._speech_from: int | None = None  # the sample where the VAD heard the buffer's speech start
        self._idle_from_ms: float | None = None  # idle_timeout_ms counts from here (buffer ms; None: not counting)

    async def append(self, event: InputAudioBufferAppend) -> None:
        arrived = time.perf_counter()
        if self.session.pause.paused:
            return  # dropped unread
        samples = decode_pcm16(event.audio, "audio")
        if self.size_bytes + samples.size * 2 > self.max_bytes:
            raise EventError(f"audio: the input audio buffer would exceed {self.max_bytes} bytes; commit or "
                             "clear it", "audio", code="buffer_too_large")
        if samples.size == 0:
            return
        self.chunks.append(samples)
        self.size_bytes += samples.size * 2
        self._arrivals.append((self.size_bytes // 2, arrived))
        if self.vad is not None:
            await self._detect_turns(samples)
            await self._check_idle()
        if self.chunks and (self.vad is None or self.vad.speaking) and self.live.enabled():
            self.live.heard(self.size_bytes // 2 - (self._speech_from or 0), self.speech)

    def audio(self) -> np.ndarray:
        """The buffer's audio (24 kHz float32)."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    def speech(self, audio: np.ndarray | None = None) -> np.ndarray:
        """The buffer's audio (``audio``, when already joined) from where the VAD heard speech start (all of it
        without a VAD)."""
        return (self.audio() if audio is None else audio)[self._speech_from or 0:]

    async def _detect_turns(self, samples: np.ndarray) -> None:
        """Feed the VAD; act on the speech it hears start (barge-in), pause (a tentative answer), go on (the
        tentative answer dropped) and stop (commit, respond)."""
        assert self.vad is not None
        session = self.session
        for vad_event in await asyncio.to_thread(self.vad.feed, samples):
            detection = session.settings.turn_detection or {}
            if vad_event.kind == "pause_started":
                self.speculation.begin(self.speech())
            elif vad_event.kind == "pause_ended":
                await self.speculation.drop()
            elif vad_event.kind == "speech_started":
                session.idle.touch()
                self._idle_from_ms = None
                if self._speech_from is None:
                    self._speech_from = vad_event.audio_ms * PCM16_RATE_HZ // 1000
                await self.speculation.drop()
                await session.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED, audio_start_ms=vad_event.audio_ms,
                                   item_id=self._next_item_id())
                if detection.get("interrupt_response", True):
                    await session.responses.cancel("turn_detected")  # barge-in
            else:
                await session.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED, audio_end_ms=vad_event.audio_ms,
                                   item_id=self._next_item_id())
                await self._end_turn(vad_event.audio_ms, detection)

    async def _end_turn(self, audio_end_ms: int, detection: dict[str, Any]) -> None:
        """The VAD heard the speech stop: commit, and respond (adopting the tentative answer, if any)."""
        session = self.session
        tentative = self.speculation.take()
        try:
            await self.commit(speech_end=(self._arrival_of(audio_end_ms), "server_vad"), tentative=tentative)
            if detection.get("create_response", True) and not session.responses.running:
                await session.responses.start(None, tentative)
                tentative = None
        except (EventError, APIError) as exc:
            await session.send_error(exc.message, param=exc.param, code=exc.code)
        finally:
            if tentative is not None:
                await tentative.drop()

    def buffered_ms(self) -> float:
        return self.size_bytes / 2 * 1000 / PCM16_RATE_HZ

    def answer_played(self, ends_at: float | None) -> None:
        """An answer ended; its audio plays out at ``ends_at`` (perf_counter; None: it had none): the idle timeout
        counts the audio appended from then on (the microphone streams at real-time pace)."""
        ahead_s = 0.0 if ends_at is None else max(0.0, ends_at - time.perf_counter())
        self._idle_from_ms = self.buffered_ms() + ahead_s * 1000

    async def _check_idle(self) -> None:
        """``idle_timeout_ms`` of silence after the last answer played: commit the silence and answer it."""
        session = self.session
        timeout = (session.settings.turn_detection or {}).get("idle_timeout_ms")
        if timeout is None or self._idle_from_ms is None or (self.vad is not None and self.vad.speaking) \
                or session.responses.running or session.pause.paused:
            return
        now_ms = self.buffered_ms()
        if now_ms - self._idle_from_ms < timeout:
            return
        started_ms, self._idle_from_ms = max(0.0, self._idle_from_ms), None
        await session.send(ServerEvent.INPUT_AUDIO_BUFFER_TIMEOUT_TRIGGERED, audio_start_ms=int(started_ms),
                           audio_end_ms=int(now_ms), item_id=self._next_item_id())
        try:
            await self.commit(idle=True)
            await session.responses.start(None, None)
        except (EventError, APIError) as exc:
            await session.send_error(exc.message, param=exc.param, code=exc.code)

    def _next_item_id(self) -> str:
        if self._pending_item_id is None:
            self._pending_item_id = new_item_id()
        return self._pending_item_id

    def _arrival_of(self, audio_ms: int) -> float:
        """When the chunk holding the buffer's audio at ``audio_ms`` arrived (now, past the buffer's end)."""
        sample = audio_ms * PCM16_RATE_HZ // 1000
        return next((at for end, at in self._arrivals if end >= sample), time.perf_counter())

    async def commit(self, _: Any = None, speech_end: tuple[float, str] | None = None,
                     tentative: TentativeAnswer | None = None, idle: bool = False) -> None:
        """The buffer becomes a spoken user item at the end of the conversation; ``speech_end``: when the speech
        ended and what ended the turn (default: now, by the client's commit); ``tentative``: an answer started at
        the pause before, whose transcript the item takes; ``idle``: silence the idle timeout commits (nothing is
        transcribed: the item's words stay empty, and the thinker is told the user said nothing)."""
        session = self.session
        if not self.chunks:
            raise EventError("the input audio buffer is empty", None, code=COMMIT_EMPTY)
        check_takes_audio(session.pipeline, None)
        self.speech_end = None if idle else speech_end or (time.perf_counter(), "commit")
        audio = self.audio()
        words: str | None = ""
        if not idle:
            words = await self._transcript(self.speech(audio), tentative) if self.live.enabled() else None
        await self.reset()
        item_id = self._next_item_id()
        self._pending_item_id = None
        await session.send(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED,
                           previous_item_id=session.conversation.last_item_id(), item_id=item_id)
        item = ConversationItem(item_id, "user", audio=audio, spoken=True, pending=True, words=words or "",
                                transcribed=words is not None, idle=idle)
        item.take_frames(session.frames.take(until_ms=None if tentative is None else tentative.frames_until_ms))
        await session.conversation.add(item)

    async def _transcript(self, speech: np.ndarray, tentative: TentativeAnswer | None) -> str | None:
        """The turn's words, heard live (the tentative answer's, when it has them); None when live transcription
        failed (the pipeline then hears the audio itself)."""
        words = None
        if tentative is not None:
            try:
                words = await asyncio.shield(tentative.transcript)
            except asyncio.CancelledError:
                if not tentative.transcript.cancelled():
                    raise  # this task was cancelled, not the tentative transcription
            except Exception:  # noqa: BLE001 - transcribed again below
                words = None
        if words is None:
            try:
                words = await self.live.final(speech)
            except Exception:  # noqa: BLE001 - the audio goes to the pipeline instead
                logger.warning("live transcription failed; the turn's audio goes to the pipeline", exc_info=True)
                return None
        self.session.metrics.count_turn_transcription()
        return words

    async def reset(self) -> None:
        """Empty the buffer (its audio is dropped), restart the VAD, forget the live transcript and drop a
        tentative answer."""
        if self._idle_from_ms is not None:  # the idle count goes on across the reset, in the new buffer's time
            self._idle_from_ms -= self.buffered_ms()
        self.chunks, self.size_bytes, self._arrivals, self._speech_from = [], 0, [], None
        if self.vad is not None:
            self.vad.reset()
        await self.speculation.drop()
        await self.live.reset()

    async def clear(self, _: Any) -> None:
        await self.reset()
        self.session.frames.clear()
        await self.session.send(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)
