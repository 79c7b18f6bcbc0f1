"""The compute floor of time to first audio: what the first packet of one request costs with nothing else running
and no hop between stages.

The default pipeline's own stage runners are loaded in this process (one thread each, as the default deploy runs
them) and driven for one request at a time through the same edge processors the engine uses: the thinker's prefill,
its decode steps until the thinker -> talker processor cuts the first spoken piece, the talker on that piece, the
frame edge's first window, and the vocoder on that window. Each piece is timed on its own; their sum is the least a
first packet can take on this machine, whatever the framework does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.chunk.accumulation import FrameChunkOptions
from omnipipe.chunk.context import ChunkContext
from omnipipe.chunk.frame_processors import frames_async_chunk
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext


@dataclass
class FirstPacketFloor:
    """One request's first-packet pieces, in seconds."""

    prefill_s: float
    decode_s: float  # decode steps until the first spoken piece is cut
    decode_tokens: int
    talker_s: float  # the talker on that piece
    vocoder_s: float  # the vocoder on the first window of its frames
    first_piece: str

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s + self.talker_s + self.vocoder_s


def _request(request_id: str, params: dict[str, Any], inputs: list[dict[str, Any]]) -> StageRequest:
    request = StageRequest(request_id, params, emit_final=True, emit_data=True, chunk_targets=[])
    request.inputs.extend(inputs)
    request.input_finished = True
    return request


class FloorProbe:
    """The default pipeline's thinker, talker and vocoder runners in this process, for timing one request alone."""

    def __init__(self, thinker_options: dict[str, Any], frame_options: dict[str, Any],
                 spoken_options: dict[str, Any] | None = None, threads: int = 1) -> None:
        from omnipipe.models.default.processors import SpokenPieceOptions
        from omnipipe.models.default.runners.code2wav import PiperCode2WavRunner
        from omnipipe.models.default.runners.talker import PiperTalkerRunner
        from omnipipe.models.default.runners.thinker import ThinkerRunner

        def context(stage: str, options: dict[str, Any]) -> RunnerContext:
            return RunnerContext(stage, "cpu", threads, 1, dict(options))

        import torch

        torch.set_num_threads(threads)
        self.thinker = ThinkerRunner(context("thinker", thinker_options))
        self.talker = PiperTalkerRunner(context("talker", {}))
        self.vocoder = PiperCode2WavRunner(context("code2wav", {}))
        for runner in (self.thinker, self.talker, self.vocoder):
            runner.load()
            runner.warmup()
        self.frame_options = FrameChunkOptions(**frame_options)
        self.spoken_options = SpokenPieceOptions(**(spoken_options or {}))
        self._count = 0

    def measure(self, question: str, max_tokens: int) -> FirstPacketFloor:
        from omnipipe.models.default.processors import thinker2talker_async_chunk

        self._count += 1
        rid = f"floor-{self._count}"
        request = _request(rid, {"max_tokens": max_tokens}, [{"text": question, "history": []}])
        edge_state: dict[str, Any] = {}
        edge = ChunkContext(self.spoken_options, active_requests=1, max_num_seqs=1)
        try:
            start = time.perf_counter()
            (output,) = self.thinker.execute([request], True)
            prefill_s = time.perf_counter() - start
            pieces = thinker2talker_async_chunk(edge_state, output.data or {}, output.finished, edge)
            tokens, decode_s = 0, 0.0
            while not pieces and not output.finished:
                start = time.perf_counter()
                (output,) = self.thinker.execute([request], False)
                decode_s += time.perf_counter() - start
                tokens += 1
                pieces = thinker2talker_async_chunk(edge_state, output.data or {}, output.finished, edge)
        finally:
            self.thinker.free(request)
        piece = pieces[0] if pieces else {"text": "."}
        talk = _request(rid, {}, [piece])
        start = time.perf_counter()
        (spoken,) = self.talker.execute([talk], False)
        talker_s = time.perf_counter() - start
        frames = np.asarray((spoken.data or {})["frames"])
        frame_edge = ChunkContext(self.frame_options, active_requests=1, max_num_seqs=8)
        state: dict[str, Any] = {}
        # the talker's first piece: more may follow, unless the answer ended with it
        windows = frames_async_chunk(state, {"frames": frames}, output.finished and len(pieces) <= 1, frame_edge)
        if not windows:  # a piece shorter than the first chunk and its lookahead: the engine waits for the next one
            windows = frames_async_chunk(state, {}, True, frame_edge)
        vocoder_s = 0.0
        if windows:
            voc = _request(rid, {}, [windows[0]])
            start = time.perf_counter()
            self.vocoder.execute([voc], False)
            vocoder_s = time.perf_counter() - start
        return FirstPacketFloor(prefill_s, decode_s, tokens, talker_s, vocoder_s, str(piece.get("text", "")))

    def close(self) -> None:
        for runner in (self.thinker, self.talker, self.vocoder):
            runner.close()
