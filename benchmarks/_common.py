"""Small helpers shared by the benchmark scripts: quiet TensorFlow, statistics, one table."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

# Quiet TensorFlow's C++ logging in this process and in every process it starts.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
try:  # an installed (or PYTHONPATH) nbdist wins; else the checkout this script lives in
    import nbdist  # noqa: F401
except ImportError:
    sys.path.insert(1, str(REPO))


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    """'min-max' of repeated measurements, to show how noisy the machine was."""
    values = [v for v in values if v == v]
    if len(values) < 2:
        return "-"
    return f"{min(values):,.0f}-{max(values):,.0f}"


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain text table, right-aligned numbers, left-aligned text."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(items):
        return "  ".join(s.rjust(w) if num else s.ljust(w)
                         for s, w, num in zip(items, widths, numeric, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
