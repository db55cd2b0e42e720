"""A hub shard's process and engine killed mid-run (--mode async): the kernel's latest snapshot
of the shard starts it anew on another engine, the workers start again towards it, and the run
finishes its epochs as well as an undisturbed one (nbdist/run/takeover.py). Engines are killed,
so these tests start a cluster of their own: five engines, so that the first test (one shard,
two workers) leaves free engines, and the second (two shards, two workers, on the four left)
none: a worker's engine takes the shard over and the run finishes with the other worker."""

import os
import signal
import time

import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL, hub_process_pids, wait_ended, wait_paused

EPOCHS = 8
RUN = dict(workers=2, epochs=EPOCHS, batch_size=8, seed=3)


@pytest.fixture(scope="module")
def own_cluster():
    from nbdist.cluster.engines import Cluster

    handle = Cluster.start(5)
    handle.pids = dict(zip(handle.engine_ids, handle.client[:].apply_sync(os.getpid), strict=True))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def undisturbed(own_cluster) -> float:
    """The test accuracy of the same run with nothing killed."""
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, namespace=ns, **RUN, wait=True)
    assert run.status == "finished", run.error
    return ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]


def kill_shard(cluster, run, shard: int) -> None:
    """SIGKILL to hub shard `shard`'s process and to its engine, a moment after `run` (held at
    its pause_at step) resumed training."""
    engine = run.hubs[shard]["engine"]
    pids = cluster.client[engine].apply_sync(hub_process_pids)
    run.resume()
    time.sleep(0.3)  # a few steps after the last snapshot: some updates are lost
    for pid in [*pids, cluster.pids[engine]]:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("servers", "shard"), [(1, 0), (2, 1)], ids=["one-shard", "two-shards"])
def test_a_killed_hub_shard_is_taken_over_and_the_run_finishes_as_undisturbed(
        own_cluster, undisturbed, servers, shard):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, namespace=ns, servers=servers,
                       pause_at=300, **RUN)
    with run:
        wait_paused(run)
        lost_engine = run.hubs[shard]["engine"]
        kill_shard(own_cluster, run, shard)
        wait_ended(run, 240)
    assert run.status == "finished" and run.error is None, run.error
    events = run.events
    taken = events[events["event"] == "shard_taken_over"]
    assert list(taken["shard"]) == [shard], events
    row = taken.iloc[0]
    assert row["engine"] != lost_engine and run.hubs[shard]["engine"] == row["engine"]
    assert row["updates_lost"] >= 0 and row["snapshot_age_s"] < 10, row
    print(f"\nshard {shard} of {servers}: recovered in {row['recovery_s']:.1f} s, "
          f"{row['updates_lost']} updates lost, snapshot {row['snapshot_age_s']:.1f} s old")
    assert any(w.startswith(f"hub shard {shard} was lost") for w in run.warnings), run.warnings
    # every epoch was trained to its end, with a validation each
    assert len(run.history["val_accuracy"].dropna()) >= EPOCHS - 1
    acc = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]
    assert acc >= undisturbed - 0.03, (acc, undisturbed)
    if servers == 2:  # the four engines left: no free one, so a worker's engine took it
        nodes = run.nodes.set_index("worker")
        assert list(nodes["state"]) == ["done", "lost"], nodes
