import json
import math

import numpy as np
import pytest

from nbdist.core.timeline import DEFAULT_COLUMNS, DelayWindow, Timeline
from nbdist.errors import ConfigError

COLS = ("time", "loss", "delay_max", "group")


def small(n, capacity=4):
    """Rows i = 1..n: time i, loss i, delay_max 10 - i (falling), group i."""
    t = Timeline(COLS, capacity=capacity)
    for i in range(1, n + 1):
        t.append(0, {"time": i, "loss": i, "delay_max": 10 - i, "group": i})
    return t


# --- Timeline --------------------------------------------------------------------------------


def test_rows_are_kept_as_appended_until_the_buffer_is_full():
    t = small(4)
    assert t.rows(0).tolist() == [[i, i, 10 - i, i] for i in (1.0, 2.0, 3.0, 4.0)]
    assert t.stride(0) == 1


def test_full_buffer_merges_pairs_and_new_rows_wait_for_a_full_stride():
    t = small(5)
    # Append 5 finds 4 closed rows: (1,2) and (3,4) merge; row 5 is open (1 of 2 appends).
    assert t.rows(0).tolist() == [[2, 1.5, 9, 2], [4, 3.5, 7, 4]]
    assert t.rows(0, include_open=True).tolist()[-1] == [5, 5, 5, 5]
    assert t.stride(0) == 2
    t.append(0, {"time": 6, "loss": 6, "delay_max": 4, "group": 6})
    # Later time, mean loss, max delay_max, later group.
    assert t.rows(0).tolist() == [[2, 1.5, 9, 2], [4, 3.5, 7, 4], [6, 5.5, 5, 6]]


def test_second_merge_keeps_every_row_standing_for_the_same_number_of_appends():
    t = small(9)
    # Rows were (2, 1.5), (4, 3.5), (6, 5.5), (8, 7.5); append 9 merges them into means of 1..4
    # and 5..8; row 9 is open (1 of 4).
    assert t.rows(0).tolist() == [[4, 2.5, 9, 4], [8, 6.5, 5, 8]]
    assert t.stride(0) == 4
    assert t.rows(0, include_open=True).tolist()[-1] == [9, 9, 1, 9]


def test_missing_values_are_ignored_when_merging():
    t = Timeline(("time", "loss"), capacity=2)
    t.append(0, {"time": 1})  # loss missing
    t.append(0, {"time": 2, "loss": 4.0})
    t.append(0, {"time": 3, "loss": None})
    t.append(0, [4, math.nan])
    rows = t.rows(0)
    assert rows[0].tolist() == [2, 4.0]  # the mean of (missing, 4) is 4
    assert rows[1, 0] == 4 and np.isnan(rows[1, 1])  # both missing: still missing
    t.append(0, {"time": 5})  # merges the pairs: (2, 4.0) and (4, missing) -> (4, 4.0)
    t.append(0, {"time": 6, "loss": 8.0})  # open row: (missing) then 8.0 -> 8.0
    assert t.rows(0, include_open=True).tolist() == [[4, 4.0], [6, 8.0]]


def test_memory_stays_bounded_over_a_long_run():
    t = Timeline(capacity=64)
    row = dict.fromkeys(DEFAULT_COLUMNS, 0.0)
    t.append(0, row)
    size = t.nbytes
    for i in range(1, 100_000):
        row["time"], row["loss"] = float(i), float(i)
        t.append(0, row)
    assert t.nbytes == size
    rows = t.rows(0)
    # 64 * 1024 = 65,536 < 100,000 <= 64 * 2048: stride 2048, 32 + 16 closed rows.
    assert len(rows) == 48 and t.stride(0) == 2048
    # The whole run is kept: the first row is the mean of appends 0..2047.
    assert rows[0, DEFAULT_COLUMNS.index("time")] == 2047.0
    assert rows[0, DEFAULT_COLUMNS.index("loss")] == 1023.5


def test_latest_is_the_last_appended_row_unmerged():
    t = small(7)
    assert t.latest(0) == {"time": 7.0, "loss": 7.0, "delay_max": 3.0, "group": 7.0}
    t.append(0, {"time": 8})
    assert t.latest(0) == {"time": 8.0, "loss": None, "delay_max": None, "group": None}
    assert t.latest(1) == {}


def test_since_time_returns_only_newer_rows():
    t = small(4)
    assert t.rows(0, since_time=2).tolist() == [[3, 3, 7, 3], [4, 4, 6, 4]]
    assert t.rows(0, since_time=4).shape == (0, 4)
    assert t.rows(3).shape == (0, 4)


def test_records_are_json_able_with_a_worker_key():
    t = Timeline(("time", "loss"), capacity=4)
    t.append(1, {"time": 1.0, "loss": 0.5})
    t.append(0, {"time": 2.0})
    recs = t.to_records()
    assert recs == [{"worker": 0, "time": 2.0, "loss": None},
                    {"worker": 1, "time": 1.0, "loss": 0.5}]
    json.dumps(recs, allow_nan=False)
    assert t.workers == [0, 1]


def test_rows_are_copies():
    t = small(2)
    t.rows(0)[0, 0] = 99
    assert t.rows(0)[0, 0] == 1


def test_bad_columns_capacity_and_rows_are_errors():
    with pytest.raises(ConfigError, match="include 'time'"):
        Timeline(("loss",))
    with pytest.raises(ConfigError, match="unique"):
        Timeline(("time", "time"))
    with pytest.raises(ConfigError, match="even number"):
        Timeline(COLS, capacity=5)
    t = Timeline(COLS)
    with pytest.raises(ConfigError, match=r"Unknown timeline column\(s\) \['lss'\]"):
        t.append(0, {"time": 1, "lss": 2})
    with pytest.raises(ConfigError, match="needs 4 values"):
        t.append(0, [1, 2])


# --- DelayWindow -----------------------------------------------------------------------------


def test_delay_stats_by_hand():
    d = DelayWindow()
    for tau in [0, 1, 1, 2, 10]:
        d.add(3, tau)
    s = d.stats(3)
    # p95, linear: h = 0.95 * 4 = 3.8 -> x3 + 0.8 * (x4 - x3) = 2 + 0.8 * 8 = 8.4
    assert s["delay_mean"] == 2.8 and s["delay_max"] == 10.0
    assert s["delay_p95"] == pytest.approx(8.4, rel=1e-12)


def test_p95_is_numpys_linear_percentile_for_every_window_length():
    """The hub computes p95 without numpy.percentile (0.2 ms a call); the number is the same."""
    rng = np.random.default_rng(0)
    for n in range(1, 300):
        d = DelayWindow(window=256)
        for tau in rng.integers(0, 40, n):
            d.add(0, int(tau))
        recent = d.recent(0)
        assert d.stats(0) == {"delay_mean": float(np.mean(recent)),
                              "delay_max": float(np.max(recent)),
                              "delay_p95": float(np.percentile(recent, 95, method="linear"))}


def test_window_keeps_only_recent_delays_oldest_first():
    d = DelayWindow(window=3)
    for tau in [9, 1, 2, 3, 4]:
        d.add(0, tau)
    assert d.recent(0).tolist() == [2, 3, 4]
    assert d.stats(0)["delay_mean"] == 3.0 and d.stats(0)["delay_max"] == 4.0


def test_histogram_counts_every_delay_with_a_last_bin_for_large_ones():
    d = DelayWindow(window=2, cap=4)
    for tau in [0, 1, 1, 2, 10, 4, 5]:
        d.add(0, tau)
    assert d.histogram(0) == {0: 1, 1: 2, 2: 1, 4: 3}
    assert d.histogram(1) == {}


def test_worker_without_pushes_has_nan_stats():
    s = DelayWindow().stats(0)
    assert all(math.isnan(v) for v in s.values())


def test_negative_delay_and_bad_settings_are_errors():
    with pytest.raises(ConfigError, match="Received: -1 from worker 0"):
        DelayWindow().add(0, -1)
    with pytest.raises(ConfigError, match="window >= 1"):
        DelayWindow(window=0)
