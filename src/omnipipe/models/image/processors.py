"""The image family's request knobs, prompt processors and edge handoff."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.util.field_error import FieldError

MAX_STEPS = 1000
MAX_SIDE = 4096


def _integer(value: object, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FieldError(name, f"must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class DiffusionParams:
    """The diffusion stage's ``SamplingParams.extra`` (the seed is ``SamplingParams.seed``).

    ``steps``, ``guidance_scale``: denoising steps and classifier-free guidance scale (None: the deploy's
    ``stages.diffusion.options`` defaults; a scale of 1 or less runs no guidance). ``preview_every``: a preview image
    every k steps (0: none). ``progress``: a progress event after every step. ``width``/``height``: the image's
    size in pixels for a model that can draw several sizes (None: the model's own size).
    """

    steps: int | None = None
    guidance_scale: float | None = None
    preview_every: int = 0
    progress: bool = False
    width: int | None = None
    height: int | None = None

    def __post_init__(self) -> None:
        if self.steps is not None:
            _integer(self.steps, "steps", 1, MAX_STEPS)
        scale = self.guidance_scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not 0 <= scale <= 50):
            raise FieldError("guidance_scale", f"must be a number in [0, 50], got {scale!r}")
        _integer(self.preview_every, "preview_every", 0, MAX_STEPS)
        if not isinstance(self.progress, bool):
            raise FieldError("progress", f"must be true or false, got {self.progress!r}")
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None:
                _integer(value, name, 8, MAX_SIDE)
