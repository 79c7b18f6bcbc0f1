"""The Qwen3-Omni code2wav stage: windows of codec frames ([num_quantizers, frames] codes with left context) in,
24 kHz audio out. Each window's samples are the ones its new frames add to the stream, so the concatenated stream
equals one decode of all the frames (``modeling/code2wav_stream.py``).

Stage options: ``Code2WavOptions`` (``options.py``). It takes no SamplingParams."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from omnipipe.models.qwen3_omni.modeling.code2wav_stream import (
    CodeWindow,
    decode_windows,
    exact_left_context_frames,
)
from omnipipe.models.qwen3_omni.options import Code2WavOptions
from omnipipe.models.qwen3_omni.weights.load import load_part
from omnipipe.stage.checkpoint_options import checked_options
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError

if TYPE_CHECKING:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

SAMPLE_RATE_HZ = 24000
logger = logging.getLogger(__name__)


class Qwen3Code2WavRunner(StageRunner):
    def load(self) -> None:
        _, directory, dtype = checked_options(self.context, Code2WavOptions)
        self.model = cast("Qwen3OmniMoeCode2Wav", load_part(directory, "code2wav", self.context.device, dtype))
        exact = exact_left_context_frames(self.model)
        logger.info("code2wav: a left context of %d frames makes a streamed decode equal the whole decode "
                    "(edge option left_context_frames)", exact)

    def validate(self, params: dict[str, Any]) -> str | None:
        if params:
            raise FieldError("sampling_params", "the code2wav stage decodes codes as they are: it takes no "
                             f"sampling params (got {', '.join(sorted(params))})")
        return None

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        chunks = [request.take_input() for request in batch]
        windows = []
        for chunk in chunks:
            assert chunk is not None  # a generation stage's request is scheduled with an input chunk (StageRunner)
            windows.append(CodeWindow.from_chunk(chunk))
        waves = decode_windows(self.model, windows)
        return [RunnerOutput(request.request_id, audio=np.ascontiguousarray(wave.float().cpu().numpy(), np.float32),
                             num_units=window.frames.shape[-1] - window.context_frames)
                for request, window, wave in zip(batch, windows, waves, strict=True)]
