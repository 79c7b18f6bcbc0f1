"""Frame accumulation for frame-producing edges (talker -> code2wav).

Frames are buffered until a chunk is due: the first chunk after ``initial_chunk_frames`` (small, to cut time to
first audio), then every ``codec_chunk_frames``. Each chunk carries up to ``left_context_frames`` frames before it
and, for vocoders that look ahead, ``right_context_frames`` after it (a chunk then waits until those frames
exist), so the seam decodes without a click; the consumer drops the audio of the context frames. The last chunk
takes whatever is left.

RTF-aware sizes (``adaptive_chunk``): after the first chunk, the regular size follows how far the audio already cut
is ahead of playback (``frames cut / frame_rate_hz`` against the wall time since the first chunk was cut). At
``target_lead_s`` ahead or more a chunk is ``codec_chunk_frames``; behind real time (lead 0 or less) it is
``max_codec_chunk_frames``, linear between. A producer that falls behind playback (the cores are busy) thus sends
fewer, larger windows: fewer context frames decoded twice, fewer vocoder steps; one that keeps ahead keeps small
chunks, so no window holds the vocoder long. Only the cuts move: every frame is still sent once, with the same
context, so the concatenated audio matches the fixed-size stream.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.util.field_error import FieldError

MAX_CHUNK_FRAMES = 4096  # a bound far above any useful chunk (25 frames are about 0.3 s of speech)


@dataclass(frozen=True)
class FrameChunkOptions:
    """The options of a frame edge (talker -> vocoder): deploy ``edges.NAME.options``, per-request overrides."""

    codec_chunk_frames: int = 25
    left_context_frames: int = 8
    right_context_frames: int = 0  # lookahead frames a window carries after its new frames (0 for causal vocoders)
    initial_codec_chunk_frames: int | str = "auto"  # an int, or "auto" (chosen from the producing stage's load)
    # RTF-aware chunk sizes (see the module's docstring): off by default
    adaptive_chunk: bool = False
    max_codec_chunk_frames: int = 100  # the regular size when the audio is behind playback
    target_lead_s: float = 1.0  # audio ahead of playback at which chunks are back to codec_chunk_frames
    frame_rate_hz: float = 0.0  # frames per second of audio (the vocoder's rate / hop); adaptive_chunk needs it

    def __post_init__(self) -> None:
        for name, minimum in (("codec_chunk_frames", 1), ("left_context_frames", 0), ("right_context_frames", 0),
                              ("max_codec_chunk_frames", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_CHUNK_FRAMES:
                raise FieldError(name, f"must be an integer in [{minimum}, {MAX_CHUNK_FRAMES}], got {value!r}")
        value = self.initial_codec_chunk_frames
        if not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                                    and 1 <= value <= MAX_CHUNK_FRAMES)):
            raise FieldError("initial_codec_chunk_frames",
                             f'must be "auto" or an integer in [1, {MAX_CHUNK_FRAMES}], got {value!r}')
        if not isinstance(self.adaptive_chunk, bool):
            raise FieldError("adaptive_chunk", f"must be true or false, got {self.adaptive_chunk!r}")
        for name in ("target_lead_s", "frame_rate_hz"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise FieldError(name, f"must be a number >= 0, got {value!r}")
        if self.adaptive_chunk:
            if self.max_codec_chunk_frames < self.codec_chunk_frames:
                raise FieldError("max_codec_chunk_frames", f"must be at least codec_chunk_frames "
                                 f"({self.codec_chunk_frames}) with adaptive_chunk, got {self.max_codec_chunk_frames}")
            if self.frame_rate_hz <= 0:
                raise FieldError("frame_rate_hz", "must be > 0 with adaptive_chunk (the audio frames per second: "
                                 "the vocoder's sample rate over its hop)")

    def regular_chunk_frames(self, lead_s: float | None) -> int:
        """The size of a chunk after the first, given how far the audio cut is ahead of playback (None: unknown)."""
        if not self.adaptive_chunk or lead_s is None:
            return self.codec_chunk_frames
        if self.target_lead_s > 0:
            behind = min(1.0, max(0.0, 1.0 - lead_s / self.target_lead_s))
        else:
            behind = 1.0 if lead_s <= 0 else 0.0
        return int(round(self.codec_chunk_frames + behind * (self.max_codec_chunk_frames - self.codec_chunk_frames)))


def choose_initial_chunk_frames(
    requested: int | str | None, codec_chunk_frames: int, active_requests: int, max_num_seqs: int
) -> int:
    """Resolve the first-chunk size. An explicit integer wins; ``"auto"`` picks from the current load.

    Lightly loaded: a small first chunk (a fifth of a regular one) gets audio out at once. As the producing stage
    fills up, small chunks cost more per-call overhead than they save, so the first chunk grows toward a full one.
    """
    if isinstance(requested, int) and not isinstance(requested, bool):
        return max(1, min(requested, codec_chunk_frames))
    smallest = max(2, codec_chunk_frames // 5)
    load = min(1.0, max(0, active_requests - 1) / max(1, max_num_seqs - 1))
    return int(round(smallest + load * (codec_chunk_frames - smallest)))


class FrameAccumulator:
    """Collects [D, T] frame blocks and cuts them into windows with left context."""

    def __init__(self) -> None:
        self.frames: np.ndarray | None = None  # all frames not yet fully emitted, plus context
        self.emitted = 0  # frames already shipped
        self.offset = 0  # absolute index of self.frames[:, 0]
        self.chunks_sent = 0
        self.first_cut_s: float | None = None  # when the first chunk was cut (playback starts about then)
        self.window_frames = 0  # frames sent in all windows, context included (what the consumer decodes)

    def lead_s(self, frame_rate_hz: float, now: float) -> float | None:
        """Seconds of audio cut ahead of playback begun at the first chunk (None before the first chunk)."""
        if self.first_cut_s is None or frame_rate_hz <= 0:
            return None
        return self.emitted / frame_rate_hz - (now - self.first_cut_s)

    def add(self, block: np.ndarray) -> None:
        if block.ndim != 2:
            raise ValueError(f"frames must be [dim, T], got shape {block.shape}")
        self.frames = block if self.frames is None else np.concatenate([self.frames, block], axis=1)

    def pending(self) -> int:
        total = 0 if self.frames is None else self.offset + self.frames.shape[1]
        return total - self.emitted

    def cut(self, options: FrameChunkOptions, initial_chunk_frames: int, is_last: bool,
            now: float | None = None) -> list[dict[str, Any]]:
        """Return the chunks due now: ``{"frames": [D, L+N+R], "context_frames": L, "lookahead_frames": R,
        "start_frame": k}`` where the N frames from ``start_frame`` on are new. ``now`` (``time.perf_counter()``
        when None) places the call on the playback clock of ``adaptive_chunk``: the regular size is chosen once
        per call, from the lead when it is made."""
        if now is None:
            now = time.perf_counter()
        regular = options.regular_chunk_frames(self.lead_s(options.frame_rate_hz, now))
        chunks = []
        while True:
            due = initial_chunk_frames if self.chunks_sent == 0 else regular
            pending = self.pending()
            if pending <= 0:
                break
            if is_last:
                take = min(due, pending)
            elif pending >= due + options.right_context_frames:
                take = due
            else:
                break
            lookahead = min(options.right_context_frames, pending - take)
            chunks.append(self._emit(take, options.left_context_frames, lookahead))
            if self.first_cut_s is None:
                self.first_cut_s = now
        return chunks

    def _emit(self, count: int, left_context: int, lookahead: int) -> dict[str, Any]:
        assert self.frames is not None
        context = min(left_context, self.emitted)
        start = self.emitted - context - self.offset
        window = self.frames[:, start : self.emitted - self.offset + count + lookahead]
        chunk = {"frames": np.ascontiguousarray(window), "context_frames": context, "lookahead_frames": lookahead,
                 "start_frame": self.emitted}
        self.emitted += count
        self.chunks_sent += 1
        self.window_frames += window.shape[1]
        # keep only what the next window's context can need
        keep_from = max(0, self.emitted - left_context - self.offset)
        if keep_from:
            self.frames = self.frames[:, keep_from:]
            self.offset += keep_from
        return chunk
