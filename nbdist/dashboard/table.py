"""The node table of the dashboard: one row per worker, as a plotly table and as HTML.

Responsible for turning `run.nodes` into display strings (rounded rates and delays, groups
as "0,2", blanks for what is not known yet) and drawing each worker id in its colour, the one
it has in every figure; the GPU columns (name, utilisation, memory used of total) appear only
when some worker's engine has a GPU, and the `wire` column (the codec, and its frames' bytes as
a share of float32's) only when some worker compresses them. Pure (pandas, NumPy, standard
library; no plotly).
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from nbdist.dashboard.style import WAITING, empty_figure, missing, worker_color

__all__ = ["GPU_COLUMNS", "TABLE_COLUMNS", "WIRE_COLUMNS", "node_table", "node_table_figure",
           "node_table_html", "table_columns"]

TABLE_COLUMNS = ("worker", "state", "slowdown", "group", "batch_size", "samples_per_s",
                 "delay_mean", "delay_p95")
GPU_COLUMNS = ("gpu", "gpu_util", "gpu_mem")  # shown only when some worker has a GPU
WIRE_COLUMNS = ("wire",)  # shown only when some worker's frames are compressed
GB = 2**30


def table_columns(nodes: pd.DataFrame | None) -> tuple[str, ...]:
    """The columns to show: the wire's when some worker compresses its frames, the GPU's when
    some worker reported one."""
    columns = TABLE_COLUMNS
    if nodes is not None and "compression" in nodes.columns and any(
            not missing(v) and v != "none" for v in nodes["compression"]):
        columns += WIRE_COLUMNS
    if nodes is not None and "gpu" in nodes.columns and not all(missing(v) for v in nodes["gpu"]):
        columns += GPU_COLUMNS
    return columns


def _wire(row: dict) -> str:
    """The codec and its frames' share of float32's bytes: "int8 25%" (the codec alone
    before its first frame)."""
    codec, ratio = row.get("compression"), row.get("compression_ratio")
    if missing(codec):
        return ""
    return codec if missing(ratio) else f"{codec} {100 * float(ratio):.0f}%"


def _gpu_mem(row: dict) -> str:
    """Memory used of total, in GiB: "3.0 / 16.0 GB" ("? / 16.0 GB" before the first reading)."""
    used, total = row.get("gpu_mem"), row.get("gpu_mem_total")
    if missing(total):
        return "" if missing(used) else f"{float(used) / GB:.1f} GB"
    return f"{'?' if missing(used) else f'{float(used) / GB:.1f}'} / {float(total) / GB:.1f} GB"


def _cell(column: str, row: dict) -> str:
    if column == "gpu_mem":
        return _gpu_mem(row)
    if column == "wire":
        return _wire(row)
    v = row.get(column)
    if isinstance(v, list | tuple | np.ndarray):
        return ",".join(str(int(i)) for i in v)
    if missing(v) or v is pd.NA:
        return ""
    if column in ("samples_per_s",):
        return f"{float(v):.1f}"
    if column in ("delay_mean", "delay_p95"):
        return f"{float(v):.2f}"
    if column == "gpu_util":
        return f"{float(v):.0f}%"
    if column == "slowdown":
        return f"{float(v):g}"
    if isinstance(v, float | np.floating) and float(v).is_integer():
        return str(int(v))
    return str(v.item() if isinstance(v, np.generic) else v)


def node_table(nodes: pd.DataFrame | None) -> dict:
    """A plotly table trace, one row per worker, values as display strings; the worker id is
    drawn in the worker's colour to tie the row to its curves."""
    rows = [] if nodes is None else nodes.to_dict("records")
    columns = table_columns(nodes)
    cells = [[_cell(c, r) for r in rows] for c in columns]
    colors = [[worker_color(r["worker"]) if not missing(r.get("worker")) else "#222222"
               for r in rows]] + [["#222222"] * len(rows)] * (len(columns) - 1)
    return {"type": "table",
            "header": {"values": list(columns), "fill": {"color": "#EEEEEE"},
                       "align": "left", "font": {"size": 12}},
            "cells": {"values": cells, "align": "left", "font": {"color": colors, "size": 12}}}


def node_table_html(nodes: pd.DataFrame | None) -> str:
    """The node table as a small HTML table (the live dashboard's panel: text is cheaper to
    refresh than a plotly table and can be read and searched in the page)."""
    if nodes is None or nodes.empty:
        return f"<p><i>workers: {WAITING}</i></p>"
    pad = "padding:2px 10px 2px 0;text-align:left"
    columns = table_columns(nodes)
    head = "".join(f'<th style="{pad}">{html.escape(c)}</th>' for c in columns)
    body = []
    for r in nodes.to_dict("records"):
        color = worker_color(int(r["worker"])) if not missing(r.get("worker")) else "#222222"
        cells = [f'<td style="{pad};color:{color};font-weight:bold">'
                 f'{html.escape(_cell("worker", r))}</td>']
        cells += [f'<td style="{pad}">{html.escape(_cell(c, r))}</td>' for c in columns[1:]]
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


