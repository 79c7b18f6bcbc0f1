"""The image family's request knobs, prompt processors and edge handoff."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
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


# ---------------------------------------------------------------------------------------------- prompts
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_WORD = re.compile(r"[a-z]+|\d+")


def class_for_prompt(text: str, classes: Sequence[str]) -> int:
    """The class a prompt asks a class-conditional model for: a class name in it ("draw a sneaker"); for a model
    of the digits 0-9 also a number word ("draw a seven", "A spider has eight legs."). A FieldError on ``prompt``
    that lists what the model draws when the prompt names none of them, or several."""
    lowered = text.lower()
    names = [c.lower() for c in classes]
    digits = names == [str(i) for i in range(10)]
    found: list[int] = []
    for token in _WORD.findall(lowered):
        if digits and token in NUMBER_WORDS:
            found.append(NUMBER_WORDS.index(token))
        elif token in names:
            found.append(names.index(token))
    for index, name in enumerate(names):  # names of several words ("ankle boot")
        if " " in name and re.search(rf"\b{re.escape(name)}\b", lowered):
            found.append(index)
    kinds = sorted(set(found))
    what = "the digits 0-9, e.g. 'draw a seven' or '7'" if digits else ", ".join(classes)
    if not kinds:
        raise FieldError("prompt", f"names nothing this model can draw (it draws {what}), got {text[:200]!r}")
    if len(kinds) > 1:
        raise FieldError("prompt", f"names several things to draw ({', '.join(classes[k] for k in kinds)}); "
                         f"ask for one (this model draws {what})")
    return kinds[0]


def class_named(prompt: str, labels: dict[str, int], class_names: Sequence[str]) -> int:
    """The class a prompt names: one of ``labels`` as written or in another case, else a phrase naming one of
    ``class_names`` ("draw a seven"). A FieldError on ``prompt`` when it names none."""
    found = labels.get(prompt.strip())
    if found is None:
        found = {name.lower(): i for name, i in labels.items()}.get(prompt.strip().lower())
    if found is None and class_names:
        found = class_for_prompt(prompt, class_names)
    if found is None:
        names = sorted(labels)
        known = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        known = known if names else "none: send a class_label"
        raise FieldError("prompt", f"names no class of this model (known: {known}), got {prompt!r}")
    return found


def image_prompt(prompt: dict[str, Any]) -> EntryInput:
    """The prompt as text; the diffusion stage reads what it asks for (a digit, a class, a text prompt)."""
    text = prompt["prompt"]
    if not text.strip():
        raise FieldError("prompt", "must say what to draw, e.g. 'draw a seven'")
    return EntryInput("diffusion", {"prompt": text})


# measured with the default thinker on 7 "draw the number of ..." questions: 6 right with this instruction, 4 with
# none (spider legs "four", continents "5"); an example answer in it was copied into unrelated answers
THINK_AND_DRAW_INSTRUCTION = "Answer in one short sentence that says the number."


def think_and_draw_prompt(prompt: dict[str, Any]) -> EntryInput:
    """The question goes to the thinker with an instruction to answer briefly, naming its number."""
    history = [*(prompt.get("history") or []), {"role": "system", "content": THINK_AND_DRAW_INSTRUCTION}]
    return EntryInput("thinker", {"text": prompt["prompt"], "history": history})


def thinker2diffusion(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The thinker's whole answer becomes the diffusion stage's prompt (it draws the digit the answer names)."""
    return [{"prompt": "".join(o.get("text", "") for o in outputs).strip()}]
