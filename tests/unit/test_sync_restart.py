"""A --mode sync run restarted on the ranks left (nbdist.modes.sync.restart, and the hub's side
in the coordinator), exact and by hand: the state the ranks start from, where in the data,
each rank's batch, and the hub's epochs and batches once a rank is out."""

from nbdist.core.coordinator import Coordinator, Plan
from nbdist.modes.sync.restart import latest_state, rank_batch, start_at
from nbdist.wire.messages import Control, Hello, Report


def sync_hub(num_workers: int = 3, batch_size: int = 16) -> Coordinator:
    c = Coordinator(Plan(num_workers=num_workers, num_samples=900, epochs=2,
                         batch_size=batch_size, lr=0.1, lr_owner="workers",
                         silence_is_loss=False, has_validation=False))
    for w in range(num_workers):
        c.hello(Hello(w, host="h", engine=w))
    return c


def test_the_ranks_left_start_from_the_most_advanced_state_the_lowest_worker_on_a_tie():
    assert latest_state({2: {"steps": 5}, 1: {"steps": 5}})[0] == 1
    assert latest_state({0: {"steps": 4}, 3: {"steps": 5}}) == (3, {"steps": 5})


def test_a_rank_stranded_after_an_epoch_s_last_step_starts_the_next_epoch():
    assert start_at((0, 0), 900) == (0, 0)
    assert start_at((1, 899), 900) == (1, 899)
    assert start_at((1, 900), 900) == (2, 0)


def test_the_ranks_left_share_the_global_batch_and_say_when_they_cannot_exactly():
    assert rank_batch(48, 3) == (16, None)
    assert rank_batch(48, 2) == (24, None)
    each, warning = rank_batch(48, 5)
    assert each == 9 and "each step trains on 45 samples, not 48" in warning
    assert rank_batch(2, 3)[0] == 1  # never an empty batch


def test_the_hub_gives_the_ranks_left_the_global_batch_and_ends_epochs_without_the_lost():
    c = sync_hub()
    c.report(Report(1, epoch_end=0), now=1.0)  # rank 1 ended epoch 0, then its engine died
    c.lose(1, now=2.0, reason="engine died")  # (ShardCore.control, on Control(lost=1))
    c.apply(Control(ranks=[0, 2], rank_batch=24), now=2.0)
    reply = c.report(Report(0, batch=24, samples=24, epoch=0.5), now=3.0)
    assert reply.batches == [24, 0, 24]  # by worker id: rank 0 sends [24, 24] in rank order
    assert c.snapshot(0)["nodes"][2]["batch_size"] == 24
    c.report(Report(2, epoch_end=0), now=4.0)
    assert not any(e["event"] == "epoch_end" for e in c.stats.events)
    c.report(Report(0, epoch_end=0), now=5.0)  # every rank left has ended it
    assert [e["epoch"] for e in c.stats.events if e["event"] == "epoch_end"] == [0]
    for w in (0, 2):
        c.bye(w, now=6.0)
    assert c.finished and c.lost == {1}


def test_a_state_report_counts_from_whichever_worker_is_rank_0_now():
    c = sync_hub(num_workers=2)
    c.lose(0, now=1.0, reason="engine died")
    c.apply(Control(ranks=[1], rank_batch=32), now=1.0)
    reply = c.report(Report(1, batch=32, samples=32, epoch=0.1), now=2.0)
    assert reply.batches == [0, 32] and c.stats.workers[1].samples == 32


def test_an_epoch_the_ranks_left_had_ended_ends_when_the_rank_that_had_not_is_lost():
    """Ranks 0 and 2 ended epoch 0 and wait at its gate; rank 1 died before saying so: the
    epoch ends when the kernel says rank 1 is lost, and the hub's replies name it, so the
    ranks waiting on the hub leave for the restart."""
    c = sync_hub()
    for w in (0, 2):
        c.report(Report(w, epoch_end=0), now=1.0)
    assert not any(e["event"] == "epoch_end" for e in c.stats.events)
    c.lose(1, now=2.0, reason="engine died")
    assert [(e["event"], e.get("epoch")) for e in c.stats.events
            if e["event"] in ("epoch_end", "worker_lost")] == [("worker_lost", None),
                                                               ("epoch_end", 0)]
    assert c.report(Report(0), now=3.0).lost == [1]
