"""Workers that join a running async job on real engines: `run.add_workers([spare])`, and
`--elastic` taking in an engine started into the cluster mid-run."""


import pytest

import nbdist
from nbdist.errors import ClusterError, TrainingError
from tests.helpers import SYNTHETIC_CELL, wait_for, wait_paused

EPOCHS = 12
TRAIN_SAMPLES = 900  # SYNTHETIC_CELL's x_train


def _said_hello(run, worker: int) -> bool:
    nodes = run.nodes
    return len(nodes) > worker and nodes["state"][worker] not in ("starting",)


def _check_both_trained_every_sample_once(run) -> None:
    nodes = run.nodes
    assert list(nodes["worker"]) == [0, 1] and (nodes["samples"] > 0).all()
    assert set(nodes["state"]) == {"done"}
    assert run.stats["epoch_samples"] == [TRAIN_SAMPLES] * EPOCHS  # every sample once per epoch
    assert nodes["samples"].sum() == EPOCHS * TRAIN_SAMPLES
    added = run.events[run.events["event"] == "worker_added"]
    assert added["worker"].tolist() == [1]


def test_add_workers_brings_a_spare_engine_into_a_running_job(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=1, epochs=EPOCHS,
                       batch_size=16, pause_at=5)
    with run:
        wait_paused(run)  # held at step 5: the newcomer surely finds data left when it arrives
        (hub,), (first,) = [h["engine"] for h in run.hubs], run.nodes["engine"].tolist()
        (spare,) = set(cluster.engine_ids) - {hub, first}
        assert run.add_workers([spare]) == [1]
        wait_for(lambda: _said_hello(run, 1))
        assert run.nodes["engine"].tolist() == [first, spare]
        run.resume()
        run.wait(timeout=300)
    assert run.status == "finished"
    _check_both_trained_every_sample_once(run)
    assert run.events[run.events["event"] == "worker_added"]["engine"].tolist() == [spare]
    with pytest.raises(TrainingError, match="The run is finished, so it takes no new workers"):
        run.add_workers([spare])


def test_add_workers_refuses_engines_in_use_or_unknown_and_the_run_goes_on(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=1, pause_at=0)
    with run:
        wait_paused(run)  # the worker said hello (its engine is known); the run cannot end
        (hub,), (first,) = [h["engine"] for h in run.hubs], run.nodes["engine"].tolist()
        with pytest.raises(ClusterError, match=rf"already in it: engine {hub} \(a hub shard\), "
                                               rf"engine {first} \(worker 0\)"):
            run.add_workers([hub, first])
        with pytest.raises(ClusterError, match=r"not in the cluster: \[99\]"):
            run.add_workers([99])
        run.stop()
        run.wait(timeout=60)
    assert run.status == "stopped" and len(run.nodes) == 1
    assert "worker_added" not in run.events["event"].tolist()


def test_elastic_run_takes_in_an_engine_started_into_the_cluster():
    own = nbdist.Cluster.start(2)  # engines are added to it: never the shared session cluster
    try:
        run = nbdist.train(SYNTHETIC_CELL, cluster=own, namespace={}, workers=1, epochs=EPOCHS,
                           batch_size=16, elastic=True, pause_at=5)
        with run:
            wait_paused(run)  # held at step 5 while an engine is started into the cluster
            (joined,) = own.start_engines(1)
            wait_for(lambda: _said_hello(run, 1))
            assert run.nodes["engine"].tolist()[1] == joined
            run.resume()
            run.wait(timeout=300)
        assert run.status == "finished" and not [w for w in run.warnings if "--elastic" in w]
        _check_both_trained_every_sample_once(run)
    finally:
        own.stop()
