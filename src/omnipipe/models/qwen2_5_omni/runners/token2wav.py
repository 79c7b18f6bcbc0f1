"""The Qwen2.5-Omni token2wav stage: codec code windows -> waveform at 24 kHz through
``Qwen2_5OmniToken2WavModel`` (DiT + BigVGAN), streamed per request with fixed noise and context
(``modeling/token2wav_stream.py``), one step decoding the windows of every request of its batch together (one DiT
forward per ODE evaluation for all of them); a request's voice is encoded once, when its first window comes.
float32 unless its ``dtype`` option says otherwise (``Token2WavOptions``; the ODE itself stays float32). The noise
seed is the token2wav stage's ``SamplingParams.seed`` (0 without one); its token-sampling fields have no meaning
here and are refused unless neutral (``max_tokens`` is not read: the talker's bounds the codes). A request's
``extra["reference_mel"]`` (``Qwen25Token2WavParams``: a voice made from a clip, ``reference_voice.py``) replaces
its voice's reference mel; the voice's x-vector stays."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from omnipipe.models.qwen2_5_omni.modeling.token2wav_stream import (
    Token2WavStream,
    Token2WavWindow,
    decode_windows,
    utterance_noise,
)
from omnipipe.models.qwen2_5_omni.options import Token2WavOptions
from omnipipe.models.qwen2_5_omni.processors import DEFAULT_SPEAKER, Qwen25Token2WavParams
from omnipipe.models.qwen2_5_omni.weights.load import load_part, load_speakers
from omnipipe.stage.checkpoint_options import checked_options
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError

if TYPE_CHECKING:
    from transformers import PreTrainedConfig
    from transformers.models.qwen2_5_omni import Qwen2_5OmniToken2WavModel

SAMPLE_RATE_HZ = 24_000
# SamplingParams fields with the value that leaves decoding as it is: the only ones token2wav accepts
NEUTRAL_PARAMS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "stop": [], "repetition_penalty": 1.0,
                  "presence_penalty": 0.0, "frequency_penalty": 0.0}


class Qwen25Token2WavRunner(StageRunner):
    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, Token2WavOptions)
        self.device = torch.device(self.context.device)
        self.model = cast("Qwen2_5OmniToken2WavModel", load_part(directory, "token2wav", self.device, dtype))
        # the vocoder's anti-aliasing filters are buffers built in float32 whatever dtype the weights load in
        self.model.code2wav_bigvgan_model.to(dtype)
        self.speakers = {name: (s["cond"].float().to(self.device), s["ref_mel"].float().to(self.device))
                         for name, s in load_speakers(directory).items()}
        self.vocoder_left_mel = self.options.vocoder_left_mel
        # codes past the DiT's codec embedding would be a device assert on a GPU (the stage and all its requests
        # lost): a window holding one fails its own request before any embedding
        self.num_codes: int = self.model.code2wav_dit_model.text_embed.codec_embed.num_embeddings

    def validate(self, params: dict[str, Any]) -> str | None:
        for name, neutral in NEUTRAL_PARAMS.items():
            if params.get(name, neutral) != neutral:
                raise FieldError(f"sampling_params.{name}", f"token2wav samples no tokens: leave it {neutral!r} "
                                 f"(only seed applies here), got {params[name]!r}")
        mel = Qwen25Token2WavParams(**(params.get("extra") or {})).reference_mel
        # a built config's dit_config is a config (transformers types the field as what it may be given)
        bands = cast("PreTrainedConfig", self.model.config.dit_config).mel_dim
        if mel is not None and len(mel[0]) != bands:
            raise FieldError("sampling_params.extra.reference_mel", f"frames of {bands} mel bands expected, got "
                             f"{len(mel[0])}")
        return None

    def _stream(self, request: StageRequest, speaker: str | None) -> Token2WavStream:
        """The request's stream, started (its voice encoded, its noise drawn) at its first window."""
        if request.runner_state is None:
            conditioning, reference_mel = self.speakers[speaker or DEFAULT_SPEAKER]
            reference = Qwen25Token2WavParams(**(request.params.get("extra") or {})).reference_mel
            if reference is not None:
                reference_mel = torch.tensor(reference, dtype=torch.float32, device=self.device)[None]
            seed = request.params.get("seed")
            noise = utterance_noise(self.model, 0 if seed is None else int(seed), self.device)
            request.runner_state = Token2WavStream.start(self.model, conditioning, reference_mel, noise,
                                                         vocoder_left_mel=self.vocoder_left_mel)
        return request.runner_state

    @staticmethod
    def _window(frames: np.ndarray, chunk: dict[str, Any], device: torch.device) -> Token2WavWindow:
        codes = torch.tensor(frames.reshape(-1), device=device)  # a copy: the input is read-only
        return Token2WavWindow(codes, int(chunk.get("start_frame", 0)), int(chunk.get("context_frames", 0)),
                               int(chunk.get("lookahead_frames", 0)))

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs = [RunnerOutput(request.request_id) for request in batch]
        decoding: list[tuple[int, Token2WavStream, Token2WavWindow]] = []
        for i, request in enumerate(batch):
            chunk = request.take_input() or {}
            frames = np.asarray(chunk.get("frames", np.zeros((1, 0), np.int64)))
            problem = codes_out_of_range(frames, self.num_codes)
            if problem is not None:
                outputs[i] = RunnerOutput.failed(request.request_id, f"token2wav: {problem}")
                continue
            window = self._window(frames, chunk, self.device)
            if window.new_codes > 0:
                decoding.append((i, self._stream(request, chunk.get("speaker")), window))
        if decoding:
            audios = decode_windows(self.model, [stream for _, stream, _ in decoding],
                                    [window for _, _, window in decoding])
            for (i, _, window), audio in zip(decoding, audios, strict=True):
                outputs[i] = RunnerOutput(batch[i].request_id, audio=audio.float().cpu().numpy(),
                                          num_units=window.new_codes)
        return outputs

    def snapshot(self, request: StageRequest) -> Any:
        """The stream's vocoder context (a step replaces it, never changes it in place); None before its first
        window (``restore`` then drops the stream the failed step started)."""
        stream = request.runner_state
        return None if stream is None else (stream.mel_tail,)

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            self.free(request)
        else:
            request.runner_state.mel_tail = snapshot[0]


def codes_out_of_range(frames: np.ndarray, num_codes: int) -> str | None:
    """Why a window's codes cannot be embedded (one outside ``[0, num_codes)``, or not integers), or None; read on
    the host, before the codes reach the device (Qwen3's code2wav checks its windows the same way,
    ``code2wav_stream.py``)."""
    if frames.size == 0:
        return None
    if not np.issubdtype(frames.dtype, np.integer):
        return f"codes must be integers, got {frames.dtype}"
    low, high = int(frames.min()), int(frames.max())
    if low < 0 or high >= num_codes:
        return f"code {low if low < 0 else high} is outside the vocoder's codebook [0, {num_codes})"
    return None
