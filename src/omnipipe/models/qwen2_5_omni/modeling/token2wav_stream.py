"""Streaming token2wav (DiT codes -> mel, BigVGAN mel -> waveform) for Qwen2.5-Omni, chunk by chunk, equal to a
whole decode as far as the models' receptive fields allow, and batched over requests: one step decodes the windows
of every request together (the DiT sampler in ``token2wav_dit.py``, BigVGAN once per distinct window length).

- Fixed noise: the DiT's sampler starts from Gaussian noise. The noise of an utterance is drawn once, seeded per
  request, for the longest utterance the DiT takes; a chunk reads its slice, so a chunk sees the noise a whole
  decode sees at the same frames (and a whole decode equals transformers' own, which draws the same numbers from
  the global generator seeded alike: a prefix of a longer draw equals a shorter draw).
- DiT context: a window decodes ``left`` context codes before its new codes and ``right`` after them, and keeps
  the mel of the new codes. The DiT's attention works in blocks of ``block_size`` mel frames (some layers see one
  block back or ahead), so windows start on a block boundary of the whole utterance.
- BigVGAN context: the vocoder is non-causal; each new stretch of mel is vocoded with the mel before it (kept from
  earlier chunks) and the right-context mel of its window, and only the new stretch's samples are kept. Its
  convolutions pad each input's ends with zeros, so windows are vocoded together only when equally long (padding
  one would change its last samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnipipe.models.qwen2_5_omni.modeling.token2wav_dit import (
    SpeakerConditioning,
    dit_mels,
    model_dtype,
    ode_dtype,
    speaker_conditioning,
)


def hop_samples(token2wav: Any) -> int:
    return int(np.prod(token2wav.config.bigvgan_config.upsample_rates))


def utterance_noise(token2wav: Any, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The DiT's starting noise for a whole utterance of the longest length it takes: [1, max_mel, mel_dim]."""
    config = token2wav.config.dit_config
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn([1, config.max_position_embeddings, config.mel_dim], generator=generator)
    return noise.to(device)


@torch.no_grad()
def vocode(token2wav: Any, mels: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """BigVGAN: mels [mel_dim, F_i] -> waveforms [F_i * hop] (in ``ode_dtype``), one call per distinct length."""
    bigvgan = token2wav.code2wav_bigvgan_model
    dtype = model_dtype(bigvgan)
    by_length: dict[int, list[int]] = {}
    for i, mel in enumerate(mels):
        by_length.setdefault(mel.shape[1], []).append(i)
    waves: dict[int, torch.Tensor] = {}
    for indices in by_length.values():
        batch = torch.stack([mels[i] for i in indices]).to(dtype)
        for i, wave in zip(indices, bigvgan(batch).reshape(len(indices), -1), strict=True):
            waves[i] = wave.to(ode_dtype(bigvgan))
    return [waves[i] for i in range(len(mels))]


@torch.no_grad()
def decode_whole(token2wav: Any, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor,
                 noise: torch.Tensor) -> torch.Tensor:
    """All codes [1, T] in one DiT call and one BigVGAN call."""
    frames = codes.shape[1] * token2wav.code2wav_dit_model.repeats
    speaker = speaker_conditioning(token2wav, conditioning, reference_mel)
    mel = dit_mels(token2wav, [codes[0]], [speaker], [noise[0, :frames]])[0]
    return vocode(token2wav, [mel])[0]


@dataclass(frozen=True)
class Token2WavWindow:
    """A window of codes [L + N + R] whose N new codes begin at ``start_code``: L context codes before them and R
    look-ahead codes after them."""

    codes: torch.Tensor
    start_code: int
    context_codes: int
    lookahead_codes: int

    @property
    def new_codes(self) -> int:
        return self.codes.shape[0] - self.context_codes - self.lookahead_codes


@dataclass
class Token2WavStream:
    """One utterance decoded window by window: its voice (encoded once), its noise [1, max_mel, mel_dim], and the
    last ``vocoder_left_mel`` mel frames decoded (the vocoder's left context for the next window)."""

    speaker: SpeakerConditioning
    noise: torch.Tensor
    vocoder_left_mel: int = 24
    mel_tail: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def start(cls, token2wav: Any, conditioning: torch.Tensor, reference_mel: torch.Tensor, noise: torch.Tensor,
              vocoder_left_mel: int = 24) -> Token2WavStream:
        return cls(speaker_conditioning(token2wav, conditioning, reference_mel), noise, vocoder_left_mel)


@torch.no_grad()
def decode_windows(token2wav: Any, streams: Sequence[Token2WavStream],
                   windows: Sequence[Token2WavWindow]) -> list[torch.Tensor]:
    """One window of each stream decoded together -> each window's new codes' samples. The streams'
    vocoder context moves on only once every window is decoded, so a call that raises leaves them as they were."""
    repeats = token2wav.code2wav_dit_model.repeats
    noises = []
    for stream, window in zip(streams, windows, strict=True):
        first = (window.start_code - window.context_codes) * repeats
        noises.append(stream.noise[0, first : first + window.codes.shape[0] * repeats])
    mels = dit_mels(token2wav, [w.codes for w in windows], [s.speaker for s in streams], noises)
    histories, vocoder_inputs = [], []
    for stream, window, mel in zip(streams, windows, mels, strict=True):
        new_end = (window.context_codes + window.new_codes) * repeats
        new_mel = mel[:, window.context_codes * repeats : new_end]
        left_mel = stream.mel_tail if stream.mel_tail is not None else new_mel[:, :0]
        histories.append(torch.cat([left_mel, new_mel], dim=1))
        vocoder_inputs.append(torch.cat([left_mel, new_mel, mel[:, new_end:]], dim=1))
    hop = hop_samples(token2wav)
    audios = []
    for stream, history, wave in zip(streams, histories, vocode(token2wav, vocoder_inputs), strict=True):
        left = 0 if stream.mel_tail is None else stream.mel_tail.shape[1]
        audios.append(wave[left * hop : history.shape[1] * hop])
    for stream, history in zip(streams, histories, strict=True):
        stream.mel_tail = history[:, max(0, history.shape[1] - stream.vocoder_left_mel):]
    return audios


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
    stream = Token2WavStream.start(token2wav, conditioning, reference_mel, noise,
                                   vocoder_left_mel=vocoder_left_mel if left else 0)
    pieces, decoded = [], 0
    for start, context, lookahead in _windows(codes.shape[1], chunk, left, right, block_codes):
        count = min(chunk, codes.shape[1] - start)
        window = Token2WavWindow(codes[0, start - context : start + count + lookahead], start, context, lookahead)
        pieces.append((start * samples_per_code, decode_windows(token2wav, [stream], [window])[0]))
        decoded += window.codes.shape[0]
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
