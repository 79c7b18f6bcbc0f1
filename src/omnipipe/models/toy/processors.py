"""Stage handoff for the toy family: whole-output input processors, async-chunk processors, and the knobs its
stages read from ``SamplingParams.extra``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnipipe.chunk.context import ChunkContext
from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.util.field_error import FieldError

MAX_FAIL_STEP = 1 << 20


def _check_fail(value: Any, steps: bool) -> None:
    if isinstance(value, bool) or (steps and isinstance(value, int) and 1 <= value <= MAX_FAIL_STEP):
        return
    rule = f"true, false or a decode step in [1, {MAX_FAIL_STEP}]" if steps else "a boolean"
    raise FieldError("fail", f"must be {rule}, got {value!r}")


@dataclass(frozen=True)
class ToyThinkerParams:
    """The toy thinker's ``extra``: ``fail`` injects a fault (only where the deploy sets the stage option
    ``fault_injection``; ignored elsewhere): ``True`` at the prefill, an integer ``n`` at decode step ``n``."""

    fail: bool | int = False

    def __post_init__(self) -> None:
        _check_fail(self.fail, steps=True)


@dataclass(frozen=True)
class ToyTalkerParams:
    """The toy talker's ``extra``: ``speed`` stretches (< 1) or squeezes (> 1) the frames in time; ``fail`` injects
    a fault like the thinker's (``fault_injection`` deploys only)."""

    speed: float = 1.0
    fail: bool = False

    def __post_init__(self) -> None:
        value = self.speed
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.25 <= value <= 4.0:
            raise FieldError("speed", f"must be a number in [0.25, 4], got {value!r}")
        _check_fail(self.fail, steps=False)


def text_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("thinker", {"text": prompt["prompt"]})


def tts_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("talker", {"text": prompt["prompt"]})


def thinker2talker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"text": "".join(o.get("text", "") for o in outputs)}]


def thinker2talker_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                               ctx: ChunkContext) -> list[dict[str, Any]]:
    """Ship text word by word: a chunk at every space, the rest at the end."""
    state["buffer"] = state.get("buffer", "") + output.get("text", "")
    buffer: str = state["buffer"]
    cut = len(buffer) if is_last else buffer.rfind(" ") + 1
    if cut <= 0:
        return []
    state["buffer"] = buffer[cut:]
    return [{"text": buffer[:cut]}]
