"""Frame accumulation for frame-producing edges (talker -> code2wav).

Frames are buffered until a chunk is due: the first chunk after ``initial_chunk_frames`` (small, to cut time to
first audio), then every ``codec_chunk_frames``. Each chunk carries up to ``left_context_frames`` frames before it
and, for vocoders that look ahead, ``right_context_frames`` after it (a chunk then waits until those frames
exist), so the seam decodes without a click; the consumer drops the audio of the context frames. The last chunk
takes whatever is left.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        for name, minimum in (("codec_chunk_frames", 1), ("left_context_frames", 0), ("right_context_frames", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_CHUNK_FRAMES:
                raise FieldError(name, f"must be an integer in [{minimum}, {MAX_CHUNK_FRAMES}], got {value!r}")
        value = self.initial_codec_chunk_frames
        if not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                                    and 1 <= value <= MAX_CHUNK_FRAMES)):
            raise FieldError("initial_codec_chunk_frames",
                             f'must be "auto" or an integer in [1, {MAX_CHUNK_FRAMES}], got {value!r}')


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

    def add(self, block: np.ndarray) -> None:
        if block.ndim != 2:
            raise ValueError(f"frames must be [dim, T], got shape {block.shape}")
        self.frames = block if self.frames is None else np.concatenate([self.frames, block], axis=1)

    def pending(self) -> int:
        total = 0 if self.frames is None else self.offset + self.frames.shape[1]
        return total - self.emitted

    def cut(self, options: FrameChunkOptions, initial_chunk_frames: int, is_last: bool) -> list[dict[str, Any]]:
        """Return the chunks due now: ``{"frames": [D, L+N+R], "context_frames": L, "lookahead_frames": R,
        "start_frame": k}`` where the N frames from ``start_frame`` on are new."""
        chunks = []
        while True:
            due = initial_chunk_frames if self.chunks_sent == 0 else options.codec_chunk_frames
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
        # keep only what the next window's context can need
        keep_from = max(0, self.emitted - left_context - self.offset)
        if keep_from:
            self.frames = self.frames[:, keep_from:]
            self.offset += keep_from
        return chunk
