"""When the monitor of a run with a fit call polls next (nbdist.run.monitor.EpochPace): fast
right after an epoch was let start, at the predicted end of a long epoch, never later than
POLL_S."""

import pytest

from nbdist.run.monitor import FAST_WINDOW_S, MIN_POLL_S, POLL_COST_RATIO, POLL_S, EpochPace

LONG_AGO = -100.0  # no epoch was let start lately


def test_right_after_an_epoch_starts_it_polls_every_min_poll():
    pace = EpochPace()
    assert pace.pause(now=10.0, released_at=9.5) == MIN_POLL_S
    assert pace.pause(now=10.0, released_at=10.0 - FAST_WINDOW_S) == POLL_S  # window over


def test_without_progress_seen_it_polls_every_poll_s():
    pace = EpochPace()
    assert pace.pause(now=0.0, released_at=LONG_AGO) == POLL_S
    pace.seen(0.0, 0.2)
    pace.seen(1.0, 0.2)  # no progress: no rate
    assert pace.pause(now=1.0, released_at=LONG_AGO) == POLL_S


def test_a_long_epoch_is_polled_when_it_is_due_to_end():
    pace = EpochPace()
    pace.seen(0.0, 1.5)
    pace.seen(1.0, 1.9)  # 0.4 epochs/s, 0.1 of the epoch left: due in 0.25 s
    assert pace.pause(now=1.0, released_at=LONG_AGO) == pytest.approx(0.25)
    pace.seen(1.1, 1.94)  # 0.06 left at 0.4 epochs/s: 0.15 s, less the 0.05 s since that poll
    assert pace.pause(now=1.15, released_at=LONG_AGO) == pytest.approx(0.1)
    pace.seen(1.2, 1.999)
    assert pace.pause(now=1.2, released_at=LONG_AGO) == MIN_POLL_S  # never busier than that


def test_a_just_ended_epoch_counts_a_whole_epoch_left():
    pace = EpochPace()
    pace.seen(0.0, 1.0)
    pace.seen(0.5, 2.0)  # 2 epochs/s; at the gate of epoch 2: a whole epoch (0.5 s) ahead
    assert pace.pause(now=0.5, released_at=LONG_AGO) == POLL_S


def test_a_costly_poll_spaces_the_next_so_polling_stays_a_tenth_of_the_kernels_time():
    pace = EpochPace()
    assert pace.pause(now=10.0, released_at=9.9, poll_s=0.005) == pytest.approx(
        POLL_COST_RATIO * 0.005)  # right after a release, but each poll costs 5 ms
    assert pace.pause(now=10.0, released_at=9.9, poll_s=1.0) == POLL_S  # never slower than before
