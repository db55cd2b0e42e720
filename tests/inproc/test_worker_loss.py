"""A worker that dies mid-run: the coordinator's decisions (no sockets), then a real hub on a
clock the test moves, which notices a silent worker, hands its chunk to the survivor and stops
holding the survivor back."""

import threading
import time

import numpy as np
import pytest

from nbdist.core.coordinator import Coordinator, Plan
from nbdist.core.liveness import LOST_EVAL_S, LOST_FIRST_S, LOST_FLOOR_S, LOST_STEPS
from nbdist.errors import TrainingError
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.wire.messages import Control, Hello, Step
from tests.helpers import wait_for


def plan(**kw):
    base = dict(num_workers=2, num_samples=40, epochs=1, batch_size=4, lr=0.1, has_validation=False)
    return Plan(**{**base, **kw})


def started(p):
    c = Coordinator(p)
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    c.heard(0, 0.0), c.heard(1, 0.0)
    return c


def push_one(c, worker, now):
    (chunk,) = c.work_for(worker, True, 0).chunks
    c.heard(worker, now)
    c.push(Step(worker, chunks=[chunk.id]), delay=0, now=now)
    return chunk.id


def push(transport, chunk_id):
    """One step of a worker that pushes `chunk_id` and pulls."""
    return transport.step(Step(transport.worker, push=True, pull=True, chunks=[chunk_id], loss=0.0,
                               compute_s=0.001))


def test_deadline_is_many_step_times_with_a_floor_and_more_while_evaluating():
    c = started(plan(num_samples=400))
    assert c.deadline(0) == LOST_FIRST_S  # no push measured yet
    for i in range(3):
        push_one(c, 0, now=1.0 + 0.01 * i)  # 10 ms steps
    assert c.deadline(0) == LOST_FLOOR_S
    for i in range(1, 12):
        push_one(c, 1, now=1.0 + 1.0 * i)  # 1 s steps
    assert c.deadline(1) == pytest.approx(LOST_STEPS * 1.0)
    c.slowdown[1] = 3.0  # slowed down live: its next steps take three times longer
    assert c.deadline(1) == pytest.approx(3 * LOST_STEPS * 1.0)
    c.evaluating[0] = 0
    assert c.deadline(0) == LOST_EVAL_S


def test_silent_worker_is_overdue_unless_paused_or_its_reply_is_held():
    c = started(plan())
    for i in range(3):
        push_one(c, 0, now=0.01 * i)
        push_one(c, 1, now=0.01 * i)
    c.heard(0, 100.0)
    now = 0.02 + LOST_FLOOR_S + 0.1
    assert c.overdue(now - 0.2) == []
    assert c.overdue(now) == [1]
    assert c.overdue(now, exempt={1: None}) == []  # the hub holds its reply: it cannot speak
    c.apply(Control(paused=True), now=now)
    assert c.overdue(now) == []


def test_a_lost_worker_s_chunks_and_eval_go_to_the_others_and_every_sample_is_seen_once():
    c = started(plan(num_samples=16, has_validation=True))
    first = push_one(c, 0, now=1.0)
    lost_chunk = c.work_for(1, True, 0).chunks[0]  # worker 1 takes a chunk, then dies
    push_one(c, 0, now=2.0)
    c.lose(1, now=9.0, reason="silent")
    assert c.stats.workers[1].state == "lost" and c.lost == {1}
    event = c.stats.events[-1]
    assert event["event"] == "worker_lost" and event["worker"] == 1 and event["silent_s"] == 9.0
    taken = [push_one(c, 0, now=10.0 + i) for i in range(2)]
    assert lost_chunk.id in taken and first not in taken
    assert c.schedule.samples_per_epoch == [16] and c.schedule.finished
    job = c.work_for(0, True, 5)
    assert job.eval.epoch == 0  # the survivor evaluates
    c.evaluating[0] = 0
    c.lose(0, now=11.0, reason="silent")  # then it dies too, mid-evaluation
    assert c.finished and c.snapshot(0)["lost"] == [0, 1]


def test_ssp_stops_waiting_for_a_lost_worker_and_a_rejoin_starts_at_the_slowest_clock():
    c = started(plan(num_samples=100, staleness=0))
    push_one(c, 0, now=1.0)
    assert c.work_for(0, True, 0) is None  # one clock ahead of worker 1 with S = 0
    c.lose(1, now=9.0, reason="engine died")
    assert c.work_for(0, True, 0) is not None
    c.hello(Hello(1, host="h", engine=1))  # it comes back: no longer lost, nobody waits for anybody
    assert 1 not in c.lost and c.work_for(1, True, 0) is not None


def test_group_members_lost_are_not_waited_for():
    c = started(plan(algorithm="group", groups=1))
    assert c.reply_for(0, True, 0).group == [0, 1]
    c.lose(1, now=1.0, reason="silent")
    assert c.reply_for(0, True, 0).group == [0]


# -- a real hub on a clock the test moves: no waiting for deadlines -----------------------------

SIZE = 64
TICK_S = 0.25  # what the test's clock moves on each of the survivor's messages


class TestClock:
    """The hub's `now()`, moved by the test alone."""

    __test__ = False

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def start_hub(p, clock=None):
    key = new_key()
    hub = Hub(HubSpec("loss", key, 0, 1, p, np.zeros(SIZE, np.float32), np.zeros(0, np.float32)),
              clock=clock)
    thread = threading.Thread(target=hub.serve, daemon=True)
    thread.start()
    return hub, key, thread


def grad_for(chunk_id):
    return np.full(SIZE, chunk_id + 1, np.float32)  # deterministic: the expected sum is exact


def train_until_done(t, reply, applied, clock=None, deadline_s=30.0):
    """Push every chunk handed out (gradient = chunk id + 1) until the hub says done; with
    `clock`, each message comes TICK_S after the last on the hub's clock."""
    end = time.monotonic() + deadline_s
    while not reply.done:
        assert time.monotonic() < end, "the run did not finish"
        if clock is not None:
            clock.advance(TICK_S)
        if reply.chunks:
            cid = reply.chunks[0].id
            t.grad[:] = grad_for(cid)
            reply = push(t, cid)
            applied.append(cid)
        else:
            if clock is None:
                time.sleep(0.02)  # deliberate: a worker without a chunk asks again a moment later
            reply = t.step(Step(t.worker))
    return reply


@pytest.mark.parametrize("staleness", [None, 2])
def test_hub_writes_off_a_silent_worker_and_the_survivor_finishes_the_epoch(staleness):
    """Time is the test's: b goes silent while a trains on, one tick per message; with SSP, a is
    held 3 clocks ahead (exempt from the deadline) and the clock jumps past b's deadline."""
    p = plan(num_samples=80, batch_size=4, staleness=staleness)
    clock = TestClock()
    hub, key, thread = start_hub(p, clock)
    control = HubControl(key, [hub.endpoints])
    a, b = (WorkerTransport(key, w, [hub.endpoints], 0, "tcp", timeout=20) for w in (0, 1))
    try:
        ra, rb = a.hello(), b.hello()
        ra = a.step(Step(a.worker))  # both here now: chunks are handed out
        rb = b.step(Step(b.worker))
        applied = []
        for _ in range(2):  # b trains a little (so its step time is measured), then goes silent
            cid = rb.chunks[0].id
            b.grad[:] = grad_for(cid)
            rb = push(b, cid)
            applied.append(cid)
        assert rb.chunks  # it holds a chunk it will never push
        outcome = {}

        def survivor():
            try:
                outcome["reply"] = train_until_done(a, ra, applied, clock)
            except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
                outcome["error"] = exc

        trainer = threading.Thread(target=survivor, daemon=True)
        trainer.start()
        if staleness is not None:  # a is held until b is written off: move time past b's deadline
            wait_for(lambda: control.stats()["nodes"][0]["state"] == "blocked"
                     or not trainer.is_alive(), 15, what="the survivor held by SSP")
            assert trainer.is_alive(), outcome
            assert control.stats()["lost"] == []  # held, not yet released
            clock.advance(LOST_FLOOR_S + 1.0)
        trainer.join(20)
        assert "error" not in outcome and outcome["reply"].done, outcome
        snap = control.stats()
        assert snap["lost"] == [1] and snap["nodes"][1]["state"] == "lost"
        assert snap["nodes"][0]["state"] != "lost"  # a spoke on every tick: never overdue
        lost = [e for e in snap["events"] if e["event"] == "worker_lost"]
        assert len(lost) == 1 and lost[0]["worker"] == 1 and lost[0]["silent_s"] > LOST_FLOOR_S
        if staleness is None:  # found within a check interval (0.5 s) and a tick of its deadline
            assert lost[0]["silent_s"] <= LOST_FLOOR_S + 0.5 + 2 * TICK_S
        assert snap["epoch_samples"] == [80] and sorted(applied) == list(range(20))
        assert sum(n["samples"] for n in snap["nodes"]) == 80
        params, _ = control.params()  # each chunk's gradient applied exactly once
        expected = -np.float32(0.1) * sum(grad_for(c) for c in applied)
        np.testing.assert_allclose(params, expected, rtol=1e-5)
        late = b.step(Step(b.worker, push=True, pull=True, chunks=[rb.chunks[0].id], loss=0.0))
        assert late.lost and late.done  # it was alive after all: told to leave, not applied
        np.testing.assert_array_equal(control.params()[0], params)
        assert snap["finished"] is False
        a.bye()
        assert control.stats()["finished"]
    finally:
        control.shutdown()
        thread.join(10)
        for t in (a, b):
            t.close()
        control.close()


@pytest.mark.parametrize("algorithm", ["asgd", "ssp"])
def test_two_shards_admit_a_worker_added_mid_run_and_each_chunk_is_applied_once(algorithm):
    """The kernel's `add_worker` op reaches every shard (shard 0's coordinator first); the new
    id's hello and pushes are then accepted by both, and an id beyond it still is not."""
    key = new_key()
    p = plan(num_workers=1, num_samples=80, batch_size=4, algorithm=algorithm,
             staleness=1 if algorithm == "ssp" else None)
    half = SIZE // 2
    hubs = [Hub(HubSpec("grow", key, i, 2, p, np.zeros(half, np.float32), np.zeros(0, np.float32),
                        offset=i * half)) for i in range(2)]
    threads = [threading.Thread(target=h.serve, daemon=True) for h in hubs]
    for t in threads:
        t.start()
    shards = [h.endpoints for h in hubs]
    control = HubControl(key, shards)
    a = WorkerTransport(key, 0, shards, 0, "tcp", timeout=20)
    b = None
    try:
        ra, applied = a.hello(), []
        cid = ra.chunks[0].id
        a.grad[:] = grad_for(cid)
        ra = push(a, cid)
        applied.append(cid)
        control.control(add_worker=1, engine=5)
        assert [h.num_workers for h in hubs] == [2, 2]
        row = control.stats()["nodes"][1]
        assert (row["worker"], row["engine"], row["state"]) == (1, 5, "starting")
        with pytest.raises(TrainingError, match=r"next id, 2 \(Received: 3\)"):
            control.control(add_worker=3)
        b = WorkerTransport(key, 1, shards, 0, "tcp", timeout=20, engine=5)
        rb = b.hello()
        assert rb.chunks  # it trains at once: the start barrier is the first M only
        replies, end = {a: ra, b: rb}, time.monotonic() + 30
        while not all(r.done for r in replies.values()):  # one step each, in turn
            assert time.monotonic() < end, "the run did not finish"
            for t, r in replies.items():
                if r.chunks:
                    cid = r.chunks[0].id
                    t.grad[:] = grad_for(cid)
                    replies[t] = push(t, cid)
                    applied.append(cid)
                elif not r.done:
                    replies[t] = t.step(Step(t.worker))
        snap = control.stats()
        assert snap["epoch_samples"] == [80] and sorted(applied) == list(range(20))
        assert snap["nodes"][1]["samples"] > 0 and sum(n["samples"] for n in snap["nodes"]) == 80
        params, _ = control.params()  # every chunk's gradient applied once, on both shards
        np.testing.assert_allclose(params, -np.float32(0.1) * sum(grad_for(c) for c in applied),
                                   rtol=1e-5)
        a.bye(), b.bye()
        assert control.stats()["finished"]
    finally:
        control.shutdown()
        for t in threads:
            t.join(10)
        for t in (a, b):
            if t is not None:
                t.close()
        control.close()


def assert_each_chunk_applied_once(control, applied, chunks):
    """Every chunk pushed once, and the hub's weights are exactly the sum of their gradients."""
    assert sorted(applied) == list(range(chunks))
    expected = -np.float32(0.1) * sum(grad_for(c) for c in applied)
    np.testing.assert_allclose(control.params()[0], expected, rtol=1e-5)


def stop(control, thread, transports):
    control.shutdown()
    thread.join(10)
    for t in transports:
        if t is not None:
            t.close()
    control.close()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_late_push_from_an_earlier_incarnation_of_a_worker_is_refused(transport):
    """Worker 0 restarts (a new process says hello with the same id) while a push of its earlier
    incarnation is still on its way: that push is dropped, over TCP as over shared memory, and
    the new incarnation trains every chunk once."""
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=40))
    control = HubControl(key, [hub.endpoints])
    old = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=20)
    new = None
    try:
        chunk = old.hello().chunks[0].id
        new = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=20)
        reply = new.hello()  # the restarted worker registers
        old.grad[:] = 1000.0
        old.send_step(Step(0, push=True, pull=True, chunks=[chunk], loss=0.0))  # the late push
        dropped = wait_for(lambda: control.stats()["dropped"], 30, what="the late push dropped")
        assert dropped == {"stale incarnation": 1}
        assert control.stats()["global_step"] == 0 and hub.version == 0
        np.testing.assert_array_equal(control.params()[0], np.zeros(SIZE, np.float32))
        applied = []
        train_until_done(new, reply, applied)
        assert_each_chunk_applied_once(control, applied, 10)  # the late push's too, by the new one
    finally:
        stop(control, thread, (old, new))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_late_hello_from_an_earlier_incarnation_is_dropped_and_the_live_worker_goes_on(
        transport):
    """Worker 0 restarts; then a hello of its earlier process arrives late. It is dropped like
    that process's other messages, and the new process trains every chunk once (before: it
    re-registered the old process, whose sender then won, and the live process's steps were
    dropped as stale until its timeout)."""
    hub, key, thread = start_hub(plan(num_workers=1, num_samples=40))
    control = HubControl(key, [hub.endpoints])
    old = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=20)
    new = None
    try:
        old.hello()
        new = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=20)
        reply = new.hello()  # the restarted worker registers
        old.send_hello()  # the earlier process's hello, late
        dropped = wait_for(lambda: control.stats()["dropped"], 10, what="the late hello dropped")
        assert dropped == {"stale incarnation": 1}
        applied = []
        train_until_done(new, reply, applied)
        assert_each_chunk_applied_once(control, applied, 10)
        assert control.stats()["dropped"] == {"stale incarnation": 1}
    finally:
        stop(control, thread, (old, new))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_a_worker_that_does_not_read_its_replies_is_written_off_and_the_other_finishes(transport):
    """Worker 1 keeps asking and reads none of the answers, as a stuck process would: once the
    hub cannot queue a reply for it (its line or its ZeroMQ queue is full), shard 0 writes it
    off there and then, instead of leaving it to wait for that reply until --timeout and fail
    the run. Its chunks go to worker 0, which trains every chunk once."""
    hub, key, thread = start_hub(plan(num_samples=80))
    control = HubControl(key, [hub.endpoints])
    kind = "tcp" if transport == "tcp" else "auto"
    a, b = (WorkerTransport(key, w, [hub.endpoints], 0, kind, timeout=20) for w in (0, 1))
    try:
        assert b.line_kind == transport
        reply = a.hello()
        b.hello()
        sent = 0
        while not control.stats()["lost"]:  # full after thousands (TCP) or 512 (line)
            assert sent < 200_000, f"{sent} requests and worker 1 is still in the run"
            for _ in range(500):
                b.lines[0].send(Step(1))
            sent += 500
        snap = control.stats()
        assert snap["lost"] == [1] and snap["nodes"][1]["state"] == "lost"
        (event,) = [e for e in snap["events"] if e["event"] == "worker_lost"]
        assert "replies were not read" in event["reason"]
        assert snap["dropped"]["reply not delivered"] >= 1
        applied = []
        train_until_done(a, reply, applied)
        assert_each_chunk_applied_once(control, applied, 20)  # worker 1's chunks too, by worker 0
    finally:
        stop(control, thread, (a, b))
