"""Handoff for frame edges (talker -> vocoder), shared by model families whose talker emits [D, T] frames."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnipipe.chunk.accumulation import FrameAccumulator
from omnipipe.chunk.context import ChunkContext


def frames_whole(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Non-streaming: every frame block of the request, in one window with no context."""
    blocks = [np.asarray(o["frames"]) for o in outputs if "frames" in o and np.asarray(o["frames"]).shape[-1]]
    if not blocks:
        return []
    frames = np.concatenate(blocks, axis=1)
    return [{"frames": frames, "context_frames": 0, "lookahead_frames": 0, "start_frame": 0}]


def frames_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                       ctx: ChunkContext) -> list[dict[str, Any]]:
    """Streaming: accumulate frames and cut windows of ``codec_chunk_frames`` with context."""
    accumulator: FrameAccumulator = state.setdefault("frames", FrameAccumulator())
    if "frames" in output and np.asarray(output["frames"]).shape[-1]:
        accumulator.add(np.asarray(output["frames"]))
    return accumulator.cut(ctx, is_last)
