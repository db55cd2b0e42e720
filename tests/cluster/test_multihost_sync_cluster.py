"""--mode sync across three hosts of an emulated lab (tests/lab_network.py), the head among
them, whatever the hosts' names resolve to:

- `names="none"`: no host resolves any name but localhost (a lab without DNS or /etc/hosts);
- `names="head-loopback"`: every host resolves the lab's names, but the head resolves its own
  name to 127.0.0.1, as a default Debian /etc/hosts does.

The cluster is started by hand as in tests/cluster/test_multihost_cluster.py: engine 0 on the
head (beside the kernel and the controller), 1 on lab1, 2 on lab2. With nbdist's Horovod build
(scripts/build_horovod.sh, patch p1) every Gloo context binds the interface towards the
kernel, so both set-ups train. A Horovod build without that patch binds the address of the
host's name; nbdist then refuses before any rank starts, and no engine dies.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

import nbdist
from nbdist.errors import UnreachableHostError
from tests.helpers import SYNTHETIC_CELL as SYNTHETIC
from tests.lab_network import LabCluster, LabNetwork, unavailable

REASON = unavailable()
pytestmark = [pytest.mark.lab, pytest.mark.horovod,
              pytest.mark.skipif(REASON is not None, reason=f"lab network: {REASON}")]
ENGINES = ["head", "lab1", "lab2"]


@pytest.fixture(scope="module", params=["none", "head-loopback"])
def lab(request, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    from nbdist.cluster.engines import Cluster

    workdir = tmp_path_factory.mktemp(f"lab-{request.param}")
    with LabNetwork(hosts=2, names=request.param) as network:
        hand = LabCluster(network, workdir, ENGINES, controller_ip="*")
        hand.start()
        cluster = Cluster.connect(connection_file=str(hand.security / "ipcontroller-lab-client.json"))
        cluster.network, cluster.names = network, request.param
        try:
            yield cluster
        finally:
            cluster.stop()
    assert network.leftovers() == [], "namespaces or links left behind"


def _resolve_own_name() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def test_each_host_resolves_names_as_its_set_up_says(lab):
    resolved = dict(zip(ENGINES, lab.client[:].apply_sync(_resolve_own_name), strict=True))
    if lab.names == "none":
        assert resolved == {"head": None, "lab1": None, "lab2": None}
    else:
        assert resolved["head"] == "127.0.0.1"
        assert resolved["lab1"] == lab.network.address("lab1") and resolved["lab2"] == lab.network.address("lab2")


def test_sync_trains_across_three_hosts_the_head_among_them(lab):
    ns = {}
    run = nbdist.train(SYNTHETIC, cluster=lab, namespace=ns, mode="sync", workers=3, epochs=2, batch_size=32,
                       wait=True, timeout=60)
    assert run.status == "finished" and run.error is None
    results = run.worker_results
    assert sorted(r["host"] for r in results.values()) == sorted([socket.gethostname(), "lab1", "lab2"])
    for r in (1, 2):
        np.testing.assert_array_equal(results[0]["params"], results[r]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85


def test_without_nbdists_horovod_patch_the_name_is_refused_before_any_rank_starts(lab):
    """Stand in for an unpatched build on every engine (its metadata.json has no mark)."""
    pids = lab.client[:].apply_sync(_pid)
    lab.client[:].execute("import nbdist.modes.sync.network as _n; _n.horovod_build = lambda folder=None: ''",
                          block=True)
    try:
        with pytest.raises(UnreachableHostError) as refused:
            nbdist.train(SYNTHETIC, cluster=lab, namespace={}, mode="sync", workers=3, epochs=1, timeout=60)
    finally:
        lab.client[:].execute("import importlib, nbdist.modes.sync.network as _n; importlib.reload(_n)", block=True)
    message = str(refused.value)
    head = socket.gethostname()
    if lab.names == "none":  # every host's name resolves to nothing; the first rank's is named
        assert "resolves to nothing" in message and "make horovod" in message
        assert refused.value.host in (head, "lab1", "lab2")
    else:  # only the head's own name is wrong: loopback
        assert refused.value.host == head and f"Host {head}'s name resolves to loopback" in message
        assert f"`{lab.network.head_address} {head}` in /etc/hosts" in message
    assert lab.client[:].apply_sync(_pid) == pids  # no engine died
    again = nbdist.train(SYNTHETIC, cluster=lab, namespace={}, mode="sync", workers=3, epochs=1, wait=True,
                         timeout=60)
    assert again.status == "finished"  # and every engine takes the next run


def _pid() -> int:
    import os

    return os.getpid()



