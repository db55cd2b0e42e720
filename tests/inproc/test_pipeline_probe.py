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
