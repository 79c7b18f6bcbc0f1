"""Talker: Piper's VITS text/duration network turns each text piece into latent frames [192, T]."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnipipe.models.default.modeling.piper_talker import PiperTalker
from omnipipe.models.default.weights.voice import prepare_voice
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner


class PiperTalkerRunner(StageRunner):
    """Options (deploy ``stages.talker.options``): noise_scale, noise_w (0 for deterministic speech)."""

    def load(self) -> None:
        self.paths = prepare_voice(progress=True)
        self.talker = PiperTalker(self.paths, num_threads=self.context.threads)
        self.noise_scale = float(self.context.options.get("noise_scale", 0.667))
        self.noise_w = float(self.context.options.get("noise_w", 0.8))

    def warmup(self) -> None:
        self.talker.synthesize_latents("Hello there.", noise_scale=self.noise_scale, noise_w=self.noise_w)

    def validate(self, params: dict[str, Any]) -> str | None:
        return _speed_problem((params.get("extra") or {}).get("speed", 1.0))

    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            text = str((request.take_input() or {}).get("text", "")).strip()
            speed = (request.params.get("extra") or {}).get("speed", 1.0)
            problem = _speed_problem(speed)
            if problem is not None:  # validate() refused it on arrival already; never fail the batch over it
                outputs.append(RunnerOutput(request.request_id, error=problem))
                continue
            speed = float(speed)
            if text:
                latents = self.talker.synthesize_latents(text, noise_scale=self.noise_scale, length_scale=1.0 / speed,
                                                         noise_w=self.noise_w)
            else:
                latents = np.zeros((self.paths.latent_channels, 0), np.float32)
            outputs.append(RunnerOutput(request.request_id, data={"frames": latents}, num_units=latents.shape[1]))
        return outputs


def _speed_problem(speed: Any) -> str | None:
    """Why ``extra["speed"]`` cannot be used (a number in [0.25, 4] is needed), or None."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        return f"speed: must be a number in [0.25, 4], got {speed!r}"
    return None
