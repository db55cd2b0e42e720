"""`nbdist.sweep`: run one cell over a grid of options, one run after another on the same
cluster (or in simulate mode, for speed), and return the table a lab compares them by.

Responsible for the runs themselves: checking every grid point before the first one trains,
one run per point and seed (plus a one-worker baseline for the speed-ups), a progress bar,
stopping cleanly on Ctrl-C, and a results file that a later call continues from. The
arithmetic is `nbdist.sweeps.table`, the figure `nbdist.dashboard.sweep_figure`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nbdist.config import TrainConfig
from nbdist.core.compression import parse
from nbdist.errors import ConfigError, NbdistError
from nbdist.flag_values import parse_slowdown
from nbdist.flags import check_option_names
from nbdist.modes import check_cluster
from nbdist.sweeps.table import (
    allgather_bytes,
    grid_names,
    grid_points,
    point_label,
    reached,
    ring_bytes,
    summarize,
)

__all__ = ["SweepResult", "sweep"]

RUN_COLUMNS = ["workers", "seed", "baseline", "status", "error", "time_to_target",
               "step_to_target", "bytes_to_target", "bytes_source", "final", "wall_s",
               "compute_per_sample_s"]


@dataclass
class SweepResult:
    """What `nbdist.sweep` returns: one row per run (`runs`), one per grid point over its
    seeds (`table`), and `figure`, a plotly figure of time against bytes to the target.
    `interrupted`: Ctrl-C ended the sweep before its last run (call again with the same
    `results=` file to continue)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    target: float
    metric: str
    interrupted: bool = False

    @property
    def figure(self):
        import plotly.graph_objects as go  # plotly: heavy, only to draw

        from nbdist.dashboard.sweep_figure import sweep_figure

        return go.Figure(sweep_figure(self.table, self.target, self.metric))

    def _repr_html_(self) -> str:
        note = "<p>interrupted: call again with the same results= to continue</p>" * bool(
            self.interrupted)
        return note + self.table.to_html(index=False, float_format=lambda v: f"{v:.4g}")


def sweep(cell: str, grid: Mapping[str, Sequence] | Sequence[Mapping], *, target: float,
          metric: str = "accuracy",
          seeds: Sequence[int] = (0,), cluster=None, results: str | os.PathLike | None = None,
          baseline: bool = True, progress: bool = True, **options) -> SweepResult:
    """Train `cell` once per combination of `grid`'s values (or per point, for a list of dicts:
    ways of training that differ in more than one option) and per seed, with `options`
    (TrainConfig's fields, as `nbdist.train` takes them) for every run, and tabulate when each
    reached `target` on the validation `metric`.

    Every point is checked before the first run starts. Unless the grid has `workers=1`, one
    baseline run per seed (one worker, `options` only) gives the speed-ups. A run that fails
    is a row with its error; Ctrl-C stops the running run and returns what is done. With
    `results="sweep.jsonl"`, each finished run is appended there, and a later call with the
    same file runs only what is missing.

    Example:
        >>> result = nbdist.sweep(CELL, {"compression": ["none", "int8"]}, target=0.85,
        ...                       seeds=[0, 1], cluster=cluster, workers=2)  # doctest: +SKIP
        >>> result.table                                                      # doctest: +SKIP
    """
    if not grid:
        raise ConfigError(f"nbdist.sweep needs a grid: a dict of options to the values to try "
                          f"(Received: {grid!r}). Example: grid={{'compression': ['none', "
                          f"'int8'], 'workers': [1, 2]}}.")
    points = grid_points(grid)
    names = grid_names(grid)
    check_option_names([*names, *options])
    if "seed" in options:
        raise ConfigError("nbdist.sweep: pass the seeds as seeds=[...], not seed=: the table "
                          "takes its mean and spread over them.")
    if not isinstance(target, int | float) or isinstance(target, bool) or not math.isfinite(
            target):
        raise ConfigError(f"nbdist.sweep: target must be a number, the validation {metric} to "
                          f"reach (Received: {target!r}). Example: target=0.85.")
    points = [(p, False) for p in points]
    if baseline and not any(p.get("workers") == 1 for p, _ in points):
        points.append((_one_worker(options), True))
    plan = [(point, seed, base) for point, base in points for seed in seeds]
    configs = {}
    for point, _, _ in plan:  # a bad point is refused before anything trains
        label = point_label(point)
        try:
            configs[label] = TrainConfig(**{**options, **point})
        except ConfigError as exc:
            raise ConfigError(f"nbdist.sweep: the grid point {label} is refused, before any run "
                              f"started: {exc}") from None
        check_cluster(configs[label].mode, cluster)
    store = _Results(results, _fingerprint(cell, grid, options, target, metric))
    rows, interrupted = [], False
    bar = _Progress(len(plan), enabled=progress)
    try:
        for i, (point, seed, base) in enumerate(plan):
            key = _key(point, seed, base)
            bar.show(i, f"{point_label(point)}, seed {seed}")
            row = store.done.get(key)
            if row is None:
                row = _one_run(cell, cluster, {**options, **point}, configs[point_label(point)],
                               seed, target, metric)
                store.add(key, {**point, **row, "seed": seed, "baseline": base})
            rows.append({**point, **row, "seed": seed, "baseline": base})
        bar.show(len(plan), "done")
    except KeyboardInterrupt:  # the running run was stopped (Run.wait); keep what is done
        interrupted = True
        bar.show(len(rows), "interrupted: call again with the same results= to continue"
                 if results else "interrupted")
    runs = pd.DataFrame(rows, columns=[*names, *(c for c in RUN_COLUMNS if c not in names)])
    table = summarize(runs, names) if len(runs) else pd.DataFrame()
    return SweepResult(runs, table, float(target), metric, interrupted)


def _one_worker(options: dict) -> dict:
    """The baseline's options: one worker (in simulate, the first --slowdown factor's)."""
    slowdown = options.get("slowdown")
    if not slowdown:
        return {"workers": 1}
    return {"workers": 1, "slowdown": parse_slowdown(slowdown)[:1]}


def _one_run(cell: str, cluster, options: dict, config: TrainConfig, seed: int, target: float,
             metric: str) -> dict:
    """One run to its end: its row (a failed run's too)."""
    from nbdist.api import train  # the run's machinery: not at `import nbdist`

    started = time.monotonic()
    try:
        run = train(cell, cluster=cluster, namespace={}, wait=True, seed=seed, **options)
    except NbdistError as exc:
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                "wall_s": time.monotonic() - started}
    row = {"status": run.status, "error": None if run.error is None else str(run.error),
           "workers": len(run.nodes),
           "wall_s": time.monotonic() - started,
           # the workers' compute per sample, as the run measured it (in simulate, the cost
           # model's): what --sim per_sample takes to predict the run (benchmarks/
           # communication_lab.py --predict)
           "compute_per_sample_s": _compute_per_sample(run.nodes),
           **reached(run.history, target, metric)}
    row["bytes_source"] = "counted" if not math.isnan(row["bytes_to_target"]) else None
    synchronous = config.mode.value == "sync" or (config.mode.value == "simulate"
                                                   and config.sim.get("sync"))
    if synchronous and not math.isnan(row["step_to_target"]):
        workers = max(1, len(run.nodes))  # the hub counts each rank's step: M per allreduce
        shapes = [tuple(v.shape) for v in run.model.trainable_weights]
        floats = sum(math.prod(shape) for shape in shapes)
        codec = parse(config.compression).bind(shapes, 0, floats)  # powersgd: its factors
        frame, steps = codec.wire_bytes(floats), row["step_to_target"] / workers
        if codec.gathered:  # frames an allreduce cannot sum (nbdist.core.gathered)
            row["bytes_to_target"] = allgather_bytes(steps, workers, frame)
            row["bytes_source"] = "ring allgather (modelled)"
        else:
            row["bytes_to_target"] = ring_bytes(steps, workers, frame)
            row["bytes_source"] = "ring allreduce (modelled)"
    return row


def _compute_per_sample(nodes) -> float:
    """Seconds of compute per sample over the run's workers (NaN before any sample): a run's
    speed without its waiting and communication, which is what a simulation is given."""
    samples = nodes["samples"].sum() if "samples" in nodes else 0
    return float(nodes["compute_s"].sum() / samples) if samples else math.nan


def _fingerprint(cell: str, grid: Mapping, options: dict, target: float, metric: str) -> str:
    described = json.dumps({"cell": cell, "grid": [{k: str(v) for k, v in p.items()}
                                                   for p in grid_points(grid)],
                            "options": {k: str(v) for k, v in sorted(options.items())},
                            "target": target, "metric": metric}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def _key(point: dict, seed: int, base: bool) -> str:
    return json.dumps({"point": {k: str(v) for k, v in point.items()}, "seed": seed,
                       "baseline": base}, sort_keys=True)


class _Results:
    """The results file: a header naming the sweep, then one JSON line per finished run."""

    def __init__(self, path, fingerprint: str):
        self.path = None if path is None else Path(path)
        self.done: dict[str, dict] = {}
        if self.path is None:
            return
        if self.path.exists() and self.path.stat().st_size:
            lines = self.path.read_text().splitlines()
            header = json.loads(lines[0])
            if header.get("sweep") != fingerprint:
                raise ConfigError(
                    f"nbdist.sweep: {self.path} holds the results of another sweep (another "
                    f"cell, grid, options or target), so its runs cannot continue this one. "
                    f"Pass another results= path, or delete the file to start again.")
            for line in lines[1:]:
                entry = json.loads(line)
                self.done[entry["key"]] = entry["row"]
        else:
            self.path.write_text(json.dumps({"sweep": fingerprint}) + "\n")

    def add(self, key: str, row: dict) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "row": row}, default=_plain) + "\n")


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)


def _in_a_kernel() -> bool:
    """Whether this runs in a Jupyter kernel, where a widget shows under the cell."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


class _Progress:
    """A progress bar under the cell in a notebook (ipywidgets), else one line per run."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self._bar = total, enabled, None
        if enabled and _in_a_kernel():
            try:
                import ipywidgets
                from IPython.display import display

                self._bar = ipywidgets.IntProgress(value=0, min=0, max=total,
                                                   description="sweep")
                self._label = ipywidgets.Label()
                display(ipywidgets.HBox([self._bar, self._label]))
            except ImportError:
                self._bar = None

    def show(self, done: int, what: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.value, self._label.value = done, f"{done}/{self.total} {what}"
        else:
            print(f"sweep {done}/{self.total}: {what}", flush=True)
