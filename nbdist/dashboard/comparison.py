"""Runs side by side: two or more runs overlaid on the same axes.

Responsible for:
- `compare_figure`, the pure part: a figure dict of one metric of several runs (loss and
  validation accuracy against time or against samples seen, total throughput, the delay
  distribution), from each run's `history` and `delays` (so any mode works: async, sync,
  local and simulate, finished or still running);
- `run_label`: a run named by its options (algorithm, workers, DBS, mode), made unique by the
  first options that tell equal labels apart (`lr=0.1`), else by a number;
- `compare`, the public entry point (`nbdist.compare`, `run.compare`): the same figure as a
  plotly `Figure`, to show in a notebook, `update_layout` or `write_html`.

Only `compare` imports plotly, and only when it is called.

Example:
    >>> nbdist.compare(asgd_run, dc_run, metric="accuracy", x="samples")   # doctest: +SKIP
    >>> nbdist.compare({"fixed": run_a, "DBS": run_b}, metric="throughput") # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from nbdist.dashboard.style import PALETTE, empty_figure, has, layout, values
from nbdist.errors import ConfigError

__all__ = ["METRICS", "compare", "compare_figure", "comparison_figures", "named_runs", "run_label"]

METRICS = ("accuracy", "loss", "val_loss", "throughput", "delay")
XS = ("time", "samples")
THROUGHPUT_BINS = 60  # a run's throughput is drawn as samples/s over at most this many time bins
PUSHES_PER_BIN = 20  # ... each holding this many pushes on average
# Options that tell two runs apart, in the order they are named in a label.
DISTINGUISHING = ("lr", "batch_size", "seed", "epochs", "staleness", "n", "groups", "local_steps",
                  "server_optimizer", "algo_options", "slowdown", "batch_min", "batch_max",
                  "compression", "overlap", "sim")


def _option(value: object) -> str:
    value = getattr(value, "value", value)  # enums by their plain string
    if isinstance(value, dict):
        return ",".join(f"{k}={_option(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _workers(run) -> int | None:
    workers = getattr(run.config, "workers", None)
    if workers is None:
        nodes = run.nodes
        workers = len(nodes) if nodes is not None and len(nodes) else None
    return workers


def run_label(run) -> str:
    """What a reader needs to tell the run apart: its rule (or sync), workers, DBS, mode."""
    config = run.config
    mode = _option(config.mode)
    parts = ["sync allreduce" if mode == "sync" else _option(config.rule)]
    if getattr(config, "staleness_lr", False):
        parts[0] += " + staleness-lr"
    workers = _workers(run)
    if workers is not None:
        parts.append(f"{workers} worker{'s' if workers != 1 else ''}")
    if getattr(config, "dbs", False):
        parts.append("DBS")
    if mode in ("simulate", "local"):
        parts.append(mode)
    return ", ".join(parts)


def _unique(runs: list, labels: list[str]) -> list[str]:
    """Equal labels get the first options in which their runs differ, then a number."""
    out = list(labels)
    for label in set(labels):
        same = [i for i, lab in enumerate(labels) if lab == label]
        if len(same) < 2:
            continue
        configs = [runs[i].config for i in same]
        fields = [f for f in DISTINGUISHING
                  if dataclasses.is_dataclass(configs[0]) and hasattr(configs[0], f)
                  and len({_option(getattr(c, f)) for c in configs}) > 1]
        for i, config in zip(same, configs, strict=True):
            extra = [f"{f}={_option(getattr(config, f))}" for f in fields[:2]]
            out[i] = ", ".join([label, *extra])
    for label in set(out):  # still equal: the same options, e.g. a re-run or another cell
        same = [i for i, lab in enumerate(out) if lab == label]
        if len(same) > 1:
            for k, i in enumerate(same, 1):
                out[i] = f"{label} (#{k})"
    return out


def named_runs(runs: tuple, labels: list[str] | None) -> list[tuple[str, object]]:
    """(label, run) pairs from runs (or one {label: run} dict) and optional labels."""
    if len(runs) == 1 and isinstance(runs[0], Mapping):
        labels, runs = [str(k) for k in runs[0]], tuple(runs[0].values())
    if not runs:
        raise ConfigError("compare needs at least one run. Received: no runs. "
                          "Pass runs, e.g. nbdist.compare(run_a, run_b).")
    if labels is not None and len(labels) != len(runs):
        raise ConfigError(f"compare needs one label per run. Received: {len(labels)} labels for "
                          f"{len(runs)} runs. Pass labels=[...] with {len(runs)} names, or none.")
    labels = labels if labels is not None else _unique(list(runs), [run_label(r) for r in runs])
    return list(zip(labels, runs, strict=True))


def _pushes(history: pd.DataFrame) -> pd.DataFrame:
    """The history with `time` since the run's first push and `samples` seen so far."""
    h = history.sort_values(["time", "step"], kind="stable").reset_index(drop=True)
    t0 = h.loc[h["loss"].notna(), "time"].min() if "loss" in h else h["time"].min()
    h["time"] = h["time"] - (t0 if pd.notna(t0) else h["time"].min())
    seen = h["batch_size"].fillna(0) if "batch_size" in h else pd.Series(0.0, index=h.index)
    h["samples"] = seen.cumsum()
    return h


def _xy(h: pd.DataFrame, metric: str, x: str, window: int) -> tuple[list, list]:
    if metric == "loss":
        p = h[h["loss"].notna()] if "loss" in h else h.iloc[:0]
        return values(p[x]), values(p["loss"].rolling(window, min_periods=1).mean())
    column = "val_accuracy" if metric == "accuracy" else "val_loss"
    p = h[h[column].notna()] if column in h else h.iloc[:0]
    return values(p[x]), values(p[column])


def _throughput(h: pd.DataFrame) -> tuple[list, list]:
    """Samples/s of the whole run (every worker) in equal time bins."""
    p = h[h["loss"].notna()] if "loss" in h else h
    if len(p) < 2 or "batch_size" not in p:
        return [], []
    bins = max(1, min(THROUGHPUT_BINS, len(p) // PUSHES_PER_BIN))  # few pushes per bin: jagged
    edges = np.linspace(p["time"].min(), p["time"].max(), bins + 1)
    if edges[-1] <= edges[0]:
        return [], []
    counts, _ = np.histogram(p["time"], bins=edges, weights=p["batch_size"].fillna(0))
    width = edges[1] - edges[0]
    return values(pd.Series((edges[:-1] + edges[1:]) / 2)), values(pd.Series(counts / width))


def _delay_shares(delays: pd.DataFrame | None) -> tuple[list, list]:
    """The share of pushes at each delay τ (every worker together)."""
    if not has(delays, "delay", "count"):
        return [], []
    total = delays.groupby("delay")["count"].sum().sort_index()
    if total.sum() <= 0:
        return [], []
    return values(pd.Series(total.index)), values(total / total.sum())


def compare_figure(runs: list[tuple[str, object]], metric: str = "accuracy", x: str = "time",
                   *, window: int = 50) -> dict:
    """One metric of several (label, run) pairs as a figure dict, each run in its colour."""
    if metric not in METRICS:
        raise ConfigError(f"compare draws one of {', '.join(METRICS)}. Received: "
                          f"metric={metric!r}. Pass e.g. metric='accuracy'.")
    if x not in XS:
        raise ConfigError(f"compare plots against 'time' or 'samples'. Received: x={x!r}. "
                          "Pass x='time' or x='samples'.")
    if metric == "throughput":
        x = "time"  # samples/s against time; against samples it would hide the stalls
    virtual = any(_option(getattr(r.config, "mode", "")) == "simulate" for _, r in runs)
    xtitle = ("seconds since the first push" + (" (virtual for simulate runs)" if virtual else "")
              if x == "time" else "samples seen")
    name = {"accuracy": "validation accuracy", "loss": f"training loss (mean of {window} pushes)",
            "val_loss": "validation loss", "throughput": "throughput of the whole run",
            "delay": "share of pushes at each delay τ"}[metric]
    title = name if metric == "delay" else f"{name} against {x}"
    traces = []
    for i, (label, run) in enumerate(runs):
        color = PALETTE[i % len(PALETTE)]
        if metric == "delay":
            xs, ys = _delay_shares(run.delays)
            if xs:
                traces.append({"type": "bar", "x": xs, "y": ys, "name": label,
                               "marker": {"color": color}})
            continue
        history = run.history
        if not has(history, "time"):
            continue
        h = _pushes(history)
        xs, ys = _throughput(h) if metric == "throughput" else _xy(h, metric, x, window)
        if xs:
            mode = "lines+markers" if metric in ("accuracy", "val_loss") else "lines"
            traces.append({"type": "scatter", "mode": mode, "x": xs, "y": ys, "name": label,
                           "line": {"color": color, "width": 2}, "marker": {"color": color}})
    if not traces:
        return empty_figure(title)
    if metric == "delay":
        fig_layout = layout(title, "delay τ (versions)", "share of pushes", traces, barmode="group")
        fig_layout["xaxis"].update(tickmode="linear", tick0=0, dtick=1)
        fig_layout["yaxis"]["tickformat"] = ".0%"
    else:
        ytitle = {"accuracy": "val accuracy", "loss": "loss", "val_loss": "val loss",
                  "throughput": "samples/s"}[metric]
        fig_layout = layout(title, xtitle, ytitle, traces)
        if metric == "accuracy":
            fig_layout["yaxis"].update(range=[0, 1], tickmode="linear", tick0=0, dtick=0.2,
                                       tickformat=".1f")
    return {"data": traces, "layout": fig_layout}


def comparison_figures(runs: list[tuple[str, object]], *, window: int = 50) -> dict[str, dict]:
    """Every comparison, by name (what a report of several runs holds)."""
    figs = {}
    for metric in ("accuracy", "loss"):
        for x in XS:
            figs[f"compare_{metric}_{x}"] = compare_figure(runs, metric, x, window=window)
    figs["compare_throughput"] = compare_figure(runs, "throughput", window=window)
    figs["compare_delay"] = compare_figure(runs, "delay", window=window)
    return figs


def compare(*runs, metric: str = "accuracy", x: str = "time", labels: list[str] | None = None,
            window: int = 50, height: int = 400):
    """Overlay `metric` of two or more runs (finished or running, any mode) on the same axes.

    Args:
        *runs: Runs, or one dict of {label: run}.
        metric: "accuracy" (validation), "loss" (training, mean of `window` pushes),
            "val_loss", "throughput" (samples/s of the whole run) or "delay" (the share of
            pushes at each delay τ).
        x: "time" (seconds since each run's first push; virtual seconds for simulate runs)
            or "samples" (samples seen so far, fair between sync and async runs).
        labels: one name per run; default: the runs' options ("dc-asgd-a, 4 workers").

    Returns a plotly `Figure`: it shows itself in a notebook and has `write_html`.

    Example:
        >>> nbdist.compare(asgd_run, dc_run, metric="loss", x="samples")   # doctest: +SKIP
    """
    import plotly.graph_objects as go  # plotly: heavy, only to draw

    fig = compare_figure(named_runs(runs, labels), metric, x, window=window)
    fig["layout"]["height"] = height
    return go.Figure(fig)
