"""The hosts view (workers grouped by host, traffic per worker in MB/s) and the node table's
GPU columns, as pure figure dicts with exact values."""

import math

import pandas as pd

from nbdist.dashboard import all_figures
from nbdist.dashboard.hosts import HOSTS_TITLE, hosts_figure
from nbdist.dashboard.style import worker_color
from nbdist.dashboard.table import (
    GPU_COLUMNS,
    TABLE_COLUMNS,
    WIRE_COLUMNS,
    node_table,
    node_table_html,
)

NODES = pd.DataFrame([
    {"worker": 0, "host": "node-b", "link": "tcp", "bytes_per_s": 12_500_000.0,
     "bytes_sent": 40_000_000, "bytes_received": 60_000_000},
    {"worker": 1, "host": "node-a", "link": "shm", "bytes_per_s": 250_000.0,
     "bytes_sent": 1_000_000, "bytes_received": 500_000},
    {"worker": 2, "host": "node-b", "link": "tcp", "bytes_per_s": math.nan,  # no rate yet
     "bytes_sent": 0, "bytes_received": 0},
])
HUBS = [{"shard": 1, "host": "node-c", "engine": 5}, {"shard": 0, "host": "node-a", "engine": 4}]


def test_workers_are_grouped_by_host_with_their_traffic_in_megabytes_per_second():
    fig = hosts_figure(NODES, HUBS)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert [(t["name"], t["x"], t["y"]) for t in bars] == [
        ("worker 1", [["node-a · hub 0"], ["w1 shm"]], [0.25]),
        ("worker 0", [["node-b"], ["w0 tcp"]], [12.5]),
        ("worker 2", [["node-b"], ["w2 tcp"]], [0.0]),
    ]
    assert ([t["marker"]["color"] for t in bars]
            == [worker_color(1), worker_color(0), worker_color(2)])
    assert bars[1]["hovertext"] == ["worker 0 on node-b (tcp)<br>12.50 MB/s<br>sent 40.0 MB, "
                                    "received 60.0 MB"]
    assert (fig["layout"]["xaxis"]["type"] == "multicategory"
            and fig["layout"]["title"]["text"] == HOSTS_TITLE)


def test_hub_shards_mark_their_hosts_even_where_no_worker_runs():
    hub = hosts_figure(NODES, HUBS)["data"][-1]
    assert (hub["name"], hub["type"], hub["y"]) == ("hub shard", "scatter", [0, 0])
    assert hub["x"] == [["node-a · hub 0", "node-c · hub 1"], ["hub 0", "hub 1"]]


def test_the_only_legend_entry_is_the_hub_marker_the_workers_are_named_on_the_axis():
    fig = hosts_figure(NODES, HUBS)
    assert [t["name"] for t in fig["data"] if t.get("showlegend", True)] == ["hub shard"]
    assert fig["layout"]["legend"]["yanchor"] == "bottom" and fig["layout"]["margin"]["b"] > 100


def test_without_workers_the_hosts_view_waits_and_without_hubs_it_has_no_marker():
    assert hosts_figure(None, HUBS)["data"] == []
    assert "waiting for data" in hosts_figure(pd.DataFrame(), None)["layout"]["title"]["text"]
    fig = hosts_figure([{"worker": 0, "host": "", "link": None}], None)
    assert [(t["x"], t["y"]) for t in fig["data"]] == [([["?"], ["w0"]], [0.0])]


def test_the_report_and_live_view_get_the_hosts_panel_from_all_figures():
    figs = all_figures(history=None, nodes=NODES, timeline=None, delays=None, events=None,
                       hubs=HUBS)
    assert list(figs)[-2:] == ["hosts", "nodes"] and figs["hosts"] == hosts_figure(NODES, HUBS)


GPU_NODES = pd.DataFrame([
    {"worker": 0, "state": "running", "gpu": "Tesla T4", "gpu_util": 87, "gpu_mem": 3 * 2**30,
     "gpu_mem_total": 16 * 2**30},
    {"worker": 1, "state": "running", "gpu": "Tesla T4", "gpu_util": None, "gpu_mem": None,
     "gpu_mem_total": 16 * 2**30},  # said hello, no reading yet
    {"worker": 2, "state": "running", "gpu": None, "gpu_util": None, "gpu_mem": None,
     "gpu_mem_total": None},  # a CPU node in the same run
])


def test_gpu_columns_show_name_utilisation_and_memory_used_of_total():
    trace = node_table(GPU_NODES)
    assert trace["header"]["values"] == list(TABLE_COLUMNS + GPU_COLUMNS)
    cells = dict(zip(trace["header"]["values"], trace["cells"]["values"], strict=True))
    assert cells["gpu"] == ["Tesla T4", "Tesla T4", ""]
    assert cells["gpu_util"] == ["87%", "", ""]
    assert cells["gpu_mem"] == ["3.0 / 16.0 GB", "? / 16.0 GB", ""]


def test_gpu_columns_are_left_out_when_no_worker_has_a_gpu():
    cpu_only = GPU_NODES.iloc[[2]]
    assert node_table(cpu_only)["header"]["values"] == list(TABLE_COLUMNS)
    assert "gpu" not in node_table_html(cpu_only)
    assert "<th" in node_table_html(GPU_NODES) and "87%" in node_table_html(GPU_NODES)


WIRE_NODES = pd.DataFrame([
    {"worker": 0, "host": "a", "link": "tcp", "state": "running", "compression": "int8",
     "compression_ratio": 0.2539, "bytes_per_s": 1e6},
    {"worker": 1, "host": "a", "link": "tcp", "state": "running", "compression": "int8",
     "compression_ratio": float("nan"), "bytes_per_s": 0.0},  # no frame yet
    {"worker": 2, "host": "h", "link": "shm", "state": "running", "compression": "none",
     "compression_ratio": float("nan"), "bytes_per_s": 0.0},  # beside the hub: nothing to save
])


def test_the_wire_column_shows_each_workers_codec_and_its_frames_share_of_float32():
    trace = node_table(WIRE_NODES)
    assert trace["header"]["values"] == list(TABLE_COLUMNS + WIRE_COLUMNS)
    cells = dict(zip(trace["header"]["values"], trace["cells"]["values"], strict=True))
    assert cells["wire"] == ["int8 25%", "int8", "none"]
    hover = [t["hovertext"][0] for t in hosts_figure(WIRE_NODES)["data"]]
    assert hover[0].endswith("<br>int8: frames 25% of float32's")
    assert "frames" not in hover[1] and "frames" not in hover[2]
    uncompressed = WIRE_NODES.assign(compression="none")
    assert node_table(uncompressed)["header"]["values"] == list(TABLE_COLUMNS)
