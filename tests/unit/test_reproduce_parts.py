"""reproduce.py's real-cluster parts, their pure pieces: the utilisation window, the overlap and
pipeline verdicts from hand-built rows (the runs themselves need a cluster: --part
overlap/pipeline)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _reproduce_overlap import overlap_block, utilisation
from _reproduce_pipeline import pipeline_block


def test_utilisation_sums_compute_inside_the_window_over_its_wall_time():
    # 20 pushes 1 s apart; rows 2..18 form the window (10%..95%), whose first row only opens it
    rows = [{"time": float(t), "compute_s": 0.25 if t % 2 else 0.75} for t in range(20)]
    util, pushes, wall = utilisation(rows)
    assert (pushes, wall) == (16, 16.0)
    assert util == pytest.approx((8 * 0.25 + 8 * 0.75) / 16)


def _overlap(regime, seed, overlap, util):
    return {"regime": regime, "seed": seed, "overlap": overlap, "utilisation": util,
            "samples": 3200, "samples_per_s": 100 * util, "compute_ms": 2.0,
            "delay_mean": 1.0 if overlap else 0.0, "pushes": 80}


def test_overlap_verdict_is_a_sign_test_over_the_repeats_pairs():
    rows = [r for s in range(5)
            for r in (_overlap("overhead", s, False, 0.5), _overlap("overhead", s, True, 0.6))]
    rows += [_overlap("compute", s, ov, u)
             for s, (a, b) in enumerate([(0.9, 0.92), (0.9, 0.88), (0.9, 0.91)])
             for ov, u in ((False, a), (True, b))]
    lines, verdicts = overlap_block(rows, ["overhead", "compute"])
    # 5 of 5: p = 1/32
    assert verdicts["overhead"] == "HOLDS (+20% against the thesis's +28%; samples/s +20%)"
    assert verdicts["compute"].startswith("NOT SHOWN")  # 2 wins, 1 loss
    assert "5 wins, 0 losses (sign test p = 0.0312 for" in "\n".join(lines)


def _pipe(method, seed, cut, epoch_s):
    return {"method": method, "seed": seed, "cut": cut, "epoch_s": epoch_s,
            "samples_per_s": 1024 / epoch_s, "measured_ms": epoch_s, "predicted_ms": epoch_s,
            "predicted_all_ms": {"optimal": 1.0, "greedy": 1.0, "random": 2.0},
            "cores": {"0": 0, "1": 1}, "pinned": {"0": [40, 40], "1": [41, 41]}}


def test_pipeline_verdict_pairs_random_with_greedy_by_seed_and_counts_the_same_cut_as_a_tie():
    greedy = "conv1 | conv2, pool"
    rows = [_pipe("optimal", 0, greedy, 9.0)]
    for seed, (cut, t) in enumerate([("conv1, conv2 | pool", 15.0), (greedy, 9.5), ("c | d", 12.0),
                                     ("e | f", 20.0), ("g | h", 10.0), ("i | j", 12.5)]):
        rows += [_pipe("greedy", seed, greedy, 10.0), _pipe("random", seed, cut, t)]
    lines, verdict = pipeline_block(rows)
    text = "\n".join(lines)
    assert "4 wins, 0 losses, 2 ties" in text  # seed 1 drew greedy's cut, seed 4 took the same time
    assert verdict.startswith("NOT SHOWN")
    rows[-3]["epoch_s"] = 11.0  # seed 4's random run now slower than greedy: 5 wins of 5
    lines, verdict = pipeline_block(rows)
    assert "5 wins, 0 losses, 1 ties (sign test p = 0.0312 for" in "\n".join(lines)
    # time saved 1 - 10/t over seeds 0, 2, 3, 4, 5: 1/3, 1/6, 1/2, 1/11, 1/5
    assert verdict == (f"HOLDS ({-100 * (1 / 3 + 1 / 6 + 1 / 2 + 1 / 11 + 1 / 5) / 5:+.0f}% time "
                       "against the thesis's −34%)")
    assert "no network" in "\n".join(lines)


def test_pipeline_block_without_runs_says_how_to_measure():
    lines, verdict = pipeline_block([])
    assert verdict == "not measured yet" and "--part pipeline" in "\n".join(lines)
