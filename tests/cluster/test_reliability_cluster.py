"""Reliability edges on real engines: a worker stuck in its step, a worker that stops reading its
replies, and a hub process that dies. Each ends the way the docs say (the worker written off and
the run finished, or the run failed within its bound), and the same engines take the next run.
Faults are injected into the engines (tests/helpers.py), so these tests start a cluster of their
own and stop it at the end."""

import os
import signal

import pytest

import nbdist
from nbdist.cluster.engines import assign_roles
from nbdist.errors import TrainingError
from tests.helpers import (
    SYNTHETIC_CELL,
    hang_worker_once,
    hub_process_pids,
    stop_reading_once,
    wait_paused,
)

TWO_WORKERS = dict(namespace={}, workers=2, batch_size=8)


@pytest.fixture(scope="module")
def own_cluster():
    from nbdist.cluster.engines import Cluster

    handle = Cluster.start(3)  # one hub shard and two workers
    yield handle
    handle.stop()


def worker_engine(cluster, worker: int, workers: int = 2) -> int:
    """The engine a run with one hub shard and `workers` workers gives worker `worker`."""
    return assign_roles(cluster.engine_hosts(), 1, workers).workers[worker]


def next_run_takes_every_engine(cluster, busy_engine: int) -> None:
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, **TWO_WORKERS, epochs=1, wait=True)
    assert again.status == "finished"
    assert busy_engine in [*again.nodes["engine"], *(h["engine"] for h in again.hubs)]


def finished_without(run, worker: int, epochs: int, reason: str) -> None:
    """`run` finished with every sample trained once by the others, `worker` written off."""
    assert run.status == "finished" and run.error is None, run.error
    assert run.nodes.set_index("worker")["state"][worker] == "lost"
    lost = run.events[run.events["event"] == "worker_lost"]
    assert list(lost["worker"]) == [worker] and reason in lost["reason"].iloc[0]
    assert run.stats["epoch_samples"] == [900] * epochs


def test_a_hung_worker_is_written_off_and_its_engine_takes_the_next_run(own_cluster):
    """Worker 1 stops in its step and never returns: the hub writes it off after its silence,
    the kernel interrupts its task, the other finishes the run, and the next run starts on
    every engine (before: its engine stayed busy, and the next run failed with
    EngineTimeoutError)."""
    stuck = worker_engine(own_cluster, 1)
    own_cluster.client[stuck].apply_sync(hang_worker_once, 1, 20)
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, **TWO_WORKERS, epochs=4)
    run.wait(timeout=240)
    finished_without(run, 1, 4, "silent for over")
    next_run_takes_every_engine(own_cluster, stuck)


def test_a_worker_that_stops_reading_its_replies_is_written_off_not_the_end_of_the_run(own_cluster):
    """Worker 1 stops reading its line while it fills, so the hub cannot queue the reply it
    then waits for: the hub writes it off there and then and the kernel interrupts its task;
    the run goes on and is stopped by hand, not failed (before: worker 1 waited for that reply
    until --timeout, then its error failed the run)."""
    reader = worker_engine(own_cluster, 1)
    own_cluster.client[reader].apply_sync(stop_reading_once, 1, 20, 2000, 2.0)
    # the run pauses itself at step 200 (of 226) at the latest: it cannot end before the test
    # stops it, wherever worker 1's write-off falls
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, **TWO_WORKERS, epochs=2, timeout=10,
                       pause_at=200)
    with run:
        own_cluster.client[reader].apply_async(os.getpid).get(120)  # worker 1's task has ended
        assert not run.done(), run.error
        run.stop()
        run.wait(timeout=120)
    assert run.status == "stopped" and run.error is None
    lost = run.events[run.events["event"] == "worker_lost"]
    assert list(lost["worker"]) == [1] and "replies were not read" in lost["reason"].iloc[0]
    next_run_takes_every_engine(own_cluster, reader)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_run_whose_hub_process_dies_fails_within_its_bound_and_frees_the_engines(own_cluster,
                                                                                   transport,
                                                                                   monkeypatch):
    """SIGKILL to the hub's process mid-run (held at step 20), with no snapshots to take it over
    from (NBDIST_HUB_SNAPSHOT_S=0; tests/cluster/test_shard_takeover_cluster.py takes one over):
    the run fails, through the workers' line that closes at once on one host or, over TCP where
    nothing tells them, the --timeout silence deadline (docs/architecture.md gives the bound:
    --timeout plus the fixed clean-up waits; a speed claim, not asserted here), and the next run
    takes every engine."""
    monkeypatch.setenv("NBDIST_HUB_SNAPSHOT_S", "0")
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, **TWO_WORKERS, timeout=10.0,
                       transport=transport, pause_at=20)
    with run:
        (hub_engine,) = [h["engine"] for h in run.hubs]
        wait_paused(run)
        (pid,) = own_cluster.client[hub_engine].apply_sync(hub_process_pids)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TrainingError, match="hub"):
            run.wait(timeout=300)
    assert run.status == "failed"
    next_run_takes_every_engine(own_cluster, hub_engine)


def test_a_run_failed_in_epoch_2_leaves_the_model_what_it_learned_and_checkpoints(own_cluster,
                                                                                 tmp_path,
                                                                                 monkeypatch):
    """The hub process is killed in epoch 2 (held at step 150; 113 steps an epoch), over TCP,
    with no snapshots to take it over from, so the run fails with its hub gone: the notebook's
    model holds the weights the kernel kept after epoch 1 ended, run.error says so, and
    run.checkpoint() saves them (before: the cell's initial weights, accuracy at chance, and
    checkpoint() refused: 'its hub is gone')."""
    monkeypatch.setenv("NBDIST_HUB_SNAPSHOT_S", "0")
    import numpy as np

    from nbdist.checkpoint.store import load

    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, namespace=ns, workers=2, batch_size=8,
                       epochs=3, timeout=10.0, transport="tcp", pause_at=150)
    initial = [w.copy() for w in ns["model"].get_weights()]
    with run:
        (hub_engine,) = [h["engine"] for h in run.hubs]
        wait_paused(run)
        (pid,) = own_cluster.client[hub_engine].apply_sync(hub_process_pids)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TrainingError, match=r"holds the weights of step \d+, after epoch 1 "
                                                r"ended"):
            run.wait(timeout=300)
    assert run.status == "failed"
    weights = ns["model"].get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(weights, initial, strict=True))
    acc = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]
    assert acc > 0.6, acc  # one epoch's learning (chance: 0.33)
    kept = load(run.checkpoint(str(tmp_path / "ckpt")))
    assert kept.meta["shards"][0]["version"] >= 113, kept.meta["shards"]
