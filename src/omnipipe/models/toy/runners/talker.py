"""Toy talker: text -> 8-dim frames, ``frames_per_char`` per character, one batched call for many requests.

``extra`` is ``ToyTalkerParams``: ``speed`` (the pipeline's speed stage) stretches or squeezes a request's frames in
time.

Fault injection, for tests only (stage option ``fault_injection: true``; otherwise ignored): ``extra["fail"] = True``
in a request's talker params makes ``execute`` raise a RuntimeError after the whole batch's inputs were taken (alone
too), so that request fails and its batch-mates must come out as if it had never been there.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from omnipipe.models.toy.processors import ToyTalkerParams
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner

FRAME_DIM = 8


class ToyTalkerModel(torch.nn.Module):
    def __init__(self, frames_per_char: int) -> None:
        super().__init__()
        self.frames_per_char = frames_per_char
        generator = torch.Generator().manual_seed(1234)
        self.embed = torch.nn.Parameter(torch.rand(256, FRAME_DIM * frames_per_char, generator=generator) - 0.5)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """[N] -> [FRAME_DIM, N * frames_per_char]"""
        frames = self.embed[char_ids].reshape(-1, self.frames_per_char, FRAME_DIM)
        return frames.reshape(-1, FRAME_DIM).T.contiguous()


class ToyTalkerRunner(StageRunner):
    def load(self) -> None:
        self.frames_per_char = int(self.context.options.get("frames_per_char", 4))
        self.model = ToyTalkerModel(self.frames_per_char).eval()
        self.call_delay_s = float(self.context.options.get("call_delay_ms", 0)) / 1000
        self.fault_injection = bool(self.context.options.get("fault_injection", False))

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        pieces = []
        for request in batch:
            chunk = request.take_input()
            assert chunk is not None  # a generation stage's request is scheduled with an input chunk (StageRunner)
            pieces.append(list(chunk.get("text", "").encode("latin-1", errors="replace")))
        flat = torch.tensor([c for piece in pieces for c in piece], dtype=torch.long)
        frames = self.model(flat).numpy() if len(flat) else np.zeros((FRAME_DIM, 0), np.float32)
        if self.call_delay_s:
            time.sleep(self.call_delay_s)
        outputs, start = [], 0
        for request, piece in zip(batch, pieces, strict=True):
            count = len(piece) * self.frames_per_char
            block = frames[:, start : start + count]
            start += count
            extra = ToyTalkerParams(**(request.params.get("extra") or {}))  # checked when the request arrived
            if extra.fail and self.fault_injection:
                raise RuntimeError(f"injected fault in {request.request_id}")
            speed = float(extra.speed)
            if speed != 1.0:
                block = block[:, (np.arange(int(round(count / speed))) * speed).astype(np.int64)]
            block = np.ascontiguousarray(block)
            count = block.shape[1]
            outputs.append(RunnerOutput(request.request_id, data={"frames": block}, num_units=count))
        return outputs
