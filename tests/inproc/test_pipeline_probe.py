"""The pipeline's bandwidth probe (`nbdist.modes.pipeline.profile.measure_link`) binds its port
behind a gate, like every socket nbdist binds: a peer without the probe's key that connects
first does not take the probe's socket, and the probe still measures. Before, the probe's PAIR
socket took whoever connected first, and the probe waited on its blocking `recv` forever."""

import threading

import zmq

from nbdist.modes.pipeline.profile import measure_link

_bind = zmq.Socket.bind_to_random_port


def test_a_peer_that_connects_to_the_probe_first_does_not_take_it(monkeypatch):
    ctx = zmq.Context()
    intruders = []

    def bind_then_intrude(sock, addr, *args, **kwargs):
        """The probe's port, with an intruder connected (no key) before the probe's client."""
        port = _bind(sock, addr, *args, **kwargs)
        if sock.type == zmq.PAIR and not intruders:
            intruder = ctx.socket(zmq.PAIR)
            intruder.setsockopt(zmq.LINGER, 0)
            intruder.connect(f"{addr}:{port}")
            intruder.send(b"intruder")
            intruders.append(intruder)
            threading.Event().wait(0.3)  # its connection is in before the client's
        return port

    monkeypatch.setattr(zmq.Socket, "bind_to_random_port", bind_then_intrude)
    result = {}
    probe = threading.Thread(target=lambda: result.update(measure_link(1 << 16)), daemon=True)
    probe.start()
    probe.join(20)
    try:
        assert not probe.is_alive(), "the probe hangs: the intruder took its socket"
        assert intruders and result["bandwidth"] > 0 and result["latency"] > 0
        assert intruders[0].poll(200) == 0  # nothing of the probe's reached the intruder
    finally:
        for sock in intruders:
            sock.close(0)
        ctx.term()


def test_the_probe_across_hosts_measures_the_link_to_the_far_ends_echo_and_the_echo_ends():
    """Where the stages span hosts, the second stage's engine serves an echo (`serve_echo`)
    and the first stage's profile times round trips to it (`measure_link_to`), so the cost
    model counts the link the activations will cross, not the first engine's loopback. Here
    both ends on loopback: it measures, and the echo's thread ends when told. A client without
    the key is refused at the echo's gate, and its probe says so within its timeout."""
    import time

    import pytest

    from nbdist.errors import TrainingError
    from nbdist.hub.protocol import new_key
    from nbdist.modes.pipeline import profile

    key = new_key()
    peer = profile.serve_echo(key, "127.0.0.1", nbytes=1 << 16)
    echo = profile._ECHOES[-1]  # noqa: SLF001 - the thread this test waits for
    link = profile.measure_link_to(peer, key, nbytes=1 << 16)
    assert link["bandwidth"] > 0 and link["latency"] > 0 and link["to"] == peer["endpoint"]
    echo.join(5)
    assert not echo.is_alive() and echo not in profile._ECHOES  # noqa: SLF001
    other = profile.serve_echo(key, "127.0.0.1", nbytes=1 << 16, timeout=3.0)
    started = time.monotonic()
    with pytest.raises(TrainingError, match="got no answer within 1 s"):
        profile.measure_link_to(other, new_key(), nbytes=1 << 16, timeout=1.0)
    assert time.monotonic() - started < 5
