"""Voxtral Realtime's inputs, built here rather than by mistral-common (which transformers'
``VoxtralRealtimeProcessor`` needs): the checkpoint's ``tekken.json`` read as a BPE tokenizer by transformers' own
converter, its ``audio`` section read for the streaming geometry, and the log-mel frames made by transformers'
``VoxtralRealtimeFeatureExtractor`` (which needs no mistral-common).

The layout is mistral-common's offline streaming transcription (``encode_transcription`` with
``StreamingMode.OFFLINE``), the ids read from ``tekken.json``:

- ids: ``<s>`` then ``[STREAMING_PAD]`` x (``streaming_n_left_pad_tokens`` + delay tokens), the delay tokens being
  ``transcription_delay_ms`` in 80 ms tokens (480 ms: 6);
- audio: the clip with ``streaming_n_left_pad_tokens`` tokens of silence before it and, after it, silence up to a
  whole token and then delay + 1 + ``OFFLINE_BUFFER_TOKENS`` tokens more (so the words said last are heard before
  the audio ends); its log-mel frames (centred STFT, 8 a token).

The model reads one audio token (8 mel frames, 80 ms) at every position, the prompt's included, so a clip of N
tokens (padding included) gives N - len(ids) text tokens."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnipipe.models.voxtral.prompting import BOS, EOS, TEKKEN_FILE, load_tekken

STREAMING_PAD, STREAMING_WORD = "[STREAMING_PAD]", "[STREAMING_WORD]"
OFFLINE_BUFFER_TOKENS = 10  # mistral-common's OFFLINE_STREAMING_BUFFER_TOKENS: the longest word, in tokens


@dataclass(frozen=True)
class StreamingGeometry:
    """``tekken.json``'s ``audio`` section, as far as the prompt needs it."""

    sample_rate_hz: int
    samples_per_token: int  # sampling rate / frame rate: 1280 at 16 kHz and 12.5 Hz
    hop_length: int
    delay_tokens: int
    left_pad_tokens: int

    @classmethod
    def read(cls, tekken: dict[str, Any], where: str) -> StreamingGeometry:
        audio = tekken.get("audio")
        if not isinstance(audio, dict) or audio.get("transcription_format") != "streaming":
            raise ValueError(f"{where}: no streaming 'audio' section (Voxtral Realtime's)")
        try:
            rate = int(audio["sampling_rate"])
            hop = int(audio["audio_encoding_config"]["hop_length"])
            per_token = int(rate // float(audio["frame_rate"]))
            delay_samples = int(float(audio["transcription_delay_ms"]) / 1000.0 * rate)
            left = int(audio["streaming_n_left_pad_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: its 'audio' section lacks or mistypes {exc}") from None
        # mistral-common's ``num_audio_tokens`` of the delay's samples
        frames = math.ceil(delay_samples / hop - 1) if delay_samples % hop else delay_samples // hop
        return cls(rate, per_token, hop, math.ceil(frames / (per_token // hop)), left)

    @property
    def frames_per_token(self) -> int:
        return self.samples_per_token // self.hop_length

    @property
    def right_pad_tokens(self) -> int:
        return self.delay_tokens + 1 + OFFLINE_BUFFER_TOKENS


class RealtimePrompts:
    """Turns a clip (16 kHz float samples) into the model's ``input_ids`` [1, L] and ``input_features`` [1, mel
    bins, 8 x N] (N audio tokens, padding included), as mistral-common and the feature extractor would."""

    def __init__(self, directory: Path, config: Any) -> None:
        from transformers import VoxtralRealtimeFeatureExtractor

        self.tokenizer = load_tekken(directory)
        self.feature_extractor = VoxtralRealtimeFeatureExtractor.from_pretrained(directory, local_files_only=True)
        self.geometry = StreamingGeometry.read(json.loads((directory / TEKKEN_FILE).read_text()),
                                               str(directory / TEKKEN_FILE))
        vocab = self.tokenizer.get_vocab()
        missing = [name for name in (BOS, EOS, STREAMING_PAD) if name not in vocab]
        if missing:
            raise ValueError(f"{directory / TEKKEN_FILE}: lacks the special tokens {', '.join(missing)}")
        self.ids = {name: int(vocab[name]) for name in (BOS, EOS, STREAMING_PAD)}
        geometry = self.geometry
        if geometry.frames_per_token != int(config.audio_length_per_tok):
            raise ValueError(f"{directory}: {TEKKEN_FILE} gives {geometry.frames_per_token} mel frames a token, the "
                             f"config's audio_length_per_tok is {config.audio_length_per_tok}")
        if geometry.sample_rate_hz != int(self.feature_extractor.sampling_rate):
            raise ValueError(f"{directory}: {TEKKEN_FILE}'s sampling rate {geometry.sample_rate_hz} is not the "
                             f"feature extractor's {self.feature_extractor.sampling_rate}")
        self.sample_rate_hz = geometry.sample_rate_hz

    @property
    def num_delay_tokens(self) -> int:
        return self.geometry.delay_tokens

    def input_ids(self) -> torch.Tensor:
        """``<s>`` and the streaming pads of the left silence and the delay [1, L]."""
        pads = self.geometry.left_pad_tokens + self.geometry.delay_tokens
        return torch.tensor([[self.ids[BOS]] + [self.ids[STREAMING_PAD]] * pads], dtype=torch.long)

    def padded(self, samples: np.ndarray) -> np.ndarray:
        """The clip with mistral-common's offline padding: silence on the left, to a whole token and the delay's
        buffer on the right."""
        per_token = self.geometry.samples_per_token
        right = (per_token - len(samples) % per_token) % per_token + per_token * self.geometry.right_pad_tokens
        return np.pad(np.asarray(samples, dtype=np.float32), (per_token * self.geometry.left_pad_tokens, right))

    def features(self, samples: np.ndarray) -> torch.Tensor:
        """Log-mel frames [1, mel bins, frames] of already padded samples (a whole number of tokens)."""
        return self.feature_extractor(samples, sampling_rate=self.sample_rate_hz, return_tensors="pt")[
            "input_features"]

    def __call__(self, samples: np.ndarray) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids(), "input_features": self.features(self.padded(samples))}
