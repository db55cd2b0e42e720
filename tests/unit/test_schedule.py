import numpy as np
import pytest

from nbdist.core.schedule import (
    EpochSchedule,
    epoch_permutation,
    remaining_per_epoch,
    schedule_state,
)


def drain(schedule, size, order=None):
    chunks = []
    while (c := schedule.next_chunk(size)) is not None:
        chunks.append(c)
    return chunks


def test_every_sample_is_handed_out_once_per_epoch():
    s = EpochSchedule(num_samples=10, epochs=2)
    chunks = drain(s, 4)
    assert [(c.epoch, c.start, c.stop) for c in chunks] == [
        (0, 0, 4), (0, 4, 8), (0, 8, 10), (1, 0, 4), (1, 4, 8), (1, 8, 10)]


def test_epoch_completes_when_its_last_chunk_is_trained_even_out_of_order():
    s = EpochSchedule(num_samples=6, epochs=1)
    a, b = s.next_chunk(3), s.next_chunk(3)
    assert s.complete(b.id) is None
    assert not s.finished
    assert s.complete(a.id) == 0
    assert s.finished and s.epochs_done == 1.0


def test_completing_a_chunk_twice_is_an_error():
    s = EpochSchedule(num_samples=4, epochs=1)
    c = s.next_chunk(4)
    s.complete(c.id)
    with pytest.raises(KeyError):
        s.complete(c.id)


def test_requeued_chunk_goes_to_the_next_asker():
    s = EpochSchedule(num_samples=8, epochs=1)
    a = s.next_chunk(4)
    s.requeue(a.id)
    again = s.next_chunk(4)
    assert again == a
    s.complete(again.id)
    s.complete(s.next_chunk(4).id)
    assert s.finished


def test_permutation_is_shared_by_seed_and_differs_by_epoch():
    p0 = epoch_permutation(100, seed=3, epoch=0)
    np.testing.assert_array_equal(p0, epoch_permutation(100, seed=3, epoch=0))
    assert not np.array_equal(p0, epoch_permutation(100, seed=3, epoch=1))
    assert sorted(p0) == list(range(100))


def test_samples_left_counts_later_epochs_and_requeued_chunks():
    s = EpochSchedule(num_samples=10, epochs=2)
    assert s.samples_left() == 20
    a = s.next_chunk(4)
    assert s.samples_left() == 16
    s.requeue(a.id)
    assert s.samples_left() == 20
    drain(s, 4)
    assert s.samples_left() == 0


def test_the_state_of_a_long_run_lists_only_the_epochs_begun():
    """A run of 10^5 epochs ("train until I click Stop") stopped in its third epoch: its state
    travels in a message header (at most 64 KiB), so the untouched epochs are implied."""
    s = EpochSchedule(num_samples=10, epochs=100_000)
    for _ in range(2):  # two whole epochs trained
        s.complete(s.next_chunk(10).id)
    _in_flight, third = s.next_chunk(4), s.next_chunk(4)  # epoch 2: one in flight, one trained
    s.complete(third.id)
    state = s.state()
    assert state["remaining"] == [0, 0, 6] and state["pending"] == [[2, 0, 4]]
    every = remaining_per_epoch(state)
    assert every[:4] == [0, 0, 6, 10] and len(every) == 100_000
    again = EpochSchedule.from_state(state)
    assert again.samples_per_epoch[:4] == [10, 10, 4, 0]
    assert again.next_chunk(9).to_list()[1:] == [2, 0, 4]  # the one in flight, first
    assert schedule_state(10, 100_000, 1, 4)["remaining"] == [0, 6]


def test_a_state_listing_more_epochs_than_the_run_has_is_refused():
    state = EpochSchedule(num_samples=10, epochs=2).state()
    state["remaining"] = [10, 10, 10]
    with pytest.raises(ValueError, match="3 epochs' remaining samples listed, for 2 epochs"):
        EpochSchedule.from_state(state)


def test_the_kernel_reads_the_samples_of_the_epochs_begun_only():
    s = EpochSchedule(num_samples=4, epochs=100_000)  # "train until I click Stop"
    assert s.samples_per_begun_epoch == [0]
    a, b = s.next_chunk(4), s.next_chunk(2)
    s.complete(a.id)
    assert s.samples_per_begun_epoch == [4, 0]  # the second epoch is handed out, none trained
    s.complete(b.id)
    assert s.samples_per_begun_epoch == [4, 2]
