"""`%nbdist start --encrypt` (kept as `cluster.encrypt`) in every mode that trains on engines:
ipyparallel's channel and nbdist's sockets use CurveZMQ, and a run trains as usual.

- async: the hub shards' sockets;
- sync: the kernel's metrics hub; the Horovod rendezvous answers only requests signed with the
  run's key (with or without --encrypt); Gloo's tensors between hosts stay plaintext and
  run.warnings says so (tests/unit/test_sync_network.py: here every rank is on one host);
- pipeline: every stage's socket and the kernel's report and control sockets.
local and simulate send nothing off this host (docs/security.md).
"""

import http.client
import importlib.util

import numpy as np
import pytest
import zmq

import nbdist
from nbdist.hub.protocol import Codec
from tests.helpers import PIPELINE_SKIP_CELL, SYNTHETIC_CELL, wait_paused


@pytest.mark.slow
def test_an_encrypted_cluster_trains_with_curve_on_every_socket(ip):
    import nbdist

    ip.run_line_magic("nbdist", "start 2 --encrypt")
    magics = ip.magics_manager.registry["NbdistMagics"]
    cluster = magics.cluster
    try:
        assert cluster.encrypt and cluster.client.curve_serverkey  # ipyparallel's channel
        assert "encrypted (CurveZMQ)" in cluster.describe()
        run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=1, epochs=1,
                           wait=True)
        assert run.status == "finished" and run.nodes["samples"].sum() == 900
        assert run.stats["dropped"] == {}
    finally:
        ip.run_line_magic("nbdist", "stop")


@pytest.fixture(scope="module")
def encrypted():
    from nbdist.cluster.engines import Cluster

    cluster = Cluster.start(2, encrypt=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is built by `make horovod`")
def test_sync_on_an_encrypted_cluster_curve_on_the_hub_and_a_signed_rendezvous(encrypted):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=encrypted, namespace=ns, mode="sync", workers=2,
                       epochs=2, batch_size=32, timeout=60, pause_at=4)
    wait_paused(run)  # the strangers come while it holds at step 4: it cannot end meanwhile
    line = run.state.control.lines[0]  # the kernel's line to the metrics hub
    assert line.endpoint["curve"]  # the hub is a CurveZMQ server
    # a plaintext client, even one that signs with the run's key, gets no answer
    stranger = zmq.Context.instance().socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(line.endpoint["tcp"])
    key = line._key  # noqa: SLF001 - the stranger holds the run's key, which nbdist never shows
    stranger.send_multipart(Codec(key, "kernel", run.run_id).encode({"op": "stats"}, to="hub-0"))
    # and the rendezvous takes nothing unsigned
    rendezvous = run.state.backend.rendezvous
    conn = http.client.HTTPConnection(*rendezvous.server_address[:2], timeout=10)
    conn.request("PUT", "/global/0", body=b"6.6.6.6:1", headers={"Content-Length": "9"})
    assert conn.getresponse().status == 403
    conn.close()
    assert dict(rendezvous.rejected) == {"unsigned": 1}
    try:
        assert not stranger.poll(1000)
    finally:
        stranger.close()
    run.stop()
    run.wait(timeout=120)
    assert run.status in ("finished", "stopped") and run.error is None
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    # nothing of the stranger's was read. Its plaintext connections are refused at the
    # handshake; whether libzmq reports a refusal or only a closed connection depends on which
    # end reads the other's greeting first, so the count itself may be 0
    assert set(run.stats["dropped"]) <= {"refused at the handshake"}
    # every rank on this host: Gloo over loopback
    assert not [w for w in run.warnings if "plaintext" in w]


@pytest.mark.slow
def test_pipeline_on_an_encrypted_cluster_trains_exactly_over_curve_links(encrypted):
    from tests.cluster.test_pipeline_cluster import _single_machine

    cell = "B = 16\n" + PIPELINE_SKIP_CELL
    ns = {}
    run = nbdist.train(cell, cluster=encrypted, namespace=ns, mode="pipeline", stages=2,
                       micro_batches=4, batch_size=16, partition="uniform", transport="tcp")
    kernel = run.state.control.link  # the kernel's report and control sockets
    assert (kernel.pull.getsockopt(zmq.MECHANISM) == kernel.pub.getsockopt(zmq.MECHANISM)
            == zmq.CURVE)
    run.wait(timeout=240)
    assert run.status == "finished"
    # every stage's arrays went over its CurveZMQ socket (a plaintext end could not have talked)
    assert all(m["tcp"] > 0 and m["shm"] == 0 for m in run.pipeline["messages"])
    for a, b in zip([w.numpy() for w in ns["model"].weights], _single_machine(cell, 16),
                    strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
