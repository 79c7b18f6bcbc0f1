"""Voxtral Realtime's audio heard live: a stream of 16 kHz pieces (``AsyncOmni.append_audio``) turned, token by token
as it comes, into the audio embeddings the language model reads at each position, the same ones the whole clip
gives (``prompting.py``'s offline layout: silence on the left, and at the stream's end silence to a whole token and
the delay's buffer).

- ``LogMelTokens``: one audio token's log-mel frames (8, 80 ms) once every sample their centred windows read is
  heard: the STFT frame ``t`` reads samples ``[t * hop - n_fft / 2, t * hop + n_fft / 2)``, so a token's last frame
  reads 40 samples of the next token, held back until they come (or the stream ends: the padded clip then ends in
  silence, and the samples past it are its reflection, as the extractor's reflect padding gives them). Each frame's
  power spectrum is bit-identical to the whole clip's; the mel product is made over a 16-frame panel, zero but for
  the token's frames at their place in the whole product's aligned panel, which on MKL's AVX-512 kernels gives the
  extractor's own bits (elsewhere a last-bit difference at most); the normalisation is the checkpoint's fixed
  ``global_log_mel_max`` (a feature extractor without one, which normalises by the clip's maximum, cannot stream).
- ``EncoderStream``: the causal encoder run one token at a time (its convolutions over their padding cache, its
  sliding-window attention over its KV cache, as ``generate`` runs it in its decode steps), so the embeddings are
  bit-identical however the stream is cut into pieces. The whole-clip path runs the same layers over 64 tokens at
  once, which rounds differently: the two agree to float rounding (the test states the bound), not to the bit.
- ``AudioTokens`` (a whole clip's embeddings, given at once) and ``HeardClip`` (a live stream's, growing; the
  stage's ``LiveAudio``): what a transcription reads, ``ready`` embeddings so far and its ``total`` once it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnipipe.stage.live_audio import INPUT_RATE_HZ

if TYPE_CHECKING:
    from omnipipe.models.voxtral_realtime.prompting import RealtimePrompts, StreamingGeometry

MEL_PANEL_FRAMES = 16  # columns of MKL's sgemm panel: a token's frames sit where the whole product puts them


class LogMelTokens:
    """Log-mel frames [mel bins, 8] of the padded clip, one token at a time, from 16 kHz pieces of the clip itself
    (``push``) and its end (``end``); transformers' ``VoxtralRealtimeFeatureExtractor`` read for its settings."""

    def __init__(self, extractor: Any, geometry: StreamingGeometry) -> None:
        if extractor.global_log_mel_max is None:
            raise ValueError("the feature extractor normalises by the whole clip's maximum (global_log_mel_max "
                             "unset): its frames cannot be made before the clip ends")
        self.hop = geometry.hop_length
        self.per_token = geometry.samples_per_token
        self.frames = geometry.frames_per_token
        self.right_pad_tokens = geometry.right_pad_tokens
        self.n_fft = int(extractor.n_fft)
        self.half = self.n_fft // 2
        self._window = torch.hann_window(self.n_fft)
        self._filters = torch.from_numpy(extractor.mel_filters).to("cpu", torch.float32)
        self._max = float(extractor.global_log_mel_max)
        # the padded clip from sample ``_first`` on (what later tokens' windows still read): the left silence first
        self._samples = np.zeros(geometry.left_pad_tokens * self.per_token, dtype=np.float32)
        self._first = 0
        self.clip_samples = 0  # of the clip itself
        self.tokens = 0  # tokens made
        self.total: int | None = None  # the padded clip's tokens, once it ended

    def push(self, pcm16k: np.ndarray) -> list[torch.Tensor]:
        """The frames of every token whose windows the piece completes."""
        if self.total is not None:
            raise ValueError("the clip has ended")
        piece = np.asarray(pcm16k, dtype=np.float32).reshape(-1)
        self.clip_samples += piece.size
        self._samples = np.concatenate([self._samples, piece])
        return self._ready()

    def end(self) -> list[torch.Tensor]:
        """The clip ended: silence to a whole token and the delay's buffer, then its reflection past the end (the
        extractor's reflect padding of the whole padded clip), and the frames of every token left."""
        if self.total is not None:
            return []
        right = (-self.clip_samples) % self.per_token + self.per_token * self.right_pad_tokens
        padded = np.concatenate([self._samples, np.zeros(right, dtype=np.float32)])
        self.total = (self._first + padded.size) // self.per_token
        self._samples = np.pad(padded, (0, self.half), mode="reflect")
        return self._ready()

    def _ready(self) -> list[torch.Tensor]:
        made = []
        span = (self.frames - 1) * self.hop + self.n_fft  # the samples a token's frames read
        while self.total is None or self.tokens < self.total:
            start = self.tokens * self.per_token - self.half
            if start + span > self._first + self._samples.size:
                break
            if start < 0:  # the first frame's window reaches before the clip: the extractor reflects it
                window = np.pad(self._samples[:start + span], (-start, 0), mode="reflect")
            else:
                window = self._samples[start - self._first:start - self._first + span]
            made.append(self._features(window))
            self.tokens += 1
        keep = self.tokens * self.per_token - self.half - self._first  # samples no later window reads
        if keep > 0:
            self._samples, self._first = self._samples[keep:], self._first + keep
        return made

    def _features(self, window: np.ndarray) -> torch.Tensor:
        """One token's frames, computed as ``_torch_extract_fbank_features`` computes the whole clip's."""
        stft = torch.stft(torch.from_numpy(np.ascontiguousarray(window))[None], self.n_fft, self.hop,
                          window=self._window, return_complex=True, center=False)
        power = stft.abs() ** 2  # [1, bins, frames]
        offset = ((self.tokens * self.frames) % MEL_PANEL_FRAMES
                  if MEL_PANEL_FRAMES % self.frames == 0 else None)
        if offset is None:
            mel = self._filters.T @ power
        else:
            panel = power.new_zeros(1, power.shape[1], MEL_PANEL_FRAMES)
            panel[..., offset:offset + self.frames] = power
            mel = (self._filters.T @ panel)[..., offset:offset + self.frames]
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, torch.tensor(self._max, dtype=log_spec.dtype) - 8.0)
        return ((log_spec + 4.0) / 4.0)[0]


class EncoderStream:
    """The causal audio encoder and projector run one token's frames at a time: its convolutions over their
    padding cache, its sliding-window attention over its own KV cache."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache
        from transformers.models.voxtral_realtime.modeling_voxtral_realtime import (
            VoxtralRealtimeConv1dPaddingCache,
        )

        self.model = model.model  # VoxtralRealtimeModel
        self.device, self.dtype = model.device, model.dtype
        self.padding = VoxtralRealtimeConv1dPaddingCache()
        self.cache = DynamicCache(config=self.model.audio_tower.config)

    @torch.inference_mode()
    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        """One token's log-mel frames [mel bins, 8] -> its audio embedding [D]."""
        embedded = self.model.audio_tower.embedder(frames[None].to(self.device, self.dtype), self.padding)
        out = self.model.get_audio_features(encoder_inputs_embeds=embedded, past_key_values=self.cache,
                                            use_cache=True)
        return out.pooler_output[0, 0]


class AudioTokens:
    """A transcription's audio embeddings, one a position: ``ready`` of them so far, ``total`` once the audio
    ended (None before, and for audio that failed: ``error``). Built whole from a clip's embeddings [N, D]."""

    def __init__(self, embeddings: torch.Tensor | None = None, clip_s: float = 0.0) -> None:
        self.embeddings: list[torch.Tensor] = [] if embeddings is None else list(embeddings.unbind(0))
        self.closed = embeddings is not None
        self.error: str | None = None
        self.clip_s = clip_s

    @property
    def ready(self) -> int:
        return len(self.embeddings)

    @property
    def frames_ready(self) -> int:
        return len(self.embeddings)

    @property
    def total(self) -> int | None:
        return len(self.embeddings) if self.closed and self.error is None else None


class HeardClip(AudioTokens):
    """A live stream's audio embeddings, made token by token on the stage loop as its 16 kHz pieces come
    (``append``) and at its end (``close``): the stage's ``LiveAudio`` (``stage/live_audio.py``)."""

    def __init__(self, prompts: RealtimePrompts, model: Any) -> None:
        super().__init__()
        self.features = LogMelTokens(prompts.feature_extractor, prompts.geometry)
        self.encoder = EncoderStream(model)
        self.heard_samples = 0

    def append(self, pcm16k: np.ndarray) -> None:
        if self.closed:
            raise ValueError("the audio stream is closed")
        self.heard_samples += int(np.asarray(pcm16k).size)
        self.clip_s = self.heard_samples / INPUT_RATE_HZ
        self.embeddings += [self.encoder(frames) for frames in self.features.push(pcm16k)]

    def close(self) -> None:
        """No more audio: the right padding's tokens are made, and the total is known."""
        if not self.closed:
            self.embeddings += [self.encoder(frames) for frames in self.features.end()]
            self.closed = True

    def fail(self, error: str) -> None:
        self.error, self.closed = error, True
