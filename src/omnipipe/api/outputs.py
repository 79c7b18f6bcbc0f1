"""What callers receive: one ``OmniRequestOutput`` per text delta, audio chunk, image, progress step, or final
result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestMetrics:
    """Per-request timings in seconds (see docs/architecture.md for definitions)."""

    e2e_s: float = 0.0
    ttft_s: float | None = None  # first text token
    tpot_s: float | None = None  # mean time per output token after the first
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive text outputs
    ttfp_s: float | None = None  # first audio packet
    audio_duration_s: float = 0.0
    rtf: float | None = None  # e2e / audio duration
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0  # as the comprehension stage tokenised the prompt (0: it does not say)
    num_cached_tokens: int = 0  # of those, the ones its prefix cache spared the prefill
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)  # queue/compute time, tokens/frames
    edges: dict[str, dict[str, Any]] = field(default_factory=dict)  # bytes, chunks, transfer time
    # time between stages of a request that went through its stages one after another, e.g. {"caller->thinker":
    # ..., "thinker->talker": ..., "code2wav->caller": ...}: from the sender's stamp to the receiver's (see
    # RequestClock.hops); empty where the stages overlap (async chunk) or a stamp is missing
    hops_s: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        itl_mean = float(np.mean(self.itl_s)) if self.itl_s else None
        return {
            "e2e_s": self.e2e_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "itl_mean_s": itl_mean,
            "ttfp_s": self.ttfp_s,
            "rtf": self.rtf,
            "audio_duration_s": self.audio_duration_s,
            "num_output_tokens": self.num_output_tokens,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_tokens": self.num_cached_tokens,
        }


@dataclass
class OmniRequestOutput:
    """One event of a request's stream, or (``finished=True``) its final summary.

    ``text`` is the cumulative text so far; ``text_delta`` what this event added. ``audio`` is this event's
    chunk (float32 mono at ``sample_rate_hz``). The final output of ``Omni.generate`` carries the whole audio.
    ``details`` is what the stage reported beside a text event (the default family's speech recognition: one
    transcript segment with its times and scores, or the clip's language and duration); ``None`` otherwise.

    Image-producing pipelines: an ``"image"`` event carries ``image`` (uint8, height x width x channels, 1 or 3
    channels); a preview of an image still being drawn has ``details = {"step": i, "steps": n}``, the finished
    image ``details = None``. A ``"progress"`` event says a diffusion step is done (``details`` as for a preview).
    The final output carries the finished image.
    """

    request_id: str
    stage: str
    modality: str  # "text" | "audio" | "image" | "progress" | "final"
    text: str = ""
    text_delta: str = ""
    num_tokens: int = 0  # tokens in ``text_delta``
    details: dict[str, Any] | None = None  # a "text" event's structured results, e.g. a transcript segment's times
    audio: np.ndarray | None = None
    sample_rate_hz: int | None = None
    image: np.ndarray | None = None
    finished: bool = False
    finish_reason: str | None = None
    metrics: RequestMetrics | None = None

    def pil_image(self) -> Any:
        """``image`` as a ``PIL.Image.Image`` (grayscale or RGB), or None."""
        if self.image is None:
            return None
        from PIL import Image

        array = self.image[:, :, 0] if self.image.ndim == 3 and self.image.shape[2] == 1 else self.image
        return Image.fromarray(array)

    @property
    def is_preview(self) -> bool:
        """An image event showing an image still being drawn (not the finished one)."""
        return self.modality == "image" and self.details is not None

    @property
    def audio_duration_s(self) -> float:
        if self.audio is None or not self.sample_rate_hz:
            return 0.0
        return len(self.audio) / self.sample_rate_hz
