"""Handoff for frame edges (talker -> vocoder), shared by model families whose talker emits [D, T] frames."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnipipe.chunk.accumulation import FrameAccumulator, FrameChunkOptions, choose_initial_chunk_frames
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
    """Streaming: accumulate frames and cut windows of ``codec_chunk_frames`` with context.

    The first chunk's size is resolved once per request (``"auto"``: from the producing stage's load when the
    request arrived) and reported in ``state["metrics"]``, which the stage adds to the request's metrics.
    """
    options: FrameChunkOptions = ctx.options
    accumulator: FrameAccumulator = state.setdefault("frames", FrameAccumulator())
    metrics = state.setdefault("metrics", {})
    if "initial_chunk_frames" not in metrics:
        metrics["initial_chunk_frames"] = choose_initial_chunk_frames(
            options.initial_codec_chunk_frames, options.codec_chunk_frames, ctx.active_requests, ctx.max_num_seqs)
    if "frames" in output and np.asarray(output["frames"]).shape[-1]:
        accumulator.add(np.asarray(output["frames"]))
    chunks = accumulator.cut(options, metrics["initial_chunk_frames"], is_last)
    metrics["frame_chunks"] = accumulator.chunks_sent
    metrics["window_frames"] = accumulator.window_frames  # frames the vocoder decodes, context included
    return chunks
