"""The live dashboard of a run: plotly plots and ipywidgets controls in the notebook.

Each plot is a `plots.PlotPanel` (a small anywidget around plotly.js): a refresh assigns the
panel's new figure dict and the browser redraws it in place with `Plotly.react`, keeping the
user's zoom and pan. (plotly's `FigureWidget` left panels blank in JupyterLab under load, and
plotly MIME outputs, replaced on each refresh, reset the zoom every time.) The kernel does no
per-property validation: a panel costs one JSON encoding per redraw.

Responsible for:
- laying out the panels of `figures` (throughput, delay, delay histogram, batch size, loss
  against time and against global step, hosts view, node table) and the controls (pause/resume,
  stop, learning rate, batch policy, regroup, per-worker slow-down, top-k), the slow-down sliders
  following the workers (one more for each worker added mid-run);
- refreshing them from the kernel's own asyncio loop (a `call_later` chain on the main
  thread): widgets are only touched by the thread that also handles the clicks. While a cell
  blocks that loop waiting for the run (`%%distribute --wait`), `nbdist.run.live_wait.wait_live`
  calls `step` at the same cadence, from the same thread, and passes the clicks on;
- redrawing only what changed: the node table on every poll, the per-worker series when a
  new timeline arrived (every 2 s), the loss curves at most every `LOSS_EVERY_S`;
- falling back to a one-line text status where widgets cannot render (plain IPython, a
  script, nbclient without a widget manager): the display carries both, and the text is
  brought up to date when the run ends.

Every control calls the same Run method code would call (`run.pause()`, `run.set_lr(...)`).
"""

from __future__ import annotations

import asyncio
import html
import logging
import math
import time

from nbdist.dashboard import figures
from nbdist.env import switch
from nbdist.errors import NbdistError

log = logging.getLogger(__name__)

REFRESH_S = 0.5  # how often the kernel's loop redraws what changed
LOSS_EVERY_S = 2.0  # the loss panels rebuild the history DataFrame at most this often
LOSS_POINTS = 2000  # pushes drawn per loss panel (thinned beyond that)
STATUS_EVERY_S = 1.0  # text status line refresh
FIGURE_HEIGHT = 380  # px: the plot area, and the legend's rows below it
SLOWDOWN_MAX = 8.0
MANY_WORKERS = 8  # above this many workers the panels start at "8 slowest + mean of the others"
STATUS_COLORS = {"starting": "#555555", "running": "#1CA71C", "paused": "#B68100",
                 "finished": "#2E91E5", "stopped": "#555555", "failed": "#FB0D0D"}
# grid order
PANELS = ("throughput", "delay", "batch", "delay_histogram", "loss_time", "loss_step", "hosts")


def widgets_available() -> bool:
    """True in a Jupyter kernel whose event loop runs here, with the widget packages installed.
    `NBDIST_DASHBOARD=text` forces the text status line."""
    if switch("NBDIST_DASHBOARD") == "text":
        return False
    try:
        from IPython import get_ipython  # IPython: only in a shell

        shell = get_ipython()
        if shell is None or getattr(shell, "kernel", None) is None:
            return False
        asyncio.get_running_loop()
        # probes: are the widget packages there? (heavy: imported only for a dashboard)
        import anywidget  # noqa: F401
        import ipywidgets  # noqa: F401
        import plotly  # noqa: F401
    except (ImportError, RuntimeError):
        return False
    return True


def show(run, top_k: int | None = None) -> Dashboard | None:
    """Show the run's live view under the current cell: the dashboard where widgets work, else
    the text status line. Returns the dashboard, if one was shown."""
    if not widgets_available():
        show_status_line(run)
        return None
    dashboard = Dashboard(run, top_k=top_k)
    dashboard.display()
    return dashboard


def show_status_line(run) -> None:
    """A one-line status under the cell, refreshed at most once a second (from the run's
    monitor thread, so it also moves while a cell blocks in `run.wait()`)."""
    from IPython.display import Pretty, display  # IPython: only in a shell

    handle = display(Pretty(run.summary()), display_id=True)
    last = [0.0]

    def refresh(r) -> None:
        now = time.monotonic()
        if now - last[0] >= STATUS_EVERY_S or r.ended():
            last[0] = now
            handle.update(Pretty(r.summary()))

    run.state.listeners.append(refresh)


def _warnings_html(warnings: list[str]) -> str:
    """Every warning of the run (e.g. it trains with another optimizer than the cell's)."""
    if not warnings:
        return ""
    items = "".join(f"<li>{html.escape(text)}</li>" for text in warnings)
    return (f'<ul class="nbdist-warnings" style="margin:2px 0;padding-left:20px;color:#8a5a00">'
            f"{items}</ul>")


def _status_html(run) -> str:
    color = STATUS_COLORS.get(run.status, "#222222")
    return (f'<div class="nbdist-status" data-status="{html.escape(run.status)}" '
            f'style="font-family:monospace;border-left:4px solid {color};padding:2px 8px">'
            f"{html.escape(run.summary())}</div>")


class Dashboard:
    """Plots and controls of one Run, refreshed by the kernel's loop (or by `wait_live` while a
    cell waits for the run).

    Example:
        >>> run = nbdist.train(cell, cluster=cluster, epochs=5)   # doctest: +SKIP
        >>> run.dashboard(top_k=4)                                # doctest: +SKIP
    """

    def __init__(self, run, *, top_k: int | None = None, refresh_s: float = REFRESH_S):
        import ipywidgets as w  # ipywidgets: only for a dashboard

        from nbdist.dashboard.plots import PlotPanel  # anywidget, ipywidgets: only for a dashboard

        self.run = run
        self.refresh_s = refresh_s
        self._top_k_given = top_k is not None
        self._seen = {"revision": -1, "timeline": -1, "events": -1, "top_k": -1}
        self._loss_at = -math.inf
        self._handle = None
        self._running = False
        self._finished = False  # the last redraw after the run's end is done
        self._syncing = False  # True while the dashboard itself sets a control's value
        self.plots = {name: PlotPanel(name=name, height=FIGURE_HEIGHT,
                                       layout={"min_height": f"{FIGURE_HEIGHT}px"})
                      for name in PANELS}
        if hasattr(run, "pipeline_figure"):  # --mode pipeline: the stages' timeline and bubble
            self.plots["pipeline"] = PlotPanel(name="pipeline", height=FIGURE_HEIGHT,
                                               layout={"min_height": f"{FIGURE_HEIGHT}px"})
        self.figures: dict[str, dict] = {}  # the figure each plot shows now

        self.status = w.HTML(_status_html(run))
        self.warnings = w.HTML(_warnings_html(run.warnings))
        self.message = w.HTML()
        self.table = w.HTML(figures.node_table_html(None))
        self.pause_button = w.Button(description="Pause", icon="pause",
                                     tooltip="pause/resume every worker")
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="end training; the notebook's model gets the "
                                            "weights so far")
        self.lr_slider = w.FloatLogSlider(value=1e-2, base=10, min=-5, max=1, step=0.05,
                                          description="learning rate", continuous_update=False,
                                          readout_format=".2g", disabled=True,
                                          style={"description_width": "initial"})
        self.policy = w.ToggleButtons(options=["fixed", "dbs"], description="batch",
                                      value="dbs" if getattr(run.config, "dbs", False) else "fixed",
                                      style={"button_width": "60px"})
        self.regroup_button = w.Button(description="Regroup", icon="refresh",
                                       tooltip="re-form the speed groups from current throughput")
        self.top_k = w.Dropdown(options=[("all workers", 0), ("4 slowest + mean", 4),
                                         ("8 slowest + mean", 8)], value=top_k or 0,
                                description="show", layout={"width": "220px"})
        self.slowdown_sliders: list = []
        self.slowdown_box = w.GridBox(layout={"grid_template_columns": "repeat(4, 1fr)"})
        self.lab = w.Accordion(children=[self.slowdown_box], titles=("slow-down per worker (lab)",),
                               selected_index=None)

        self.pause_button.on_click(lambda _: self._act(self._toggle_pause))
        self.stop_button.on_click(lambda _: self._act(run.stop, "stop sent"))
        self.regroup_button.on_click(lambda _: self._act(run.regroup, "regroup sent"))
        self.lr_slider.observe(self._on_lr, names="value")
        self.policy.observe(self._on_policy, names="value")
        self.top_k.observe(lambda _: self.refresh(), names="value")

        controls = [self.pause_button, self.stop_button, self.lr_slider, self.policy]
        if run.config.rule_name == "group":
            controls.append(self.regroup_button)
        self.grid = w.GridBox(list(self.plots.values()),
                              layout={"grid_template_columns": "repeat(2, minmax(0, 1fr))",
                                      "width": "100%"})
        self.widget = w.VBox([self.status, self.warnings,
                              w.HBox(controls + [self.top_k], layout={"flex_flow": "row wrap"}),
                              self.lab, self.message, self.grid, self.table])
        self.widget.add_class("nbdist-dashboard")
        self.refresh()

    # -- display ----------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget view, with the run's status line as the text fallback."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.run.summary()
        return bundle

    def display(self) -> None:
        """Display under the current cell and start refreshing; when the run ends, the text
        fallback of the display is brought up to date (what nbclient or a terminal keeps)."""
        from IPython.display import display  # IPython: only in a shell

        self._handle = display(self, display_id=True)
        self.run.state.listeners.append(self._on_run_event)
        self.start()

    def _on_run_event(self, run) -> None:
        if run.ended() and self._handle is not None:
            self._handle.update(self)

    def start(self) -> None:
        """Refresh every `refresh_s` on the kernel's event loop until the run ends."""
        if not self._running:
            self._running = True
            asyncio.get_running_loop().call_later(self.refresh_s, self._tick)

    def _tick(self) -> None:
        self.step()
        if self._running:
            asyncio.get_running_loop().call_later(self.refresh_s, self._tick)

    def step(self) -> None:
        """One refresh at the cadence (from the loop's chain, or from `wait_live` while a cell
        blocks the loop); after the run's end, the last redraw once, then nothing."""
        if self._finished:
            return
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - a drawing problem must not stop the refresh
            log.warning("dashboard refresh failed: %s", exc)
        if self.run.ended():
            self._running, self._finished = False, True
            self._finish()

    def _finish(self) -> None:
        """The last redraw, forced: the run's final status is set after its last poll."""
        self._loss_at = -math.inf
        self._seen["revision"] = -1
        self.refresh()
        for control in [self.pause_button, self.stop_button, self.lr_slider, self.policy,
                        self.regroup_button, *self.slowdown_sliders]:
            control.disabled = True

    # -- refresh ----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Redraw what changed since the last call."""
        run, seen, nodes = self.run, self._seen, None
        if run.revision != seen["revision"]:
            seen["revision"] = run.revision
            self.status.value = _status_html(run)
            self.warnings.value = _warnings_html(run.warnings)
            self.pause_button.description = "Resume" if run.status == "paused" else "Pause"
            self.pause_button.icon = "play" if run.status == "paused" else "pause"
            nodes = run.nodes
            self.table.value = figures.node_table_html(nodes)
            self._sync_controls(run.state.snapshot, nodes)
            if "pipeline" in self.plots:
                self._draw("pipeline", run.pipeline_figure())
        events = run.events
        top_k = self.top_k.value or None
        key = (run.timeline_revision, len(events), top_k)
        if key != (seen["timeline"], seen["events"], seen["top_k"]):
            seen["timeline"], seen["events"], seen["top_k"] = key
            timeline = run.timeline
            self._draw("throughput", figures.throughput_figure(timeline, top_k=top_k,
                                                               events=events))
            self._draw("delay", figures.delay_figure(timeline, top_k=top_k, events=events))
            self._draw("batch", figures.batch_figure(timeline, top_k=top_k, events=events))
            self._draw("delay_histogram", figures.delay_histogram_figure(run.delays))
        if time.monotonic() - self._loss_at >= LOSS_EVERY_S:
            self._loss_at = time.monotonic()
            history = run.history
            for name, x in (("loss_time", "time"), ("loss_step", "step")):
                self._draw(name, figures.loss_figure(history, x, events=events,
                                                     max_points=LOSS_POINTS))
        if nodes is not None:
            self._draw("hosts", figures.hosts_figure(nodes, getattr(run, "hubs", None)))

    def _draw(self, name: str, fig: dict) -> None:
        """Show `fig` in its panel, unless the panel shows it already."""
        if fig != self.figures.get(name):
            self.figures[name] = fig
            self.plots[name].figure = fig

    def _sync_controls(self, snap: dict, nodes) -> None:
        """Follow the run's state (also when code changed it): learning rate, batch policy,
        the slow-down sliders (one per worker, added as workers join)."""
        self._syncing = True
        try:
            lr = snap.get("lr")
            if lr and self.lr_slider.disabled and not self.run.ended():
                exponent = math.log10(lr)
                self.lr_slider.min, self.lr_slider.max = (math.floor(exponent) - 2,
                                                          math.ceil(exponent) + 1)
                self.lr_slider.disabled = False
            if lr and not math.isclose(self.lr_slider.value, lr, rel_tol=1e-3):
                self.lr_slider.value = lr
            if snap.get("batch_policy") in self.policy.options:
                self.policy.value = snap["batch_policy"]
            if len(nodes) > len(self.slowdown_sliders):
                self._make_sliders(nodes)
            for slider, factor in zip(self.slowdown_sliders, nodes["slowdown"], strict=False):
                if factor == factor and slider.value != factor:  # NaN: unknown yet
                    slider.value = min(float(factor), SLOWDOWN_MAX)
        finally:
            self._syncing = False

    def _make_sliders(self, nodes) -> None:
        """A slider for each worker that has none yet (all at first, then those added mid-run)."""
        import ipywidgets as w  # ipywidgets: only for a dashboard

        first = not self.slowdown_sliders
        for worker in nodes["worker"][len(self.slowdown_sliders):]:
            slider = w.FloatSlider(value=1.0, min=1.0, max=SLOWDOWN_MAX, step=0.5,
                                   description=f"worker {int(worker)}", continuous_update=False,
                                   style={"description_width": "initial"})
            slider.observe(lambda change, k=int(worker): self._on_slowdown(k, change),
                           names="value")
            slider.disabled = self.run.ended()
            self.slowdown_sliders.append(slider)
        self.slowdown_box.children = tuple(self.slowdown_sliders)
        if first and not self._top_k_given and len(nodes) > MANY_WORKERS:
            self.top_k.value = MANY_WORKERS

    # -- controls ---------------------------------------------------------------------------

    def _act(self, action, done: str | None = None) -> None:
        """Run a control; its error (e.g. the run already ended) is shown, never raised into
        the widget callback where it would be lost in the kernel log."""
        try:
            action()
            if done is not None:
                self.message.value = html.escape(done)
        except NbdistError as exc:
            self.message.value = f'<span style="color:#FB0D0D">{html.escape(str(exc))}</span>'

    def _toggle_pause(self) -> None:
        if self.run.status == "paused":
            self.run.resume()
            self.message.value = "resume sent"
        else:
            self.run.pause()
            self.message.value = "pause sent"

    def _on_lr(self, change) -> None:
        if not self._syncing:
            self._act(lambda: self.run.set_lr(change["new"]),
                      f"learning rate {change['new']:.3g} sent")

    def _on_policy(self, change) -> None:
        if not self._syncing:
            self._act(lambda: self.run.set_batch_policy(change["new"]),
                      f"batch policy {change['new']} sent")

    def _on_slowdown(self, worker: int, change) -> None:
        if not self._syncing:
            self._act(lambda: self.run.set_slowdown(worker, change["new"]),
                      f"worker {worker} slow-down ×{change['new']:g} sent")
