"""Dashboard panels as plotly figure dicts, from the Run's plain DataFrames.

Responsible for:
- one function per panel (throughput, delay, delay histogram, batch size, loss; the node
  table is in `table`), each returning the JSON form `{"data": [...], "layout": {...}}`
  with a title of its own ("... against time", "... against step");
- readability at 16+ workers: one fixed colour and legend group per worker in every figure
  (`style`), `top_k` (the k slowest workers plus the mean of the others), throughput as a
  moving average with the raw values faint behind it;
- control events as vertical markers on every time axis.

Pure (pandas, NumPy, standard library; no plotly), so panels are tested without a browser
and the live widget and the HTML report draw the same figures. Empty inputs give an empty
figure titled "waiting for data", never an exception: a dashboard polls before data exists.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from nbdist.dashboard.hosts import hosts_figure
from nbdist.dashboard.style import (
    OTHERS_COLOR,
    PALETTE,
    empty_figure,
    has,
    layout,
    missing,
    values,
    worker_color,
)
from nbdist.dashboard.table import TABLE_COLUMNS, node_table, node_table_figure, node_table_html
from nbdist.errors import ConfigError

__all__ = [
    "CONTROL_EVENTS",
    "PALETTE",
    "TABLE_COLUMNS",
    "all_figures",
    "batch_figure",
    "delay_figure",
    "delay_histogram_figure",
    "empty_figure",
    "event_markers",
    "hosts_figure",
    "loss_figure",
    "node_table",
    "node_table_figure",
    "node_table_html",
    "slowest_workers",
    "throughput_figure",
    "worker_color",
]

LOSS_COLOR = "#0072B2"
VAL_COLOR = "#D55E00"
CONTROL_EVENTS = ("pause", "resume", "set_lr", "set_slowdown", "set_batch_policy", "set_option",
                  "regroup", "stop", "worker_added")
MEAN_POINTS = 512  # at most this many points in the "mean of the others" trace
SMOOTH_POINTS = 5  # throughput: the moving average over this many timeline points
RAW_OPACITY = 0.25


def _line(x: list, y: list, *, name: str, color: str, group: str, dash: str | None = None,
          showlegend: bool = True, shape: str = "linear") -> dict:
    line = {"color": color, "width": 1.5, "shape": shape}
    if dash:
        line["dash"] = dash
    return {"type": "scatter", "mode": "lines", "x": x, "y": y, "name": name,
            "legendgroup": group, "showlegend": showlegend, "line": line}


# -- events -----------------------------------------------------------------------------------


def _event_label(e: dict) -> str:
    kind = e["event"]
    get = lambda k: None if missing(e.get(k)) else e.get(k)  # noqa: E731
    if kind == "set_lr" and get("lr") is not None:
        return f"lr={get('lr'):g}"
    if kind == "set_slowdown" and get("worker") is not None:
        return f"w{int(get('worker'))} ×{get('factor'):g}"
    if kind == "set_batch_policy" and get("policy") is not None:
        return f"batch: {get('policy')}"
    if kind == "worker_added" and get("worker") is not None:
        return f"+w{int(get('worker'))}"
    if kind == "set_option" and get("name") is not None:
        return f"{get('name')}={get('value'):g}"
    return kind


def event_markers(events: pd.DataFrame | None, x: str = "time") -> dict:
    """Layout `shapes` (dotted vertical lines) and `annotations` (short labels) at each
    control action, so a change in a curve can be read against what the user did. Automatic
    events (epoch_end, rebalance, ...) are left out: they would crowd the axis."""
    if not has(events, "event", x):
        return {"shapes": [], "annotations": []}
    shapes, notes = [], []
    for e in events[events["event"].isin(CONTROL_EVENTS)].to_dict("records"):
        if missing(e[x]):
            continue
        at = e[x].item() if isinstance(e[x], np.generic) else e[x]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at,
                       "y0": 0, "y1": 1, "line": {"color": "#555555", "width": 1, "dash": "dot"}})
        notes.append({"x": at, "xref": "x", "y": 1, "yref": "paper", "text": _event_label(e),
                      "showarrow": False, "textangle": -90, "xanchor": "left",
                      "yanchor": "top", "font": {"size": 10, "color": "#555555"}})
    return {"shapes": shapes, "annotations": notes}


def _with_events(fig: dict, events: pd.DataFrame | None, x: str = "time") -> dict:
    if fig["data"]:
        marks = event_markers(events, x)
        fig["layout"]["shapes"] = marks["shapes"]
        fig["layout"]["annotations"] = marks["annotations"]
    return fig


# -- per-worker time series -------------------------------------------------------------------


def slowest_workers(timeline: pd.DataFrame, k: int) -> list[int]:
    """The `k` workers with the lowest mean samples/s (ties: lower worker id first)."""
    rate = timeline.groupby("worker")["samples_per_s"].mean().sort_values(kind="stable")
    return [int(w) for w in rate.index[:k]]


def _split(timeline: pd.DataFrame, top_k: int | None) -> tuple[list[int], list[int]]:
    """(workers drawn one by one, workers folded into the mean trace)."""
    workers = sorted(int(w) for w in timeline["worker"].dropna().unique())
    if top_k is None or top_k >= len(workers):
        return workers, []
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0 or None. Received: top_k={top_k}.")
    keep = (sorted(slowest_workers(timeline, top_k)) if "samples_per_s" in timeline
            else workers[:top_k])
    return keep, [w for w in workers if w not in keep]


def _others_mean(timeline: pd.DataFrame, others: list[int], column: str) -> tuple[list, list]:
    """Mean of `others` at the union of their times (each interpolated, none extrapolated)."""
    rows = timeline[timeline["worker"].isin(others)].dropna(subset=["time", column])
    grid = np.unique(rows["time"].to_numpy(float))
    if len(grid) > MEAN_POINTS:
        grid = np.linspace(grid[0], grid[-1], MEAN_POINTS)
    curves = []
    for _, f in rows.groupby("worker"):
        f = f.sort_values("time", kind="stable")
        curves.append(np.interp(grid, f["time"].to_numpy(float), f[column].to_numpy(float),
                                left=np.nan, right=np.nan))
    if not curves:
        return [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a grid point no worker covers
        mean = np.nanmean(np.vstack(curves), axis=0)
    return values(pd.Series(grid)), values(pd.Series(mean))


def _smooth(y: pd.Series, window: int | None) -> pd.Series:
    return y if not window or window <= 1 else y.rolling(window, min_periods=1).mean()


def _raw(x: list, y: list, *, color: str, group: str, shape: str) -> dict:
    """The unsmoothed values, faint behind their moving average (no legend entry, no hover)."""
    trace = _line(x, y, name=f"{group} (raw)", color=color, group=group, showlegend=False,
                  shape=shape)
    trace["opacity"], trace["hoverinfo"] = RAW_OPACITY, "skip"
    trace["line"]["width"] = 1
    return trace


def _per_worker(timeline: pd.DataFrame | None, columns: Sequence[tuple[str, str, str | None]],
                title: str, ytitle: str, top_k: int | None, events: pd.DataFrame | None,
                shape: str = "linear", smooth: int | None = None) -> dict:
    """One trace per (worker, column); columns are (name, suffix, dash); the first column's
    trace carries the worker's legend entry, the others follow it through the legend group.
    With `smooth`, each line is a moving average over that many points, the raw values faint
    behind it."""
    if not has(timeline, "worker", "time", columns[0][0]):
        return empty_figure(title)
    keep, others = _split(timeline, top_k)
    series = []  # (x, y, name, colour, group, dash, showlegend)
    for w in keep:
        f = timeline[timeline["worker"] == w].sort_values("time", kind="stable")
        for i, (col, suffix, dash) in enumerate(columns):
            if col in f:
                series.append((values(f["time"]), f[col], f"worker {w}{suffix}", worker_color(w),
                               f"worker {w}", dash, i == 0))
    for i, (col, suffix, dash) in enumerate(columns):
        if others and col in timeline:
            x, y = _others_mean(timeline, others, col)
            series.append((x, pd.Series(y, dtype=float), f"mean of {len(others)} others{suffix}",
                           OTHERS_COLOR, "others", dash or "dash", i == 0))
    traces = []
    for x, y, name, color, group, dash, legend in series:
        if smooth:
            traces.append(_raw(x, values(y), color=color, group=group, shape=shape))
        traces.append(_line(x, values(_smooth(y, smooth)), name=name, color=color, group=group,
                            dash=dash, showlegend=legend, shape=shape))
    fig = {"data": traces, "layout": layout(title, "time (s)", ytitle, traces)}
    return _with_events(fig, events)


def throughput_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                      events: pd.DataFrame | None = None,
                      smooth: int | None = SMOOTH_POINTS) -> dict:
    """Samples/s per worker over time, as a moving average over `smooth` points with the raw
    values faint behind it: who is slow, and whether DBS evens it out."""
    return _per_worker(timeline, [("samples_per_s", "", None)],
                       f"throughput per worker against time (mean of {smooth} points)"
                       if smooth and smooth > 1 else "throughput per worker against time",
                       "samples/s", top_k, events, smooth=smooth)


def delay_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                 events: pd.DataFrame | None = None) -> dict:
    """Staleness τ per worker: recent mean (solid) and p95 (dotted)."""
    return _per_worker(timeline, [("delay_mean", "", None), ("delay_p95", " p95", "dot")],
                       "delay τ per worker against time (mean solid, p95 dotted)", "versions",
                       top_k, events)


def batch_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                 events: pd.DataFrame | None = None) -> dict:
    """Batch size per worker over time (a step line: sizes change at discrete pushes)."""
    return _per_worker(timeline, [("batch_size", "", None)], "batch size per worker against time",
                       "samples per step", top_k, events, shape="hv")


def delay_histogram_figure(delays: pd.DataFrame | None) -> dict:
    """How often each delay τ occurred, one bar series per worker (the last bin counts every
    delay at or above the hub's cap)."""
    title = "how often each delay τ occurred"
    if not has(delays, "worker", "delay", "count"):
        return empty_figure(title)
    traces = []
    for w, f in delays.sort_values(["worker", "delay"], kind="stable").groupby("worker", sort=True):
        traces.append({"type": "bar", "x": values(f["delay"]), "y": values(f["count"]),
                       "name": f"worker {int(w)}", "legendgroup": f"worker {int(w)}",
                       "marker": {"color": worker_color(int(w))}})
    fig_layout = layout(title, "delay τ (versions)", "pushes", traces, barmode="group")
    fig_layout["xaxis"].update(tickmode="linear", dtick=1, tick0=0)  # whole versions only
    return {"data": traces, "layout": fig_layout}


# -- loss and accuracy ------------------------------------------------------------------------

ACCURACY_AXIS = {"title": {"text": "val accuracy"}, "overlaying": "y", "side": "right",
                 "range": [0, 1], "tickmode": "linear", "tick0": 0, "dtick": 0.2,
                 "tickformat": ".1f", "showgrid": False, "automargin": True, "fixedrange": True}


def loss_figure(history: pd.DataFrame | None, x: str = "time", *, window: int = 20,
                events: pd.DataFrame | None = None, max_points: int | None = None) -> dict:
    """Training loss (faint per-push points and their rolling mean over `window` pushes: one
    push's loss is one worker's batch, noisy) and validation accuracy on a second axis, fixed
    at 0 to 1 with ticks every 0.2. `max_points` keeps every n-th push (the mean is taken
    before thinning), so a live view of a long run sends a bounded figure."""
    if x not in ("time", "step"):
        raise ConfigError(f"loss_figure plots against 'time' or 'step'. Received: x={x!r}. "
                          "Pass x='time' or x='step'.")
    title = f"loss and validation accuracy against {x}"
    if not has(history, x):
        return empty_figure(title)
    xtitle = "time (s)" if x == "time" else "global step"
    traces = []
    if "loss" in history:
        train = history[history["loss"].notna()].sort_values(x, kind="stable")
        if not train.empty:
            mean = train["loss"].rolling(window, min_periods=1).mean()
            if max_points and len(train) > max_points:
                every = math.ceil(len(train) / max_points)
                train, mean = train.iloc[::every], mean.iloc[::every]
            xs = values(train[x])
            traces.append({"type": "scatter", "mode": "markers", "x": xs,
                           "y": values(train["loss"]), "name": "loss (each push)",
                           "legendgroup": "loss", "opacity": RAW_OPACITY,
                           "marker": {"color": LOSS_COLOR, "size": 3}})
            traces.append(_line(xs, values(mean), name=f"loss (mean of {window} pushes)",
                                color=LOSS_COLOR, group="loss"))
    for col, axis, name in (("val_loss", "y", "val loss"), ("val_accuracy", "y2", "val accuracy")):
        if col in history:
            val = history[history[col].notna()].sort_values(x, kind="stable")
            if not val.empty:
                traces.append({"type": "scatter", "mode": "lines+markers", "x": values(val[x]),
                               "y": values(val[col]), "name": name, "yaxis": axis,
                               "line": {"color": VAL_COLOR,
                                        **({"dash": "dot"} if axis == "y" else {})}})
    if not traces:
        return empty_figure(title)
    fig_layout = layout(title, xtitle, "loss", traces)
    if any(t.get("yaxis") == "y2" for t in traces):
        fig_layout["yaxis2"] = dict(ACCURACY_AXIS)
        fig_layout["margin"]["r"] = 60  # room for the accuracy ticks and title
    return _with_events({"data": traces, "layout": fig_layout}, events, x)


def all_figures(*, history: pd.DataFrame | None, nodes: pd.DataFrame | None,
                timeline: pd.DataFrame | None, delays: pd.DataFrame | None,
                events: pd.DataFrame | None, top_k: int | None = None,
                hubs: list[dict] | None = None) -> dict[str, dict]:
    """Every panel, by name, in display order (what the report and the live view draw);
    `hubs` (`run.hubs`) mark the hub shards' hosts in the hosts view."""
    return {"loss": loss_figure(history, events=events),
            "throughput": throughput_figure(timeline, top_k=top_k, events=events),
            "delay": delay_figure(timeline, top_k=top_k, events=events),
            "delay_histogram": delay_histogram_figure(delays),
            "batch": batch_figure(timeline, top_k=top_k, events=events),
            "hosts": hosts_figure(nodes, hubs),
            "nodes": node_table_figure(nodes)}
