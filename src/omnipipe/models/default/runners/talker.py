"""Talker: Piper's VITS text/duration network turns each text piece into latent frames [192, T].

A piece of several sentences (a whole ``/v1/audio/speech`` input) is spoken a sentence a step: the rest goes back
to the front of the request's inputs, so the first frames leave after the first sentence, however long the text.
"""

from __future__ import annotations

import numpy as np

from omnipipe.models.default.modeling.piper_talker import PiperTalker
from omnipipe.models.default.processors import PiperTalkerParams, first_sentence
from omnipipe.models.default.weights.voice import onnx_providers, prepare_voice
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner


class PiperTalkerRunner(StageRunner):
    """Options (deploy ``stages.talker.options``): noise_scale, noise_w (0 for deterministic speech)."""

    def load(self) -> None:
        self.paths = prepare_voice(progress=True)
        self.talker = PiperTalker(self.paths, num_threads=self.context.threads,
                                  providers=onnx_providers(self.context.device, self.context.stage))
        self.noise_scale = float(self.context.options.get("noise_scale", 0.667))
        self.noise_w = float(self.context.options.get("noise_w", 0.8))
        self.frame_s = self.paths.hop_samples / self.paths.sample_rate_hz  # the playback one latent frame becomes

    def warmup(self) -> None:
        self.talker.synthesize_latents("Hello there.", noise_scale=self.noise_scale, noise_w=self.noise_w)

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            text, rest = first_sentence(str((request.take_input() or {}).get("text", "")))
            if rest:  # spoken at the next step
                request.inputs.appendleft({"text": rest})
                request.consumed_inputs -= 1
            speed = float(PiperTalkerParams(**(request.params.get("extra") or {})).speed)  # checked on arrival
            if text:
                latents = self.talker.latents_at_speed(self.talker.phonemize(text), speed,
                                                       noise_scale=self.noise_scale, noise_w=self.noise_w)
            else:
                latents = np.zeros((self.paths.latent_channels, 0), np.float32)
            outputs.append(RunnerOutput(request.request_id, data={"frames": latents}, num_units=latents.shape[1],
                                        playback_s=latents.shape[1] * self.frame_s))
        return outputs
