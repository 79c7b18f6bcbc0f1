"""The Mimi decoder stage: frame-edge chunks of codes from an AR stage (CSM's or Moshi's frames) in, 24 kHz float32
audio out. Each request keeps a ``MimiDecodeStream`` (``modeling/stream.py``) from its first chunk until it is freed,
so its audio, chunk after chunk, equals one ``MimiModel.decode`` of all its frames, whatever the chunk sizes and the
edge's ``left_context_frames`` (0 is enough: the stream carries its own context; context frames a chunk repeats
are skipped, and lookahead frames are left for the chunk that brings them as new). A step's requests are decoded
together (``decode_together``): those with equal new-frame counts (all of them, for Moshi's 1-frame chunks) share
the upsampling and the SEANet pass; the transformer runs per request (each its own positions and KV cache).

Stage options: ``MimiDecoderOptions`` (``options.py``). It takes no SamplingParams."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnipipe.models.mimi.modeling.stream import (
    MimiDecodeStream,
    check_codes,
    decode_together,
    mimi_decode_geometry,
)
from omnipipe.models.mimi.options import MimiDecoderOptions
from omnipipe.models.mimi.weights.load import checkpoint_num_codebooks, load_config, load_mimi, mimi_layout
from omnipipe.stage.checkpoint_options import checked_options
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError

SAMPLE_RATE_HZ = 24_000
FRAME_RATE_HZ = 12.5  # code frames per second (1920 samples each)
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameWindow:
    """One chunk of a frame edge: ``codes`` [num_codebooks, context + new] (its lookahead frames dropped), the
    first of them frame ``first_frame`` of the request's stream."""

    codes: torch.Tensor
    first_frame: int

    @classmethod
    def from_chunk(cls, chunk: Mapping[str, Any], config: Any, num_codebooks: int) -> FrameWindow:
        """The window of a chunk as ``frames_async_chunk``/``frames_whole`` cut it (``frames`` [Q, context + new +
        lookahead] codes, ``context_frames``, ``start_frame``, ``lookahead_frames``); a ``FieldError`` naming the
        field at fault."""
        for name in ("frames", "context_frames", "start_frame"):
            if name not in chunk:
                raise FieldError(name, "missing from the chunk")
        codes = check_codes(chunk["frames"], config, num_codebooks, "frames")
        total = codes.shape[1]
        context = _whole_number("context_frames", chunk["context_frames"])
        start = _whole_number("start_frame", chunk["start_frame"])
        lookahead = _whole_number("lookahead_frames", chunk.get("lookahead_frames", 0))
        if context + lookahead > total:
            raise FieldError("context_frames", f"{context} context and {lookahead} lookahead frames are more than "
                             f"the chunk's {total} frames")
        if context > start:
            raise FieldError("context_frames", f"{context} frames before start_frame {start} do not exist")
        return cls(codes[:, : total - lookahead], start - context)

    def frames_from(self, frame: int) -> torch.Tensor:
        """Its codes from absolute frame ``frame`` on (none when it ends before; a ``FieldError`` when it starts
        after ``frame``: the frames between would be missing from the stream)."""
        if self.first_frame > frame:
            raise FieldError("start_frame", f"the chunk starts at frame {self.first_frame} (context included) but "
                             f"the stream has decoded {frame} frames: frames {frame}..{self.first_frame - 1} are "
                             "missing")
        return self.codes[:, frame - self.first_frame:]


def _whole_number(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise FieldError(field, f"must be an integer >= 0, got {value!r}")
    return int(value)


class MimiDecoderRunner(StageRunner):
    def load(self) -> None:
        options, directory, dtype = checked_options(self.context, MimiDecoderOptions)
        where = f"stages.{self.context.stage}.options"
        config = load_config(directory)
        try:
            layout = mimi_layout(config, options.weights_prefix, options.config_key)
        except ValueError as error:
            raise FieldError(f"{where}.weights_prefix", str(error)) from error
        self.model = load_mimi(directory, self.context.device, dtype, layout, encoder=False, config=config)
        if self.model.config.sampling_rate != SAMPLE_RATE_HZ:
            raise ValueError(f"{directory}: Mimi at {self.model.config.sampling_rate} Hz; the stage serves "
                             f"{SAMPLE_RATE_HZ} Hz")
        self.geometry = mimi_decode_geometry(self.model)
        self.num_codebooks = options.num_codebooks or checkpoint_num_codebooks(config, layout)
        try:
            MimiDecodeStream(self.model, self.num_codebooks, self.geometry)
        except FieldError as error:
            raise FieldError(f"{where}.num_codebooks", error.rule) from error
        logger.info("mimi decoder: %d codebooks a frame, %d samples a frame; a stream carries %d latent frame(s) "
                    "and %d transformer steps of context", self.num_codebooks, self.geometry.samples_per_frame,
                    self.geometry.upsample_context_frames, self.geometry.seanet_context_steps)

    def warmup(self) -> None:
        MimiDecodeStream(self.model, self.num_codebooks, self.geometry).decode(
            torch.zeros((self.num_codebooks, 2), dtype=torch.int64))

    def validate(self, params: dict[str, Any]) -> str | None:
        if params:
            raise FieldError("sampling_params", "the Mimi decoder decodes codes as they are: it takes no sampling "
                             f"params (got {', '.join(sorted(params))})")
        return None

    def _stream(self, request: StageRequest) -> MimiDecodeStream:
        if request.runner_state is None:
            request.runner_state = MimiDecodeStream(self.model, self.num_codebooks, self.geometry)
        stream: MimiDecodeStream = request.runner_state
        return stream

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs: list[RunnerOutput | None] = [None] * len(batch)
        work: list[tuple[int, MimiDecodeStream, torch.Tensor]] = []  # (place in the batch, stream, new codes)
        for place, request in enumerate(batch):
            chunk = request.take_input()
            assert chunk is not None  # a generation stage's request is scheduled with an input chunk (StageRunner)
            stream = self._stream(request)
            try:
                codes = FrameWindow.from_chunk(chunk, self.model.config, self.num_codebooks).frames_from(
                    stream.frames_decoded)
            except FieldError as error:
                outputs[place] = RunnerOutput.failed(request.request_id, error.rule, error.field)
                continue
            work.append((place, stream, codes))
        waves = decode_together([stream for _, stream, _ in work], [codes for _, _, codes in work])
        for (place, _, codes), wave in zip(work, waves, strict=True):
            outputs[place] = RunnerOutput(batch[place].request_id, num_units=codes.shape[1],
                                          audio=np.ascontiguousarray(wave.float().cpu().numpy(), np.float32),
                                          playback_s=wave.shape[0] / SAMPLE_RATE_HZ)
        return [output for output in outputs if output is not None]

    def snapshot(self, request: StageRequest) -> Any:
        """The stream's state (a decode binds a new one); None before its first chunk."""
        stream = request.runner_state
        return None if stream is None else stream.snapshot()

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            self.free(request)
        else:
            request.runner_state.restore(snapshot)

    def free(self, request: StageRequest) -> None:
        """Drop the request's stream (its KV cache and context)."""
        request.runner_state = None
