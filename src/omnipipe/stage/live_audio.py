"""A stage's live audio streams, by id, heard while a session runs (the duplex and live-transcription families): each
opened by its first append (``AsyncOmni.append_audio``, 16 kHz) or by the session that names it (``{"stream":
id}``), whichever comes first, and processed as it comes, on the stage loop, by the family's own ``LiveAudio`` (Moshi:
upsampled and Mimi-encoded frame by frame; Voxtral Realtime: log-mel frames and its causal encoder token by token).

A stream is read by at most one session (a request of the stage): ``claim`` gives the session its stream's audio
object; an append that makes a new frame ready for a claimed stream, and the stream's end (``close``: the caller
dropped it or ended its session), wake the session (``woken``: the stage moves a session parked in
WAITING_FOR_CHUNK back to run). A session that ends (``release``) forgets its stream. A stream appended to and closed
before any session names it is heard whole by the session that names it later (a clip sent in pieces).

Limits: ``max_streams`` open streams (a new one beyond drops the least recently used that no session reads, which a
session naming it later finds unknown, or is refused when all are read) and ``max_samples`` of 16 kHz audio each
(the engine counts the same bound first). An append out of sequence (``seq``: appends lost, e.g. the stage
restarted while the stream was going) fails the stream, and the session reading it, rather than hear a hole.

``LiveAudioRunner``: the runner hooks (``append_audio``, ``drop_audio_stream``, ``end_session``,
``woken_requests``, and ``free`` releasing a session's stream) of a runner that keeps its streams in ``streams``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import StageRunner
from omnipipe.stage.streaming_audio import AUDIO_FIELD
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)
INPUT_RATE_HZ = 16_000  # what AsyncOmni.append_audio carries


class LiveAudio(Protocol):
    """A family's per-stream audio: ``append`` processes a 16 kHz piece as it comes (raising fails the stream),
    ``close`` says no more will come (what is held back is processed then), ``fail`` stops it with the reason
    (``error``). ``frames_ready`` is any count that grows when a session has something new to read."""

    closed: bool
    error: str | None
    heard_samples: int  # at 16 kHz, every append

    def append(self, pcm16k: np.ndarray) -> None: ...

    def close(self) -> None: ...

    def fail(self, error: str) -> None: ...

    @property
    def frames_ready(self) -> int: ...


Audio = TypeVar("Audio", bound=LiveAudio)


@dataclass
class _Stream(Generic[Audio]):
    audio: Audio
    session_id: str | None
    next_seq: int = 0
    reader: str | None = None  # the request that reads it
    used_at: float = field(default_factory=time.monotonic)


class LiveStreams(Generic[Audio]):
    """Held and called on the stage loop: ``append``, ``close``, ``end_session`` (messages on the control socket),
    ``claim`` and ``release`` (the runner, as sessions start and end), ``woken`` (the stage, after its messages).
    ``new_audio`` makes a new stream's audio object."""

    def __init__(self, new_audio: Callable[[], Audio], max_streams: int, max_samples: int) -> None:
        self._new_audio = new_audio
        self.max_streams = max_streams
        self.max_samples = max_samples
        self._open: dict[str, _Stream[Audio]] = {}
        self._woken: set[str] = set()

    def __len__(self) -> int:
        return len(self._open)

    def _stream(self, stream_id: str, session_id: str | None) -> _Stream[Audio] | None:
        """The stream ``stream_id``, opened if new (None: no room, every open stream being read)."""
        entry = self._open.get(stream_id)
        if entry is not None:
            entry.used_at = time.monotonic()
            entry.session_id = entry.session_id or session_id  # opened by its session before its first append
            return entry
        while len(self._open) >= self.max_streams:
            unread = [key for key, stream in self._open.items() if stream.reader is None]
            if not unread:
                return None
            oldest = min(unread, key=lambda key: self._open[key].used_at)
            logger.warning("audio stream %s dropped: %d streams are open (the most the stage keeps)", oldest,
                           len(self._open))
            del self._open[oldest]
        entry = self._open[stream_id] = _Stream(self._new_audio(), session_id)
        return entry

    def append(self, stream_id: str, session_id: str | None, seq: int, pcm16k: np.ndarray) -> None:
        entry = self._stream(stream_id, session_id)
        if entry is None:
            logger.warning("audio stream %s refused: %d streams are open and read", stream_id, len(self._open))
            return
        audio = entry.audio
        if audio.error is not None:
            return
        if audio.closed:
            self._fail(entry, f"stream {stream_id!r} was appended to after its end")
        elif seq != entry.next_seq:
            self._fail(entry, f"stream {stream_id!r} lost appends {entry.next_seq} to {seq - 1} (the stage "
                              "restarted while it streamed)")
        elif audio.heard_samples + len(pcm16k) > self.max_samples:
            self._fail(entry, f"stream {stream_id!r} is longer than the stage takes "
                              f"({self.max_samples / INPUT_RATE_HZ:g} s)")
        else:
            entry.next_seq += 1
            before = audio.frames_ready
            try:
                audio.append(pcm16k)
            except Exception as exc:  # noqa: BLE001 - the session that hears the stream fails with it
                logger.exception("audio stream %s: an append failed", stream_id)
                self._fail(entry, f"stream {stream_id!r} could not be processed: {exc}")
                return
            if audio.frames_ready > before:
                self._wake(entry)

    def close(self, stream_id: str) -> None:
        """The stream ended: what it heard is all there will be."""
        entry = self._open.get(stream_id)
        if entry is None:
            return
        if not entry.audio.closed:
            try:
                entry.audio.close()
            except Exception as exc:  # noqa: BLE001 - the session that hears the stream fails with it
                logger.exception("audio stream %s: its end failed", stream_id)
                self._fail(entry, f"stream {stream_id!r} could not be processed: {exc}")
                return
        self._wake(entry)

    def end_session(self, session_id: str) -> None:
        for stream_id in [key for key, entry in self._open.items() if entry.session_id == session_id]:
            self.close(stream_id)

    def claim(self, request_id: str, stream_id: str) -> Audio:
        """The stream a session reads (opened now if it was never appended to); a FieldError naming the audio when
        another session reads it, or no room is left."""
        entry = self._open.get(stream_id)
        if entry is not None and entry.reader not in (None, request_id):
            raise FieldError(AUDIO_FIELD, f"stream {stream_id!r} is already heard by another session")
        entry = self._stream(stream_id, None)
        if entry is None:
            raise FieldError(AUDIO_FIELD, f"the stage keeps at most {self.max_streams} audio streams, and that "
                             "many are heard by sessions")
        entry.reader = request_id
        return entry.audio

    def release(self, request_id: str) -> None:
        """The session left the stage: its stream goes (later appends to its id open a new one)."""
        for stream_id in [key for key, entry in self._open.items() if entry.reader == request_id]:
            del self._open[stream_id]
        self._woken.discard(request_id)

    def woken(self) -> list[str]:
        """The sessions whose stream gave them something to do since the last call."""
        woken, self._woken = sorted(self._woken), set()
        return woken

    def _wake(self, entry: _Stream[Audio]) -> None:
        if entry.reader is not None:
            self._woken.add(entry.reader)

    def _fail(self, entry: _Stream[Audio], error: str) -> None:
        logger.warning("audio %s", error)
        entry.audio.fail(error)
        self._wake(entry)


class LiveAudioRunner(StageRunner):
    """The live-stream hooks of a runner that keeps its streams in ``streams`` (a ``LiveStreams`` it makes at load,
    setting ``max_audio_streams`` and ``max_audio_stream_s`` to its limits): appends and drops go to it, a session's
    end closes its streams first, the sessions a stream woke are the stage's to wake, and a request that leaves the
    stage releases its stream. Put it before the runner's other base (``class R(LiveAudioRunner,
    BatchedDecoderRunner)``) so its ``end_session`` and ``free`` run first."""

    streams: LiveStreams[Any]

    def append_audio(self, stream_id: str, session_id: str | None, pcm16k: np.ndarray, seq: int) -> None:
        self.streams.append(stream_id, session_id, seq, pcm16k)

    def drop_audio_stream(self, stream_id: str) -> None:
        self.streams.close(stream_id)

    def end_session(self, session_id: str) -> None:
        self.streams.end_session(session_id)
        super().end_session(session_id)

    def woken_requests(self) -> list[str]:
        return self.streams.woken()

    def free(self, request: StageRequest) -> None:
        self.streams.release(request.request_id)
        super().free(request)
