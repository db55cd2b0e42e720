"""The pipeline timeline figure and bubble arithmetic (nbdist.dashboard.pipeline), by hand."""

from __future__ import annotations

import pytest

from nbdist.dashboard.pipeline import pipeline_figure, pipeline_summary, step_bubble

# S = 2, M = 2, GPipe with unit-time ops: stage 0 F0 [0,1] F1 [1,2] ... B0 [4,5] B1 [5,6];
# stage 1 F0 [1,2] F1 [2,3] B0 [3,4] B1 [4,5]. Wall 6, busy 4 + 4 = 8: bubble 1 - 8 / 12 = 1/3,
# which is the ideal (S-1)/(M+S-1) = 1/3.
OPS = {0: [["F", 0, 0.0, 1.0], ["F", 1, 1.0, 2.0], ["B", 0, 4.0, 5.0], ["B", 1, 5.0, 6.0]],
       1: [["F", 0, 1.0, 2.0], ["F", 1, 2.0, 3.0], ["B", 0, 3.0, 4.0], ["B", 1, 4.0, 5.0]]}


def test_step_bubble_matches_the_ideal_for_equal_stages():
    assert step_bubble(OPS) == pytest.approx(1 / 3)


def test_summary_bubble_and_utilisation():
    s = pipeline_summary({"busy": [4.0, 4.0], "wall": 6.0, "measured_steps": 1}, 2, 2)
    assert s["bubble"] == pytest.approx(1 / 3)
    assert s["ideal_bubble"] == pytest.approx(1 / 3)
    assert s["utilisation"] == pytest.approx([2 / 3, 2 / 3])
    empty = pipeline_summary({}, 3, 4)
    assert empty["bubble"] is None and empty["utilisation"] == [None] * 3
    assert empty["ideal_bubble"] == pytest.approx(2 / 6)


def test_figure_has_one_bar_per_op_in_ms_from_the_step_start():
    fig = pipeline_figure(OPS, 2, 2, pipeline_summary({"busy": [4.0, 4.0], "wall": 6.0}, 2, 2))
    by_name = {t["name"]: t for t in fig["data"]}
    assert set(by_name) == {"forward", "backward"}
    fwd = by_name["forward"]
    assert fwd["y"] == ["stage 0", "stage 0", "stage 1", "stage 1"]
    assert fwd["base"] == [0.0, 1000.0, 1000.0, 2000.0]
    assert fwd["x"] == [1000.0, 1000.0, 1000.0, 1000.0]
    assert fwd["text"] == ["0", "1", "0", "1"]
    title = fig["layout"]["title"]["text"]
    assert "bubble 33% this step" in title and "ideal (S-1)/(M+S-1) = 33%" in title
    assert "stage 0 67%, stage 1 67%" in title


def test_no_ops_yet_is_an_empty_figure():
    assert pipeline_figure({}, 2, 4)["data"] == []
