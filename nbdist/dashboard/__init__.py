"""nbdist's dashboard: figures of a run, and its self-contained HTML report.

`figures` turns the Run's DataFrames (history, nodes, timeline, delays, events) into plotly
figure dicts with no plotly import; `report` writes them to one offline HTML file, importing
plotly only then; `compare` overlays several runs on the same axes.

Example:
    >>> from nbdist.dashboard import throughput_figure, write_report
    >>> fig = throughput_figure(run.timeline, top_k=4, events=run.events)   # doctest: +SKIP
    >>> write_report("run.html", history=run.history, nodes=run.nodes,       # doctest: +SKIP
    ...              timeline=run.timeline, delays=run.delays, events=run.events,
    ...              title="run 1", summary=run.summary())
"""

from __future__ import annotations

from nbdist.dashboard.comparison import compare, compare_figure, comparison_figures, run_label
from nbdist.dashboard.figures import (
    all_figures,
    batch_figure,
    delay_figure,
    delay_histogram_figure,
    empty_figure,
    event_markers,
    hosts_figure,
    loss_figure,
    node_table,
    node_table_figure,
    node_table_html,
    slowest_workers,
    throughput_figure,
    worker_color,
)
from nbdist.dashboard.report import report_html, write_report

__all__ = [  # sorted
    "all_figures", "batch_figure", "compare", "compare_figure", "comparison_figures",
    "delay_figure", "delay_histogram_figure", "empty_figure", "event_markers", "hosts_figure",
    "loss_figure", "node_table", "node_table_figure", "node_table_html", "report_html",
    "run_label", "slowest_workers", "throughput_figure", "worker_color", "write_report",
]
