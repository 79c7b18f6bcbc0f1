"""How a deploy-file knob is checked, kept on the dataclass field it fills.

``knob(check, default)`` is a dataclass field a deploy file may set; ``check(value, key)`` gives the value to keep
or raises ``FieldError(key, rule)``. ``build(cls, mapping, key)`` makes a dataclass from a mapping through its
fields' checks, refusing keys it has no knob for; a nested section or a mapping of named sections is a check that
builds in turn, so every error carries its dotted key (``stages.talker.cpu.nice``). The checks below are the
kinds of value the deploy file takes.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields
from typing import Any, TypeVar

from omnipipe.util.field_error import FieldError

Check = Callable[[Any, str], Any]
T = TypeVar("T")

_CHECK = "deploy_check"  # the metadata key of a knob's check


def knob(check: Check, default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A dataclass field a deploy file may set, its value checked by ``check`` (``factory``: a mutable default)."""
    return field(default=default, default_factory=factory, metadata={_CHECK: check})


def _key(prefix: str, name: Any) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def build(cls: type[T], raw: Any, key: str, retired: Mapping[str, str] | None = None) -> T:
    """``cls`` made from the mapping ``raw`` found at ``key`` ("" for the file's top level): every key must be a
    knob of ``cls`` and every value passes the knob's check; fields without a knob keep their defaults.
    ``retired``: keys that once were knobs here -> the rule saying where they went."""
    if not isinstance(raw, dict):
        raise FieldError(key, f"must be a mapping, got {type(raw).__name__}")
    checks = {f.name: f.metadata[_CHECK] for f in fields(cls) if _CHECK in f.metadata}  # type: ignore[arg-type]
    for name in raw:
        if retired and name in retired:
            raise FieldError(_key(key, name), retired[name])
        if name not in checks:
            raise FieldError(_key(key, name), f"unknown key (expected one of: {', '.join(checks)})")
    return cls(**{name: checks[name](value, _key(key, name)) for name, value in raw.items()})


# ---------------------------------------------------------------------------------------------- sections
def section(cls: type, null_is_empty: bool = False) -> Check:
    """A nested mapping built into ``cls`` (``null_is_empty``: a null value gives ``cls``'s defaults)."""
    def check(value: Any, key: str) -> Any:
        return build(cls, {} if value is None and null_is_empty else value, key)
    return check


def named_sections(cls: type, noun: str) -> Check:
    """A mapping of ``noun`` name -> settings, each built into ``cls`` (a null entry gives its defaults)."""
    def check(value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise FieldError(key, f"must be a mapping of {noun} name -> settings")
        return {str(name): build(cls, item if item is not None else {}, f"{key}.{name}")
                for name, item in value.items()}
    return check


def free_mapping(value: Any, key: str) -> dict[str, Any]:
    """A free mapping, read (and checked) by whoever it configures."""
    if not isinstance(value, dict):
        raise FieldError(key, "must be a mapping")
    return dict(value)


# ---------------------------------------------------------------------------------------------- scalars
def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(key, f"must be true or false, got {value!r}")
    return value


def text(nullable: bool = False) -> Check:
    """A non-empty string (or null, when ``nullable``)."""
    def check(value: Any, key: str) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or not value:
            raise FieldError(key, f"must be a non-empty string, got {value!r}")
        return value
    return check


def label(rule: str) -> Check:
    """A non-empty string or null, refused with ``rule`` (``must be ...``)."""
    def check(value: Any, key: str) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            raise FieldError(key, f"{rule}, got {value!r}")
        return value
    return check


def one_of(choices: tuple[str, ...]) -> Check:
    def check(value: Any, key: str) -> Any:
        if value not in choices:
            raise FieldError(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _at_least(kind: type, minimum: float, nullable: bool) -> Check:
    noun = "an integer" if kind is int else "a number"

    def check(value: Any, key: str) -> Any:
        if value is None and nullable:
            return None
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
        if isinstance(value, bool) or not ok or not math.isfinite(value) or value < minimum:
            raise FieldError(key, f"must be {noun} >= {minimum}, got {value!r}")
        return kind(value)
    return check


def integer(minimum: int) -> Check:
    """An integer >= ``minimum``."""
    return _at_least(int, minimum, nullable=False)


def number(minimum: float, nullable: bool = False) -> Check:
    """A finite number >= ``minimum``, kept as a float (or null, when ``nullable``)."""
    return _at_least(float, minimum, nullable)


# ---------------------------------------------------------------------------------------------- stage knobs
def device_name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not (value == "cpu" or re.fullmatch(r"cuda(:\d+)?", value)):
        raise FieldError(key, f'must be "cpu" or "cuda[:N]", got {value!r}')
    return value


def check_device_present(device: str, key: str, ranks: int = 1) -> None:
    """Refuse (``FieldError(key, ...)``) a CUDA ``device`` this process cannot use: no CUDA at all, or fewer GPUs
    than ``ranks`` consecutive ones from its index (a tensor-parallel stage's ranks take ``cuda:N``, ``N+1``, ...).
    The one check of a stage's device, made where its processes will run: at deploy validation for stages on this
    host, in the stage process otherwise. torch is imported only for a CUDA device."""
    if not device.startswith("cuda"):
        return
    import torch

    first = int(device.partition(":")[2] or 0)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        raise FieldError(key, f"{device!r} needs a CUDA GPU, and this host has none that torch {torch.__version__} "
                         "can use (a CPU-only build, no driver, or CUDA_VISIBLE_DEVICES empty); use cpu")
    if first + ranks > visible:
        needs = f"cuda:{first}" if ranks == 1 else f"cuda:{first}..cuda:{first + ranks - 1} (one per rank)"
        raise FieldError(key, f"{device!r} needs {needs}, and this host has {visible} GPU(s): "
                         f"cuda:0..cuda:{visible - 1}")


def niceness(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
        raise FieldError(key, f"must be an integer in [0, 19] (a stage may only lower its priority), got {value!r}")
    return value


def ray_resources(value: Any, key: str) -> dict[str, float]:
    """Ray resources a rank asks for: name -> a number >= 0 (CPU, GPU or a custom resource of the cluster)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(key, f"must be a mapping of resource name -> amount, e.g. {{CPU: 1, node_b: 1}}, "
                         f"got {value!r}")
    out = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise FieldError(key, f"resource names must be non-empty strings, got {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise FieldError(f"{key}.{name}", f"must be a number >= 0, got {amount!r}")
        out[name] = float(amount)
    return out


def core_affinity(value: Any, key: str) -> list[int] | None:
    """A list of distinct core numbers this process may use (checked against this host's usable cores)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise FieldError(key, f"must be a non-empty list of core numbers, e.g. [0] or [0, 1], got {value!r}")
    if any(isinstance(core, bool) or not isinstance(core, int) or core < 0 for core in value):
        raise FieldError(key, f"must list core numbers (integers >= 0), got {value!r}")
    if len(set(value)) != len(value):
        raise FieldError(key, f"lists a core twice: {value!r}")
    usable = sorted(os.sched_getaffinity(0))
    missing = [core for core in value if core not in usable]
    if missing:
        raise FieldError(key, f"core(s) {missing} are not usable on this host (usable: {usable})")
    return list(value)
