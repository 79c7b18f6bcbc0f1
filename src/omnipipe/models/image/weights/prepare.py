"""Prepare and check the weights the image family's pipelines need: ``image`` the digits model (trained here
once, cached); ``think-and-draw`` that and the default family's thinker it borrows."""

from __future__ import annotations

from omnipipe.models.image.pipeline import THINKER
from omnipipe.models.image.weights.digits import digits_status, prepare_digits
from omnipipe.util.dotted import resolve

# the default family's thinker weights, by dotted path (a family imports nothing of another's)
_PREPARE_THINKER = "omnipipe.models.default.weights.thinker.prepare_thinker"
_THINKER_READY = "omnipipe.models.default.weights.thinker.thinker_ready"


def prepare_image(progress: bool = True) -> None:
    prepare_digits(progress=progress)


def image_status() -> tuple[bool, str]:
    return digits_status()


def prepare_think_and_draw(progress: bool = True) -> None:
    resolve(_PREPARE_THINKER)(THINKER.default_options["model"], progress=progress)
    prepare_digits(progress=progress)


def think_and_draw_status() -> tuple[bool, str]:
    model = THINKER.default_options["model"]
    ready, detail = digits_status()
    if not resolve(_THINKER_READY)(model):
        return False, f"thinker {model}: run `omnipipe download`; {detail}"
    return ready, f"thinker {model}; {detail}"
