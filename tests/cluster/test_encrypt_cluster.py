"""`%nbdist start --encrypt`: ipyparallel's channel and nbdist's hub sockets use CurveZMQ,
and a run trains as usual."""

import pytest

from tests.helpers import SYNTHETIC_CELL


@pytest.mark.slow
def test_an_encrypted_cluster_trains_with_curve_on_every_socket(ip):
    import nbdist

    ip.run_line_magic("nbdist", "start 2 --encrypt")
    magics = ip.magics_manager.registry["NbdistMagics"]
    cluster = magics.cluster
    try:
        assert cluster.encrypt and cluster.client.curve_serverkey  # ipyparallel's channel
        assert "encrypted (CurveZMQ)" in cluster.describe()
        run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=1, epochs=1, wait=True)
        assert run.status == "finished" and run.nodes["samples"].sum() == 900
        assert run.stats["dropped"] == {}
    finally:
        ip.run_line_magic("nbdist", "stop")
