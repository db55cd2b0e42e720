"""Liveness that a pause cannot fool, on a real hub and a real line: their clocks jump 100 s
(what a process sees once it was stopped for 100 s, or its wall clock was stepped), and nobody
is written off and no wait gives up; a worker that is really quiet is still found."""

import threading
import time

import numpy as np

from nbdist.core import liveness
from nbdist.core.coordinator import Plan
from nbdist.errors import TrainingError
from nbdist.hub import control as control_module
from nbdist.hub import lines, server
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.wire.messages import Shutdown, Step
from tests.helpers import wait_for

JUMP_S = 100.0


class JumpingTime:
    """A stand-in for the `time` module of one nbdist module: its wall and monotonic clocks run
    JUMP_S ahead from its `after`-th monotonic reading on (`None`: when the test calls `jump`)."""

    def __init__(self, after: int | None = None):
        self.offset, self.after, self.readings = 0.0, after, 0

    def jump(self) -> None:
        self.offset = JUMP_S

    def monotonic(self) -> float:
        self.readings += 1
        if self.after is not None and self.readings >= self.after:
            self.jump()
        return time.monotonic() + self.offset

    def time(self) -> float:
        return time.time() + self.offset

    def __getattr__(self, name):
        return getattr(time, name)


def start_hub(workers: int):
    key = new_key()
    p = Plan(num_workers=workers, num_samples=400, epochs=1, batch_size=4, lr=0.1,
             has_validation=False)
    hub = Hub(HubSpec("pause", key, 0, 1, p, np.zeros(16, np.float32), np.zeros(0, np.float32)))
    thread = threading.Thread(target=hub.serve, daemon=True)
    thread.start()
    return hub, key, thread


def test_a_jump_of_the_hubs_clocks_writes_off_nobody_and_a_quiet_worker_is_still_found(
        monkeypatch):
    """Both workers said hello (a deadline of LOST_FIRST_S, here 3 s); the hub's clocks jump
    100 s. Before: both were written off at the hub's next check (`time.time()`). Now the gap
    counts GAP_S at most: worker 0, which keeps talking, stays; worker 1, quiet, is found once
    the hub has run its deadline."""
    monkeypatch.setattr(liveness, "LOST_FIRST_S", 3.0)
    clocks = JumpingTime()
    monkeypatch.setattr(server, "time", clocks)
    hub, key, thread = start_hub(workers=2)
    control = HubControl(key, [hub.endpoints])
    a, b = (WorkerTransport(key, w, [hub.endpoints], 0, "tcp", timeout=20) for w in (0, 1))
    try:
        a.hello(), b.hello()
        quiet_from = time.monotonic()
        clocks.jump()
        while time.monotonic() - quiet_from < 1.0:  # two of the hub's checks for lost workers
            a.step(Step(a.worker))
            time.sleep(0.05)
        assert control.stats()["lost"] == []
        lost = wait_for(lambda: a.step(Step(a.worker)) and control.stats()["lost"], 30,
                        what="worker 1 written off")
        found_s = time.monotonic() - quiet_from
        assert lost == [1]
        # it counted at most GAP_S of the jump: not sooner than its deadline less that
        assert found_s >= liveness.LOST_FIRST_S - liveness.GAP_S, found_s
        reason = [e for e in control.stats()["events"] if e["event"] == "worker_lost"][0]
        assert reason["worker"] == 1 and "silent for over 3.0s" in reason["reason"]
        print(f"quiet worker found after {found_s:.2f}s (deadline 3 s, jump {JUMP_S:g} s)")
    finally:
        a.close(), b.close()
        control.shutdown()
        control.close()
        thread.join(10)
    assert hub.error is None


def test_a_wait_for_a_reply_across_a_stop_of_the_waiting_process_takes_the_reply(monkeypatch):
    """The kernel asks for stats with 5 s to wait, and its clock jumps 100 s during the wait
    (it was stopped): the hub's answer is taken (before: 'did not answer within 5s', before
    even looking at the socket)."""
    hub, key, thread = start_hub(workers=1)
    control = HubControl(key, [hub.endpoints])
    try:
        clocks = JumpingTime(after=2)  # the wait's first reading, then 100 s later
        monkeypatch.setattr(lines, "time", clocks)
        monkeypatch.setattr(control_module, "time", clocks)
        snap = control.stats(timeout=5.0)
        assert clocks.offset == JUMP_S and snap["global_step"] == 0
        monkeypatch.undo()
    finally:
        control.shutdown()
        control.close()
        thread.join(10)


# -- every shard is watched ---------------------------------------------------------------------


def start_two_shards(key):
    p = Plan(num_workers=2, num_samples=400, epochs=1, batch_size=4, lr=0.1,
             has_validation=False)
    hubs = [Hub(HubSpec("shards", key, i, 2, p, np.zeros(16, np.float32),
                        np.zeros(0, np.float32))) for i in range(2)]
    threads = [threading.Thread(target=h.serve, daemon=True) for h in hubs]
    for t in threads:
        t.start()
    return hubs, threads


def stop_shard(key, hubs, shard: int) -> None:
    """End one shard's loop (its sockets close), as if its process had died."""
    stopper = HubControl(key, [h.endpoints for h in hubs], name="test-stop")
    stopper.lines[shard].request(Shutdown())
    stopper.close()


def test_a_dead_shard_1_is_noticed_by_the_kernels_poll_as_shard_0_would_be():
    """The kernel's stats poll asks every shard: with shard 1 gone it fails within its timeout,
    naming shard 1 (before: shard 0 alone was asked, and answered, so nothing noticed)."""
    key = new_key()
    hubs, threads = start_two_shards(key)
    control = HubControl(key, [h.endpoints for h in hubs])
    try:
        assert control.stats(timeout=5.0)["global_step"] == 0  # both answer
        stop_shard(key, hubs, 1)
        threads[1].join(10)
        began = time.monotonic()
        try:
            control.stats(timeout=1.0)
        except TrainingError as exc:
            noticed_s = time.monotonic() - began
            assert "hub shard 1 did not answer" in str(exc)
        else:
            raise AssertionError("shard 1 is gone, and the kernel's poll did not notice")
        print(f"dead shard 1 noticed after {noticed_s:.2f}s of a 1 s poll timeout")
        assert noticed_s < 5.0
    finally:
        stop_shard(key, hubs, 0)
        control.close()
        threads[0].join(10)


def test_write_offs_relayed_to_a_dead_shard_wait_for_it_once_not_on_each(monkeypatch):
    """Shard 1 is gone; both workers go quiet, so shard 0 writes both off and relays each
    write-off to shard 1. The first relay waits RELAY_TIMEOUT_S (here 2 s) for shard 1, the
    second not at all (before: each waited, 2 x 2 s in shard 0's loop)."""
    from nbdist.hub import writeoff

    monkeypatch.setattr(liveness, "LOST_FIRST_S", 0.3)
    monkeypatch.setattr(writeoff, "RELAY_TIMEOUT_S", 2.0)
    key = new_key()
    hubs, threads = start_two_shards(key)
    HubControl(key, [h.endpoints for h in hubs]).close()  # the kernel tells shard 0 its peers
    watch = HubControl(key, [hubs[0].endpoints], name="watch")
    workers = [WorkerTransport(key, w, [h.endpoints for h in hubs], 0, "tcp", timeout=20)
               for w in (0, 1)]
    try:
        for w in workers:
            w.hello()
        stop_shard(key, hubs, 1)
        threads[1].join(10)
        began = time.monotonic()
        wait_for(lambda: len(watch.stats(timeout=10.0)["lost"]) == 2, 30,
                 what="both workers written off")
        both_s = time.monotonic() - began
        print(f"two write-offs relayed to a dead shard took {both_s:.2f}s (relay timeout 2 s)")
        assert both_s < 2 * writeoff.RELAY_TIMEOUT_S, both_s
        assert hubs[0].peers.unreachable == {"hub shard 1"}
    finally:
        for w in workers:
            w.close()
        stop_shard(key, hubs, 0)
        watch.close()
        threads[0].join(10)
