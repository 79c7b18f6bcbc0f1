"""Toy code2wav: a causal conv vocoder (receptive field 3 frames) that upsamples each frame to 32 samples.

Batched: windows of many requests are right-padded into one [B, 8, T] tensor and run in one call. With at least
2 frames of left context, a chunked decode equals the whole decode exactly.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from omnipipe.models.toy.runners.talker import FRAME_DIM
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner

HOP_SAMPLES = 32
SAMPLE_RATE_HZ = 8000
RECEPTIVE_FIELD_FRAMES = 3


class ToyVocoderModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(99)
        self.conv = torch.nn.Conv1d(FRAME_DIM, 16, RECEPTIVE_FIELD_FRAMES)
        self.up = torch.nn.ConvTranspose1d(16, 1, HOP_SAMPLES, stride=HOP_SAMPLES)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, 8, T] -> [B, T * HOP_SAMPLES]"""
        padded = torch.nn.functional.pad(frames, (RECEPTIVE_FIELD_FRAMES - 1, 0))
        return torch.tanh(self.up(torch.tanh(self.conv(padded)))).squeeze(1)


def decode_whole(frames: np.ndarray) -> np.ndarray:
    """Reference: decode all frames in one call."""
    with torch.inference_mode():
        return ToyVocoderModel()(torch.from_numpy(np.ascontiguousarray(frames))[None]).numpy()[0]


class ToyVocoderRunner(StageRunner):
    def load(self) -> None:
        self.model = ToyVocoderModel().eval()
        self.call_delay_s = float(self.context.options.get("call_delay_ms", 0)) / 1000
        self.batch_sizes: list[int] = []

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        chunks = []
        for request in batch:
            chunk = request.take_input()
            assert chunk is not None  # a generation stage's request is scheduled with an input chunk (StageRunner)
            chunks.append(chunk)
        windows = [np.asarray(c["frames"], dtype=np.float32) for c in chunks]
        longest = max(w.shape[1] for w in windows)
        stacked = np.zeros((len(windows), FRAME_DIM, longest), np.float32)
        for i, window in enumerate(windows):
            stacked[i, :, : window.shape[1]] = window
        waves = self.model(torch.from_numpy(stacked)).numpy()
        if self.call_delay_s:
            time.sleep(self.call_delay_s)
        self.batch_sizes.append(len(batch))
        outputs = []
        for request, chunk, window, wave in zip(batch, chunks, windows, waves, strict=True):
            context = int(chunk.get("context_frames", 0))
            new_frames = window.shape[1] - context - int(chunk.get("lookahead_frames", 0))
            audio = np.ascontiguousarray(wave[context * HOP_SAMPLES : (context + new_frames) * HOP_SAMPLES])
            outputs.append(RunnerOutput(request.request_id, audio=audio, num_units=new_frames,
                                        data={"batch_size": len(batch)}))
        return outputs
