"""Keras's weight constraints in NumPy (nbdist/algorithms/constraints.py) on hand-computed
values, their entries' checks, one shard's constraints, and shard bounds that keep a
constrained variable whole. (Against Keras's own objects: tests/inproc/test_constraints_keras.py.)

The numbers are chosen so the norms are exact (3-4-5 triangles); the remaining rounding is
Keras's ε = 1e-7 in the denominator, hence `rel=1e-6`.
"""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.algorithms.constraints import (
    SUPPORTED_CONSTRAINTS,
    ShardConstraints,
    checked_constraint,
    constrain,
    constrained_ranges,
)
from nbdist.core.sharding import shard_bounds
from nbdist.errors import ConfigError


def entry(class_name="MaxNorm", shape=(2, 2), start=0, variable="dense/kernel", **config):
    return {"variable": variable, "start": start, "shape": list(shape), "class_name": class_name,
            "config": config, "epsilon": 1e-7}


def kernel():
    """A Dense kernel (inputs 2, units 2): column norms 5 and 0.5, row norms √9.25 and 4."""
    return np.array([[3.0, 0.3], [4.0, 0.4]], np.float32)


def test_max_norm_scales_only_the_columns_above_the_limit():
    w = kernel()
    constrain(w, "MaxNorm", {"max_value": 2.0, "axis": 0})
    # column 0: 2/5 of itself; column 1 (norm 0.5): unchanged but for ε
    np.testing.assert_allclose(w, [[1.2, 0.3], [1.6, 0.4]], rtol=1e-6)
    assert w.dtype == np.float32


def test_max_norm_along_the_other_axis_and_a_negative_axis_agree():
    a, b = kernel(), kernel()
    constrain(a, "MaxNorm", {"max_value": 2.0, "axis": 1})
    constrain(b, "MaxNorm", {"max_value": 2.0, "axis": -1})
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a[1], [4.0 * 2 / np.sqrt(16.16), 0.4 * 2 / np.sqrt(16.16)],
                               rtol=1e-6)


def test_unit_norm_divides_each_column_by_its_norm():
    w = kernel()
    constrain(w, "UnitNorm", {"axis": 0})
    np.testing.assert_allclose(w, [[0.6, 0.6], [0.8, 0.8]], rtol=1e-6)


def test_min_max_norm_moves_norms_rate_of_the_way_into_the_interval():
    w = kernel()  # norms 5 and 0.5 into [1, 2] at rate 0.5: desired 3.5 and 0.75
    constrain(w, "MinMaxNorm", {"min_value": 1.0, "max_value": 2.0, "rate": 0.5, "axis": 0})
    np.testing.assert_allclose(w, [[2.1, 0.45], [2.8, 0.6]], rtol=1e-6)


def test_non_neg_clips_below_zero():
    w = np.array([[-1.5, 0.0], [2.0, -0.25]], np.float32)
    constrain(w, "NonNeg", {})
    assert w.tolist() == [[0.0, 0.0], [2.0, 0.0]]


def test_a_conv_kernel_is_constrained_per_filter_over_axes_0_1_2():
    w = np.zeros((1, 2, 1, 2), np.float32)  # two filters of 2 weights
    w[0, :, 0, 0] = [6.0, 8.0]  # norm 10
    w[0, :, 0, 1] = [0.6, 0.8]  # norm 1
    constrain(w, "MaxNorm", {"max_value": 2.0, "axis": [0, 1, 2]})
    np.testing.assert_allclose(w[0, :, 0, 0], [1.2, 1.6], rtol=1e-6)
    np.testing.assert_allclose(w[0, :, 0, 1], [0.6, 0.8], rtol=1e-6)


def test_axis_none_takes_the_norm_of_the_whole_variable():
    w = kernel()  # whole norm √(25 + 0.25)
    constrain(w, "UnitNorm", {"axis": None})
    np.testing.assert_allclose(w, kernel() / np.sqrt(25.25), rtol=1e-6)


def test_a_zero_column_stays_zero():
    w = np.zeros((3, 2), np.float32)
    for name in ("MaxNorm", "UnitNorm", "MinMaxNorm"):
        constrain(w, name, {})
        assert not w.any()


@pytest.mark.parametrize("shape", [(784, 9), (15, 4), (16, 4), (3, 3, 5, 2), (1000,)])
def test_norms_over_the_leading_axes_are_the_float32_sum_of_squares_rounded_once(shape):
    """16 squares at a time in float32, then float64: within 2e-7 of the exact sum of the
    float32 squares, whatever the remainder of the rows by 16."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=shape).astype(np.float32)
    axes = list(range(len(shape) - 1)) or [0]
    exact = np.sqrt(np.add.reduce(np.square(w).astype(np.float64), axis=tuple(axes), keepdims=True))
    got = w.copy()
    constrain(got, "UnitNorm", {"axis": axes})  # w / (ε + norms)
    np.testing.assert_allclose(got, w / (1e-7 + exact), rtol=2e-7)


# -- entries -------------------------------------------------------------------------------

def test_an_entry_gets_keras_defaults():
    assert checked_constraint(entry("MaxNorm"))["config"] == {"max_value": 2.0, "axis": 0}
    assert checked_constraint(entry("MinMaxNorm", max_value=3))["config"] == {
        "min_value": 0.0, "max_value": 3, "rate": 1.0, "axis": 0}
    assert checked_constraint(entry("NonNeg"))["config"] == {}
    assert SUPPORTED_CONSTRAINTS == ("MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm")


@pytest.mark.parametrize(("bad", "match"), [
    ({"class_name": "Clip"},
     "applies the constraints MaxNorm, MinMaxNorm, NonNeg, UnitNorm. Received: 'Clip'"),
    ({"config": {"max_norm": 2}}, "Unknown setting.*max_norm.*Valid: max_value, axis"),
    ({"config": {"max_value": float("nan")}}, "max_value must be a finite number"),
    ({"config": {"max_value": True}}, "max_value must be a finite number"),
    ({"config": {"axis": 2}},
     r"axis must be an int or a list of ints within the variable's 2 dim.*axis=2"),
    ({"config": {"axis": [0, "1"]}}, "axis must be an int or a list of ints"),
    ({"shape": [2.5]}, "shape must be a list of sizes"),
    ({"start": -1}, "start a non-negative int"),
    ({"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
])
def test_a_bad_entry_is_refused_saying_what_is_wrong(bad, match):
    with pytest.raises(ConfigError, match=match):
        checked_constraint({**entry(), **bad})


def test_an_entry_with_missing_keys_is_refused():
    broken = entry()
    del broken["epsilon"]
    with pytest.raises(ConfigError, match="needs exactly the keys"):
        checked_constraint(broken)


# -- one shard -----------------------------------------------------------------------------

def layout_entries():
    """Flat vector: a 2x2 MaxNorm kernel at 0, an unconstrained 2-vector at 4, a NonNeg
    2-vector at 6: 8 floats."""
    return [entry("MaxNorm", (2, 2), 0, max_value=2.0),
            entry("NonNeg", (2,), 6, variable="dense/bias")]


def flat_weights():
    return np.concatenate([kernel().ravel(), [-1, -1], [-1, 5]]).astype(np.float32)


def test_a_shard_constrains_its_variables_in_place_and_leaves_the_rest():
    w = flat_weights()
    ShardConstraints(layout_entries(), offset=0, size=8).apply(w)
    np.testing.assert_allclose(w, [1.2, 0.3, 1.6, 0.4, -1, -1, 0, 5], rtol=1e-6)


def test_a_shard_holds_only_the_variables_inside_it_at_local_offsets():
    whole = flat_weights()
    w = whole[4:].copy()
    cons = ShardConstraints(layout_entries(), offset=4, size=4)
    assert cons
    cons.apply(w)
    assert w.tolist() == [-1, -1, 0, 5]
    assert not ShardConstraints(layout_entries(), offset=4, size=2)  # nothing constrained there


def test_refresh_brings_a_reply_copy_up_to_date_on_the_constrained_parts():
    w = flat_weights()
    reply = w.copy()
    reply[4:6] = 7  # what the reply held of an unconstrained part is not rewritten
    ShardConstraints(layout_entries(), 0, 8).apply(w, refresh=reply)
    np.testing.assert_array_equal(reply[:4], w[:4])
    np.testing.assert_array_equal(reply[6:], w[6:])
    assert reply[4:6].tolist() == [7, 7]


def test_a_shard_that_cuts_a_constrained_variable_is_refused():
    with pytest.raises(ConfigError,
                       match=r"'dense/kernel' \(floats \[0, 4\)\) is cut by the shard \[2, 8\)"):
        ShardConstraints(layout_entries(), offset=2, size=6)


# -- shard bounds --------------------------------------------------------------------------

def test_constrained_ranges_are_the_variables_floats():
    assert constrained_ranges(layout_entries()) == [(0, 4), (6, 8)]


def test_shard_bounds_move_a_cut_to_the_nearer_edge_of_a_constrained_variable():
    assert shard_bounds(100, 2, whole=[(40, 70)]) == [(0, 40), (40, 100)]  # 48 -> 40
    assert shard_bounds(100, 2, whole=[(30, 60)]) == [(0, 60), (60, 100)]  # 48 -> 60
    # already on an edge
    assert shard_bounds(100, 2, whole=[(0, 48), (48, 100)]) == [(0, 48), (48, 100)]


def test_shard_bounds_take_the_far_edge_when_the_near_one_is_taken():
    # 3 shards of 300: cuts 96 and 208; both fall in [0, 250), whose edges are 0 and 250
    assert shard_bounds(300, 3, whole=[(0, 250)]) == [(0, 250), (250, 251), (251, 300)]


def test_shard_bounds_with_no_room_for_the_shards_say_how_many_fit():
    with pytest.raises(ConfigError, match=r"cannot be split into 3 parameter shards.*Received: "
                                          r"--servers 3 for 200 floats, 2 constrained.*"
                                          r"--servers 2 or fewer"):
        shard_bounds(200, 3, whole=[(0, 100), (100, 200)])


@pytest.mark.parametrize("seed", range(20))
def test_shard_bounds_never_cut_inside_a_constrained_variable(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 400, size=8)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    whole = [(int(s), int(s + n))
             for s, n, c in zip(starts, sizes, rng.random(8) < 0.5, strict=True) if c]
    size, shards = int(sizes.sum()), int(rng.integers(1, 5))
    bounds = shard_bounds(size, shards, whole=whole)  # (11 of these 20 move a cut)
    assert len(bounds) == shards and bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(lo < hi for lo, hi in bounds)
    assert not any(s < lo < e for lo, _ in bounds for s, e in whole)
