"""A run's dashboard as one self-contained HTML file.

Responsible for turning the figure dicts of `nbdist.dashboard.figures` into a page that opens
offline, years later, on a machine without Python: plotly.js is embedded once, inline, and
nothing is loaded from a network. plotly is imported only here, and only when a report is
written, so `import nbdist` stays light.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from nbdist.dashboard.figures import all_figures

__all__ = ["report_html", "write_report"]

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
.summary {{ font-family: ui-monospace, monospace; background: #f5f5f5; padding: .6em .8em; }}
section {{ margin: 1em 0; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head>
<body>
<h1>{title}</h1>
<p class="summary">{summary}</p>
{sections}
</body>
</html>
"""


def report_html(*, history: pd.DataFrame | None, nodes: pd.DataFrame | None,
                timeline: pd.DataFrame | None, delays: pd.DataFrame | None,
                events: pd.DataFrame | None, title: str = "nbdist run", summary: str = "",
                top_k: int | None = None, extra: dict[str, dict] | None = None,
                hubs: list[dict] | None = None) -> str:
    """The whole report page as a string: every panel, the node table and the summary line,
    then the figures of `extra` by name (e.g. `comparison_figures` of several runs); `hubs`
    (`run.hubs`) mark the hub shards' hosts in the hosts view.

    Example:
        >>> page = report_html(history=run.history, nodes=run.nodes, timeline=run.timeline,
        ...                    delays=run.delays, events=run.events, title="run 1",
        ...                    summary=run.summary())                # doctest: +SKIP
    """
    import plotly.io as pio  # plotly: heavy, only to draw
    from plotly.offline import get_plotlyjs  # plotly: heavy, only to draw

    figures = all_figures(history=history, nodes=nodes, timeline=timeline, delays=delays,
                          events=events, top_k=top_k, hubs=hubs)
    figures.update(extra or {})
    sections = []
    for name, fig in figures.items():
        div = pio.to_html(fig, include_plotlyjs=False, full_html=False, config=PLOT_CONFIG,
                          div_id=f"nbdist-{name}", default_width="100%",
                          default_height=fig["layout"].get("height", 380))
        sections.append(f'<section id="{name}">\n{div}\n</section>')
    return _PAGE.format(title=html.escape(title), summary=html.escape(summary),
                        plotlyjs=get_plotlyjs(), sections="\n".join(sections))


def write_report(path: str | Path, *, history: pd.DataFrame | None, nodes: pd.DataFrame | None,
                 timeline: pd.DataFrame | None, delays: pd.DataFrame | None,
                 events: pd.DataFrame | None, title: str = "nbdist run", summary: str = "",
                 top_k: int | None = None, extra: dict[str, dict] | None = None,
                 hubs: list[dict] | None = None) -> Path:
    """Write `report_html(...)` to `path` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(history=history, nodes=nodes, timeline=timeline, delays=delays,
                                events=events, title=title, summary=summary, top_k=top_k,
                                extra=extra, hubs=hubs),
                    encoding="utf-8")
    return path
