"""The Qwen2.5-Omni token2wav stage: codec code windows -> waveform at 24 kHz through
``Qwen2_5OmniToken2WavModel`` (DiT + BigVGAN), streamed per request with fixed noise and context
(``modeling/token2wav_stream.py``); float32 unless its ``dtype`` option says otherwise (``Token2WavOptions``). The
noise seed is the token2wav
stage's ``SamplingParams.seed`` (0 without one); its token-sampling fields have no meaning here and are refused
unless neutral (``max_tokens`` is not read: the talker's bounds the codes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnipipe.models.qwen2_5_omni.modeling.token2wav_stream import Token2WavStream, utterance_noise
from omnipipe.models.qwen2_5_omni.options import Token2WavOptions
from omnipipe.models.qwen2_5_omni.weights.load import load_part, load_speakers
from omnipipe.stage.checkpoint_options import checked_options
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError

SAMPLE_RATE_HZ = 24_000
DEFAULT_SPEAKER = "Chelsie"
# SamplingParams fields with the value that leaves decoding as it is: the only ones token2wav accepts
NEUTRAL_PARAMS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "stop": [], "repetition_penalty": 1.0,
                  "presence_penalty": 0.0, "frequency_penalty": 0.0}


class QwenOmniToken2WavRunner(StageRunner):
    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, Token2WavOptions)
        self.device = torch.device(self.context.device)
        self.model = load_part(directory, "token2wav", self.device, dtype)
        self.speakers = {name: (s["cond"].float().to(self.device), s["ref_mel"].float().to(self.device))
                         for name, s in load_speakers(directory).items()}
        self.vocoder_left_mel = self.options.vocoder_left_mel

    def validate(self, params: dict[str, Any]) -> str | None:
        for name, neutral in NEUTRAL_PARAMS.items():
            if params.get(name, neutral) != neutral:
                raise FieldError(f"sampling_params.{name}", f"token2wav samples no tokens: leave it {neutral!r} "
                                 f"(only seed applies here), got {params[name]!r}")
        return None

    def _stream(self, request: StageRequest, speaker: str | None) -> Token2WavStream:
        if request.runner_state is None:
            conditioning, reference_mel = self.speakers[speaker or DEFAULT_SPEAKER]
            seed = request.params.get("seed")
            noise = utterance_noise(self.model, 0 if seed is None else int(seed), self.device)
            request.runner_state = Token2WavStream(self.model, conditioning, reference_mel, noise,
                                                   vocoder_left_mel=self.vocoder_left_mel)
        return request.runner_state

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            chunk = request.take_input() or {}
            frames = np.asarray(chunk.get("frames", np.zeros((1, 0), np.int64)))
            context = int(chunk.get("context_frames", 0))
            lookahead = int(chunk.get("lookahead_frames", 0))
            new = frames.shape[-1] - context - lookahead
            if new <= 0:
                outputs.append(RunnerOutput(request.request_id))
                continue
            stream = self._stream(request, chunk.get("speaker"))
            codes = torch.tensor(frames.reshape(1, -1), device=self.device)  # a copy: the input is read-only
            audio = stream.decode(codes, int(chunk.get("start_frame", 0)), context, lookahead)
            outputs.append(RunnerOutput(request.request_id, audio=audio.float().cpu().numpy(), num_units=new))
        return outputs
