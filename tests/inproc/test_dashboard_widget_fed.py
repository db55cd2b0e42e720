"""The live dashboard: real ipywidgets and its PlotPanel anywidgets (no browser), fed through
the same Run path the monitor thread uses (`tests.helpers.fed_run`); its controls on a real
run are tested in tests/cluster/test_dashboard_widget.py."""

import pytest

from nbdist.config import TrainConfig
from nbdist.core.traffic import TrafficRates
from nbdist.dashboard.plots import PlotPanel, plotly_js_path
from nbdist.dashboard.widget import PANELS, Dashboard, show, widgets_available
from nbdist.run.handle import Run
from tests.helpers import end, fed_run, feed, snapshot

pytest.importorskip("ipywidgets")


def legend(fig: dict) -> set:
    return {t["name"] for t in fig["data"] if t.get("showlegend", True)}


def names(fig: dict) -> list:
    return [t["name"] for t in fig["data"]]


def test_dashboard_draws_each_worker_and_lists_it_in_the_table():
    run = fed_run(3)
    dash = Dashboard(run)
    assert legend(dash.figures["throughput"]) == {"worker 0", "worker 1", "worker 2"}
    assert len(dash.figures["delay"]["data"]) == 6  # mean and p95 per worker
    assert set(names(dash.figures["delay_histogram"])) == {"worker 0", "worker 1", "worker 2"}
    assert names(dash.figures["loss_time"]) == [
        "loss (each push)", "loss (mean of 20 pushes)", "val loss", "val accuracy"]
    assert dash.figures["loss_step"]["layout"]["xaxis"]["title"]["text"] == "global step"
    panel = dash.plots["throughput"]  # what the browser gets: the figure dict, drawn in place
    assert isinstance(panel, PlotPanel) and panel.figure == dash.figures["throughput"]
    assert panel.template["layout"]  # the template itself, sent once: plotly.js knows no names
    assert dash.table.value.count('class="nbdist-node"') == 3
    assert [s.description for s in dash.slowdown_sliders] == ["worker 0", "worker 1", "worker 2"]
    assert dash.slowdown_sliders[1].value == 2.0  # follows the run's state
    assert dash.lr_slider.value == pytest.approx(0.05) and not dash.lr_slider.disabled
    assert [a["text"] for a in dash.figures["throughput"]["layout"]["annotations"]] == ["lr=0.05"]
    assert 'data-status="running"' in dash.status.value


def test_a_step_after_the_end_draws_the_final_state_once_and_disables_the_controls():
    """`step` is what the kernel's loop and `wait_live` call at the refresh cadence."""
    run = fed_run(2)
    dash = Dashboard(run)
    dash.step()
    assert not dash.stop_button.disabled and 'data-status="running"' in dash.status.value
    end(run, "stopped")
    dash.step()
    assert dash.stop_button.disabled and dash.lr_slider.disabled
    assert 'data-status="stopped"' in dash.status.value
    dash.status.value = "drawn once"
    dash.step()  # the loop's chain and a wait may both call it: the last redraw happens once
    assert dash.status.value == "drawn once"


def test_every_warning_of_the_run_is_listed_under_the_status_line():
    run = fed_run(2)
    run.warnings.append("--server-optimizer sgd: the hub trains with SGD (lr 0.001), not with the cell's Adam.")
    dash = Dashboard(run)
    assert "not with the cell&#x27;s Adam" in dash.warnings.value
    run.warnings.append("The run replaced the cell's CosineDecay schedule: run.set_lr(0.01) ...")
    feed(run, snapshot(2, 6.0))  # the next poll
    dash.refresh()
    assert dash.warnings.value.count("<li>") == 2
    assert "replaced the cell&#x27;s CosineDecay schedule" in dash.warnings.value


def test_sixteen_workers_start_at_the_eight_slowest_plus_the_mean_of_the_others():
    dash = Dashboard(fed_run(16))
    assert dash.top_k.value == 8
    names = legend(dash.figures["throughput"])
    assert names == {f"worker {w}" for w in range(8, 16)} | {"mean of 8 others"}
    assert dash.table.value.count('class="nbdist-node"') == 16  # the table keeps everyone
    dash.top_k.value = 0
    assert len(legend(dash.figures["throughput"])) == 16


def test_refresh_redraws_only_what_changed():
    run = fed_run(2, t=3.0)
    dash = Dashboard(run)
    sent = []
    dash.plots["throughput"].observe(sent.append, names="figure")
    dash.refresh()
    assert sent == []  # nothing new: not sent again
    feed(run, snapshot(2, 6.0, paused=True))
    dash.refresh()
    assert len(dash.figures["throughput"]["data"][0]["x"]) == 6
    assert len(sent) == 1 and dash.plots["throughput"].figure == dash.figures["throughput"]
    assert 'data-status="paused"' in dash.status.value
    assert dash.pause_button.description == "Resume"


def test_a_panel_sends_plotly_js_from_the_installed_package_when_its_page_asks():
    panel = PlotPanel(name="throughput")
    sent = []
    panel.send = lambda content, buffers=None: sent.append(content)
    panel.on_front_end(panel, {"type": "something else"}, [])
    assert sent == []
    panel.on_front_end(panel, {"type": "need-plotly.js"}, [])
    (reply,) = sent
    assert reply["type"] == "plotly.js"
    assert reply["source"] == plotly_js_path().read_text(encoding="utf-8")  # offline: no CDN
    assert "window.Plotly" in reply["source"]


def test_panels_show_waiting_for_data_before_the_workers_report():
    dash = Dashboard(Run(TrainConfig(), model=None, model_name="model"))
    assert list(dash.figures) == list(PANELS)
    assert all("waiting for data" in f["layout"]["title"]["text"] for f in dash.figures.values())


def test_a_control_on_an_ended_run_shows_the_error_in_the_dashboard():
    run = fed_run(2)
    end(run, "finished")
    dash = Dashboard(run)
    dash.pause_button.click()
    assert "nothing to control" in dash.message.value
    dash.stop_button.click()  # stopping an ended run is not an error


def test_outside_a_kernel_the_magic_falls_back_to_the_text_status_line(ip):
    assert not widgets_available()  # an InteractiveShell, not a kernel
    run = fed_run(2)
    assert show(run) is None
    assert len(run.state.listeners) == 1  # the text status line listens


def test_a_worker_added_mid_run_gets_its_row_slider_traces_and_a_marker():
    run = fed_run(2)
    dash = Dashboard(run)
    assert [s.description for s in dash.slowdown_sliders] == ["worker 0", "worker 1"]
    grown = snapshot(3, 6.0)  # the hub's next answer: worker 2 was added and trains
    grown["events"].append({"time": 5.0, "step": 40, "event": "worker_added", "worker": 2, "engine": 3})
    feed(run, grown)
    dash.refresh()
    assert [s.description for s in dash.slowdown_sliders] == ["worker 0", "worker 1", "worker 2"]
    assert len(dash.slowdown_box.children) == 3 and dash.slowdown_sliders[1].value == 2.0
    assert dash.table.value.count('class="nbdist-node"') == 3
    assert legend(dash.figures["throughput"]) == {"worker 0", "worker 1", "worker 2"}
    assert "+w2" in [a["text"] for a in dash.figures["throughput"]["layout"]["annotations"]]
    dash.slowdown_sliders[2].value = 4.0  # acts on worker 2: the run has ended here, so it says so
    assert "nothing to control" in dash.message.value


def test_hosts_panel_groups_workers_by_host_and_marks_the_hub_shards_host():
    run = fed_run(2)
    run.state.hubs = [{"shard": 0, "host": "localhost", "engine": 0}]
    run.state.traffic = TrafficRates(window_s=0.0)  # a rate from every poll (the default waits 1 s)
    dash = Dashboard(run)
    snap = snapshot(2, 6.0)
    for n in snap["nodes"]:
        n.update(link="tcp", bytes_sent=0, bytes_received=0)
    feed(run, snap)
    snap = snapshot(2, 7.0)
    for n in snap["nodes"]:
        n.update(link="tcp", bytes_sent=4_000_000 * (n["worker"] + 1), bytes_received=0)
    feed(run, snap)
    dash.refresh()
    fig = dash.figures["hosts"]
    assert dash.plots["hosts"].figure == fig
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert [t["x"] for t in bars] == [[["localhost · hub 0"], ["w0 tcp"]], [["localhost · hub 0"], ["w1 tcp"]]]
    assert all(t["y"][0] > 0 for t in bars)  # MB/s from the byte totals of two polls
    assert [t["name"] for t in fig["data"] if t["type"] == "scatter"] == ["hub shard"]
