"""A Qwen2.5-Omni voice made from a short clip: the clip's mel spectrogram as the token2wav's reference mel.

What each part of a Qwen2.5-Omni voice is (``spk_dict.pt``, per name): ``bos_token``, the talker's start token;
``cond``, an x-vector the DiT adds to every frame; ``ref_mel``, a mel spectrogram [1, frames, mel_dim] that the DiT's
own ECAPA speaker encoder reads (``DiTInputEmbedding.spk_encoder``) in every evaluation. Of the three only the
reference mel can be made from audio with the checkpoint alone (the x-vector's speaker model is not part of it), so a
reference voice is a base voice of the checkpoint (its start token and x-vector) with the clip's mel in place of its
``ref_mel``: the token2wav stage's ``SamplingParams.extra["reference_mel"]`` (``Qwen25Token2WavParams``).

The mel is the one the DiT writes and BigVGAN reads (``process_mel_spectrogram`` takes its ``exp``): the natural log
of a mel amplitude spectrogram (clamped at 1e-5) at 24 kHz, one frame per vocoder hop (the product of BigVGAN's
``upsample_rates``: 240 samples, 100 frames per second), ``mel_dim`` bands. The analysis follows BigVGAN's
recipe (Hann window and FFT of 1024 samples, reflect-padded, Slaney mel filters from 0 Hz to Nyquist); Qwen has not
published the settings its own ``ref_mel`` tensors were made with, so a real checkpoint's voice follows the clip as
far as those settings agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

REFERENCE_RATE_HZ = 24_000
FFT_SAMPLES = 1024
LOG_FLOOR = 1e-5


def _framing(directory: Path) -> tuple[int, int]:
    """(hop in samples, mel bands) of the checkpoint's token2wav."""
    from omnipipe.models.qwen2_5_omni.weights.load import load_config

    token2wav = load_config(directory).token2wav_config
    return int(np.prod(token2wav.bigvgan_config.upsample_rates)), int(token2wav.dit_config.mel_dim)


def reference_mel(samples: np.ndarray, hop: int, bands: int) -> np.ndarray:
    """``samples`` (float32 mono at 24 kHz) -> their log mel spectrogram [frames, bands] (float32), one frame per
    ``hop`` samples."""
    import torch
    from transformers.audio_utils import mel_filter_bank

    filters = mel_filter_bank(FFT_SAMPLES // 2 + 1, bands, 0.0, REFERENCE_RATE_HZ / 2, REFERENCE_RATE_HZ,
                              norm="slaney", mel_scale="slaney")  # [freq, bands]
    wave = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))[None]
    pad = (FFT_SAMPLES - hop) // 2
    wave = torch.nn.functional.pad(wave[None], (pad, pad), mode="reflect")[0]
    spectrum = torch.stft(wave, FFT_SAMPLES, hop_length=hop, win_length=FFT_SAMPLES,
                          window=torch.hann_window(FFT_SAMPLES), center=False, return_complex=True)
    amplitude = spectrum.abs()[0]  # [freq, frames]
    mel = torch.from_numpy(filters.T.astype(np.float32)) @ amplitude
    return torch.log(torch.clamp(mel, min=LOG_FLOOR)).T.contiguous().numpy()


def reference_from_clip(options: dict[str, Any], samples: np.ndarray, rate_hz: int) -> list[list[float]]:
    """The token2wav's ``extra["reference_mel"]`` for a clip (float32 mono at ``rate_hz``), framed as the checkpoint
    the stage options name (``ServingTraits.reference_voice``)."""
    from omnipipe.util.audio import resample

    if rate_hz != REFERENCE_RATE_HZ:
        samples = resample(samples, rate_hz, REFERENCE_RATE_HZ)
    hop, bands = _framing(Path(options["model"]))
    return reference_mel(samples, hop, bands).tolist()
