"""What a chunk processor knows about the edge and the request when it decides to cut a chunk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChunkContext:
    options: Any  # the edge's options (its EdgeSpec.options dataclass, request overrides applied), or None
    active_requests: int  # requests the producing stage held when this one arrived (load, for adaptive sizes)
    max_num_seqs: int  # the producing stage's batch limit
