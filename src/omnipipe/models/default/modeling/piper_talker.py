"""Talker stage of a Piper voice: text -> phoneme ids -> latent frames."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np

from omnipipe.models.default.weights.voice import (
    LATENTS_NAME,
    ModelPreparationError,
    VoicePaths,
    make_session_options,
)

logger = logging.getLogger(__name__)

DEFAULT_NOISE_SCALE = 0.667
DEFAULT_LENGTH_SCALE = 1.0
DEFAULT_NOISE_W = 0.8
SPEED_TOLERANCE = 0.03  # how far (relative) the frame count at a speed may miss ``frames at 1.0 / speed``
_SPEED_TRIES = 3  # length-scale corrections after the first guess


class PiperTalker:
    """Runs the talker graph of a split Piper voice (see ``voice_weights``).

    Output latents are ``float32 [latent_channels, frames]``; one frame is
    ``paths.hop_samples`` samples at ``paths.sample_rate_hz``.
    """

    def __init__(self, paths: VoicePaths, num_threads: int = 1, providers: list[Any] | None = None) -> None:
        try:
            import onnxruntime
            from piper.config import PiperConfig
            from piper.voice import PiperVoice
        except ImportError as exc:
            raise ModelPreparationError(
                f"the Piper talker needs piper-tts and onnxruntime ({exc}): pip install piper-tts onnxruntime"
            ) from exc

        self.paths = paths
        self.sample_rate_hz = paths.sample_rate_hz
        self.hop_samples = paths.hop_samples
        self.latent_channels = paths.latent_channels
        config = PiperConfig.from_dict(json.loads(paths.config_json.read_text(encoding="utf-8")))
        self._default_speaker_id = config.default_speaker_id
        # The session is unused: PiperVoice is only the phonemizer front end.
        self._voice = PiperVoice(session=None, config=config)  # type: ignore[arg-type]
        self._session = onnxruntime.InferenceSession(
            str(paths.talker_onnx),
            sess_options=make_session_options(num_threads),
            providers=providers or ["CPUExecutionProvider"],
        )
        self._input_names = {value.name for value in self._session.get_inputs()}

    def _sentences(self, text: str) -> list[list[str]]:
        # espeak takes a C string: a NUL would end it (the binding refuses it), so it is read as a space
        text = text.replace("\x00", " ")
        if not text.strip():
            return []
        return [phonemes for phonemes in self._voice.phonemize(text) if phonemes]

    def phonemize_sentences(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence of ``text``, each with its own BOS/EOS."""
        return [self._voice.phonemes_to_ids(phonemes) for phonemes in self._sentences(text)]

    def phonemize(self, text: str) -> list[int]:
        """Phoneme ids of ``text`` as one utterance (sentences joined by a space)."""
        sentences = self._sentences(text)
        if not sentences:
            return []
        joined: list[str] = []
        for index, phonemes in enumerate(sentences):
            if index:
                joined.append(" ")
            joined.extend(phonemes)
        return self._voice.phonemes_to_ids(joined)

    def latents_from_ids(
        self,
        phoneme_ids: list[int],
        *,
        noise_scale: float = DEFAULT_NOISE_SCALE,
        length_scale: float = DEFAULT_LENGTH_SCALE,
        noise_w: float = DEFAULT_NOISE_W,
        speaker_id: int | None = None,
    ) -> np.ndarray:
        """Latent frames ``float32 [latent_channels, frames]`` for phoneme ids."""
        if not phoneme_ids:
            return np.zeros((self.latent_channels, 0), dtype=np.float32)
        feeds: dict[str, np.ndarray] = {
            "input": np.asarray(phoneme_ids, dtype=np.int64)[None, :],
            "input_lengths": np.asarray([len(phoneme_ids)], dtype=np.int64),
            "scales": np.asarray([noise_scale, length_scale, noise_w], dtype=np.float32),
        }
        if "sid" in self._input_names:
            sid = self._default_speaker_id if speaker_id is None else speaker_id
            feeds["sid"] = np.asarray([sid], dtype=np.int64)
        started_s = time.perf_counter()
        (latents,) = self._session.run([LATENTS_NAME], feeds)
        logger.debug(
            "talker: %d phoneme ids -> %d frames in %.1f ms",
            len(phoneme_ids),
            latents.shape[-1],
            (time.perf_counter() - started_s) * 1e3,
        )
        return np.ascontiguousarray(latents[0], dtype=np.float32)

    def synthesize_latents(
        self,
        text: str,
        *,
        noise_scale: float = DEFAULT_NOISE_SCALE,
        length_scale: float = DEFAULT_LENGTH_SCALE,
        noise_w: float = DEFAULT_NOISE_W,
    ) -> np.ndarray:
        """Latent frames ``float32 [latent_channels, frames]`` for ``text``.

        Deterministic when ``noise_scale`` and ``noise_w`` are 0. Empty or
        whitespace-only text gives ``[latent_channels, 0]``.
        """
        return self.latents_from_ids(
            self.phonemize(text), noise_scale=noise_scale, length_scale=length_scale, noise_w=noise_w
        )

    def latents_at_speed(
        self,
        phoneme_ids: list[int],
        speed: float,
        *,
        noise_scale: float = DEFAULT_NOISE_SCALE,
        noise_w: float = DEFAULT_NOISE_W,
    ) -> np.ndarray:
        """Latent frames for ``phoneme_ids`` spoken ``speed`` times as fast: ``frames(1.0) / speed`` frames.

        Piper rounds each phoneme's scaled duration up to whole frames, so ``length_scale = 1 / speed`` alone is far
        from proportional (speed 2 kept ~64 % of the frames, 0.5 gave ~172 %). The length scale is corrected by
        secant steps on the frame count (from a first guess that takes half a frame per phoneme as the unscaled
        part) until it is within ``SPEED_TOLERANCE``; where no scale gets there (at high speeds every phoneme keeps
        at least one frame) the nearest try is resampled in time to the target count.
        """
        base = self.latents_from_ids(phoneme_ids, noise_scale=noise_scale, length_scale=1.0, noise_w=noise_w)
        if speed == 1.0 or base.shape[1] == 0:
            return base
        target = base.shape[1] / speed
        tries = [(1.0, base)]
        # first guess: each phoneme's round-up adds half a frame on average, which does not scale
        fixed = min(0.5 * len(phoneme_ids), 0.9 * base.shape[1])
        scale = max(0.05, (target - fixed) / (base.shape[1] - fixed))
        for _ in range(1 + _SPEED_TRIES):
            latents = self.latents_from_ids(phoneme_ids, noise_scale=noise_scale, length_scale=scale, noise_w=noise_w)
            tries.append((scale, latents))
            if abs(latents.shape[1] - target) <= SPEED_TOLERANCE * target:
                return latents
            (scale0, prev), (scale1, last) = tries[-2], tries[-1]
            if last.shape[1] == prev.shape[1]:
                break
            scale = scale1 + (target - last.shape[1]) * (scale1 - scale0) / (last.shape[1] - prev.shape[1])
            scale = float(min(max(scale, 0.05), 16.0))
        _, nearest = min(tries, key=lambda t: abs(t[1].shape[1] - target))
        frames = max(1, int(round(target)))
        index = np.minimum((np.arange(frames) * nearest.shape[1] / frames).astype(np.int64), nearest.shape[1] - 1)
        return np.ascontiguousarray(nearest[:, index])
