from nbdist.core.stats import RunStats


def test_push_counts_delay_and_rate_per_worker():
    s = RunStats(num_workers=2)
    s.record_push(0, samples=10, loss=1.0, compute_s=0.5, comm_s=0.1, delay=0, epoch=0.1, now=1.0)
    s.record_push(1, samples=10, loss=0.8, compute_s=1.0, comm_s=0.1, delay=1, epoch=0.2, now=2.0)
    s.record_push(0, samples=10, loss=0.6, compute_s=0.25, comm_s=0.1, delay=1, epoch=0.3, now=3.0)
    w0, w1 = s.workers
    assert (w0.steps, w0.samples, w0.delay_max, w0.delay_mean) == (2, 20, 1, 0.5)
    assert w0.samples_per_s == 0.8 * 20 + 0.2 * 40  # EMA of 20/s then 40/s
    assert w1.samples_per_s == 10.0
    assert s.global_step == 3


def test_history_is_returned_incrementally():
    s = RunStats(num_workers=1)
    for i in range(3):
        s.record_push(0, samples=4, loss=float(i), compute_s=0.1, comm_s=0.0, delay=0, epoch=0.0,
                      now=float(i))
    assert [row[4] for row in s.snapshot(since=1)["history"]] == [1.0, 2.0]


def test_eval_and_events_carry_the_global_step():
    s = RunStats(num_workers=1)
    s.record_push(0, samples=4, loss=1.0, compute_s=0.1, comm_s=0.0, delay=0, epoch=1.0, now=1.0)
    s.record_eval({"accuracy": 0.9}, epoch=0, version=1, now=2.0)
    s.record_event("pause", 3.0)
    snap = s.snapshot()
    assert snap["evals"][0]["val_accuracy"] == 0.9 and snap["evals"][0]["step"] == 1
    assert snap["events"][0] == {"time": 3.0, "step": 1, "event": "pause"}
