"""Recording one session: its turns, timeline, audio and images (sent and drawn), written in the background as
it happens.

``SessionRecorder`` methods are cheap and never touch the disk on the caller's thread (apart from creating the
session directory): every write is a job for a shared ``RecordingWriter``. The jobs of one session run one at a
time in the order they were submitted, and every file is replaced atomically, so a gateway that dies mid-session
leaves readable ``meta.json`` and ``recording.json`` describing the turns so far.

Times in ``recording.json`` are seconds since the session start (``meta.json`` ``created_at``, epoch seconds),
rounded to milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from omnipipe.gateway.recording.file_checks import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    audio_extension,
    check_image,
    check_video,
    png_size,
)
from omnipipe.gateway.recording.replay import check_rate, encode_wav, resample_clip, to_mono_float32
from omnipipe.gateway.recording.session_lock import SessionLock
from omnipipe.gateway.recording.session_replay import write_session_replays
from omnipipe.gateway.recording.store import META_FILENAME, RECORDING_FILENAME, SessionStore, atomic_write_bytes
from omnipipe.gateway.recording.user_frames import MAX_RECORDED_FRAMES, frame_path, save_frame
from omnipipe.gateway.recording.writer import RecordingWriter
from omnipipe.util.audio import load_audio

logger = logging.getLogger(__name__)

SESSION_KINDS = ("chat", "speech", "transcription", "voice")
TURN_STATUSES = ("completed", "cancelled", "failed")
SESSION_STATUSES = (*TURN_STATUSES, "interrupted")
"""Final session statuses; ``interrupted``: the gateway stopped during the session."""
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_VIDEO_BYTES = 32 * 1024 * 1024  # the most a request body may carry
MAX_AI_IMAGE_BYTES = 4 * 1024 * 1024
"""A drawn answer's image larger than this is not recorded."""
DEFAULT_MAX_REPLAY_S = 4 * 3600.0
RECORDING_WRITE_INTERVAL_S = 0.5
"""Event-only changes rewrite ``recording.json`` at most this often; turn ends and ``finish`` always do."""

def _check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name}: must be one of {', '.join(choices)}, got {value!r}")
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


class SessionRecorder:
    """Records one session of ``kind`` (chat, speech, transcription or voice) into ``store``.

    Construction creates the session directory and writes ``meta.json`` (status ``recording``) and an empty
    ``recording.json``. Call the methods from one thread at a time (the event loop's); file writes happen on
    ``writer``'s threads. ``finish`` ends the session and writes ``merged_replay.wav`` when there is audio and
    ``merged_replay.mp4`` when there are camera frames. From construction until its last write the recorder holds
    the session directory's ``SessionLock``.
    """

    def __init__(self, store: SessionStore, session_id: str, kind: str, *, writer: RecordingWriter,
                 worker: str | None = None, config: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time, max_replay_s: float = DEFAULT_MAX_REPLAY_S) -> None:
        _check_choice(kind, SESSION_KINDS, "kind")
        created_at = clock()
        self.store = store
        self.session_id = session_id
        self.directory = store.session_dir(session_id, must_exist=False)
        self.kind = kind
        self.created_at = created_at
        self.max_replay_s = max_replay_s
        self._writer = writer
        self._clock = clock
        self._lane = str(self.directory)
        self._lock = threading.RLock()
        self._meta: dict[str, Any] = {
            "session_id": session_id, "type": kind, "created_at": created_at, "ended_at": None, "status": "recording",
            "worker": worker, "config": dict(config) if config is not None else None, "error": None}
        self._recording: dict[str, Any] = {"session_id": session_id, "type": kind, "turns": [], "events": [],
                                           "frames": []}
        self._turn: dict[str, Any] | None = None
        self._next_index = 1
        self._ai_chunks: list[np.ndarray] = []
        self._ai_rate, self._ai_t_start = 0, 0.0
        self._finished = self._discarded = False
        self._recording_write_queued = False
        self._recording_timer: asyncio.TimerHandle | None = None
        self._last_recording_write = float("-inf")
        # Creating the directory here reserves the id before any job runs; it is a single, tiny operation.
        self.directory.mkdir(parents=True, exist_ok=True)
        self._directory_lock = SessionLock(self.directory)
        self._submit(self._write_meta)
        self._write_recording_soon(immediately=True)

    # ------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        """Whether ``finish`` has been called."""
        return self._finished

    @property
    def current_turn(self) -> dict[str, Any] | None:
        """The open turn (as stored in ``recording.json``), or ``None`` between turns."""
        return self._turn

    @property
    def next_turn_index(self) -> int:
        """The index ``begin_turn`` will give the next turn."""
        return self._next_index

    def user_transcript(self, turn_index: int, text: str) -> None:
        """What the user said in turn ``turn_index`` (a transcript may arrive after the turn ended, or before it
        opened); ignored for a turn that never opens."""
        with self._lock:
            if self._turn is None and turn_index == self._next_index:
                self.begin_turn()
            for turn in self._recording["turns"]:
                if turn["index"] == turn_index:
                    turn["user_transcript"] = text
                    self._write_recording_soon()
                    return

    def elapsed(self) -> float:
        """Seconds since the session started, rounded to milliseconds (the timeline's unit)."""
        return round(self._clock() - self.created_at, 3)

    def begin_turn(self, *, started_at: float | None = None) -> int:
        """Open a new turn and return its 1-based index; an open turn is first ended as ``cancelled``.

        ``started_at`` (seconds since the session start) defaults to now.
        """
        with self._lock:
            if self._turn is not None:
                self.end_turn("cancelled")
            index = self._next_index
            self._next_index += 1
            self._turn = {"index": index, "started_at": self._start_time(started_at), "user_text": "",
                          "assistant_text": "", "user_audio": None, "user_audio_extra": [], "ai_audio": [],
                          "user_images": [], "user_videos": [], "ai_images": [], "metrics": {},
                          "status": "in_progress"}
            self._recording["turns"].append(self._turn)
            self._write_recording_soon()
            return index

    def _open_turn(self) -> dict[str, Any]:
        if self._turn is None:
            self.begin_turn()
        assert self._turn is not None
        return self._turn

    # ------------------------------------------------------------------ user side
    def user_text(self, text: str) -> None:
        """Append ``text`` to the user's text of the current turn (opening one if needed)."""
        with self._lock:
            turn = self._open_turn()
            turn["user_text"] = f"{turn['user_text']} {text}".strip() if turn["user_text"] else text
            self._write_recording_soon()

    def _user_audio_name(self, turn: dict[str, Any], extension: str) -> tuple[str, bool]:
        """The next user clip's relative path, and whether it is the turn's first clip."""
        count = len(turn["user_audio_extra"]) + (turn["user_audio"] is not None)
        suffix = f"_{count + 1}" if count else ""
        return f"user_audio/turn{turn['index']:03d}{suffix}.{extension}", count == 0

    def _add_user_clip(self, turn: dict[str, Any], entry: dict[str, Any], first: bool) -> None:
        if first:
            turn["user_audio"] = entry
        else:
            turn["user_audio_extra"].append(entry)
        self._write_recording_soon()

    def user_audio(self, samples: np.ndarray, rate: int, *, t_start: float | None = None) -> str:
        """Save user audio (float in [-1, 1] or int16) of the current turn as a WAV; return its relative path.

        ``t_start`` (seconds since the session start) defaults to now. The turn's first clip is
        ``user_audio/turn{NNN}.wav`` (in ``turn["user_audio"]``); later ones get ``_2``, ``_3``, ... and go to
        ``turn["user_audio_extra"]``.
        """
        rate = check_rate(rate)
        audio = to_mono_float32(samples)
        with self._lock:
            turn = self._open_turn()
            relpath, first = self._user_audio_name(turn, "wav")
            entry = {"path": relpath, "t_start": self._start_time(t_start), "duration_s": round(audio.size / rate, 3),
                     "sample_rate": rate}
            self._submit(self._write_wav, relpath, audio, rate)
            self._add_user_clip(turn, entry, first)
            return relpath

    def user_audio_encoded(self, data: bytes, extension: str, *, t_start: float | None = None) -> None:
        """Save an audio file the user sent (``extension``: its format, e.g. ``mp3``) like ``user_audio``.

        It is decoded on the writer (not on the caller's thread) and saved as WAV; if it cannot be decoded, the
        bytes are kept as ``...{NNN}.{extension}`` (``.bin`` unless ``extension`` is in ``AUDIO_FILE_EXTENSIONS``)
        and the entry gets ``size_bytes`` and ``decode_error``.
        """
        with self._lock:
            turn = self._open_turn()
            relpath, first = self._user_audio_name(turn, "wav")
            entry = {"path": relpath, "t_start": self._start_time(t_start)}
            self._submit(self._decode_and_save, entry, bytes(data), audio_extension(extension))
            self._add_user_clip(turn, entry, first)

    def user_image(self, data: bytes, mime: str, *, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> str:
        """Save an image the user sent (PNG, JPEG, GIF or WebP, at most ``max_image_bytes``) as
        ``user_images/turn{NNN}_{k}.{ext}``; return its path.

        ``ValueError`` for another type, an oversized or empty image, or bytes that are not of type ``mime``.
        """
        return self._keep_sent_file("image", data, mime, IMAGE_EXTENSIONS, check_image, max_image_bytes)

    def user_video(self, data: bytes, mime: str, *, max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES) -> str:
        """Save a video the user sent (MP4, QuickTime, WebM, Matroska or Ogg, at most ``max_video_bytes``) as
        ``user_videos/turn{NNN}_{k}.{ext}``; return its path.

        ``ValueError`` for another type, an oversized or empty video, or bytes that do not begin as ``mime`` does.
        """
        return self._keep_sent_file("video", data, mime, VIDEO_EXTENSIONS, check_video, max_video_bytes)

    def _keep_sent_file(self, kind: str, data: bytes, mime: str, extensions: dict[str, str],
                        check: Callable[[bytes, str, int], None], max_bytes: int) -> str:
        mime = mime.split(";", 1)[0].strip().lower()
        if mime not in extensions:
            raise ValueError(f"mime: {kind}s must be one of {', '.join(extensions)}, got {mime!r}")
        check(data, mime, max_bytes)
        with self._lock:
            turn = self._open_turn()
            kept = turn[f"user_{kind}s"]
            relpath = f"user_{kind}s/turn{turn['index']:03d}_{len(kept) + 1}.{extensions[mime]}"
            kept.append({"path": relpath, "mime": mime, "size_bytes": len(data), "t": self.elapsed()})
            self._submit(self._write_bytes, relpath, bytes(data))
            self._write_recording_soon()
            return relpath

    def user_frame(self, data: bytes, mime: str, *, t: float, captured_at_ms: float) -> str | None:
        """Save a camera frame (PNG or JPEG bytes ``user_frames.read_frame`` took) shown from ``t`` s as
        ``user_frames/{NNNNNN}.jpg`` (converted on the writer); ``None`` once ``MAX_RECORDED_FRAMES`` are kept.
        Its ``recording["frames"]`` entry: ``path``, ``t``, ``captured_at_ms``, ``turn`` (``decode_error``)."""
        with self._lock:
            frames = self._recording["frames"]
            if len(frames) >= MAX_RECORDED_FRAMES:
                return None
            entry = {"path": frame_path(len(frames) + 1), "t": round(t, 3), "captured_at_ms": captured_at_ms,
                     "turn": self._turn["index"] if self._turn else None}
            frames.append(entry)
            self._submit(self._save_frame, entry, bytes(data), mime)
            self._write_recording_soon()
            return str(entry["path"])

    # ------------------------------------------------------------------ assistant side
    def assistant_text(self, delta: str) -> None:
        """Append a piece of the answer's text to the current turn (opening one if needed)."""
        with self._lock:
            turn = self._open_turn()
            turn["assistant_text"] += delta
            self._write_recording_soon()

    def tool_call(self, call_id: str, name: str, arguments: str) -> None:
        """A function the model called in the current turn (opening one if needed): ``turn["tool_calls"]`` (only
        in turns that made calls), each ``{"call_id", "name", "arguments", "output"}``; the output comes later."""
        with self._lock:
            turn = self._open_turn()
            turn.setdefault("tool_calls", []).append(
                {"call_id": call_id, "name": name, "arguments": arguments, "output": None})
            self._write_recording_soon()

    def tool_output(self, call_id: str, output: str) -> bool:
        """The client's output for an earlier call, kept with that call (in whichever turn made it); False when no
        recorded call has ``call_id``."""
        with self._lock:
            for turn in reversed(self._recording["turns"]):
                for call in turn.get("tool_calls", ()):
                    if call["call_id"] == call_id:
                        call["output"] = output
                        self._write_recording_soon()
                        return True
            return False

    def ai_audio(self, samples: np.ndarray, rate: int, *, t_start: float | None = None) -> None:
        """Buffer a chunk of the spoken answer; the turn's chunks become ``ai_audio/turn{NNN}.wav`` at its end.

        The clip starts at the first chunk's ``t_start`` (default: when it arrived). Chunks at another rate than
        the first are resampled to it.
        """
        rate = check_rate(rate)
        audio = to_mono_float32(samples)
        with self._lock:
            self._open_turn()
            if not self._ai_chunks:
                self._ai_rate = rate
                self._ai_t_start = self._start_time(t_start)
            elif rate != self._ai_rate:
                audio = resample_clip(audio, rate, self._ai_rate)
            self._ai_chunks.append(audio)

    def ai_audio_encoded(self, data: bytes, extension: str, *, t_start: float | None = None) -> None:
        """Save a whole encoded answer (e.g. a WAV file) of the current turn; decoded on the writer like
        ``user_audio_encoded``."""
        with self._lock:
            turn = self._open_turn()
            entry = {"path": self._ai_audio_name(turn, "wav"), "t_start": self._start_time(t_start)}
            turn["ai_audio"].append(entry)
            self._submit(self._decode_and_save, entry, bytes(data), audio_extension(extension))
            self._write_recording_soon()

    def ai_audio_file(self, data: bytes, extension: str, *, t_start: float | None = None) -> str:
        """Save an encoded answer (e.g. mp3 or opus) byte for byte in ``ai_audio/``; return its relative path.

        ``extension`` outside ``AUDIO_FILE_EXTENSIONS`` becomes ``bin``.
        """
        with self._lock:
            turn = self._open_turn()
            relpath = self._ai_audio_name(turn, audio_extension(extension))
            turn["ai_audio"].append({"path": relpath, "t_start": self._start_time(t_start), "size_bytes": len(data)})
            self._submit(self._write_bytes, relpath, bytes(data))
            self._write_recording_soon()
            return relpath

    def ai_image(self, data: bytes, mime: str = "image/png", *, max_image_bytes: int = MAX_AI_IMAGE_BYTES) -> str:
        """Save an image the answer drew (a PNG, at most ``max_image_bytes``) in ``ai_images/``; return its path.

        The turn's first image is ``ai_images/turn{NNN}.png``, later ones get ``_2``, ``_3``, ...; the entry in
        ``turn["ai_images"]`` has ``path``, ``mime``, ``size_bytes``, ``t`` and, read from the PNG header,
        ``width`` and ``height``. ``ValueError`` for another type, an empty or oversized image, or bytes that are
        not a PNG.
        """
        mime = mime.split(";", 1)[0].strip().lower()
        if mime != "image/png":
            raise ValueError(f"mime: a drawn image must be image/png, got {mime!r}")
        check_image(data, mime, max_image_bytes)
        entry: dict[str, Any] = {"mime": mime, "size_bytes": len(data), **png_size(data)}
        with self._lock:
            turn = self._open_turn()
            count = len(turn["ai_images"])
            relpath = f"ai_images/turn{turn['index']:03d}{f'_{count + 1}' if count else ''}.png"
            turn["ai_images"].append({"path": relpath, **entry, "t": self.elapsed()})
            self._submit(self._write_bytes, relpath, bytes(data))
            self._write_recording_soon()
            return relpath

    @staticmethod
    def _ai_audio_name(turn: dict[str, Any], extension: str) -> str:
        count = len(turn["ai_audio"])
        return f"ai_audio/turn{turn['index']:03d}{f'_{count + 1}' if count else ''}.{extension}"

    def _save_ai_audio(self, turn: dict[str, Any]) -> None:
        if not self._ai_chunks:
            return
        chunks, self._ai_chunks = self._ai_chunks, []
        relpath = self._ai_audio_name(turn, "wav")
        frames = sum(chunk.size for chunk in chunks)
        turn["ai_audio"].append({"path": relpath, "t_start": self._ai_t_start,
                                 "duration_s": round(frames / self._ai_rate, 3), "sample_rate": self._ai_rate})
        self._submit(self._write_wav, relpath, chunks, self._ai_rate)

    # ------------------------------------------------------------------ timeline
    def metric(self, name: str, value: Any) -> None:
        """Set a metric (``ttft_ms``, ``ttfp_ms``, ...) of the current turn, or of the last one between turns."""
        with self._lock:
            turns = self._recording["turns"]
            turn = self._turn or (turns[-1] if turns else None)
            if turn is None:
                logger.debug("session %s: metric %s before any turn; ignored", self.session_id, name)
                return
            turn["metrics"][name] = value
            self._write_recording_soon()

    def event(self, kind: str, **fields: Any) -> None:
        """Add ``{"t", "kind", "turn", **fields}`` to the timeline (``turn`` is the open turn's index or null)."""
        with self._lock:
            turn = self._turn["index"] if self._turn else None
            self._recording["events"].append({"t": self.elapsed(), "kind": kind, "turn": turn, **fields})
            self._write_recording_soon()

    def end_turn(self, status: str = "completed", error: str | None = None) -> None:
        """Close the open turn with ``status`` (completed, cancelled or failed); no-op when none is open."""
        _check_choice(status, TURN_STATUSES, "status")
        with self._lock:
            turn = self._turn
            if turn is None:
                return
            self._save_ai_audio(turn)
            turn.update(status=status, ended_at=self.elapsed())
            if error is not None:
                turn["error"] = error
            self._turn = None
            self._write_recording_soon(immediately=True)

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        """End the session with ``status`` (completed, cancelled, failed or interrupted): close an open turn with
        the same status (``cancelled`` if interrupted), write the replay and the final metadata.

        Idempotent: only the first call counts.
        """
        _check_choice(status, SESSION_STATUSES, "status")
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self.end_turn(status if status in TURN_STATUSES else "cancelled", error)
            self._meta.update(ended_at=self._clock(), status=status, error=error)
            self._submit(self._write_replay)
            self._write_recording_soon(immediately=True)
            self._submit(self._write_meta)
            self._submit(self._directory_lock.release)

    def discard(self) -> None:
        """Drop the session: nothing more is written and its directory is deleted once the writes already
        queued have run (on the same lane, after them)."""
        with self._lock:
            self._finished = True
            self._discarded = True
            if self._recording_timer is not None:
                self._recording_timer.cancel()
                self._recording_timer = None
            self._writer.submit(shutil.rmtree, self.directory, True, lane=self._lane)
            self._writer.submit(self._directory_lock.release, lane=self._lane)

    def _start_time(self, t_start: float | None) -> float:
        return self.elapsed() if t_start is None else round(max(0.0, float(t_start)), 3)

    # ------------------------------------------------------------------ writing (jobs run on the writer)
    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if not self._discarded:
            self._writer.submit(fn, *args, lane=self._lane)

    def _write_recording_soon(self, *, immediately: bool = False) -> None:
        """Queue a rewrite of ``recording.json``: now if ``immediately``, else at most every
        ``RECORDING_WRITE_INTERVAL_S`` (timed on the running event loop; without one, now).

        The job serializes the state current when it runs, so changes made while it waits coalesce into it.
        """
        with self._lock:
            if self._recording_write_queued:
                return
            if not immediately:
                if self._recording_timer is not None:
                    return
                delay = self._last_recording_write + RECORDING_WRITE_INTERVAL_S - time.monotonic()
                if delay > 0:
                    try:
                        loop = asyncio.get_running_loop()
                    except RuntimeError:
                        pass  # no event loop on this thread to wait with: write now
                    else:
                        self._recording_timer = loop.call_later(delay, self._write_recording_after_delay)
                        return
            self._recording_write_queued = True
            self._submit(self._write_recording)

    def _write_recording_after_delay(self) -> None:
        with self._lock:
            self._recording_timer = None
        self._write_recording_soon(immediately=True)

    def _write_recording(self) -> None:
        with self._lock:
            self._recording_write_queued = False
            self._last_recording_write = time.monotonic()
            text = json.dumps(self._recording, indent=2, ensure_ascii=False, default=_json_default)
        atomic_write_bytes(self.directory / RECORDING_FILENAME, text.encode())

    def _write_meta(self) -> None:
        with self._lock:
            text = json.dumps(self._meta, indent=2, ensure_ascii=False, default=_json_default)
        atomic_write_bytes(self.directory / META_FILENAME, text.encode())

    def _write_bytes(self, relpath: str, data: bytes) -> None:
        path = self.directory / relpath
        path.parent.mkdir(exist_ok=True)
        atomic_write_bytes(path, data)

    def _write_wav(self, relpath: str, audio: np.ndarray | list[np.ndarray], rate: int) -> None:
        self._write_bytes(relpath, encode_wav(np.concatenate(audio) if isinstance(audio, list) else audio, rate))

    def _decode_and_save(self, entry: dict[str, Any], data: bytes, extension: str) -> None:
        """Write ``data`` as the WAV ``entry`` names, or byte for byte if it does not decode; update ``entry``."""
        try:
            samples, rate = load_audio(data)
        except Exception as exc:  # noqa: BLE001 - any decoder failure keeps the original bytes
            relpath = str(PurePosixPath(entry["path"]).with_suffix(f".{extension}"))
            self._write_bytes(relpath, data)
            update = {"path": relpath, "size_bytes": len(data), "decode_error": str(exc)[:300]}
        else:
            self._write_wav(entry["path"], samples, rate)
            update = {"duration_s": round(samples.size / rate, 3), "sample_rate": rate}
        with self._lock:
            entry.update(update)
        self._write_recording_soon(immediately=True)

    def _save_frame(self, entry: dict[str, Any], data: bytes, mime: str) -> None:
        error = save_frame(self.directory / entry["path"], data, mime)
        if error is not None:
            with self._lock:
                entry["decode_error"] = error
            self._write_recording_soon(immediately=True)

    def _write_replay(self) -> None:
        with self._lock:
            recording = {"turns": list(self._recording["turns"]), "frames": list(self._recording["frames"])}
            duration_s = (self._meta["ended_at"] or self._clock()) - self.created_at
        write_session_replays(self.directory, recording, duration_s=duration_s, max_duration_s=self.max_replay_s,
                              session_id=self.session_id)
