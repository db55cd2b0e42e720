"""Whether a host answers on an address: real sockets on loopback (the address choices
themselves are pure functions, tested in tests/unit/test_netaddr.py)."""

import socket

import pytest

from nbdist.cluster.netaddr import check_reachable
from nbdist.errors import UnreachableHostError


def test_unreachable_address_raises_naming_host_and_address_within_the_timeout():
    # a listening socket that never accepts: a full backlog makes further connects hang
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        try:
            with pytest.raises(UnreachableHostError) as info:
                check_reachable("127.0.0.1", port, "hub shard 0", "lab3", timeout=0.5)
            assert info.value.host == "lab3" and info.value.address == f"127.0.0.1:{port}"
            assert "hub shard 0 on host lab3 at 127.0.0.1:" in str(info.value)
        finally:
            for s in fillers:
                s.close()


def test_a_refused_port_means_the_host_is_reachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
    assert check_reachable("127.0.0.1", port, "hub shard 0", "localhost", timeout=2) is None  # no raise
