"""What every dashboard figure shares, so panels read the same way in every view.

Responsible for:
- the colours: a colour-blind-safe palette with one fixed colour per worker (and per run in
  a comparison), in every panel;
- the layout a class can read from the back row: a title per panel, the legend in rows
  *below* the plot area (anchored to the figure's bottom edge, with a bottom margin sized
  to its rows, so it never covers data, tick labels or a second y axis), round ticks;
- JSON-ready values (NaN becomes None, NumPy scalars plain numbers) and the empty
  "waiting for data" figure.

Pure (pandas, NumPy, standard library; no plotly).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["PALETTE", "empty_figure", "layout", "legend_below", "worker_color"]

# Okabe & Ito's eight colours (yellow last: faint on white), then Paul Tol's "muted" set: each
# half is told apart with the common colour-vision deficiencies, and 16 workers never share one.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#000000",
           "#F0E442", "#332288", "#DDCC77", "#117733", "#882255", "#44AA99", "#999933",
           "#AA4499", "#CC6677")
OTHERS_COLOR = "#8C8C8C"
WAITING = "waiting for data"
UIREVISION = "nbdist"  # constant: plotly keeps the user's zoom across updates (Plotly.react)

# The legend's rows are sized for a panel this wide (the dashboard's half of a notebook);
# wider panels leave spare room under the legend, never too little.
PANEL_WIDTH_PX = 440
AXIS_ROOM_PX = 62  # x tick labels and the x axis title, under the plot area
LEGEND_ROW_PX = 22
CHAR_PX = 7  # the width of one character of a legend entry (12 px font)
SYMBOL_PX = 45  # what plotly adds to an entry's text width: its line or marker, and gaps


def worker_color(worker: int) -> str:
    """The colour of `worker` in every figure (the palette wraps after 16 workers)."""
    return PALETTE[int(worker) % len(PALETTE)]


def missing(v: object) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float | np.floating) and math.isnan(v))


def values(series: pd.Series) -> list:
    """Python numbers for JSON: NaN becomes None, NumPy scalars become int/float."""
    return [None if missing(v) else (v.item() if isinstance(v, np.generic) else v)
            for v in series]


def has(frame: pd.DataFrame | None, *columns: str) -> bool:
    return frame is not None and not frame.empty and all(c in frame.columns for c in columns)


def legend_below(names: list[str]) -> tuple[dict, int]:
    """(legend layout, bottom margin in px) for a legend of `names` laid out in rows under
    the x axis: anchored to the figure's bottom edge (`yref="container"`), entries of one
    width, and a margin that holds the axis and every row."""
    entry = 10 + CHAR_PX * max((len(n) for n in names), default=8)  # plotly's entrywidth: text
    per_row = max(1, PANEL_WIDTH_PX // (entry + SYMBOL_PX))
    rows = max(1, math.ceil(len(names) / per_row))
    legend = {"orientation": "h", "xref": "container", "x": 0.01, "xanchor": "left",
              "yref": "container", "y": 0, "yanchor": "bottom", "entrywidth": entry,
              "entrywidthmode": "pixels", "groupclick": "togglegroup", "font": {"size": 12}}
    return legend, AXIS_ROOM_PX + LEGEND_ROW_PX * rows + 6


def layout(title: str, xtitle: str, ytitle: str, traces: list[dict], **extra: object) -> dict:
    """The layout of a panel: its title, axis titles, and the legend of `traces` below it."""
    names = [t["name"] for t in traces if t.get("showlegend", True) and t.get("name")]
    legend, bottom = legend_below(names)
    return {"title": {"text": title, "x": 0.01, "xanchor": "left"},
            "xaxis": {"title": {"text": xtitle}, "automargin": True},
            "yaxis": {"title": {"text": ytitle}, "automargin": True, "rangemode": "tozero"},
            "template": "plotly_white", "legend": legend, "showlegend": bool(names),
            "uirevision": UIREVISION, "margin": {"t": 50, "r": 20, "l": 60, "b": bottom},
            **extra}


def empty_figure(title: str) -> dict:
    """A valid figure with no traces, for panels polled before their data exists."""
    return {"data": [], "layout": {"title": {"text": f"{title}: {WAITING}"},
                                   "template": "plotly_white", "uirevision": UIREVISION,
                                   "xaxis": {"visible": False}, "yaxis": {"visible": False}}}
