"""Dashboard panels as plotly figure dicts, from the Run's plain DataFrames.

Responsible for:
- one function per panel (throughput, delay, delay histogram, batch size, loss, node table),
  each returning the JSON form `{"data": [...], "layout": {...}}`;
- readability at 16+ workers: one fixed colour and legend group per worker in every figure,
  and `top_k` (the k slowest workers plus the mean of the others);
- control events as vertical markers on every time axis.

Pure (pandas, NumPy, standard library; no plotly), so panels are tested without a browser
and the live widget and the HTML report draw the same figures. Empty inputs give an empty
figure titled "waiting for data", never an exception: a dashboard polls before data exists.
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

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
    "loss_figure",
    "node_table",
    "node_table_figure",
    "node_table_html",
    "slowest_workers",
    "throughput_figure",
    "worker_color",
]

# plotly's "Dark24": 24 distinct colours, so 16 workers never share one.
PALETTE = ("#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#222A2A", "#B68100",
           "#750D86", "#EB663B", "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D",
           "#6C7C32", "#778AAE", "#862A16", "#A777F1", "#620042", "#1616A7", "#DA60CA",
           "#6C4516", "#0D2A63", "#AF0038")
OTHERS_COLOR = "#9E9E9E"
LOSS_COLOR = "#636EFA"
VAL_COLOR = "#EF553B"
CONTROL_EVENTS = ("pause", "resume", "set_lr", "set_slowdown", "set_batch_policy", "set_option",
                  "regroup", "stop", "worker_added")
TABLE_COLUMNS = ("worker", "state", "slowdown", "group", "batch_size", "samples_per_s",
                 "delay_mean", "delay_p95")
MEAN_POINTS = 512  # at most this many points in the "mean of the others" trace
WAITING = "waiting for data"


def worker_color(worker: int) -> str:
    """The colour of `worker` in every figure (the palette wraps after 24 workers)."""
    return PALETTE[int(worker) % len(PALETTE)]


def _values(series: pd.Series) -> list:
    """Python numbers for JSON: NaN becomes None, NumPy scalars become int/float."""
    return [None if _missing(v) else (v.item() if isinstance(v, np.generic) else v)
            for v in series]


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float | np.floating) and math.isnan(v))


def _has(frame: pd.DataFrame | None, *columns: str) -> bool:
    return frame is not None and not frame.empty and all(c in frame.columns for c in columns)


def _layout(title: str, xtitle: str, ytitle: str, **extra: object) -> dict:
    return {"title": {"text": title}, "xaxis": {"title": {"text": xtitle}},
            "yaxis": {"title": {"text": ytitle}}, "template": "plotly_white",
            "legend": {"groupclick": "togglegroup"}, "uirevision": "nbdist",
            "margin": {"t": 60, "r": 20}, **extra}


def empty_figure(title: str) -> dict:
    """A valid figure with no traces, for panels polled before their data exists."""
    return {"data": [], "layout": {"title": {"text": f"{title}: {WAITING}"},
                                   "template": "plotly_white", "uirevision": "nbdist",
                                   "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


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
    get = lambda k: None if _missing(e.get(k)) else e.get(k)  # noqa: E731
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
    if not _has(events, "event", x):
        return {"shapes": [], "annotations": []}
    shapes, notes = [], []
    for e in events[events["event"].isin(CONTROL_EVENTS)].to_dict("records"):
        if _missing(e[x]):
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
    keep = sorted(slowest_workers(timeline, top_k)) if "samples_per_s" in timeline else workers[:top_k]
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
    return _values(pd.Series(grid)), _values(pd.Series(mean))


def _per_worker(timeline: pd.DataFrame | None, columns: Sequence[tuple[str, str, str | None]],
                title: str, ytitle: str, top_k: int | None, events: pd.DataFrame | None,
                shape: str = "linear") -> dict:
    """One trace per (worker, column); columns are (name, suffix, dash); the first column's
    trace carries the worker's legend entry, the others follow it through the legend group."""
    if not _has(timeline, "worker", "time", columns[0][0]):
        return empty_figure(title)
    keep, others = _split(timeline, top_k)
    traces = []
    for w in keep:
        f = timeline[timeline["worker"] == w].sort_values("time", kind="stable")
        for i, (col, suffix, dash) in enumerate(columns):
            if col in f:
                traces.append(_line(_values(f["time"]), _values(f[col]), name=f"worker {w}{suffix}",
                                    color=worker_color(w), group=f"worker {w}", dash=dash,
                                    showlegend=i == 0, shape=shape))
    for i, (col, suffix, dash) in enumerate(columns):
        if others and col in timeline:
            x, y = _others_mean(timeline, others, col)
            traces.append(_line(x, y, name=f"mean of {len(others)} others{suffix}",
                                color=OTHERS_COLOR, group="others", dash=dash or "dash",
                                showlegend=i == 0, shape=shape))
    return _with_events({"data": traces, "layout": _layout(title, "time (s)", ytitle)}, events)


def throughput_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                      events: pd.DataFrame | None = None) -> dict:
    """Samples/s per worker over time: who is slow, and whether DBS evens it out."""
    return _per_worker(timeline, [("samples_per_s", "", None)], "throughput per worker",
                       "samples/s", top_k, events)


def delay_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                 events: pd.DataFrame | None = None) -> dict:
    """Staleness τ per worker: recent mean (solid) and p95 (dotted)."""
    return _per_worker(timeline, [("delay_mean", "", None), ("delay_p95", " p95", "dot")],
                       "delay τ per worker (mean solid, p95 dotted)", "versions", top_k, events)


def batch_figure(timeline: pd.DataFrame | None, *, top_k: int | None = None,
                 events: pd.DataFrame | None = None) -> dict:
    """Batch size per worker over time (a step line: sizes change at discrete pushes)."""
    return _per_worker(timeline, [("batch_size", "", None)], "batch size per worker",
                       "samples per step", top_k, events, shape="hv")


def delay_histogram_figure(delays: pd.DataFrame | None) -> dict:
    """How often each delay τ occurred, one bar series per worker (the last bin counts every
    delay at or above the hub's cap)."""
    title = "delay histogram"
    if not _has(delays, "worker", "delay", "count"):
        return empty_figure(title)
    traces = []
    for w, f in delays.sort_values(["worker", "delay"], kind="stable").groupby("worker", sort=True):
        traces.append({"type": "bar", "x": _values(f["delay"]), "y": _values(f["count"]),
                       "name": f"worker {int(w)}", "legendgroup": f"worker {int(w)}",
                       "marker": {"color": worker_color(int(w))}})
    return {"data": traces, "layout": _layout(title, "delay τ (versions)", "pushes",
                                              barmode="group")}


# -- loss and accuracy ------------------------------------------------------------------------


def loss_figure(history: pd.DataFrame | None, x: str = "time", *, window: int = 20,
                events: pd.DataFrame | None = None, max_points: int | None = None) -> dict:
    """Training loss (faint per-push points and their rolling mean over `window` pushes: one
    push's loss is one worker's batch, noisy) and validation accuracy on a second axis.
    `max_points` keeps every n-th push (the mean is taken before thinning), so a live view of
    a long run sends a bounded figure."""
    if x not in ("time", "step"):
        raise ConfigError(f"loss_figure plots against 'time' or 'step'. Received: x={x!r}.")
    title = "loss and validation accuracy"
    if not _has(history, x):
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
            xs = _values(train[x])
            traces.append({"type": "scatter", "mode": "markers", "x": xs,
                           "y": _values(train["loss"]), "name": "loss (each push)",
                           "opacity": 0.25, "marker": {"color": LOSS_COLOR, "size": 3}})
            traces.append(_line(xs, _values(mean), name=f"loss (mean of {window} pushes)",
                                color=LOSS_COLOR, group="loss"))
    for col, axis, name in (("val_loss", "y", "val loss"), ("val_accuracy", "y2", "val accuracy")):
        if col in history:
            val = history[history[col].notna()].sort_values(x, kind="stable")
            if not val.empty:
                traces.append({"type": "scatter", "mode": "lines+markers", "x": _values(val[x]),
                               "y": _values(val[col]), "name": name, "yaxis": axis,
                               "line": {"color": VAL_COLOR, **({"dash": "dot"} if axis == "y" else {})}})
    if not traces:
        return empty_figure(title)
    layout = _layout(title, xtitle, "loss", yaxis2={
        "title": {"text": "val accuracy"}, "overlaying": "y", "side": "right",
        "rangemode": "tozero", "showgrid": False},
        legend={"groupclick": "togglegroup", "x": 1.15, "xanchor": "left"})  # clear of the right axis
    return _with_events({"data": traces, "layout": layout}, events, x)


# -- node table -------------------------------------------------------------------------------


def _cell(column: str, v: object) -> str:
    if isinstance(v, list | tuple | np.ndarray):
        return ",".join(str(int(i)) for i in v)
    if _missing(v) or v is pd.NA:
        return ""
    if column in ("samples_per_s",):
        return f"{float(v):.1f}"
    if column in ("delay_mean", "delay_p95"):
        return f"{float(v):.2f}"
    if column == "slowdown":
        return f"{float(v):g}"
    if isinstance(v, float | np.floating) and float(v).is_integer():
        return str(int(v))
    return str(v.item() if isinstance(v, np.generic) else v)


def node_table(nodes: pd.DataFrame | None) -> dict:
    """A plotly table trace, one row per worker, values as display strings; the worker id is
    drawn in the worker's colour to tie the row to its curves."""
    rows = [] if nodes is None else nodes.to_dict("records")
    cells = [[_cell(c, r.get(c)) for r in rows] for c in TABLE_COLUMNS]
    colors = [[worker_color(r["worker"]) if not _missing(r.get("worker")) else "#222222"
               for r in rows]] + [["#222222"] * len(rows)] * (len(TABLE_COLUMNS) - 1)
    return {"type": "table",
            "header": {"values": list(TABLE_COLUMNS), "fill": {"color": "#EEEEEE"},
                       "align": "left", "font": {"size": 12}},
            "cells": {"values": cells, "align": "left", "font": {"color": colors, "size": 12}}}


def node_table_html(nodes: pd.DataFrame | None) -> str:
    """The node table as a small HTML table (the live dashboard's panel: text is cheaper to
    refresh than a plotly table and can be read and searched in the page)."""
    if nodes is None or nodes.empty:
        return f"<p><i>workers: {WAITING}</i></p>"
    pad = "padding:2px 10px 2px 0;text-align:left"
    head = "".join(f'<th style="{pad}">{html.escape(c)}</th>' for c in TABLE_COLUMNS)
    body = []
    for r in nodes.to_dict("records"):
        color = worker_color(int(r["worker"])) if not _missing(r.get("worker")) else "#222222"
        cells = [f'<td style="{pad};color:{color};font-weight:bold">{html.escape(_cell("worker", r.get("worker")))}</td>']
        cells += [f'<td style="{pad}">{html.escape(_cell(c, r.get(c)))}</td>' for c in TABLE_COLUMNS[1:]]
        body.append(f'<tr class="nbdist-node">{"".join(cells)}</tr>')
    return (f'<table class="nbdist-nodes" style="border-collapse:collapse;font-size:12px">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def node_table_figure(nodes: pd.DataFrame | None) -> dict:
    """The node table as a figure, sized to its rows."""
    title = "workers"
    if nodes is None or nodes.empty:
        return empty_figure(title)
    return {"data": [node_table(nodes)],
            "layout": {"title": {"text": title}, "height": 90 + 26 * (len(nodes) + 1),
                       "margin": {"t": 40, "b": 10, "l": 10, "r": 10}, "uirevision": "nbdist"}}


def all_figures(*, history: pd.DataFrame | None, nodes: pd.DataFrame | None,
                timeline: pd.DataFrame | None, delays: pd.DataFrame | None,
                events: pd.DataFrame | None, top_k: int | None = None) -> dict[str, dict]:
    """Every panel, by name, in display order (what the report and the live view draw)."""
    return {"loss": loss_figure(history, events=events),
            "throughput": throughput_figure(timeline, top_k=top_k, events=events),
            "delay": delay_figure(timeline, top_k=top_k, events=events),
            "delay_histogram": delay_histogram_figure(delays),
            "batch": batch_figure(timeline, top_k=top_k, events=events),
            "nodes": node_table_figure(nodes)}
