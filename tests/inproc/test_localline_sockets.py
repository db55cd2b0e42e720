"""The same-host line (`nbdist.hub.localline`) on real Unix sockets: whole packets, bounded,
owner-only (its packet table, hand-computed: tests/unit/test_localline.py)."""

import os
import socket
import stat

import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.hub import localline

needs_seqpacket = pytest.mark.skipif(not localline.enabled(), reason="no AF_UNIX SOCK_SEQPACKET here")


@needs_seqpacket
def test_a_packet_arrives_whole_and_a_closed_peer_reads_as_none():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sender, receiver = localline.Conn(a, 5.0), localline.Conn(b, 5.0)
    grad = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert sender.send([b"signed header", grad]) == 13 + 4000
    header, floats = receiver.receive(max_frames=6)
    assert bytes(header) == b"signed header"
    np.testing.assert_array_equal(np.frombuffer(floats, np.float32), grad)
    sender.close()
    assert receiver.receive(max_frames=6) is None
    receiver.close()


@needs_seqpacket
def test_nothing_to_read_is_a_timeout_and_an_oversized_packet_is_refused_whole():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * localline.MAX_PACKET_BYTES)
    receiver = localline.Conn(b, 0)
    with pytest.raises(TimeoutError):
        receiver.receive(max_frames=6)
    with pytest.raises(ProtocolError, match="oversized packet"):  # nbdist never sends one
        localline.Conn(a, 1.0).send([bytes(localline.MAX_PACKET_BYTES)])
    a.send(localline.table([bytes(localline.MAX_PACKET_BYTES)]) + bytes(localline.MAX_PACKET_BYTES))
    with pytest.raises(ProtocolError, match="oversized packet"):  # a stranger's: dropped whole
        receiver.receive(max_frames=6)
    a.send(localline.table([b"next"]) + b"next")
    assert [bytes(f) for f in receiver.receive(max_frames=6)] == [b"next"]  # the line goes on
    a.close()
    b.close()


@needs_seqpacket
def test_the_listener_is_owner_only_bounded_and_leaves_no_file(tmp_path):
    path = str(tmp_path / "hub.line")
    listener = localline.listen(path, max_conns=2)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    clients = [localline.connect(path, 5.0) for _ in range(3)]
    accepted = listener.accept()
    assert len(accepted) == 2 and listener.conns == set(accepted)
    assert clients[2].receive(max_frames=6) is None  # the third was closed at once
    clients[0].send([b"hello"])
    assert [bytes(f) for f in accepted[0].receive(max_frames=6)] == [b"hello"]
    accepted[0].send([b"reply"], block=False)
    assert [bytes(f) for f in clients[0].receive(max_frames=6)] == [b"reply"]
    listener.drop(accepted[0])
    assert listener.conns == {accepted[1]}
    for client in clients:
        client.close()
    listener.close()
    assert not os.path.exists(path)
