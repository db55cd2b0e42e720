"""The same-host line (`nbdist.hub.localline`): its packet table, hand-computed, and which line
a worker chooses (the socket's whole-packet, bounded, owner-only behaviour on real Unix
sockets: tests/inproc/test_localline_sockets.py)."""

import struct

import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.hub import localline
from nbdist.hub.client import choose_line


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


def test_no_listener_when_the_user_turns_the_line_off(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_LOCAL_LINE", "0")
    assert localline.listen(str(tmp_path / "hub.line"), 4) is None
    assert not (tmp_path / "hub.line").exists()
