import json
import math
import re
import sys

import numpy as np
import pandas as pd
import pytest

from nbdist.dashboard import (
    all_figures,
    batch_figure,
    delay_figure,
    delay_histogram_figure,
    event_markers,
    loss_figure,
    node_table,
    report_html,
    slowest_workers,
    throughput_figure,
    worker_color,
    write_report,
)
from nbdist.dashboard.figures import PALETTE, TABLE_COLUMNS
from nbdist.errors import ConfigError

# Three workers at the same two times: worker 0 is the slowest, worker 1 the fastest.
TIMELINE = pd.DataFrame({
    "worker": [0, 0, 1, 1, 2, 2],
    "time": [1.0, 2.0, 1.0, 2.0, 1.0, 2.0],
    "samples_per_s": [10.0, 12.0, 50.0, 54.0, 30.0, 34.0],
    "batch_size": [32, 16, 64, 80, 48, 48],
    "delay_mean": [0.5, 1.0, 2.0, 2.5, 1.0, 1.5],
    "delay_p95": [1.0, 2.0, 3.0, 4.0, 2.0, 3.0],
})
HISTORY = pd.DataFrame({
    "time": [1.0, 1.5, 2.0, 2.5, 3.0],
    "step": [1, 2, 3, 3, 4],
    "epoch": [0.2, 0.4, 0.6, 1.0, 1.2],
    "worker": [0, 1, 0, np.nan, 1],
    "loss": [2.0, 1.0, 3.0, np.nan, 0.5],
    "val_accuracy": [np.nan, np.nan, np.nan, 0.75, np.nan],
})
NODES = pd.DataFrame([
    {"worker": 0, "state": "running", "slowdown": 2.0, "group": [0, 2], "batch_size": 16,
     "samples_per_s": 12.04, "delay_mean": 1.0, "delay_p95": 2.0, "host": "a"},
    {"worker": 1, "state": "paused", "slowdown": 1.0, "group": [1], "batch_size": 80,
     "samples_per_s": 54.0, "delay_mean": 2.5, "delay_p95": 4.125, "host": "a"},
])
EVENTS = pd.DataFrame([
    {"time": 1.2, "step": 2, "event": "set_lr", "lr": 0.01},
    {"time": 1.4, "step": 2, "event": "epoch_end", "epoch": 1},
    {"time": 1.6, "step": 3, "event": "rebalance", "batches": [16, 80, 48]},
    {"time": 1.8, "step": 3, "event": "pause"},
    {"time": 1.9, "step": 4, "event": "set_slowdown", "worker": 0, "factor": 2.0},
])
DELAYS = pd.DataFrame({"worker": [0, 0, 1, 1, 1], "delay": [1, 0, 0, 1, 3],
                       "count": [4, 6, 9, 2, 1]})


def by_name(fig):
    return {t["name"]: t for t in fig["data"]}


def test_throughput_has_one_trace_per_worker_with_values_passed_through():
    fig = throughput_figure(TIMELINE, smooth=None)
    assert [t["name"] for t in fig["data"]] == ["worker 0", "worker 1", "worker 2"]
    assert [t["legendgroup"] for t in fig["data"]] == ["worker 0", "worker 1", "worker 2"]
    w1 = by_name(fig)["worker 1"]
    assert w1["x"] == [1.0, 2.0] and w1["y"] == [50.0, 54.0]
    assert type(w1["y"][0]) is float  # plain Python numbers: JSON-able as they are
    json.dumps(fig, allow_nan=False)


def test_delay_figure_draws_mean_and_p95_per_worker_under_one_legend_entry():
    fig = delay_figure(TIMELINE)
    names = [t["name"] for t in fig["data"]]
    assert names == ["worker 0", "worker 0 p95", "worker 1", "worker 1 p95", "worker 2",
                     "worker 2 p95"]
    t = by_name(fig)
    assert t["worker 2"]["y"] == [1.0, 1.5] and t["worker 2 p95"]["y"] == [2.0, 3.0]
    assert t["worker 2 p95"]["legendgroup"] == "worker 2" and not t["worker 2 p95"]["showlegend"]
    assert t["worker 2 p95"]["line"]["dash"] == "dot"


def test_batch_figure_is_a_step_line_of_batch_sizes():
    t = by_name(batch_figure(TIMELINE))
    assert t["worker 0"]["y"] == [32, 16] and t["worker 0"]["line"]["shape"] == "hv"


def test_a_worker_has_the_same_colour_in_every_figure():
    figs = [throughput_figure(TIMELINE), delay_figure(TIMELINE), batch_figure(TIMELINE),
            delay_histogram_figure(DELAYS)]
    for w in (0, 1):
        colours = {(t.get("line") or t.get("marker"))["color"] for f in figs for t in f["data"]
                   if t["legendgroup"] == f"worker {w}"}
        assert colours == {worker_color(w)} == {PALETTE[w]}
    cells_font = node_table(NODES)["cells"]["font"]["color"]
    assert cells_font[0] == [PALETTE[0], PALETTE[1]]


def test_sixteen_workers_get_sixteen_distinct_colours():
    assert len({worker_color(w) for w in range(16)}) == 16


def test_top_k_keeps_the_slowest_workers_and_one_mean_of_the_others():
    assert slowest_workers(TIMELINE, 2) == [0, 2]
    fig = throughput_figure(TIMELINE, top_k=2, smooth=None)
    assert [t["name"] for t in fig["data"]] == ["worker 0", "worker 2", "mean of 1 others"]
    fig = throughput_figure(TIMELINE, top_k=1, smooth=None)
    assert [t["name"] for t in fig["data"]] == ["worker 0", "mean of 2 others"]
    mean = fig["data"][1]
    assert mean["x"] == [1.0, 2.0] and mean["y"] == [40.0, 44.0]  # (50+30)/2, (54+34)/2
    assert mean["legendgroup"] == "others"
    # k >= workers: all drawn
    assert len(throughput_figure(TIMELINE, top_k=3, smooth=None)["data"]) == 3


def test_mean_of_others_interpolates_inside_each_worker_and_never_extrapolates():
    tl = pd.DataFrame({"worker": [0, 1, 1, 2], "time": [0.0, 1.0, 3.0, 2.0],
                       "samples_per_s": [1.0, 10.0, 30.0, 40.0]})
    mean = throughput_figure(tl, top_k=1, smooth=None)["data"][1]
    # worker 1 is (1,10)-(3,30); worker 2 has one point at t=2.
    assert mean["x"] == [1.0, 2.0, 3.0] and mean["y"] == [10.0, 30.0, 30.0]


def test_delay_figure_top_k_folds_mean_and_p95_of_the_others():
    names = [t["name"] for t in delay_figure(TIMELINE, top_k=1)["data"]]
    assert names == ["worker 0", "worker 0 p95", "mean of 2 others", "mean of 2 others p95"]


def test_event_markers_are_drawn_only_for_control_events_at_their_time():
    marks = event_markers(EVENTS)
    assert [s["x0"] for s in marks["shapes"]] == [1.2, 1.8, 1.9]
    assert all(s["x0"] == s["x1"] and s["yref"] == "paper" for s in marks["shapes"])
    assert [a["text"] for a in marks["annotations"]] == ["lr=0.01", "pause", "w0 ×2"]
    assert [s["x0"] for s in event_markers(EVENTS, x="step")["shapes"]] == [2, 3, 4]


@pytest.mark.parametrize("make", [throughput_figure, delay_figure, batch_figure])
def test_time_figures_carry_the_event_markers(make):
    assert [s["x0"] for s in make(TIMELINE, events=EVENTS)["layout"]["shapes"]] == [1.2, 1.8, 1.9]


def test_loss_figure_has_raw_points_rolling_mean_and_val_accuracy_on_a_second_axis():
    fig = loss_figure(HISTORY, window=2, events=EVENTS)
    t = by_name(fig)
    assert t["loss (each push)"]["x"] == [1.0, 1.5, 2.0, 3.0]
    assert t["loss (each push)"]["y"] == [2.0, 1.0, 3.0, 0.5]
    assert t["loss (mean of 2 pushes)"]["y"] == [2.0, 1.5, 2.0, 1.75]
    assert t["val accuracy"]["x"] == [2.5] and t["val accuracy"]["y"] == [0.75]
    assert t["val accuracy"]["yaxis"] == "y2" and fig["layout"]["yaxis2"]["overlaying"] == "y"
    assert len(fig["layout"]["shapes"]) == 3


def test_loss_figure_against_global_step():
    fig = loss_figure(HISTORY, x="step", events=EVENTS)
    assert by_name(fig)["loss (each push)"]["x"] == [1, 2, 3, 4]
    assert by_name(fig)["val accuracy"]["x"] == [3]
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [2, 3, 4]
    with pytest.raises(ConfigError, match="Received: x='epoch'"):
        loss_figure(HISTORY, x="epoch")


def test_delay_histogram_has_one_bar_series_per_worker_sorted_by_delay():
    fig = delay_histogram_figure(DELAYS)
    t = by_name(fig)
    assert list(t) == ["worker 0", "worker 1"]
    assert t["worker 0"]["x"] == [0, 1] and t["worker 0"]["y"] == [6, 4]
    assert t["worker 1"]["x"] == [0, 1, 3] and t["worker 1"]["y"] == [9, 2, 1]
    assert fig["layout"]["barmode"] == "group"


def test_node_table_shows_the_chosen_columns_as_display_strings():
    trace = node_table(NODES)
    assert trace["type"] == "table" and trace["header"]["values"] == list(TABLE_COLUMNS)
    assert dict(zip(TABLE_COLUMNS, trace["cells"]["values"], strict=True)) == {
        "worker": ["0", "1"], "state": ["running", "paused"], "slowdown": ["2", "1"],
        "group": ["0,2", "1"], "batch_size": ["16", "80"], "samples_per_s": ["12.0", "54.0"],
        "delay_mean": ["1.00", "2.50"], "delay_p95": ["2.00", "4.12"]}


def test_node_table_leaves_missing_columns_and_values_blank():
    trace = node_table(pd.DataFrame([{"worker": 3, "state": "starting", "delay_p95": math.nan}]))
    cells = dict(zip(TABLE_COLUMNS, trace["cells"]["values"], strict=True))
    assert cells["worker"] == ["3"] and cells["group"] == [""] and cells["delay_p95"] == [""]


@pytest.mark.parametrize("empty", [None, pd.DataFrame(), pd.DataFrame(columns=list(TIMELINE))])
def test_empty_inputs_give_a_waiting_figure(empty):
    figs = [throughput_figure(empty, events=EVENTS), delay_figure(empty, top_k=2),
            batch_figure(empty), loss_figure(empty), delay_histogram_figure(empty)]
    figs += list(all_figures(history=empty, nodes=empty, timeline=empty, delays=empty,
                             events=empty).values())
    for fig in figs:
        assert fig["data"] == [] and "waiting for data" in fig["layout"]["title"]["text"]
    assert event_markers(empty) == {"shapes": [], "annotations": []}


def test_history_with_only_validation_rows_still_draws_accuracy():
    fig = loss_figure(HISTORY[HISTORY["loss"].isna()])
    assert [t["name"] for t in fig["data"]] == ["val accuracy"]


def test_figures_module_does_not_import_plotly():
    import subprocess

    code = ("import sys, nbdist.dashboard.figures, nbdist.dashboard; "
            "print(any(m.split('.')[0] == 'plotly' for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_report_is_one_offline_html_file_with_every_figure(tmp_path):
    from plotly.offline import get_plotlyjs

    path = write_report(tmp_path / "sub" / "run.html", history=HISTORY, nodes=NODES,
                        timeline=TIMELINE, delays=DELAYS, events=EVENTS,
                        title="run <1>", summary="nbdist run 1: finished | step 4")
    page = path.read_text(encoding="utf-8")
    js = get_plotlyjs()
    assert page.count(js) == 1 and re.search(r"\* plotly\.js v\d+\.\d+\.\d+", page)
    assert page.count('class="plotly-graph-div"') == 7
    for name in ("loss", "throughput", "delay", "delay_histogram", "batch", "hosts", "nodes"):
        assert f'id="nbdist-{name}"' in page
    outside = page.replace(js, "")  # the bundle names geo/map URLs that no panel here uses
    assert "https://cdn" not in outside and "src=" not in outside
    assert "run &lt;1&gt;" in page and "nbdist run 1: finished | step 4" in page
    assert '"values":[["0","1"],["running","paused"]' in outside.replace(" ", "")


def test_report_of_a_run_without_data_yet_still_renders():
    page = report_html(history=None, nodes=None, timeline=None, delays=None, events=None)
    assert page.count('class="plotly-graph-div"') == 7 and "waiting for data" in page


def test_node_table_html_lists_each_worker_in_its_colour_and_escapes_text():
    from nbdist.dashboard.figures import node_table_html

    page = node_table_html(NODES.assign(state=["running", "<lost>"]))
    assert page.count('<tr class="nbdist-node">') == 2
    assert f"color:{worker_color(0)};font-weight:bold\">0</td>" in page
    assert "&lt;lost&gt;" in page and "<lost>" not in page
    # samples/s, p95, group
    assert ">12.0</td>" in page and ">4.12</td>" in page and ">0,2</td>" in page
    assert "waiting for data" in node_table_html(None)


# -- readable from the back row ---------------------------------------------------------------

OKABE_ITO = {"#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#000000", "#F0E442"}


def live_panels(timeline=TIMELINE, **kw):
    return {"throughput": throughput_figure(timeline, events=EVENTS, **kw),
            "delay": delay_figure(timeline, events=EVENTS, **kw),
            "batch": batch_figure(timeline, events=EVENTS, **kw),
            "delay_histogram": delay_histogram_figure(DELAYS),
            "loss_time": loss_figure(HISTORY, "time", events=EVENTS),
            "loss_step": loss_figure(HISTORY, "step", events=EVENTS)}


def test_every_panel_has_a_title_of_its_own_that_says_its_x_axis():
    titles = [f["layout"]["title"]["text"] for f in live_panels().values()]
    assert len(set(titles)) == len(titles)
    assert titles[-2].endswith("against time") and titles[-1].endswith("against step")
    assert all("against time" in t for t in titles[:3])


def test_legends_sit_in_rows_below_the_plot_with_a_bottom_margin_that_holds_them():
    from nbdist.dashboard.style import AXIS_ROOM_PX, LEGEND_ROW_PX

    for name, fig in live_panels().items():
        legend, margin = fig["layout"]["legend"], fig["layout"]["margin"]
        assert legend["orientation"] == "h" and legend["yref"] == "container", name
        assert legend["y"] == 0 and legend["yanchor"] == "bottom", name  # under the x axis
        assert margin["b"] >= AXIS_ROOM_PX + LEGEND_ROW_PX, name
    # more entries, more rows, a deeper margin: 16 workers need more room than 3
    many = pd.concat([TIMELINE.assign(worker=TIMELINE["worker"] + 3 * k) for k in range(6)])
    assert (throughput_figure(many)["layout"]["margin"]["b"]
            > throughput_figure(TIMELINE)["layout"]["margin"]["b"])


def test_the_accuracy_axis_is_fixed_from_0_to_1_with_round_ticks():
    axis = loss_figure(HISTORY)["layout"]["yaxis2"]
    assert axis["range"] == [0, 1] and axis["tickmode"] == "linear"
    ticks = [axis["tick0"] + k * axis["dtick"] for k in range(6)]
    assert [format(t, axis["tickformat"]) for t in ticks] == [
        "0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert "yaxis2" not in loss_figure(HISTORY.drop(columns=["val_accuracy"]))["layout"]


def test_throughput_is_a_moving_average_with_the_raw_values_faint_behind_it():
    fig = throughput_figure(TIMELINE, smooth=2)
    t = by_name(fig)
    assert [x["name"] for x in fig["data"]][:2] == ["worker 0 (raw)", "worker 0"]  # raw drawn first
    raw, mean = t["worker 1 (raw)"], t["worker 1"]
    assert raw["y"] == [50.0, 54.0] and mean["y"] == pytest.approx([50.0, 52.0])
    assert raw["opacity"] < 0.5 and raw["hoverinfo"] == "skip" and not raw["showlegend"]
    assert raw["line"]["color"] == mean["line"]["color"] == worker_color(1)
    assert raw["legendgroup"] == mean["legendgroup"] == "worker 1"  # hidden together
    assert "mean of 2 points" in fig["layout"]["title"]["text"]


def test_the_palette_is_colour_blind_safe_and_a_worker_keeps_its_colour():
    assert set(PALETTE[:8]) == OKABE_ITO  # up to 8 workers: Okabe & Ito's set only
    for w in range(3):
        colours = {(t.get("line") or t.get("marker"))["color"]
                   for f in live_panels().values() for t in f["data"]
                   if t.get("legendgroup") == f"worker {w}"}
        assert colours == {worker_color(w)}
