"""Streaming token2wav (DiT codes -> mel, BigVGAN mel -> waveform) for Qwen2.5-Omni, chunk by chunk, equal to a
whole decode as far as the models' receptive fields allow.

- Fixed noise: the DiT's sampler starts from Gaussian noise. The noise of an utterance is drawn once, seeded per
  request, for the longest utterance the DiT takes; a chunk reads its slice, so a chunk sees the noise a whole
  decode sees at the same frames (and a whole decode equals transformers' own, which draws the same numbers from
  the global generator seeded alike: a prefix of a longer draw equals a shorter draw).
- DiT context: a window decodes ``left`` context codes before its new codes and ``right`` after them, and keeps
  the mel of the new codes. The DiT's attention works in blocks of ``block_size`` mel frames (some layers see one
  block back or ahead), so windows start on a block boundary of the whole utterance.
- BigVGAN context: the vocoder is non-causal; each new stretch of mel is vocoded with the mel before it (kept from
  earlier chunks) and the right-context mel of its window, and only the new stretch's samples are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

NUM_STEPS = 10
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0


def hop_samples(token2wav: Any) -> int:
    return int(np.prod(token2wav.config.bigvgan_config.upsample_rates))


def utterance_noise(token2wav: Any, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The DiT's starting noise for a whole utterance of the longest length it takes: [1, max_mel, mel_dim]."""
    config = token2wav.config.dit_config
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn([1, config.max_position_embeddings, config.mel_dim], generator=generator)
    return noise.to(device)


@torch.no_grad()
def dit_mel(token2wav: Any, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor,
            noise: torch.Tensor, num_steps: int = NUM_STEPS, guidance_scale: float = GUIDANCE_SCALE,
            sway_coefficient: float = SWAY_COEFFICIENT) -> torch.Tensor:
    """The DiT's sampler (as ``Qwen2_5OmniToken2WavDiTModel.sample``) from the given starting ``noise``
    [1, 2 * codes, mel_dim] instead of a fresh draw: codes [1, T] -> mel [1, mel_dim, repeats * T]."""
    dit = token2wav.code2wav_dit_model
    frames = codes.shape[1] * dit.repeats
    if noise.shape[1] != frames:
        raise ValueError(f"noise covers {noise.shape[1]} mel frames, the codes need {frames}")
    condition = conditioning.unsqueeze(1).repeat(1, frames, 1)

    def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        output = dit(hidden_states=state, quantized_code=codes, speaker_embedding=condition,
                     condition_vector=reference_mel, time_step=time_step, apply_cfg=True)
        guided, unconditioned = torch.chunk(output, 2, dim=0)
        return guided + (guided - unconditioned) * guidance_scale

    times = torch.linspace(0, 1, num_steps, device=codes.device, dtype=condition.dtype)
    if sway_coefficient is not None:
        times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    trajectory = RungeKutta4ODESolver(function=velocity, initial_value=noise.to(condition.dtype)).integrate(times)
    return trajectory[-1].permute(0, 2, 1)


@torch.no_grad()
def vocode(token2wav: Any, mel: torch.Tensor) -> torch.Tensor:
    """BigVGAN: mel [1, mel_dim, F] -> waveform [F * hop]."""
    return token2wav.code2wav_bigvgan_model(mel).reshape(-1)


@torch.no_grad()
def decode_whole(token2wav: Any, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor,
                 noise: torch.Tensor) -> torch.Tensor:
    """All codes [1, T] in one DiT call and one BigVGAN call."""
    repeats = token2wav.code2wav_dit_model.repeats
    mel = dit_mel(token2wav, codes, conditioning, reference_mel, noise[:, : codes.shape[1] * repeats])
    return vocode(token2wav, mel)


@dataclass
class Token2WavStream:
    """One utterance decoded window by window. ``vocoder_left_mel`` mel frames before each new stretch are kept
    for the vocoder's left context."""

    token2wav: Any
    conditioning: torch.Tensor
    reference_mel: torch.Tensor
    noise: torch.Tensor
    vocoder_left_mel: int = 24
    mel_tail: torch.Tensor | None = field(default=None, repr=False)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, start_code: int, context_codes: int, lookahead_codes: int) -> torch.Tensor:
        """A window of codes [1, L + N + R] whose N new codes begin at ``start_code`` -> the N codes' samples."""
        repeats = self.token2wav.code2wav_dit_model.repeats
        first = (start_code - context_codes) * repeats
        noise = self.noise[:, first : first + codes.shape[1] * repeats]
        mel = dit_mel(self.token2wav, codes, self.conditioning, self.reference_mel, noise)
        new_count = codes.shape[1] - context_codes - lookahead_codes
        new_mel = mel[:, :, context_codes * repeats : (context_codes + new_count) * repeats]
        right_mel = mel[:, :, (context_codes + new_count) * repeats :]
        left_mel = self.mel_tail if self.mel_tail is not None else new_mel[:, :, :0]
        wave = vocode(self.token2wav, torch.cat([left_mel, new_mel, right_mel], dim=2))
        hop = hop_samples(self.token2wav)
        audio = wave[left_mel.shape[2] * hop : (left_mel.shape[2] + new_mel.shape[2]) * hop]
        history = torch.cat([left_mel, new_mel], dim=2)
        self.mel_tail = history[:, :, max(0, history.shape[2] - self.vocoder_left_mel):]
        return audio


def _windows(total: int, chunk: int, left: int, right: int, aligned_to: int) -> list[tuple[int, int, int]]:
    """(start, context, lookahead) of each window of a stream of ``total`` codes cut every ``chunk`` codes."""
    windows, start = [], 0
    while start < total:
        count = min(chunk, total - start)
        context = min(left, start)
        context -= (start - context) % aligned_to if aligned_to else 0
        windows.append((start, context, min(right, total - start - count)))
        start += count
    return windows


@torch.no_grad()
def stream_windows(token2wav: Any, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor,
                   noise: torch.Tensor, chunk: int, left: int, right: int,
                   vocoder_left_mel: int = 48) -> tuple[list[tuple[int, torch.Tensor]], int]:
    """``codes`` [1, T] decoded as the token2wav stage streams them: windows of ``chunk`` new codes with up to
    ``left`` context codes (on the DiT's block boundaries) and ``right`` look-ahead codes, the vocoder reading
    ``vocoder_left_mel`` mel frames before each new stretch (none without left context). Returns the pieces
    (stream position of the first sample, the samples) in order, and the codes decoded (context counted each
    time)."""
    block_codes = token2wav.config.dit_config.block_size // token2wav.code2wav_dit_model.repeats
    samples_per_code = token2wav.code2wav_dit_model.repeats * hop_samples(token2wav)
    stream = Token2WavStream(token2wav, conditioning, reference_mel, noise,
                             vocoder_left_mel=vocoder_left_mel if left else 0)
    pieces, decoded = [], 0
    for start, context, lookahead in _windows(codes.shape[1], chunk, left, right, block_codes):
        count = min(chunk, codes.shape[1] - start)
        window = codes[:, start - context : start + count + lookahead]
        pieces.append((start * samples_per_code, stream.decode(window, start, context, lookahead)))
        decoded += window.shape[1]
    return pieces, decoded


@torch.no_grad()
def token2wav_seam_rows(token2wav: Any, codes: torch.Tensor, conditioning: torch.Tensor,
                        reference_mel: torch.Tensor, seed: int = 0,
                        settings: tuple[tuple[str, int, int, int], ...] = (
                            ("no context", 24, 0, 0), ("left context", 24, 24, 0),
                            ("left + right context", 24, 24, 12), ("left + right context", 24, 48, 24),
                            ("left + right context", 12, 48, 24)),
                        vocoder_left_mel: int = 48) -> list[dict[str, Any]]:
    """How far a chunked stream of ``codes`` [1, T] is from the whole decode, with the same noise: per setting
    (method, chunk_frames, left context codes, right context codes) the row ``{"method", "chunk_frames",
    "context", "rel_error": max |diff| / max |whole|, "samples_missing": whole length - stream length}``."""
    noise = utterance_noise(token2wav, seed, codes.device).to(conditioning.dtype)
    whole = decode_whole(token2wav, codes, conditioning, reference_mel, noise)
    rows = []
    for method, chunk, left, right in settings:
        pieces, _ = stream_windows(token2wav, codes, conditioning, reference_mel, noise, chunk, left, right,
                                   vocoder_left_mel)
        streamed = torch.cat([samples for _, samples in pieces])
        length = min(len(streamed), len(whole))
        diff = (streamed[:length] - whole[:length]).abs().max().item() if length else 0.0
        rows.append({"method": method, "chunk_frames": chunk, "context": f"{left}/{right}",
                     "rel_error": diff / max(whole.abs().max().item(), 1e-12),
                     "samples_missing": len(whole) - len(streamed)})
    return rows
