"""Runs side by side (`nbdist.compare`, `run.compare`, `run.report(compare=...)`): pure figure
dicts from each run's history and delays, so every mode compares the same way."""

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import nbdist
from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.dashboard.comparison import compare_figure, comparison_figures, named_runs, run_label
from nbdist.dashboard.style import PALETTE
from nbdist.errors import ConfigError
from tests.helpers import fed_run


def history(start: float, pushes: int, batch: int = 32, rate: float = 10.0,
            evals=()) -> pd.DataFrame:
    """`pushes` pushes `1 / rate` s apart from `start`, then validation rows (time, accuracy)."""
    t = start + np.arange(pushes) / rate
    rows = pd.DataFrame({"time": t, "step": np.arange(1, pushes + 1), "epoch": 0.0,
                         "worker": np.arange(pushes) % 2, "loss": np.linspace(2.0, 1.0, pushes),
                         "delay": 1, "batch_size": batch})
    val = pd.DataFrame([{"time": start + e, "step": int(e * rate), "val_accuracy": a,
                         "val_loss": 1 - a}
                        for e, a in evals])
    return pd.concat([rows, val], ignore_index=True).sort_values(["step", "time"], kind="stable")


def fake_run(config: TrainConfig, h: pd.DataFrame, delays=None, workers: int = 2):
    """What compare reads of a Run: config, history, delays, nodes."""
    d = delays if delays is not None else pd.DataFrame(columns=["worker", "delay", "count"])
    return SimpleNamespace(config=config, history=h, delays=d,
                           nodes=pd.DataFrame({"worker": range(workers)}))


ASYNC = fake_run(TrainConfig(workers=4), history(100.0, 50, evals=[(2.0, 0.5), (4.0, 0.7)]),
                 pd.DataFrame({"worker": [0, 0, 1], "delay": [0, 1, 1], "count": [2, 4, 2]}))
DC_DBS = fake_run(TrainConfig(workers=4, algorithm=Algorithm.DC_ASGD_A, dbs=True),
                  history(3.0, 40, batch=64, evals=[(1.0, 0.6)]),
                  pd.DataFrame({"worker": [0, 1], "delay": [2, 3], "count": [1, 3]}))
SYNC = fake_run(TrainConfig(mode=Mode.SYNC), history(0.0, 20), workers=2)
SIMULATED = fake_run(TrainConfig(mode=Mode.SIMULATE, workers=8, algorithm=Algorithm.DDC_ASGD),
                     history(0.0, 30, rate=1000.0, evals=[(0.02, 0.4)]))


def by_name(fig):
    return {t["name"]: t for t in fig["data"]}


def test_a_run_is_labelled_by_its_options():
    assert run_label(ASYNC) == "asgd, 4 workers"
    assert run_label(DC_DBS) == "dc-asgd-a, 4 workers, DBS"
    assert run_label(SYNC) == "sync allreduce, 2 workers"  # workers from run.nodes
    assert run_label(SIMULATED) == "ddc-asgd, 8 workers, simulate"
    assert run_label(fake_run(TrainConfig(staleness_lr=True, workers=1), history(0, 3))) == \
        "asgd + staleness-lr, 1 worker"


def test_equal_labels_are_told_apart_by_the_options_that_differ_then_by_a_number():
    a = fake_run(TrainConfig(workers=4, lr=0.05), ASYNC.history)
    b = fake_run(TrainConfig(workers=4, lr=0.25), ASYNC.history)
    assert [label for label, _ in named_runs((a, b, DC_DBS), None)] == [
        "asgd, 4 workers, lr=0.05", "asgd, 4 workers, lr=0.25", "dc-asgd-a, 4 workers, DBS"]
    assert [label for label, _ in named_runs((a, a), None)] == [
        "asgd, 4 workers (#1)", "asgd, 4 workers (#2)"]  # a re-run: the same options


def test_labels_come_from_a_dict_or_a_list_and_must_match_the_runs():
    assert ([label for label, _ in named_runs(({"fixed": ASYNC, "DBS": DC_DBS},), None)]
            == ["fixed", "DBS"])
    assert [label for label, _ in named_runs((ASYNC, SYNC), ["a", "s"])] == ["a", "s"]
    with pytest.raises(ConfigError, match="Received: 1 labels for 2 runs"):
        named_runs((ASYNC, SYNC), ["a"])
    with pytest.raises(ConfigError, match="Received: no runs"):
        named_runs((), None)


def test_accuracy_of_several_runs_on_one_time_axis_from_each_runs_first_push():
    fig = compare_figure(named_runs((ASYNC, DC_DBS), None), "accuracy", "time")
    t = by_name(fig)
    assert t["asgd, 4 workers"]["x"] == pytest.approx([2.0, 4.0])  # run started at t=100
    assert t["asgd, 4 workers"]["y"] == [0.5, 0.7]
    assert t["dc-asgd-a, 4 workers, DBS"]["x"] == pytest.approx([1.0])
    assert [tr["line"]["color"] for tr in fig["data"]] == list(PALETTE[:2])  # a colour per run
    assert fig["layout"]["yaxis"]["range"] == [0, 1] and fig["layout"]["yaxis"]["dtick"] == 0.2
    assert fig["layout"]["title"]["text"] == "validation accuracy against time"
    json.dumps(fig, allow_nan=False)


def test_against_samples_counts_every_pushed_batch():
    fig = compare_figure(named_runs((ASYNC, DC_DBS), None), "loss", "samples", window=1)
    t = by_name(fig)
    assert t["asgd, 4 workers"]["x"][:3] == [32, 64, 96]
    assert t["dc-asgd-a, 4 workers, DBS"]["x"][:3] == [64, 128, 192]  # batch 64
    assert t["asgd, 4 workers"]["y"][0] == pytest.approx(2.0)
    accuracy = by_name(compare_figure(named_runs((ASYNC,), None), "accuracy", "samples"))
    assert accuracy["asgd, 4 workers"]["x"] == [20 * 32, 40 * 32]  # pushes before each evaluation


def test_throughput_is_samples_per_second_of_the_whole_run():
    fig = compare_figure(named_runs((ASYNC, SIMULATED), None), "throughput")
    t = by_name(fig)
    assert np.mean(t["asgd, 4 workers"]["y"]) == pytest.approx(320.0, rel=0.1)  # 10 pushes/s x 32
    assert np.mean(t["ddc-asgd, 8 workers, simulate"]["y"]) == pytest.approx(32_000, rel=0.1)
    assert "virtual" in fig["layout"]["xaxis"]["title"]["text"]


def test_delay_distribution_is_the_share_of_pushes_at_each_delay():
    fig = compare_figure(named_runs((ASYNC, DC_DBS, SYNC), None), "delay")
    t = by_name(fig)
    assert (t["asgd, 4 workers"]["x"] == [0, 1]
            and t["asgd, 4 workers"]["y"] == pytest.approx([0.25, 0.75]))
    assert t["dc-asgd-a, 4 workers, DBS"]["y"] == pytest.approx([0.25, 0.75])
    assert "sync allreduce, 2 workers" not in t  # a sync run has no delays
    assert fig["layout"]["barmode"] == "group"


def test_unknown_metric_or_axis_says_what_is_allowed():
    with pytest.raises(ConfigError, match="Received: metric='speed'"):
        compare_figure(named_runs((ASYNC,), None), "speed")
    with pytest.raises(ConfigError, match="Received: x='step'"):
        compare_figure(named_runs((ASYNC,), None), "loss", "step")


def test_runs_without_data_give_a_waiting_figure():
    empty = fake_run(TrainConfig(), pd.DataFrame(columns=["time", "step", "loss", "batch_size"]))
    for fig in comparison_figures(named_runs((empty,), None)).values():
        assert fig["data"] == [] and "waiting for data" in fig["layout"]["title"]["text"]


def test_nbdist_compare_and_run_compare_give_a_plotly_figure_of_real_runs(tmp_path):
    a, b = fed_run(2, 5.0), fed_run(2, 8.0, TrainConfig(dbs=True))
    fig = nbdist.compare(a, b, metric="loss", x="samples")
    assert [t.name for t in fig.data] == ["asgd, 2 workers", "asgd, 2 workers, DBS"]
    assert [t.name for t in a.compare(b, metric="delay").data] == [t.name for t in fig.data]
    path = tmp_path / "compare.html"
    fig.write_html(path, include_plotlyjs=False)
    assert "asgd, 2 workers, DBS" in path.read_text(encoding="utf-8")


def test_the_report_can_hold_a_comparison(tmp_path):
    a, b = fed_run(2, 5.0), fed_run(2, 8.0, TrainConfig(dbs=True))
    page = a.report(tmp_path / "r.html", compare=[b]).read_text(encoding="utf-8")
    for name in ("compare_accuracy_time", "compare_accuracy_samples", "compare_loss_time",
                 "compare_loss_samples", "compare_throughput", "compare_delay"):
        assert f'id="nbdist-{name}"' in page
    # 7 panels of the run (hosts included), 6 comparisons
    assert page.count('class="plotly-graph-div"') == 13
