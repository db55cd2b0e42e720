"""A sweep's arithmetic: the grid's points, where a run first reached the target, and the
table over seeds with the speed-up against one worker. Pure (pandas, NumPy): the runner
(`nbdist.sweeps.runner`) hands it each run's history and numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from nbdist.errors import ConfigError

__all__ = ["BASELINE", "TABLE_COLUMNS", "grid_names", "grid_points", "point_label", "reached",
           "ring_bytes", "allgather_bytes", "summarize"]

BASELINE = "one worker (baseline)"  # the run the speed-ups count from, where the grid has none
# one row per grid point, over its seeds
TABLE_COLUMNS = ["point", "runs", "reached", "time_to_target", "bytes_to_target", "bytes_source",
                 "final", "final_std", "speedup", "efficiency"]


def grid_points(grid: Mapping[str, Sequence] | Sequence[Mapping]) -> list[dict]:
    """Every combination of the grid's values, the first option varying slowest; or, for a
    list of dicts (ways of training that differ in more than one option), those points.

    Example:
        >>> grid_points({"workers": [1, 2], "compression": ["none", "int8"]})[:3]
        [{'workers': 1, 'compression': 'none'}, {'workers': 1, 'compression': 'int8'}, \
{'workers': 2, 'compression': 'none'}]
        >>> grid_points([{"mode": "sync"}, {"algorithm": "diloco", "local_steps": 50}])
        [{'mode': 'sync'}, {'algorithm': 'diloco', 'local_steps': 50}]
    """
    if not isinstance(grid, Mapping):
        points = list(grid) if isinstance(grid, Sequence) and not isinstance(grid, str) else []
        if not points or not all(isinstance(p, Mapping) for p in points):
            raise ConfigError(f"nbdist.sweep: a grid is a dict of options to the values to try, "
                              f"or a list of dicts, one per way of training (Received: "
                              f"{grid!r}). Example: [{{'mode': 'sync'}}, {{'algorithm': "
                              f"'diloco'}}].")
        if any("seed" in p for p in points):
            raise ConfigError("nbdist.sweep: pass the seeds as seeds=[0, 1, 2], not in the grid: "
                              "the table takes its mean and spread over them.")
        return [dict(p) for p in points]
    for name, values in grid.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ConfigError(f"nbdist.sweep: grid[{name!r}] must be a non-empty list of the "
                              f"values to try (Received: {values!r}). Example: "
                              f"grid={{{name!r}: [{values!r}]}}.")
        if name == "seed":
            raise ConfigError("nbdist.sweep: pass the seeds as seeds=[0, 1, 2], not in the grid: "
                              "the table takes its mean and spread over them.")
    names = list(grid)
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(grid[n] for n in names))]


def grid_names(grid: Mapping[str, Sequence] | Sequence[Mapping]) -> list[str]:
    """The options a grid sets, in the order they first appear."""
    if isinstance(grid, Mapping):
        return list(grid)
    return list(dict.fromkeys(name for point in grid for name in point))


def point_label(point: Mapping) -> str:
    """"workers=2, compression=int8", leaving out the options a point does not set (the cell
    as it is: "defaults")."""
    return ", ".join(f"{k}={_shown(v)}" for k, v in point.items() if not _unset(v)) or "defaults"


def _shown(value) -> str:
    """A whole number as one (a table's column with gaps holds its integers as floats)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unset(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def reached(history: pd.DataFrame, target: float, metric: str) -> dict:
    """When a run's validation first reached `target`: its time (s, from the run's first
    applied push, so that engines still loading their libraries do not count), global step
    and the bytes moved by then (NaN: never, or not counted), and the last validation's value.
    A metric whose name has "loss" in it is reached from above, the others from below.

    Example:
        >>> h = pd.DataFrame({"time": [0.5, 1.0, 2.0, 3.0], "step": [1, 10, 20, 30],
        ...                   "loss": [2.0, None, None, None], "bytes": [None, 100, 200, 300],
        ...                   "val_accuracy": [None, 0.5, 0.8, 0.9]})
        >>> reached(h, 0.75, "accuracy")
        {'time_to_target': 1.5, 'step_to_target': 20, 'bytes_to_target': 200, 'final': 0.9}
    """
    column = metric if metric.startswith("val_") else f"val_{metric}"
    none = {"time_to_target": math.nan, "step_to_target": math.nan,
            "bytes_to_target": math.nan, "final": math.nan}
    if history is None or column not in history.columns:
        return none
    rows = history.dropna(subset=[column]).sort_values("time", kind="stable")
    if rows.empty:
        return none
    values = rows[column].to_numpy(dtype=float)
    hit = np.flatnonzero(values <= target if "loss" in column else values >= target)
    result = {**none, "final": float(values[-1])}
    if hit.size:
        first = rows.iloc[int(hit[0])]
        moved = first.get("bytes", math.nan)
        pushes = history["time"][history["loss"].notna()] if "loss" in history else []
        start = float(pushes.min()) if len(pushes) else 0.0
        result.update(time_to_target=float(first["time"]) - start,
                      step_to_target=int(first["step"]),
                      bytes_to_target=(math.nan if moved is None or pd.isna(moved)
                                       else int(moved)))
    return result


def ring_bytes(steps: float, workers: int, frame_bytes: int) -> float:
    """The bytes a ring allreduce moves over the network in `steps` steps of `workers` ranks,
    each byte counted once: every rank sends 2 (M - 1) / M of the buffer per step.

    Example:
        >>> ring_bytes(10, 4, 1000)
        60000.0
    """
    return float(steps) * 2 * (workers - 1) * frame_bytes


def allgather_bytes(steps: float, workers: int, frame_bytes: int) -> float:
    """The bytes a ring allgather of one frame per rank moves over the network in `steps`
    steps of `workers` ranks, each byte counted once: every rank sends M - 1 frames per step.

    Example:
        >>> allgather_bytes(10, 4, 250)
        30000.0
    """
    return float(steps) * workers * (workers - 1) * frame_bytes


def summarize(rows: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """One row per grid point (its options in `names`) over its seeds: how many runs finished
    and reached the target, the mean time and bytes to it (over the runs that reached it), the
    final metric's mean and spread, and the speed-up and efficiency of the mean time against
    the point with one worker and otherwise the same options (else the baseline runs: rows
    whose `baseline` is True, one worker and none of the grid's options).

    Example:
        >>> rows = pd.DataFrame({"workers": [1, 2, 2], "seed": [0, 0, 1],
        ...                      "status": ["finished"] * 3, "time_to_target": [8.0, 5.0, 3.0],
        ...                      "bytes_to_target": [1.0, 2.0, 2.0], "bytes_source": "counted",
        ...                      "final": [0.9, 0.8, 0.9]})
        >>> summarize(rows, ["workers"])[["point", "time_to_target", "speedup", "efficiency"]]
               point  time_to_target  speedup  efficiency
        0  workers=1             8.0      1.0         1.0
        1  workers=2             4.0      2.0         1.0
    """
    names = list(names)
    table = []
    flagged = (rows["baseline"].fillna(False).astype(bool) if "baseline" in rows
               else pd.Series(False, index=rows.index))
    groups = list(rows[~flagged].groupby(names, sort=False, dropna=False) if names
                  else [((), rows[~flagged])])
    if np.any(flagged):
        groups.append((None, rows[flagged]))
    for key, group in groups:
        point = ({} if key is None
                 else dict(zip(names, key if isinstance(key, tuple) else (key,), strict=True)))
        done = group[group["status"] == "finished"]
        hit = done.dropna(subset=["time_to_target"])
        sources = sorted(set(hit["bytes_source"].dropna())) if "bytes_source" in hit else []
        table.append({**point, "point": BASELINE if key is None else point_label(point),
                      "workers": 1 if key is None else point.get("workers", _workers(group)),
                      "runs": len(group),
                      "reached": len(hit),
                      "time_to_target": hit["time_to_target"].mean() if len(hit) else math.nan,
                      "bytes_to_target": hit["bytes_to_target"].mean() if len(hit) else math.nan,
                      "bytes_source": ", ".join(sources),
                      "final": done["final"].mean() if len(done) else math.nan,
                      "final_std": done["final"].std(ddof=0) if len(done) else math.nan})
    table = pd.DataFrame(table)
    table["speedup"], table["efficiency"] = _speedups(table, names)
    return table[[*names, *TABLE_COLUMNS]]


def _workers(group: pd.DataFrame) -> float:
    """How many workers a point's runs had, where the grid does not set it (the runner
    records each run's)."""
    return group["workers"].median() if "workers" in group else math.nan


def _speedups(table: pd.DataFrame, names: list[str]) -> tuple[list, list]:
    """Each point's one-worker time over its own, and that over its workers (NaN where the
    number of workers is the cell's or nbdist's choice, not the grid's)."""
    others = [n for n in names if n != "workers"]
    ones = table[table["workers"] == 1]
    baseline = ones.loc[ones["point"] == BASELINE, "time_to_target"]
    speedups, efficiencies = [], []
    for _, row in table.iterrows():
        same = ones[ones["point"] != BASELINE]
        for name in others:
            same = same[same[name] == row[name]] if row["point"] != BASELINE else same.iloc[:0]
        base = (same["time_to_target"].iloc[0] if len(same)
                else baseline.iloc[0] if len(baseline) else math.nan)
        speedup = base / row["time_to_target"] if row["time_to_target"] > 0 else math.nan
        speedups.append(speedup)
        efficiencies.append(speedup / row["workers"] if row["workers"] > 0 else math.nan)
    return speedups, efficiencies
