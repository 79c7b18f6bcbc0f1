"""Import a function or class named by a dotted path (``package.module.attr`` or ``package.module:attr``).

Model families name their runners, processors and options this way, so the topology in code stays plain data.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class DottedPathError(ValueError):
    """A dotted path names nothing importable (a developer error in a model family or a deploy file)."""


def resolve(dotted: str) -> Callable[..., Any]:
    """Import ``package.module.attr`` or ``package.module:attr``."""
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise DottedPathError(f"{dotted!r} is not a dotted path to a function or class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DottedPathError(f"cannot import {module_name!r} for {dotted!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise DottedPathError(f"{module_name!r} has no attribute {attr!r} (from {dotted!r})") from exc


def resolve_class(dotted: str) -> type:
    """``resolve`` for a path that must name a class (an options dataclass, say)."""
    found = resolve(dotted)
    if not isinstance(found, type):
        raise DottedPathError(f"{dotted!r} names {found!r}, not a class")
    return found
