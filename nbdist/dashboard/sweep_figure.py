"""A sweep's figure: each grid point where its runs reached the target, time against bytes,
so that the way of training that gets there first and with the fewest bytes sits lower left.

Pure: a figure dict from `nbdist.sweep`'s table (`SweepResult.figure` makes it a plotly
`Figure`).
"""

from __future__ import annotations

import math

import pandas as pd

from nbdist.dashboard.style import PALETTE, empty_figure, layout

__all__ = ["SWEEP_TITLE", "sweep_figure"]

SWEEP_TITLE = "time and bytes to the target"
MB = 1e6


def _hover(row: pd.Series) -> str:
    lines = [f"<b>{row['point']}</b>", f"{row['time_to_target']:.1f} s to the target",
             f"reached in {int(row['reached'])} of {int(row['runs'])} runs",
             f"final {row['final']:.4f} ± {row['final_std']:.4f}"]
    if not math.isnan(row["bytes_to_target"]):
        lines.insert(2, f"{row['bytes_to_target'] / MB:.1f} MB ({row['bytes_source']})")
    if not math.isnan(row["speedup"]):
        lines.append(f"speed-up {row['speedup']:.2f}, efficiency {row['efficiency']:.2f}")
    return "<br>".join(lines)


def sweep_figure(table: pd.DataFrame, target: float, metric: str) -> dict:
    """One marker per grid point that reached `target`: x its mean time to it, y the bytes
    moved by then (a point without counted bytes sits at 0, and says so in its hover).

    Example:
        >>> t = pd.DataFrame([{"point": "workers=2", "runs": 1, "reached": 1,
        ...                    "time_to_target": 4.0, "bytes_to_target": 2e6,
        ...                    "bytes_source": "counted", "final": 0.9, "final_std": 0.0,
        ...                    "speedup": 2.0, "efficiency": 1.0}])
        >>> fig = sweep_figure(t, 0.85, "accuracy")
        >>> [(d["name"], d["x"], d["y"]) for d in fig["data"]]
        [('workers=2', [4.0], [2.0])]
    """
    title = f"{SWEEP_TITLE}: {metric} {'<=' if 'loss' in metric else '>='} {target:g}"
    rows = table.dropna(subset=["time_to_target"]) if len(table) else table
    missed = [p for p in table["point"] if p not in set(rows["point"])] if len(table) else []
    if not len(rows):
        return empty_figure(title)
    traces = []
    for i, (_, row) in enumerate(rows.iterrows()):
        moved = 0.0 if math.isnan(row["bytes_to_target"]) else row["bytes_to_target"] / MB
        traces.append({"type": "scatter", "mode": "markers+text", "name": row["point"],
                       "x": [float(row["time_to_target"])], "y": [moved],
                       "text": [row["point"]], "textposition": "top center",
                       "marker": {"size": 12, "color": PALETTE[i % len(PALETTE)]},
                       "hovertext": [_hover(row)], "hoverinfo": "text"})
    if missed:
        title += f" (not reached: {'; '.join(missed)})"
    return {"data": traces, "layout": layout(title, "seconds to the target",
                                             "MB moved by then", traces)}
