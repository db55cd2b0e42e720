"""The live plot panel: a small anywidget that draws a figure dict with plotly.js, in place.

Responsible for:
- one panel per figure, whose `figure` trait the dashboard replaces on each redraw; the
  front-end calls `Plotly.react` on the same element, so the plot updates in place and keeps
  the user's zoom and pan (the figures' `layout.uirevision` never changes);
- plotly.js from the installed plotly package (`plotly/package_data/plotly.min.js`), offline:
  the first panel of a page asks the kernel for it once (a custom message), every other panel
  of the page waits for that one copy; nothing is fetched from a network;
- the plotly template sent once per panel (the browser knows no template names), not with
  every redraw.

Why not plotly's `FigureWidget`: in JupyterLab 4 some of its panels stayed blank under load,
never getting their initial state. Here a view draws whatever `figure` holds when it is
created (no message is needed to get started), then follows its changes. Each drawing
increments the element's `data-revision`, which tests/e2e/test_browser.py reads.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

__all__ = ["PlotPanel", "plotly_js_path"]

FIGURE_HEIGHT = 380  # the default; the dashboard passes its own
RETRY_MS = 10_000  # a page asks for plotly.js again if no answer came in this time

_ESM = """
const CONFIG = {displaylogo: false, responsive: true};

function loadPlotly(model) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__nbdistPlotly) {
    window.__nbdistPlotly = new Promise((resolve, reject) => {
      const onMsg = (msg) => {
        if (!msg || msg.type !== "plotly.js") return;
        model.off("msg:custom", onMsg);
        clearTimeout(timer);
        try {
          (new Function(msg.source)).call(window);  // the UMD bundle sets window.Plotly
          resolve(window.Plotly);
        } catch (err) {
          window.__nbdistPlotly = null;
          reject(err);
        }
      };
      const timer = setTimeout(() => {  // that panel went away: let the next one ask
        model.off("msg:custom", onMsg);
        window.__nbdistPlotly = null;
        reject(new Error("nbdist: no plotly.js from the kernel"));
      }, RETRY_MS);
      model.on("msg:custom", onMsg);
      model.send({type: "need-plotly.js"});
    });
  }
  return window.__nbdistPlotly;
}

async function plotly(model) {
  for (;;) {
    try { return await loadPlotly(model); } catch (err) { console.warn(err); }
  }
}

function render({ model, el }) {
  const div = document.createElement("div");
  div.className = "nbdist-plot";
  div.dataset.name = model.get("name");
  div.dataset.revision = "0";
  div.style.width = "100%";
  div.style.minHeight = model.get("height") + "px";
  el.appendChild(div);
  let Plotly = null;
  let revision = 0;
  const draw = () => {
    if (!Plotly) return;
    const fig = model.get("figure") || {};
    const layout = Object.assign({}, fig.layout || {},
                                 {height: model.get("height"), autosize: true});
    if (typeof layout.template === "string") layout.template = model.get("template");
    Plotly.react(div, fig.data || [], layout, CONFIG).then(() => {
      div.dataset.revision = String(++revision);
    });
  };
  const resize = new ResizeObserver(() => {
    if (Plotly && div._fullLayout) Plotly.Plots.resize(div);
  });
  plotly(model).then((p) => { Plotly = p; draw(); resize.observe(div); });
  model.on("change:figure", draw);
  return () => {
    model.off("change:figure", draw);
    resize.disconnect();
    if (Plotly) Plotly.purge(div);
  };
}

export default { render };
""".replace("RETRY_MS", str(RETRY_MS))


def plotly_js_path() -> Path:
    """The plotly.js bundle the installed plotly package ships (what its offline HTML embeds)."""
    import plotly  # plotly: heavy, only to draw

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


_PLOTLY_JS: list[str] = []  # read once per kernel


def _plotly_js() -> str:
    if not _PLOTLY_JS:
        _PLOTLY_JS.append(plotly_js_path().read_text(encoding="utf-8"))
    return _PLOTLY_JS[0]


_TEMPLATES: dict[str, dict] = {}


def template(name: str) -> dict:
    """A plotly template by name, as the JSON plotly.js takes."""
    if name not in _TEMPLATES:
        import plotly.io as pio  # plotly: heavy, only to draw

        _TEMPLATES[name] = pio.templates[name].to_plotly_json()
    return _TEMPLATES[name]


class PlotPanel(anywidget.AnyWidget):
    """One plot of the dashboard; assign `figure` (a figure dict) to redraw it in place.

    Example:
        >>> panel = PlotPanel(name="throughput",  # doctest: +SKIP
        ...                   figure=throughput_figure(run.timeline))
        >>> panel.figure = throughput_figure(run.timeline)  # doctest: +SKIP
    """

    _esm = _ESM
    name = traitlets.Unicode("").tag(sync=True)
    figure = traitlets.Dict().tag(sync=True)
    template = traitlets.Dict().tag(sync=True)
    height = traitlets.Int(FIGURE_HEIGHT).tag(sync=True)

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("template", template("plotly_white"))
        super().__init__(**kwargs)
        self.on_msg(self.on_front_end)

    def on_front_end(self, _widget, content: dict, _buffers) -> None:
        """A message from the page (ipywidgets' `on_msg`): one asking for plotly.js gets the
        installed package's copy (offline: no CDN); anything else is ignored."""
        if isinstance(content, dict) and content.get("type") == "need-plotly.js":
            self.send({"type": "plotly.js", "source": _plotly_js()})
