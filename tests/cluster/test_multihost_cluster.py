"""Training across separate hosts of an emulated lab network (see tests/lab_network.py).

The lab is started by hand, as labs do: a controller on the head listening on all interfaces
(`--ip='*' --location=<head address>`, the set-up where hubs used to bind 127.0.0.1) and one
`ipengine` per host with the controller's connection file. Engine ids follow ENGINES:

    engine 0  lab3   hub host          engine 3  lab3   a worker beside the hub (mixed run)
    engine 1  lab1   worker host       engine 4  lab4   spare host (resume; dropped last)
    engine 2  lab2   worker host       engine 5  head   the kernel's and controller's host

The test that cuts lab4's cable for good runs last.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import nbdist
from nbdist.cluster.affinity import HUB_SPIN_S, may_spin
from nbdist.dashboard.hosts import hosts_figure
from tests.helpers import SYNTHETIC_CELL, wait_paused
from tests.lab_network import LabCluster, LabNetwork, unavailable

REASON = unavailable()
pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(REASON is not None, reason=f"lab network: {REASON}")]
ENGINES = ["lab3", "lab1", "lab2", "lab3", "lab4", "head"]
SAMPLES = 900  # SYNTHETIC_CELL's training set
PARAMS = 8 * 16 + 16 + 16 * 3 + 3  # SYNTHETIC_CELL's model: a float32 gradient is 4 * PARAMS bytes


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from nbdist.cluster.engines import Cluster

    workdir = tmp_path_factory.mktemp("lab")
    with LabNetwork(hosts=4) as network:
        hand = LabCluster(network, workdir, ENGINES, controller_ip="*")
        hand.start()
        cluster = Cluster.connect(
            connection_file=str(hand.security / "ipcontroller-lab-client.json"))
        cluster.network, cluster.hand = network, hand
        try:
            yield cluster
        finally:
            cluster.stop()
    assert network.leftovers() == [], "namespaces or links left behind"
    assert not _lab_processes(workdir), "processes left behind"


def _lab_processes(workdir) -> list[int]:
    """Processes whose command line mentions the lab's folder (controller, engines)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(workdir).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def addresses(lab, run) -> dict[int, str]:
    """Hub engine -> the address its hub bound."""
    return dict(run.state.backend.bind_hosts)


def accuracy(ns) -> float:
    return ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]


def test_async_workers_on_two_hosts_and_the_hub_on_a_third(lab):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([0, 1, 2]), namespace=ns, workers=2,
                       epochs=3, batch_size=16, wait=True, timeout=60)
    assert run.status == "finished" and run.error is None
    assert run.state.backend.roles.servers == (0,)
    assert addresses(lab, run) == {0: lab.network.address("lab3")}  # not 127.0.0.1 behind --ip='*'
    assert sorted(run.nodes["host"]) == ["lab1", "lab2"]
    assert run.stats["epoch_samples"] == [SAMPLES] * 3
    assert accuracy(ns) > 0.85


def test_mixed_run_uses_shared_memory_beside_the_hub_and_tcp_across_hosts(lab):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([0, 1, 3]), namespace=ns, workers=2,
                       epochs=2, batch_size=16, wait=True, timeout=60)
    assert run.status == "finished" and run.error is None
    roles = run.state.backend.roles
    assert roles.servers == (0,) and set(roles.workers) == {1, 3}
    assert sorted(run.nodes["host"]) == ["lab1", "lab3"]
    assert addresses(lab, run) == {0: lab.network.address("lab3")}
    assert run.stats["epoch_samples"] == [SAMPLES] * 2
    assert accuracy(ns) > 0.8
    # which transport each worker chose: shared memory only beside the hub (same host id)
    from nbdist.cluster.netaddr import host_id

    ids = dict(zip([0, 1, 3], lab.client[[0, 1, 3]].apply_sync(host_id), strict=True))
    assert ids[0] == ids[3] != ids[1]
    # ... and the bytes each one counted on its sockets: arrays over TCP, headers beside the hub
    nodes = run.nodes.set_index("host")
    # the hub shares lab3 with one worker, so under --spin auto it polls (see may_spin)
    spin = HUB_SPIN_S if may_spin(os.cpu_count() or 1, hubs=1, workers=1) else 0.0
    assert run.hubs == [{"shard": 0, "host": "lab3", "engine": 0, "spin_s": spin}]
    assert (nodes.loc["lab1", "link"], nodes.loc["lab3", "link"]) == ("tcp", "shm")
    assert nodes.loc["lab1", "shm_bytes"] == 0 and nodes.loc["lab3", "tcp_bytes"] == 0
    per_step = nodes["bytes_sent"] / nodes["steps"]
    assert per_step["lab1"] > 4 * PARAMS > per_step["lab3"]  # the gradient and a header; a header
    groups = [t["x"][0][0] for t in hosts_figure(run.nodes, run.hubs)["data"] if t["type"] == "bar"]
    assert groups == ["lab1", "lab3 · hub 0"]


@pytest.mark.horovod
def test_sync_ranks_on_two_hosts_end_with_identical_weights(lab):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([1, 2]), namespace=ns, mode="sync",
                       workers=2, epochs=2, batch_size=32, wait=True, timeout=60)
    results = run.worker_results
    assert sorted(r["host"] for r in results.values()) == ["lab1", "lab2"]
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    kernel = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    np.testing.assert_array_equal(kernel, results[0]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85


def test_a_checkpoint_of_a_multihost_run_resumes_on_other_hosts(lab, tmp_path):
    first = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([0, 1, 2]), namespace={}, workers=2,
                         epochs=2, batch_size=16, checkpoint_dir=str(tmp_path), wait=True,
                         timeout=60)
    assert first.status == "finished"
    resumed = {}
    again = nbdist.resume(tmp_path, SYNTHETIC_CELL, cluster=lab.subset([4, 5]), namespace=resumed,
                          epochs=4, workers=1, wait=True, timeout=60)
    assert again.status == "finished" and again.error is None
    roles = again.state.backend.roles
    assert roles.servers == (4,) and roles.workers == (5,)
    assert addresses(lab, again) == {4: lab.network.address("lab4")}
    assert again.nodes["samples"].sum() == 2 * SAMPLES  # only epochs 3 and 4 are trained
    assert accuracy(resumed) > 0.85


def test_nbdist_connect_to_the_hand_started_cluster_trains(lab, ip, monkeypatch, capsys):
    monkeypatch.setenv("IPYTHONDIR", str(lab.hand.ipython_dir))
    ip.run_line_magic("nbdist", "connect --profile lab --cluster-id lab")
    assert "Connected to connected ipyparallel cluster with 6 engine(s)" in capsys.readouterr().out
    magics = ip.magics_manager.registry["NbdistMagics"]
    try:
        ip.run_cell_magic("distribute", "--workers 2 --epochs 2 --batch-size 16 --wait -o lab_run",
                          SYNTHETIC_CELL)
        run = ip.user_ns["lab_run"]
        assert run.status == "finished"
        assert addresses(lab, run) == {0: lab.network.address("lab3")}
        assert sorted(run.nodes["host"]) == ["lab1", "lab2"]
    finally:
        magics.cluster.stop()  # disconnects only: the lab's engines are not ours to stop
        magics.cluster = None




def test_a_link_down_for_three_seconds_applies_nothing_twice_and_the_run_finishes(lab):
    ns = {}
    epochs = 6
    run = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([0, 1, 2]), namespace=ns, workers=2,
                       epochs=epochs, batch_size=8, timeout=60, pause_at=30)
    wait_paused(run)  # held at step 30: the cut lands mid-run whatever the machine's speed
    lab.network.set_link("lab2", up=False)
    try:
        run.resume()  # lab1 trains on while lab2's messages wait behind the cut
        time.sleep(3)  # deliberate: the link stays down for three seconds
    finally:
        lab.network.set_link("lab2", up=True)
    run.wait(timeout=240)
    assert run.status == "finished" and run.error is None
    assert run.stats["epoch_samples"] == [SAMPLES] * epochs
    assert run.nodes["samples"].sum() == SAMPLES * epochs  # no push applied twice
    assert accuracy(ns) > 0.85


def test_a_worker_host_dropped_for_good_is_written_off_and_every_sample_trained_once(lab):
    ns = {}
    epochs = 6
    run = nbdist.train(SYNTHETIC_CELL, cluster=lab.subset([0, 1, 4]), namespace=ns, workers=2,
                       epochs=epochs, batch_size=8, timeout=60, pause_at=30)
    wait_paused(run)  # held at step 30: the cut lands mid-run whatever the machine's speed
    lab.network.set_link("lab4", up=False)  # for good: engine 4 is not used after this test
    run.resume()
    run.wait(timeout=300)
    assert run.status == "finished" and run.error is None
    nodes = run.nodes.set_index("host")
    assert nodes.loc["lab4", "state"] == "lost" and nodes.loc["lab1", "state"] == "done"
    assert run.stats["epoch_samples"] == [SAMPLES] * epochs
    assert nodes["samples"].sum() == SAMPLES * epochs
    assert accuracy(ns) > 0.85
