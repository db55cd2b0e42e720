"""nbdist.sweep with real runs in this kernel (--mode local): the table and the per-run rows,
a grid point that would fail refused before any run, Ctrl-C that keeps what is done, and a
results file that a second call continues from (the cluster's sweep, with its bytes:
tests/cluster/test_sweep_cluster.py)."""

import json

import pytest

import nbdist
import nbdist.api
from nbdist.errors import ConfigError, NoClusterError
from tests.helpers import SYNTHETIC_CELL

OPTIONS = dict(mode="local", epochs=2, batch_size=32, progress=False)


def test_a_sweep_tabulates_each_point_over_its_seeds():
    result = nbdist.sweep(SYNTHETIC_CELL, {"lr": [0.05, 0.1]}, target=0.8, seeds=[0, 1],
                          baseline=False, **OPTIONS)
    assert not result.interrupted
    assert list(result.runs["lr"]) == [0.05, 0.05, 0.1, 0.1]
    assert list(result.runs["seed"]) == [0, 1, 0, 1]
    assert (result.runs["status"] == "finished").all()
    table = result.table.set_index("point")
    assert list(table.index) == ["lr=0.05", "lr=0.1"]
    for point in table.index:
        row = table.loc[point]
        assert row.runs == 2 and row.reached == 2 and row.final > 0.8
        assert row.time_to_target > 0 and row.bytes_to_target > 0  # the local hub's line counts
    figure = result.figure
    assert [trace.name for trace in figure.data] == ["lr=0.05", "lr=0.1"]


def test_a_grid_point_that_would_be_refused_stops_the_sweep_before_any_run(monkeypatch):
    calls = []
    monkeypatch.setattr(nbdist.api, "train", lambda *a, **k: calls.append(k))
    with pytest.raises(ConfigError, match="the grid point workers=2 is refused, before any run "
                                          "started: --mode local trains with one worker"):
        nbdist.sweep(SYNTHETIC_CELL, {"workers": [1, 2]}, target=0.8, **OPTIONS)
    assert calls == []
    with pytest.raises(NoClusterError, match="No cluster to train on"):
        nbdist.sweep(SYNTHETIC_CELL, [{"mode": "local"}, {"mode": "async"}], target=0.8,
                     progress=False)
    assert calls == []


def test_ctrl_c_keeps_the_runs_done_and_the_results_file_continues_the_sweep(monkeypatch,
                                                                              tmp_path):
    real, calls = nbdist.api.train, []

    def interrupted_second(*args, **kwargs):
        calls.append(kwargs["lr"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C in Run.wait: the run stopped, then this
        return real(*args, **kwargs)

    monkeypatch.setattr(nbdist.api, "train", interrupted_second)
    results = tmp_path / "sweep.jsonl"
    first = nbdist.sweep(SYNTHETIC_CELL, {"lr": [0.05, 0.1]}, target=0.8, baseline=False,
                         results=results, **OPTIONS)
    assert first.interrupted and list(first.runs["lr"]) == [0.05]
    assert len(results.read_text().splitlines()) == 2  # the header and the one run done

    monkeypatch.setattr(nbdist.api, "train", lambda *a, **k: calls.append(k["lr"]) or real(
        *a, **k))
    second = nbdist.sweep(SYNTHETIC_CELL, {"lr": [0.05, 0.1]}, target=0.8, baseline=False,
                          results=results, **OPTIONS)
    assert calls == [0.05, 0.1, 0.1]  # the second call ran only what was missing
    assert not second.interrupted and list(second.runs["lr"]) == [0.05, 0.1]
    # the first run is the one the file kept, not run again
    assert second.runs.iloc[0]["wall_s"] == first.runs.iloc[0]["wall_s"]
    assert json.loads(results.read_text().splitlines()[1])["row"]["lr"] == 0.05

    with pytest.raises(ConfigError, match="holds the results of another sweep"):
        nbdist.sweep(SYNTHETIC_CELL, {"lr": [0.05, 0.2]}, target=0.8, baseline=False,
                     results=results, **OPTIONS)


def test_a_simulated_sweep_counts_virtual_seconds_and_its_baseline_is_one_virtual_worker():
    result = nbdist.sweep(SYNTHETIC_CELL, {"algorithm": ["asgd", "dc-asgd"]}, target=0.8,
                          mode="simulate", slowdown=[1, 2], epochs=2, progress=False)
    assert (result.runs["status"] == "finished").all(), result.runs["error"].tolist()
    table = result.table.set_index("point")
    assert list(table.index) == ["algorithm=asgd", "algorithm=dc-asgd", "one worker (baseline)"]
    assert (table["reached"] == 1).all()
    # the virtual workers' pushes and pulls are counted as a TCP worker counts its own
    assert (table["bytes_to_target"] > 0).all() and (result.runs["bytes_source"] == "counted").all()
    assert table.loc["algorithm=asgd", "efficiency"] == table.loc["algorithm=asgd",
                                                                  "speedup"] / 2


def test_a_simulated_sync_sweep_models_the_bytes_of_its_allreduce_or_allgather():
    """--sim sync=1 moves nothing over nbdist's sockets: float32 is modelled as a ring
    allreduce, int8 (frames an allreduce cannot sum) as a ring allgather of its frames."""
    result = nbdist.sweep(SYNTHETIC_CELL, {"compression": ["none", "int8"]}, target=0.8,
                          mode="simulate", workers=2, sim="sync=1", epochs=2, progress=False,
                          baseline=False)
    runs = result.runs.set_index("compression")
    assert (runs["status"] == "finished").all(), runs["error"].tolist()
    floats = 8 * 16 + 16 + 16 * 3 + 3
    steps = runs["step_to_target"] / 2  # the hub counts each rank's step
    assert runs.loc["none", "bytes_source"] == "ring allreduce (modelled)"
    assert runs.loc["none", "bytes_to_target"] == steps["none"] * 2 * 1 * 4 * floats
    assert runs.loc["int8", "bytes_source"] == "ring allgather (modelled)"
    int8_frame = floats + 4  # a byte a float and one float32 scale per 512
    assert runs.loc["int8", "bytes_to_target"] == steps["int8"] * 2 * 1 * int8_frame
