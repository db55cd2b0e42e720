"""A `%%distribute --wait` cell in a real kernel (ipykernel, through jupyter_client) stays live
while it blocks: the test plays the front-end, sending on the shell channel the comm messages
JupyterLab's widget manager sends for a click or a slider, and reading the iopub channel as
the page would. The run trains in `--mode local` for 10^5 epochs: it ends only when the test
clicks Stop (or interrupts), so nothing depends on how fast it trains.

Checks, all before the cell's reply: a click on Pause reaches the run (its status comes back
as paused); a learning rate set on the slider reaches the hub (its event is drawn on the
throughput panel: `run.events` has it); the panels and the status are redrawn; an execute
request sent during the wait runs after the cell, never inside it. Ctrl-C stops the run and
aborts the request queued behind the cell, as after any failed cell; the text status line (no
widgets) moves during the wait. The same holds for a cell whose own `model.fit(...)` call waits
(then the cell goes on after it). The same click in a real browser is in
tests/e2e/test_browser.py.
"""

from __future__ import annotations

import os
import time
from queue import Empty

import pytest

from tests.helpers import SYNTHETIC_CELL

pytestmark = [pytest.mark.notebook, pytest.mark.slow]

CELL = "%%distribute --mode local --epochs 100000 --batch-size 8 --wait\n" + SYNTHETIC_CELL
# the same, as people write it: the cell's own fit call waits, then the cell goes on
FIT_CELL = ("%%distribute --mode local\n" + SYNTHETIC_CELL
            + "history = model.fit(x_train, y_train, epochs=100000, batch_size=8)\n"
            + "print('fit returned:', type(history).__name__)\n")
TIMEOUT_S = 180  # bound on each awaited event (the kernel imports TensorFlow first)


class Frontend:
    """What a notebook page does with a kernel: execute requests, comm messages for widget
    clicks and slider moves, and every iopub message kept in arrival order."""

    def __init__(self, kc):
        self.kc = kc
        self.iopub: list[dict] = []
        self.widgets: dict[str, dict] = {}  # comm id -> the model's state, as the page knows it

    def execute(self, code: str) -> str:
        return self.kc.execute(code)

    def comm(self, comm_id: str, data: dict) -> None:
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.kc.shell_channel.send(msg)

    def click(self, comm_id: str) -> None:
        self.comm(comm_id, {"method": "custom", "content": {"event": "click"}})

    def set(self, comm_id: str, **state) -> None:
        self.comm(comm_id, {"method": "update", "state": state, "buffer_paths": []})

    def pump(self, until, what: str):
        """Read iopub until `until()` is true; its value is returned."""
        deadline = time.monotonic() + TIMEOUT_S
        while not (value := until()):
            assert time.monotonic() < deadline, f"{what} not seen within {TIMEOUT_S}s"
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except Empty:
                continue
            self.iopub.append(msg)
            content = msg["content"]
            if msg["msg_type"] == "comm_open":
                self.widgets[content["comm_id"]] = dict(content["data"].get("state", {}))
            elif msg["msg_type"] == "comm_msg" and content["comm_id"] in self.widgets:
                self.widgets[content["comm_id"]].update(content["data"].get("state", {}))
        return value

    def widget(self, model: str, **state) -> str | None:
        """The comm id of a widget of this model name whose state has these values."""
        return next((cid for cid, s in self.widgets.items() if s.get("_model_name") == model
                     and all(s.get(k) == v for k, v in state.items())), None)

    def reply(self, msg_id: str) -> dict:
        """The execute reply of `msg_id`; iopub is read up to its 'idle' meanwhile."""
        self.pump(lambda: self.idle_at(msg_id) is not None, f"the end of request {msg_id}")
        while True:
            msg = self.kc.get_shell_msg(timeout=TIMEOUT_S)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def idle_at(self, msg_id: str) -> int | None:
        """Index in `iopub` of the 'idle' status that ends request `msg_id`."""
        return next((i for i, m in enumerate(self.iopub) if m["msg_type"] == "status"
                     and m["content"]["execution_state"] == "idle"
                     and m["parent_header"].get("msg_id") == msg_id), None)

    def first_of(self, msg_id: str) -> int:
        return next(i for i, m in enumerate(self.iopub) if m["parent_header"].get("msg_id") == msg_id)

    def output(self, msg_id: str) -> str:
        return "".join(m["content"]["text"] for m in self.iopub if m["msg_type"] == "stream"
                       and m["parent_header"].get("msg_id") == msg_id)


@pytest.fixture
def frontend(tmp_path):
    """A kernel of its own (the venv's ipykernel), shut down at the end with its run."""
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}  # PYTHONPATH reaches the kernel
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env, startup_timeout=120)
    fe = Frontend(kc)
    fe.km = km
    try:
        yield fe
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def figure_updates(fe: Frontend, panel_ids: set, parent: str, before: int) -> list[dict]:
    """The figures sent to the plot panels under the cell `parent`, before iopub index `before`."""
    return [m["content"]["data"]["state"]["figure"] for m in fe.iopub[:before]
            if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] in panel_ids
            and m["parent_header"].get("msg_id") == parent
            and "figure" in m["content"]["data"].get("state", {})]


def annotations(fig: dict) -> str:
    return str(fig.get("layout", {}).get("annotations", []))


@pytest.mark.parametrize("source", [CELL, FIT_CELL], ids=["wait-flag", "fit-call"])
def test_a_waiting_cell_keeps_its_dashboard_drawn_and_its_controls_acting(frontend, source):
    fe = frontend
    assert fe.reply(fe.execute("%load_ext nbdist"))["status"] == "ok"
    cell = fe.execute(source)
    status = fe.pump(lambda: next((cid for cid, s in fe.widgets.items()
                                   if 'data-status="running"' in str(s.get("value"))), None),
                     "the dashboard's status line saying running")
    pause = fe.pump(lambda: fe.widget("ButtonModel", description="Pause"), "the Pause button")
    stop = fe.pump(lambda: fe.widget("ButtonModel", description="Stop"), "the Stop button")
    slider = fe.pump(lambda: fe.widget("FloatLogSliderModel", disabled=False), "the enabled lr slider")
    panels = {cid for cid, s in fe.widgets.items() if s.get("_model_name") == "AnyModel"}
    throughput = next(cid for cid in panels if fe.widgets[cid].get("name") == "throughput")
    fe.pump(lambda: any(t.get("x") for t in fe.widgets[throughput]["figure"].get("data", [])),
            "the throughput panel drawn with the workers' timeline")  # events are drawn on it
    later = fe.execute("print('after the cell:', _nbdist_run.status)")  # queued behind the cell

    fe.click(pause)
    fe.pump(lambda: 'data-status="paused"' in fe.widgets[status]["value"]
            and fe.widgets[pause]["description"] == "Resume", "the dashboard saying paused")
    fe.set(slider, value=0.05)
    fe.pump(lambda: "lr=0.05" in annotations(fe.widgets[throughput]["figure"]),
            "the set_lr event drawn on the throughput panel")
    fe.click(stop)
    reply = fe.reply(cell)
    assert reply["status"] == "ok", reply
    end = fe.idle_at(cell)

    # everything above happened while the cell was still waiting
    drawn = figure_updates(fe, {throughput}, cell, end)
    assert any("lr=0.05" in annotations(f) for f in drawn)
    assert len(figure_updates(fe, panels, cell, end)) > len(panels)  # redrawn, not only shown
    assert fe.widgets[status]["value"].count('data-status="stopped"') == 1
    if source is FIT_CELL:  # the call returned Keras's History, and the cell went on
        assert "fit returned: History\n" in fe.output(cell)
    # the request sent during the wait ran after the cell, on the stopped run
    assert fe.reply(later)["status"] == "ok"
    assert fe.first_of(later) > end
    assert fe.output(later) == "after the cell: stopped\n"
    check = fe.execute("print([e for e in _nbdist_run.events['event'] if e in "
                       "('pause', 'set_lr', 'stop')], round(_nbdist_run.lr, 6))")
    assert fe.reply(check)["status"] == "ok"
    assert fe.output(check) == "['pause', 'set_lr', 'stop'] 0.05\n"


def test_ctrl_c_stops_a_waiting_run_and_the_text_status_line_moves_meanwhile(frontend):
    fe = frontend
    setup = fe.execute("%load_ext nbdist\nimport os\nos.environ['NBDIST_DASHBOARD'] = 'text'")
    assert fe.reply(setup)["status"] == "ok"
    cell = fe.execute(CELL)

    def lines() -> list[str]:  # the status line's texts, as the monitor thread updated it
        return [m["content"]["data"]["text/plain"] for m in fe.iopub
                if m["msg_type"] == "update_display_data" and m["parent_header"].get("msg_id") == cell]

    fe.pump(lambda: len({t for t in lines() if ": running" in t}) >= 2, "the text status line moving")
    queued = fe.execute("print('queued')")
    fe.km.interrupt_kernel()
    reply = fe.reply(cell)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert fe.reply(queued)["status"] == "aborted"  # as a cell queued behind a failed one is
    check = fe.execute("print(_nbdist_run.status, _nbdist_run.done())")
    assert fe.reply(check)["status"] == "ok"
    assert fe.output(check) == "stopped True\n"
