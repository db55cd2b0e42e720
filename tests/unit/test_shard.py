"""The shard core without sockets or wall-clock time: apply, hold and release, group steps and
their timeout, forget, control, stats, export and restore, each with hand-computed numbers."""

import numpy as np
import pytest

from nbdist.algorithms.kernels import COMPILED
from nbdist.core.plan import Plan
from nbdist.core.shard import GROUP_WAIT_LIMIT_S, ShardCore
from nbdist.core.stats import HISTORY_COLUMNS
from nbdist.wire.messages import Control, EvalResult, Hello, Step


def chunk_lists(reply):
    """A reply's chunks in their wire form, [id, epoch, start, stop]."""
    return [c.to_list() for c in reply.chunks]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def core(clock=None, size=2, **kw):
    base = dict(num_workers=2, num_samples=16, epochs=1, batch_size=4, lr=0.5, has_validation=False)
    return ShardCore(Plan(**{**base, **kw}), np.zeros(size, np.float32), np.zeros(0, np.float32),
                     now=clock or Clock())


def started(c, workers=(0, 1)):
    replies = {}
    for w in workers:
        c.hello(Hello(w, host="h", engine=w))
    for w in workers:
        replies[w] = c.reply(w, pull=True)
    return replies


def test_a_push_applies_sgd_and_is_counted_after_its_reply():
    c = core()
    replies = started(c)
    assert chunk_lists(replies[0]) == [[0, 0, 0, 4]] and chunk_lists(replies[1]) == [[1, 0, 4, 8]]
    assert c.push(Step(0, chunks=[0], batch=4), np.array([1, 2], np.float32)) is False
    assert c.params.tolist() == [-0.5, -1.0] and c.version == 1
    assert c.coordinator.stats.global_step == 0  # the bookkeeping waits for the reply ...
    reply = c.reply(0, pull=True)
    assert reply.version == 1 and chunk_lists(reply) == [[2, 0, 8, 12]]
    c.settle()  # ... and comes after it
    assert c.coordinator.stats.global_step == 1
    c.push(Step(1, chunks=[1], batch=4), np.array([2, 0], np.float32))  # read version 0: one stale
    assert c.params.tolist() == [-1.5, -1.0]
    assert [row[HISTORY_COLUMNS.index("delay")] for row in c.stats()["history"]] == [0, 1]


def test_an_overlapped_push_counts_its_delay_from_the_read_before_the_last():
    # worker 0 overlaps: push 1 on v0; push 2 computed on v0 while push 1's reply (v1) was in
    # flight (lag 1); push 3 on v1 while push 2's reply (v2) was in flight
    c = core(num_workers=1, overlap=True, num_samples=32)
    started(c, workers=(0,))
    for lag in (0, 1, 1):
        c.push(Step(0, chunks=[], lag=lag, batch=4), np.array([1, 1], np.float32))
        c.reply(0, pull=True)
    c.settle()
    assert [row[HISTORY_COLUMNS.index("delay")] for row in c.stats()["history"]] == [0, 1, 1]
    assert c.read_of(0) == 3 and c.read_of(0, lag=1) == 2


def test_a_lag_other_than_0_or_1_counts_as_0():
    c = core(num_workers=1)
    started(c, workers=(0,))
    c.push(Step(0, chunks=[], lag=-7, batch=4), np.array([1, 1], np.float32))
    c.reply(0, pull=True)
    c.push(Step(0, chunks=[], lag=99, batch=4), np.array([1, 1], np.float32))
    c.settle()
    assert [row[HISTORY_COLUMNS.index("delay")] for row in c.stats()["history"]] == [0, 0]


def test_into_receives_the_new_weights_in_the_same_pass():
    c = core()
    started(c)
    into = np.full(2, 9.0, np.float32)
    assert c.push(Step(0, chunks=[0], batch=4), np.array([1, 1], np.float32), into=into) is True
    assert into.tolist() == [-0.5, -0.5]


def test_ssp_holds_the_reply_and_releases_it_when_the_slowest_catches_up():
    c = core(algorithm="ssp", staleness=0)
    started(c)
    c.push(Step(0, chunks=[0], batch=4), np.ones(2, np.float32))
    assert c.reply(0, pull=True, token="ret-0") is None and c.held == {0: ("ret-0", True)}
    assert list(c.release()) == []  # still one clock ahead
    c.push(Step(1, chunks=[1], batch=4), np.ones(2, np.float32))
    assert chunk_lists(c.reply(1, pull=True)) == [[2, 0, 8, 12]]  # 1 asked first
    ((worker, token, pull, reply),) = list(c.release())
    assert ((worker, token, pull, reply.version, chunk_lists(reply))
            == (0, "ret-0", True, 2, [[3, 0, 12, 16]]))
    assert c.held == {}


def test_a_group_step_is_the_batch_weighted_mean_at_the_group_rate():
    c = core(algorithm="group", groups=1, batch_size=4)
    started(c)
    c.push(Step(0, chunks=[0], batch=4, group=[0, 1]), np.array([4, 0], np.float32))
    assert c.version == 0 and c.reply(0, pull=True, token="r0") is None  # waits for its group
    c.push(Step(1, chunks=[1], batch=12, group=[0, 1]), np.array([0, 8], np.float32))
    # mean (4·[4,0] + 12·[0,8]) / 16 = [1, 6], at lr · B_g / B_ref = 0.5 · 16 / 4 = 2
    assert c.params.tolist() == [-2.0, -12.0] and c.version == 1
    assert [w for w, *_ in c.release()] == [0]


def test_a_group_step_missing_a_member_is_applied_after_the_limit_on_the_injected_clock():
    clock = Clock()
    c = core(clock, algorithm="group", groups=1)
    started(c)
    clock.t = 10.0
    c.push(Step(0, chunks=[0], batch=4, group=[0, 1]), np.array([4, 0], np.float32))
    clock.t = 10.0 + GROUP_WAIT_LIMIT_S - 0.01
    assert c.expire_groups() is False and c.version == 0
    clock.t = 10.0 + GROUP_WAIT_LIMIT_S
    assert c.expire_groups() is True
    assert c.params.tolist() == [-2.0, 0.0]  # [4, 0] at 0.5 · 4 / 4
    (event,) = [e for e in c.stats()["events"] if e["event"] == "group_timeout"]
    assert event["members"] == [0, 1] and event["pushed"] == [0] and event["time"] == 15.0


def test_a_worker_that_leaves_flushes_its_group_and_frees_the_others():
    c = core(algorithm="group", groups=1)
    started(c)
    c.push(Step(0, chunks=[0], batch=4, group=[0, 1]), np.array([4, 0], np.float32))
    c.reply(0, pull=True, token="r0")
    c.bye(1)
    assert c.params.tolist() == [-2.0, 0.0] and c.version == 1
    assert [(w, token) for w, token, *_ in c.release()] == [(0, "r0")]
    assert c.coordinator.gone == {1}


def test_a_lost_worker_is_written_off_after_its_deadline_and_its_chunk_goes_back():
    clock = Clock()
    c = core(clock)
    started(c)
    clock.t = 29.0
    c.heard(0)
    clock.t = 30.5  # worker 1 never pushed: its deadline is LOST_FIRST_S = 30 s
    assert c.overdue() == [(1, 30.0)]
    c.lose(1, "silent")
    assert c.written_off(1) and c.overdue() == []
    c.push(Step(0, chunks=[0], batch=4), np.ones(2, np.float32))
    assert chunk_lists(c.reply(0, pull=True)) == [[1, 0, 4, 8]]  # worker 1's chunk, handed on


def test_control_validates_lr_and_one_owner_holds_it():
    c = core()
    with pytest.raises(ValueError, match="positive and finite, got -1.0"):
        c.control(Control(lr=-1.0))
    c.control(Control(lr=0.25))
    assert c.learning_rate() == 0.25 and c.coordinator.lr is None  # the hub optimizer owns it
    workers = core(lr_owner="workers")
    workers.control(Control(lr=0.25))
    assert workers.learning_rate() == 0.25 == workers.coordinator.lr
    assert workers.updater.learning_rate() == 0.5  # untouched: the workers apply the rate


def test_stats_are_exact():
    c = core(size=3)
    started(c)
    c.push(Step(0, chunks=[0], loss=2.0, batch=4), np.ones(3, np.float32))
    snap = c.stats()
    assert (snap["version"], snap["lr"], snap["elapsed"]) == (1, 0.5, 0.0)
    rule_scratch = 0 if COMPILED is not None else 3 * 4  # NumPy's asgd step needs a scratch array
    # what rule and optimizer keep: the optimizer's two scratch arrays
    assert snap["hub_bytes"] == 3 * 4 + c.updater.state_nbytes == 36 + rule_scratch
    assert snap["nodes"][0]["samples"] == 4 and snap["nodes"][0]["loss"] == 2.0


def test_export_and_restore_continue_exactly_like_the_uninterrupted_shard():
    def train(c, pushes, seed):
        rng = np.random.default_rng(seed)
        for i in range(pushes):
            w = i % 2
            c.push(Step(w, batch=4), rng.normal(size=5).astype(np.float32))
            c.reply(w, pull=True)

    straight, interrupted = core(size=5, algorithm="dc-asgd-a"), core(size=5, algorithm="dc-asgd-a")
    for c in (straight, interrupted):
        started(c)
        train(c, 5, seed=1)
    state = interrupted.export()
    assert state["version"] == 5 and state["lr"] == 0.5 and state["rule"] == "dc-asgd-a"
    assert state["schedule"]["pending"] == [[0, 0, 4], [0, 4, 8]]  # (epoch, start, stop) in flight
    fresh = core(size=5, algorithm="dc-asgd-a")
    fresh.params[:] = state["params"]
    fresh.restore({"version": state["version"], "rule": state["rule_state"],
                   "opt": state["opt_state"]})
    started(fresh)  # the workers reconnect and pull, to both shards
    for w in (0, 1):
        straight.reply(w, pull=True)
    train(straight, 4, seed=2)
    train(fresh, 4, seed=2)
    np.testing.assert_array_equal(fresh.params, straight.params)
    assert fresh.version == straight.version == 9


def _batched_run(settle_every):
    """Two workers of unequal speed, DBS, validation, a pause and an evaluation midway; the
    hub's order of calls: push, reply, then settle (all, or only when `settle_every` are due)."""
    clock = Clock()
    plan = Plan(num_workers=2, num_samples=96, epochs=2, batch_size=4, lr=0.5, has_validation=True,
                dbs=True)
    c = ShardCore(plan, np.zeros(3, np.float32), np.zeros(0, np.float32), now=clock,
                  settle_every=settle_every)
    replies = started(c)
    for i in range(40):
        w = i % 2
        clock.t += 0.01 * (1 + w)
        step = Step(w, chunks=[chunk.id for chunk in replies[w].chunks], loss=1.0 / (i + 1),
                    compute_s=0.01 * (1 + w), comm_s=0.001, wait_s=0.0, batch=4)
        if i == 21:
            step.eval = EvalResult(epoch=1, metrics={"accuracy": 0.5}, version=c.version)
        c.push(step, np.full(3, i, np.float32))
        c.eval_result(w, step.eval)
        replies[w] = c.reply(w, pull=True)
        c.settle(due_only=True)
        if i in (13, 14):
            c.control(Control(paused=i == 13))
    return c.stats(timeline=True), c.params.copy()


def test_accounting_in_batches_records_exactly_what_accounting_each_push_does():
    one, batched = _batched_run(1), _batched_run(16)
    assert one[1].tobytes() == batched[1].tobytes()
    assert [e["event"] for e in one[0]["events"]].count("epoch_end") >= 1  # the run ends an epoch
    assert one[0] == batched[0]


def test_a_push_fills_each_timeline_column_by_name():
    # the coordinator builds its timeline row in DEFAULT_COLUMNS' order, without names
    clock = Clock()
    c = core(clock)
    replies = started(c)
    clock.t = 2.5
    c.push(Step(0, chunks=[replies[0].chunks[0].id], loss=0.75, compute_s=0.125, comm_s=0.0625,
                wait_s=0.5, batch=4), np.ones(2, np.float32))
    c.settle()
    row = c.coordinator.pushes.timeline.latest(0)
    assert row == {"time": 2.5, "samples_per_s": 32.0, "compute_s": 0.125, "comm_s": 0.0625,
                   "wait_s": 0.5, "batch_size": 4.0, "delay_mean": 0.0, "delay_p95": 0.0,
                   "delay_max": 0.0, "loss": 0.75, "slowdown": 1.0, "group": 0.0}
