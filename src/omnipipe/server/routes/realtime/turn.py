"""A realtime session's turn, one state machine: the user listened to, speaking, pausing, a tentative answer
started at the pause, the turn committed, answered, an answer interrupted, the session done.

``transition`` is the whole decision, a pure function: the state, an event and what holds now (``Now``: whether an
answer runs, what the session's turn detection asks) -> the next state and the actions to take, in order. The
``TurnController`` feeds it the events and performs the actions on parts that decide nothing of the turn: the
input audio buffer (``audio_buffer.py``), the speech VAD and the end-of-turn model behind it (``server/vad.py``),
a tentative answer (``speculative_start.py``), the live transcript (``live_transcript.py``), the audio streamed
into the pipeline (``AudioStream``), and the session's camera frames, conversation and response, which it is given.
None of them, and not the controller either, holds the session: each is given the values and the parts it uses.

Where the turn ends, the event carries when the user's speech ended (``SpeechStopped.ended_at``: the arrival of
the audio where the VAD heard it stop; ``CommitAsked.ended_at``: the client's commit): the committed item keeps it
and its response times its first audio from it. A tentative answer is held only in ``TENTATIVE``: every event that
changes what it was planned from leaves that state and drops it, so the response of the turn takes it as planned.

Server VAD's ``idle_timeout_ms``: counted in the appended audio from where the last answer's audio will have
played out; when that much audio has come with no speech heard and no answer running, the session is sent
``input_audio_buffer.timeout_triggered`` and the silence is committed and answered (``IdleTimedOut``), so the model
may prompt a user who went quiet. Speech restarts nothing until the next answer ends."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.engine.async_omni_engine import AudioStreamsNotTakenError
from omnipipe.protocol.realtime import COMMIT_EMPTY, SEMANTIC_TURN_END_MS, InputAudioBufferAppend, ServerEvent
from omnipipe.server.end_of_turn import EndOfTurnModel
from omnipipe.server.errors import APIError
from omnipipe.server.routes.realtime.audio_buffer import InputAudioBuffer
from omnipipe.server.routes.realtime.checks import check_takes_audio, decode_pcm16
from omnipipe.server.routes.realtime.conversation import ConversationItem
from omnipipe.server.routes.realtime.events import EventError, Send, SendError, new_item_id
from omnipipe.server.routes.realtime.live_transcript import LiveTranscript
from omnipipe.server.routes.realtime.speculative_start import PAUSE_MS, TentativeAnswer
from omnipipe.server.vad import SileroVAD, TurnEnd, VadEvent

if TYPE_CHECKING:
    from omnipipe.api.async_omni import AsyncOmni
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.engines import EnginePool
    from omnipipe.server.prometheus import ServerMetrics
    from omnipipe.server.realtime_settings import Settings
    from omnipipe.server.routes.realtime.conversation import Conversation
    from omnipipe.server.routes.realtime.frames import CameraFrames
    from omnipipe.server.routes.realtime.idle import IdleWatch
    from omnipipe.server.routes.realtime.pause import SessionPause
    from omnipipe.server.routes.realtime.response import AnswerPlan, Responses

logger = logging.getLogger(__name__)


class TurnState(enum.Enum):
    LISTENING = "listening"  # no speech heard since the last commit or clear
    SPEAKING = "speaking"  # the VAD hears the user speak
    PAUSED = "paused"  # the speech paused (no tentative answer: none wanted, or one dropped)
    TENTATIVE = "tentative"  # the speech paused and an answer started tentatively
    COMMITTED = "committed"  # a turn committed; its answer not started (the client's to ask, or one still runs)
    ANSWERING = "answering"  # an answer runs and the user is quiet
    INTERRUPTED = "interrupted"  # the user spoke over an answer and it was cancelled (barge-in); they speak on
    DONE = "done"  # the session closed


class Action(enum.Enum):
    BARGE_IN = "barge_in"  # cancel the running answer (reason ``turn_detected``)
    CANCEL = "cancel"  # cancel the running answer (reason ``client_cancelled``: a pause, a close)
    START_TENTATIVE = "start_tentative"  # start an answer from the speech so far
    DROP_TENTATIVE = "drop_tentative"  # abort the tentative answer and forget it
    COMMIT = "commit"  # the buffer becomes a spoken user item (its end of speech from the event)
    RESPOND = "respond"  # answer the pending items (taking the tentative answer, if one is held)
    RESET = "reset"  # empty the buffer, restart the VAD and the live transcript, drop a tentative answer


# ---------------------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class SpeechStarted:
    audio_ms: int  # where in the buffer (prefix padding included)


@dataclass(frozen=True)
class SpeechPaused:
    audio_ms: int  # where the quiet began


@dataclass(frozen=True)
class SpeechResumed:
    audio_ms: int  # where the speech came back


@dataclass(frozen=True)
class SpeechStopped:
    """The VAD ends the turn."""

    audio_ms: int  # where the quiet began
    ended_at: float  # when the audio at ``audio_ms`` arrived (perf_counter): the end of the user's speech


@dataclass(frozen=True)
class CommitAsked:
    """``input_audio_buffer.commit``."""

    ended_at: float  # when it came (perf_counter): the end of the user's speech


@dataclass(frozen=True)
class IdleTimedOut:
    """``idle_timeout_ms`` of audio without speech after the last answer played."""


@dataclass(frozen=True)
class Cleared:
    """``input_audio_buffer.clear``."""


@dataclass(frozen=True)
class InputsChanged:
    """The session or the conversation changed (``session.update``, ``conversation.item.create`` / ``.delete`` /
    ``.truncate``): a tentative answer's plan no longer holds."""


@dataclass(frozen=True)
class DetectionChanged:
    """``session.update`` changed the turn detection: a new VAD, which has heard no speech yet."""


@dataclass(frozen=True)
class ResponseStarted:
    """The client started a response (``response.create``)."""


@dataclass(frozen=True)
class ResponseEnded:
    """A response sent its ``response.done``."""


@dataclass(frozen=True)
class SessionPaused:
    """``session.pause``."""


@dataclass(frozen=True)
class Closed:
    """The connection ended."""


TurnEvent = (SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped | CommitAsked | IdleTimedOut | Cleared
             | InputsChanged | DetectionChanged | ResponseStarted | ResponseEnded | SessionPaused | Closed)


@dataclass(frozen=True)
class Now:
    """What holds when an event comes, beside the state."""

    answering: bool = False  # a response runs
    speculate: bool = False  # a pause may start an answer (turn detection answers by itself, speculative_start on,
    # the speech transcribed live, the session not paused)
    respond: bool = True  # turn detection starts a response when it ends a turn (``create_response``)
    interrupt: bool = True  # speech cancels a running response (``interrupt_response``)


@dataclass(frozen=True)
class Step:
    state: TurnState
    actions: tuple[Action, ...] = ()


_HEARING = (TurnState.SPEAKING, TurnState.PAUSED, TurnState.TENTATIVE, TurnState.INTERRUPTED)


def transition(state: TurnState, event: TurnEvent, now: Now) -> Step:
    """The next state and the actions that take the turn there."""
    if state is TurnState.DONE:
        return Step(state)
    drop = (Action.DROP_TENTATIVE,) if state is TurnState.TENTATIVE else ()
    if isinstance(event, SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped):
        return _heard(event, drop, now)
    if isinstance(event, Closed | SessionPaused | Cleared):
        return _emptied(state, event, now)
    if isinstance(event, CommitAsked):
        return Step(TurnState.COMMITTED, (*drop, Action.COMMIT))
    if isinstance(event, IdleTimedOut):
        if state in _HEARING or now.answering:
            return Step(state)
        return Step(TurnState.ANSWERING, (Action.COMMIT, Action.RESPOND))
    if isinstance(event, ResponseStarted) and state in (TurnState.LISTENING, TurnState.COMMITTED):
        return Step(TurnState.ANSWERING)
    if isinstance(event, ResponseEnded):
        return Step(TurnState.LISTENING if state is TurnState.ANSWERING else state)
    if isinstance(event, DetectionChanged) and state in _HEARING:
        return Step(TurnState.LISTENING, drop)
    # InputsChanged, ResponseStarted while the user speaks, DetectionChanged otherwise: a tentative answer's plan is
    # gone
    return Step(TurnState.PAUSED if drop else state, drop)


def _heard(event: SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped, drop: tuple[Action, ...],
           now: Now) -> Step:
    """What the VAD heard moves the turn."""
    if isinstance(event, SpeechStarted):
        if now.answering and now.interrupt:
            return Step(TurnState.INTERRUPTED, (*drop, Action.BARGE_IN))
        return Step(TurnState.SPEAKING, drop)
    if isinstance(event, SpeechPaused):
        if now.speculate and not now.answering:
            return Step(TurnState.TENTATIVE, (*drop, Action.START_TENTATIVE))
        return Step(TurnState.PAUSED, drop)
    if isinstance(event, SpeechResumed):
        return Step(TurnState.SPEAKING, drop)
    if now.respond and not now.answering:
        return Step(TurnState.ANSWERING, (Action.COMMIT, Action.RESPOND))  # the tentative answer taken
    return Step(TurnState.COMMITTED, (*drop, Action.COMMIT))


def _emptied(state: TurnState, event: Closed | SessionPaused | Cleared, now: Now) -> Step:
    """The buffer emptied: by a clear (a committed turn and its answer stand), a pause or the end (the answer
    cancelled)."""
    if isinstance(event, Cleared):
        kept = state in (TurnState.COMMITTED, TurnState.ANSWERING)
        return Step(state if kept else TurnState.LISTENING, (Action.RESET,))
    cancel = (Action.CANCEL,) if now.answering else ()
    return Step(TurnState.DONE if isinstance(event, Closed) else TurnState.LISTENING, (*cancel, Action.RESET))


# ---------------------------------------------------------------------------------------------- the controller
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
                     turn_detection["prefix_padding_ms"],
                     pause_ms=PAUSE_MS if turn_detection.get("speculative_start", True) else None, turn_end=turn_end)


class AudioStream:
    """The input audio streamed into the pipeline while the user speaks, where the pipeline hears audio itself and
    its audio stage takes streams (the Qwen-Omni thinkers: ``AsyncOmni.append_audio``): the 16 kHz stream the
    buffer resamples to, from the buffer's first sample, under one id a buffer. At the commit the turn's item takes
    it (``take``), and the prompt names it instead of the clip, so the thinker has its features and audio encoder
    output made already; a cleared buffer's stream is dropped. A pipeline that takes no streams, or an append the
    engine refuses (its limits), leaves the turn to send its clip whole, as before."""

    def __init__(self, pipeline: PipelineSpec, settings: Settings, engine: AsyncOmni, session_id: str) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.engine = engine
        self.session_id = session_id
        self.id: str | None = None  # this buffer's stream
        self.broken = False  # an append failed: this buffer's clip goes whole
        self.taken = "audio" in pipeline.input_modalities  # until the engine says its stage takes none
        self._count = 0

    def wanted(self) -> bool:
        """Whether this session streams: its pipeline hears the audio (no session-made transcript) and takes
        streams."""
        transcribed = self.settings.live_transcription and self.pipeline.serving.live_transcription
        return self.taken and not transcribed

    async def feed(self, heard: np.ndarray, first: bool) -> None:
        """The next of the buffer's audio at 16 kHz (``first``: the buffer's first chunk)."""
        if heard.size == 0 or self.broken or not (first or self.id is not None) or not self.wanted():
            return
        if self.id is None:
            self._count += 1
            self.id = f"{self.session_id}-audio-{self._count}"
        try:
            await self.engine.append_audio(self.id, heard, session_id=self.session_id)
        except AudioStreamsNotTakenError:
            self.taken = False  # for the rest of the session
            self.id = None
        except Exception:  # noqa: BLE001 - the clip goes whole instead
            logger.debug("an audio append failed; the turn's clip goes whole", exc_info=True)
            await self.drop()
            self.broken = True

    async def take(self, buffer: InputAudioBuffer) -> str | None:
        """The stream, with the buffer's last samples (the resampler's tail), for the item the buffer becomes;
        None when the clip goes whole."""
        stream = self.id
        tail = buffer.flush() if stream is not None else np.zeros(0, np.float32)
        if stream is not None and tail.size:
            try:
                await self.engine.append_audio(stream, tail, session_id=self.session_id)
            except Exception:  # noqa: BLE001 - the clip goes whole instead
                logger.debug("an audio append failed; the turn's clip goes whole", exc_info=True)
                await self.drop()
                return None
        self.id = None
        self.broken = False
        return stream

    async def drop(self) -> None:
        """Forget this buffer's stream (a clear, a reset)."""
        stream, self.id = self.id, None
        self.broken = False
        if stream is not None:
            await self.engine.drop_audio_stream(stream)


class TurnController:
    """The session's turn: its state, the input audio buffer and what listens to it, and the tentative answer (held
    only in ``TENTATIVE``). ``handle`` moves the turn; the client's audio events come through ``append``,
    ``commit`` and ``clear``. ``settings``: the session's (its turn detection), changed in place by
    ``session.update``; ``pipeline``, ``engine`` and ``session_id``: the session's; ``pool`` and ``metrics``: the
    server's; the parts it drives: ``idle`` (speech is activity), ``pause`` (appended audio is dropped while
    paused), ``frames`` and ``conversation`` (a commit makes a user item), ``responses``; ``send`` and
    ``send_error``: the session's events."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, engine: AsyncOmni, pool: EnginePool,
                 metrics: ServerMetrics, session_id: str, *, idle: IdleWatch, pause: SessionPause,
                 frames: CameraFrames, conversation: Conversation, responses: Responses, send: Send,
                 send_error: SendError) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.engine = engine
        self.metrics = metrics
        self.idle = idle
        self.pause = pause
        self.frames = frames
        self.conversation = conversation
        self.responses = responses
        self.send = send
        self.send_error = send_error
        self.state = TurnState.LISTENING
        self.buffer = InputAudioBuffer(pool.config.max_body_bytes)
        self.vad = vad_for(settings.turn_detection)
        self.live = LiveTranscript(settings, pipeline, pool)
        self.tentative: TentativeAnswer | None = None
        self._pending_item_id: str | None = None  # the item the audio being appended will become
        self._idle_from_ms: float | None = None  # idle_timeout_ms counts from here (buffer ms; None: not counting)
        self.stream = AudioStream(pipeline, settings, engine, session_id)

    def now(self) -> Now:
        detection = self.settings.turn_detection
        answering = self.responses.running
        if detection is None:
            return Now(answering=answering)
        return Now(answering=answering,
                   speculate=bool(detection.get("speculative_start", True) and detection.get("create_response", True)
                                  and self.live.enabled() and not self.pause.paused),
                   respond=detection.get("create_response", True), interrupt=detection.get("interrupt_response", True))

    async def handle(self, event: TurnEvent) -> None:
        """Move the turn on ``event``: the state changes first (an event that comes while the actions run sees
        it), then the actions run in order. An action that fails leaves the state the parts are in."""
        step = transition(self.state, event, self.now())
        self.state = step.state
        try:
            for action in step.actions:
                await self._perform(action, event)
        except BaseException:
            self.state = self._settled()
            raise
        finally:
            if self.tentative is not None and self.state is not TurnState.TENTATIVE:
                await self._drop_tentative()  # only an action that failed leaves one behind

    def _settled(self) -> TurnState:
        """The state the parts are in (after an action failed)."""
        if self.state is TurnState.DONE:
            return TurnState.DONE
        if self.vad is not None and self.vad.speaking:
            return TurnState.TENTATIVE if self.tentative is not None else TurnState.SPEAKING
        if self.responses.running:
            return TurnState.ANSWERING
        return TurnState.COMMITTED if self.conversation.has_pending() else TurnState.LISTENING

    async def _perform(self, action: Action, event: TurnEvent) -> None:
        if action is Action.BARGE_IN:
            await self.responses.cancel("turn_detected")
        elif action is Action.CANCEL:
            await self.responses.cancel()
        elif action is Action.START_TENTATIVE:
            self._start_tentative()
        elif action is Action.DROP_TENTATIVE:
            await self._drop_tentative()
        elif action is Action.COMMIT:
            if isinstance(event, SpeechStopped):
                detection = self.settings.turn_detection or {}
                await self._commit((event.ended_at, str(detection.get("type", "server_vad"))))
            elif isinstance(event, CommitAsked):
                await self._commit((event.ended_at, "commit"))
            else:
                await self._commit(None)
        elif action is Action.RESPOND:
            tentative, self.tentative = self.tentative, None
            try:
                await self.responses.start(None, tentative)
            except BaseException:
                if tentative is not None and await tentative.drop():  # refused before it could take it
                    self.metrics.count_speculative_start("dropped")
                raise
        else:
            await self._reset()
            await self._drop_tentative()

    # ------------------------------------------------------------------ the client's audio events
    async def append(self, event: InputAudioBufferAppend) -> None:
        """``input_audio_buffer.append`` (dropped unread while the session is paused): kept, and heard by the VAD
        (which moves the turn)."""
        arrived = time.perf_counter()
        if self.pause.paused:
            return
        samples = decode_pcm16(event.audio, "audio")
        first = not self.buffer.chunks
        heard = self.buffer.append(samples, arrived)
        if samples.size == 0:
            return
        await self.stream.feed(heard, first)
        if self.vad is not None:
            for vad_event in await asyncio.to_thread(self.vad.feed, heard):
                await self._hear(vad_event)
            await self._check_idle()

    async def commit(self, _: Any = None) -> None:
        """``input_audio_buffer.commit``: the user's speech ended now."""
        await self.handle(CommitAsked(time.perf_counter()))

    async def clear(self, _: Any) -> None:
        """``input_audio_buffer.clear``: the buffer and the camera frames dropped."""
        await self.handle(Cleared())
        self.frames.clear()
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)

    def answer_ended(self, ends_at: float | None) -> None:
        """An answer ended; its audio plays out at ``ends_at`` (perf_counter; None: it had none): the idle timeout
        counts the audio appended from then on (the microphone streams at real-time pace)."""
        ahead_s = 0.0 if ends_at is None else max(0.0, ends_at - time.perf_counter())
        self._idle_from_ms = self.buffer.buffered_ms() + ahead_s * 1000
        self.state = transition(self.state, ResponseEnded(), self.now()).state  # it asks for no action

    async def detection_changed(self) -> None:
        """The session's ``turn_detection`` changed: its VAD from now on."""
        self.vad = vad_for(self.settings.turn_detection)
        await self.handle(DetectionChanged())

    async def session_paused(self) -> None:
        """``session.pause``: the answer cancelled, the buffer emptied."""
        await self.handle(SessionPaused())

    async def close(self) -> None:
        """The connection ended: the answer cancelled, the buffer emptied; the turn is done."""
        await self.handle(Closed())

    # ------------------------------------------------------------------ what the VAD hears
    async def _hear(self, vad_event: VadEvent) -> None:
        """Announce what the VAD heard and move the turn (a failure to commit or respond is reported as an
        ``error`` event: no client event caused it)."""
        at_ms = vad_event.audio_ms
        if vad_event.kind == "pause_started":
            await self.handle(SpeechPaused(at_ms))
        elif vad_event.kind == "pause_ended":
            await self.handle(SpeechResumed(at_ms))
        elif vad_event.kind == "speech_started":
            self.idle.touch()
            self._idle_from_ms = None
            self.buffer.speech_started(at_ms)
            await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED, audio_start_ms=at_ms,
                            item_id=self._next_item_id())
            await self.handle(SpeechStarted(at_ms))
        else:
            await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED, audio_end_ms=at_ms,
                            item_id=self._next_item_id())
            try:
                await self.handle(SpeechStopped(at_ms, self.buffer.arrival_of(at_ms)))
            except (EventError, APIError) as exc:
                await self.send_error(exc.message, param=exc.param, code=exc.code)

    async def _check_idle(self) -> None:
        """``idle_timeout_ms`` of silence after the last answer played: commit the silence and answer it."""
        timeout = (self.settings.turn_detection or {}).get("idle_timeout_ms")
        if timeout is None or self._idle_from_ms is None or (self.vad is not None and self.vad.speaking) \
                or self.responses.running or self.pause.paused:
            return
        now_ms = self.buffer.buffered_ms()
        if now_ms - self._idle_from_ms < timeout:
            return
        started_ms, self._idle_from_ms = max(0.0, self._idle_from_ms), None
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_TIMEOUT_TRIGGERED, audio_start_ms=int(started_ms),
                        audio_end_ms=int(now_ms), item_id=self._next_item_id())
        try:
            await self.handle(IdleTimedOut())
        except (EventError, APIError) as exc:
            await self.send_error(exc.message, param=exc.param, code=exc.code)

    def _next_item_id(self) -> str:
        if self._pending_item_id is None:
            self._pending_item_id = new_item_id()
        return self._pending_item_id

    # ------------------------------------------------------------------ the actions
    def _start_tentative(self) -> None:
        """An answer to the speech so far, started now (nothing reaches the client)."""
        speech = self.buffer.speech()
        frames_until_ms = self.frames.newest_ms()  # the camera frames of the turn: those kept at the pause
        frames = self.frames.peek(until_ms=frames_until_ms)

        def plan(words: str) -> AnswerPlan:
            heard = ConversationItem("tentative", "user", words=words, spoken=True, pending=True, transcribed=True)
            heard.take_frames(frames)
            return self.responses.plan(None, *self.conversation.peek_turn(heard))

        self.tentative = TentativeAnswer(lambda: self.live.final(speech), plan, self.responses.generate,
                                         self.engine.abort, frames, frames_until_ms)

    async def _drop_tentative(self) -> None:
        tentative, self.tentative = self.tentative, None
        if tentative is not None and await tentative.drop():
            self.metrics.count_speculative_start("dropped")

    async def _commit(self, speech_end: tuple[float, str] | None) -> None:
        """The buffer becomes a spoken user item at the end of the conversation; ``speech_end``: when the speech
        ended and what ended the turn (None: the silence the idle timeout commits; nothing is transcribed, and the
        thinker is told the user said nothing). The words are the tentative answer's, when one is held."""
        if not self.buffer.chunks:
            raise EventError("the input audio buffer is empty", None, code=COMMIT_EMPTY)
        check_takes_audio(self.pipeline, None)
        idle = speech_end is None
        audio = self.buffer.audio()
        words: str | None = ""
        if not idle:
            words = await self._transcript(self.buffer.speech(flush=True)) if self.live.enabled() else None
        stream = await self.stream.take(self.buffer)  # the audio streamed in (None: send the clip)
        if stream is not None:
            self.metrics.count_streamed_turn()
        await self._reset()
        item_id = self._next_item_id()
        self._pending_item_id = None
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED, previous_item_id=self.conversation.last_item_id(),
                        item_id=item_id)
        item = ConversationItem(item_id, "user", audio=audio, spoken=True, pending=True, words=words or "",
                                transcribed=words is not None, idle=idle, speech_end=speech_end,
                                audio_stream=stream)
        tentative = self.tentative
        if tentative is None:
            item.take_frames(self.frames.take())
        else:  # the frames its answer was planned with (those it looked at leave the buffer)
            self.frames.take(until_ms=tentative.frames_until_ms)
            item.take_frames(tentative.frames)
        await self.conversation.add(item)

    async def _transcript(self, speech: np.ndarray) -> str | None:
        """The turn's words, heard live (the tentative answer's, when it has them); None when live transcription
        failed (the pipeline then hears the audio itself)."""
        words = None
        tentative = self.tentative
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
        self.metrics.count_turn_transcription()
        return words

    async def _reset(self) -> None:
        """Empty the buffer (its audio is dropped) and restart the VAD (a tentative answer is the caller's)."""
        if self._idle_from_ms is not None:  # the idle count goes on across the reset, in the new buffer's time
            self._idle_from_ms -= self.buffer.buffered_ms()
        self.buffer.reset()
        await self.stream.drop()
        if self.vad is not None:
            self.vad.reset()
