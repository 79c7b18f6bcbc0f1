"""The Qwen3-Omni code2wav stage: windows of codec frames ([num_quantizers, frames] codes with left context) in,
24 kHz audio out. Each window's samples are the ones its new frames add to the stream, so the concatenated stream
equals one decode of all the frames (``modeling/code2wav_stream.py``).

Stage options: ``model`` (checkpoint directory, required), ``device``, ``dtype``."""

from __future__ import annotations

import numpy as np
import torch

from omnipipe.models.qwen3_omni.weights.load import check_checkpoint, load_part, resolve_dtype
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner

SAMPLE_RATE_HZ = 24000


class QwenOmniCode2WavRunner(StageRunner):
    def load(self) -> None:
        options = self.context.options
        stage = self.context.stage
        directory = check_checkpoint(options.get("model"), f"stages.{stage}.options.model")
        self.device = str(options.get("device", self.context.device or "cpu"))
        dtype = resolve_dtype(options.get("dtype"), self.device, f"stages.{stage}.options.dtype")
        self.model = load_part(directory, "code2wav", self.device, dtype)
        self.upsample = int(self.model.total_upsample)

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            chunk = request.take_input()
            codes = torch.as_tensor(np.asarray(chunk["frames"]), dtype=torch.long, device=self.device)
            context = int(chunk.get("context_frames", 0))
            new = codes.shape[-1] - context - int(chunk.get("lookahead_frames", 0))
            wave = self.model(codes[None])[0, 0].float().cpu().numpy()
            audio = np.ascontiguousarray(wave[context * self.upsample: (context + new) * self.upsample])
            outputs.append(RunnerOutput(request.request_id, audio=audio.astype(np.float32), num_units=new))
        return outputs
