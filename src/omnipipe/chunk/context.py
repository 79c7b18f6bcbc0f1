"""What a chunk processor knows about the edge and the request when it decides to cut a chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChunkContext:
    codec_chunk_frames: int
    left_context_frames: int
    right_context_frames: int  # lookahead frames a window carries after its new frames (0 for causal vocoders)
    initial_chunk_frames: int  # size of this request's first chunk (already resolved from "auto")
    options: dict[str, Any] = field(default_factory=dict)  # the edge's deploy options (processor-specific)
