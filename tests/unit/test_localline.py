"""The same-host line (`nbdist.hub.localline`): its packet table, hand-computed, and the
socket's whole-packet, bounded, owner-only behaviour on real Unix sockets."""

import os
import socket
import stat
import struct

import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.hub import localline
from nbdist.hub.client import choose_line

needs_seqpacket = pytest.mark.skipif(not localline.enabled(), reason="no AF_UNIX SOCK_SEQPACKET here")


def test_table_is_the_count_then_each_frame_size_as_little_endian_u32():
    assert localline.table([b"abc", b"", bytes(70000)]) == bytes(
        [3, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0x70, 0x11, 0x01, 0x00])  # 70000 = 0x011170


def test_split_returns_the_frames_the_table_names():
    floats = np.arange(3, dtype=np.float32)
    packet = localline.table([b"sig+header", floats]) + b"sig+header" + floats.tobytes()
    first, second = localline.split(memoryview(packet), max_frames=6)
    assert bytes(first) == b"sig+header"
    np.testing.assert_array_equal(np.frombuffer(second, np.float32), floats)


@pytest.mark.parametrize("packet, reason", [
    (b"\x01\x00", "too short"),
    (struct.pack("<I", 0), "0 frames"),  # no frame at all
    (struct.pack("<I", 7) + bytes(28), "7 frames"),  # more frames than a message may have
    (struct.pack("<II", 2, 1), "2 frames in 8 bytes"),  # the table itself is cut off
    (struct.pack("<II", 1, 5) + b"abcd", "names 5 bytes of frames, it carries 4"),
    (struct.pack("<II", 1, 3) + b"abcd", "names 3 bytes of frames, it carries 4"),
])
def test_split_refuses_a_table_that_does_not_describe_the_packet(packet, reason):
    with pytest.raises(ProtocolError, match=f"malformed packet: .*{reason}"):
        localline.split(memoryview(packet), max_frames=6)


def test_same_host_workers_choose_the_local_line_only_when_every_message_fits(monkeypatch):
    shards = [{"local": "/tmp/a.line"}, {"local": "/tmp/b.line"}]
    assert choose_line(False, shards, 0) == "tcp"
    assert choose_line(True, shards, 0) == "local"
    assert choose_line(True, [shards[0], {}], 0) == "ipc"  # one shard offers no line
    fits = (localline.MAX_PACKET_BYTES - 32 * 1024) // 4
    assert choose_line(True, shards, fits) == "local"
    assert choose_line(True, shards, fits + 1) == "ipc"  # a large non-trainable state
    monkeypatch.setenv("NBDIST_LOCAL_LINE", "0")
    assert choose_line(True, shards, 0) == "ipc"


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


def test_no_listener_when_the_user_turns_the_line_off(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_LOCAL_LINE", "0")
    assert localline.listen(str(tmp_path / "hub.line"), 4) is None
    assert not (tmp_path / "hub.line").exists()
