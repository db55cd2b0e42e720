"""nbdist.sweep's arithmetic: the grid's points, the first validation at the target, the
table over seeds with speed-ups, the ring allreduce's bytes (pure, exact values)."""

import math

import pandas as pd
import pytest

from nbdist.errors import ConfigError
from nbdist.sweeps.table import (
    BASELINE,
    allgather_bytes,
    grid_points,
    reached,
    ring_bytes,
    summarize,
)

HISTORY = pd.DataFrame({
    "time": [0.5, 1.0, 1.5, 2.0, 3.0],
    "step": [5, 10, 15, 20, 30],
    "loss": [2.0, None, 1.0, None, None],
    "bytes": [None, 1000, None, 2000, 3000],
    "val_accuracy": [None, 0.6, None, 0.86, 0.84],
    "val_loss": [None, 0.9, None, 0.5, 0.45]})


def test_the_grid_is_every_combination_first_option_slowest():
    assert grid_points({"a": [1, 2], "b": ["x", "y", "z"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"},
        {"a": 2, "b": "x"}, {"a": 2, "b": "y"}, {"a": 2, "b": "z"}]


@pytest.mark.parametrize(("grid", "says"), [
    ({"workers": 2}, r"grid\['workers'\] must be a non-empty list"),
    ({"compression": "int8"}, "must be a non-empty list"),
    ({"workers": []}, "must be a non-empty list"),
    ({"seed": [0, 1]}, "seeds=\\[0, 1, 2\\]")])
def test_a_grid_that_is_not_lists_of_values_is_refused_with_an_example(grid, says):
    with pytest.raises(ConfigError, match=says):
        grid_points(grid)


def test_the_target_is_the_first_validation_that_reaches_it_with_its_bytes():
    # the time from the first push (0.5 s), when the engines are ready
    assert reached(HISTORY, 0.85, "accuracy") == {
        "time_to_target": 1.5, "step_to_target": 20, "bytes_to_target": 2000, "final": 0.84}
    # a loss is reached from above; "val_" may be given
    assert reached(HISTORY, 0.5, "val_loss")["time_to_target"] == 1.5
    never = reached(HISTORY, 0.9, "accuracy")
    assert math.isnan(never["time_to_target"]) and never["final"] == 0.84
    assert math.isnan(reached(HISTORY, 0.5, "auc")["final"])  # a metric the run never had


def test_the_ring_allreduce_moves_twice_m_minus_one_buffers_a_step():
    assert ring_bytes(steps=3, workers=2, frame_bytes=400) == 3 * 2 * 1 * 400
    assert ring_bytes(steps=1, workers=1, frame_bytes=400) == 0
    # an allgather: each of 3 ranks sends its 100-byte frame to the 2 others, per step
    assert allgather_bytes(steps=2, workers=3, frame_bytes=100) == 2 * 3 * 2 * 100
    assert allgather_bytes(steps=5, workers=1, frame_bytes=100) == 0


def test_the_table_averages_over_seeds_and_counts_speedups_from_one_worker():
    rows = pd.DataFrame([
        # the grid has no workers=1: the baseline runs (one worker, no grid option) count
        {"compression": None, "workers": 1, "seed": 0, "baseline": True, "status": "finished",
         "time_to_target": 12.0, "bytes_to_target": 10.0, "bytes_source": "counted",
         "final": 0.9},
        {"compression": None, "workers": 1, "seed": 1, "baseline": True, "status": "finished",
         "time_to_target": 8.0, "bytes_to_target": 10.0, "bytes_source": "counted",
         "final": 0.9},
        {"compression": "none", "seed": 0, "baseline": False, "status": "finished",
         "time_to_target": 6.0, "bytes_to_target": 100.0, "bytes_source": "counted",
         "final": 0.88},
        {"compression": "none", "seed": 1, "baseline": False, "status": "finished",
         "time_to_target": 4.0, "bytes_to_target": 80.0, "bytes_source": "counted",
         "final": 0.92},
        {"compression": "int8", "seed": 0, "baseline": False, "status": "finished",
         "time_to_target": math.nan, "bytes_to_target": math.nan, "bytes_source": None,
         "final": 0.7},
        {"compression": "int8", "seed": 1, "baseline": False, "status": "failed",
         "time_to_target": math.nan, "bytes_to_target": math.nan, "bytes_source": None,
         "final": math.nan}])
    rows["workers"] = [1, 1, 2, 2, 2, 2]
    table = summarize(rows, ["compression"]).set_index("point")
    none = table.loc["compression=none"]
    assert (none.runs, none.reached, none.time_to_target, none.bytes_to_target) == (2, 2, 5.0, 90)
    assert none.final == pytest.approx(0.90) and none.final_std == pytest.approx(0.02)
    assert none.speedup == 2.0 and none.efficiency == 1.0  # 10 s on one worker, 5 s on two
    int8 = table.loc["compression=int8"]
    assert (int8.runs, int8.reached, int8.final) == (2, 0, 0.7)  # the failed run has no final
    assert math.isnan(int8.time_to_target) and math.isnan(int8.speedup)
    assert table.loc[BASELINE].speedup == 1.0


def test_a_grid_with_one_worker_counts_each_point_from_its_own_one_worker_row():
    rows = pd.DataFrame({"workers": [1, 2, 1, 2], "lr": [0.1, 0.1, 0.2, 0.2], "seed": 0,
                         "status": "finished", "time_to_target": [9.0, 3.0, 4.0, 4.0],
                         "bytes_to_target": 1.0, "bytes_source": "counted", "final": 0.9})
    table = summarize(rows, ["workers", "lr"]).set_index("point")
    assert table.loc["workers=2, lr=0.1"].speedup == 3.0
    assert table.loc["workers=2, lr=0.2"].speedup == 1.0
    assert table.loc["workers=2, lr=0.2"].efficiency == 0.5


def test_a_list_of_ways_of_training_is_its_own_points_labelled_by_what_each_sets():
    from nbdist.sweeps.table import grid_names

    grid = [{"mode": "sync"}, {"algorithm": "diloco", "local_steps": 50}]
    assert grid_points(grid) == grid and grid_names(grid) == ["mode", "algorithm", "local_steps"]
    rows = pd.DataFrame([{"mode": "sync", "workers": 4, "seed": 0, "status": "finished",
                          "time_to_target": 2.0, "bytes_to_target": 8.0, "final": 0.9},
                         {"algorithm": "diloco", "local_steps": 50, "workers": 4, "seed": 0,
                          "status": "finished", "time_to_target": 1.0, "bytes_to_target": 1.0,
                          "final": 0.9}])
    table = summarize(rows, grid_names(grid))
    assert list(table["point"]) == ["mode=sync", "algorithm=diloco, local_steps=50"]
    with pytest.raises(ConfigError, match="or a list of dicts, one per way of training"):
        grid_points(["sync", "async"])
