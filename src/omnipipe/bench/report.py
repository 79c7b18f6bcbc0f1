"""Stats and plain-text tables shared by the benchmarks."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Cell = str | int | float | None


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (the same definition as ``numpy.percentile``'s default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {pct}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def std(values: Sequence[float]) -> float:
    """Population standard deviation (``numpy.std``'s default)."""
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / len(values))


def percentile_key(pct: float) -> str:
    """``99`` -> ``"p99"``, ``99.9`` -> ``"p99.9"`` (the names ``vllm bench serve`` gives its percentiles)."""
    return f"p{int(pct)}" if int(pct) == pct else f"p{pct}"


def summarize(values: Sequence[float], scale: float = 1.0, percentiles: Sequence[float] = (99,)) -> dict[str, float]:
    """count, mean, median, std, min, max and each of ``percentiles`` (``p99``, ...) of ``values``, each multiplied by
    ``scale`` (e.g. 1e3 for s -> ms)."""
    scaled = [v * scale for v in values]
    out = {
        "count": len(scaled),
        "mean": mean(scaled),
        "median": median(scaled),
        "std": std(scaled),
        "min": min(scaled),
        "max": max(scaled),
    }
    for pct in percentiles:
        out[percentile_key(pct)] = percentile(scaled, pct)
    return out


def fmt(value: Cell, digits: int = 2) -> str:
    """A table cell: floats with ``digits`` decimals, None as '-', everything else as str."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], digits: int = 2,
                 title: str | None = None) -> str:
    """Aligned plain-text table: text columns left-aligned, numeric columns right-aligned."""
    body = [list(row) for row in rows]
    for row in body:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, the table {len(headers)} columns: {row!r}")
    numeric = [bool(body) and all(row[i] is None or (isinstance(row[i], (int, float)) and not isinstance(row[i], bool))
                                  for row in body) for i in range(len(headers))]
    cells = [[fmt(cell, digits) for cell in row] for row in body]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]

    def line(items: Sequence[str], align_numbers: bool) -> str:
        parts = [item.rjust(w) if align_numbers and numeric[i] else item.ljust(w)
                 for i, (item, w) in enumerate(zip(items, widths, strict=True))]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [title] if title else []
    out += [line(headers, False), rule, *(line(row, True) for row in cells)]
    return "\n".join(out)


def machine_info() -> dict[str, Any]:
    """Where the figures came from: cpu count, load average at the time, python and platform."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15": load,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
