"""Schedulers registered by stage kind: a new stage kind is one scheduler module plus one line here.

``encoder`` stages take their input once and produce once: the generation behaviour. (The default family's
whisper decodes a segment per step, so that its transcript streams: it is an ``ar`` stage.)
``diffusion`` stages run a denoising loop per request, batched step by step (``schedulers/diffusion.py``).
"""

from __future__ import annotations

from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.schedulers.base import Scheduler
from omnipipe.stage.schedulers.diffusion import DiffusionScheduler
from omnipipe.stage.schedulers.generation import GenerationScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "ar": ARScheduler,
    "generation": GenerationScheduler,
    "encoder": GenerationScheduler,
    "diffusion": DiffusionScheduler,
}


class UnsupportedStageKindError(ValueError):
    """No scheduler is registered for a stage kind."""


def has_scheduler(kind: str) -> bool:
    return kind in SCHEDULERS


def scheduler_for(kind: str) -> type[Scheduler]:
    try:
        return SCHEDULERS[kind]
    except KeyError:
        raise UnsupportedStageKindError(
            f"no scheduler serves stage kind {kind!r} (kinds served: {', '.join(sorted(SCHEDULERS))})") from None


__all__ = ["SCHEDULERS", "Scheduler", "UnsupportedStageKindError", "has_scheduler", "scheduler_for"]
