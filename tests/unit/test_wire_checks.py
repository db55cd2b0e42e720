"""The hub's checks on what arrives before anything is decoded: field types and worker ids
(`check_fields`), and the bounded receive that counts frames and bytes (`recv_bounded`)."""

import pytest

from nbdist.errors import ProtocolError
from nbdist.hub.wire import check_fields, recv_bounded


def test_field_checks_by_hand():
    ok = {"op": "step", "worker": 1, "push": True, "chunks": [3, 4], "loss": float("nan"), "batch": 8}
    check_fields(ok, num_workers=2)  # a NaN loss is reported, not a framing error
    check_fields({"op": "stats", "since": 0}, num_workers=2)
    with pytest.raises(ProtocolError, match=r"^malformed header: wrong type or value of push, chunks$"):
        check_fields({**ok, "push": 1, "chunks": [3, "4"]}, num_workers=2)
    with pytest.raises(ProtocolError, match=r"wrong type or value of worker=2 \(0\.\.1\)"):
        check_fields({**ok, "worker": 2}, num_workers=2)
    with pytest.raises(ProtocolError, match=r"wrong type or value of worker=True \(0\.\.1\)"):
        check_fields({**ok, "worker": True}, num_workers=2)


class FakeFrame:
    def __init__(self, size, more):
        self.size, self.more = size, more

    def __len__(self):
        return self.size


class FakeSocket:
    def __init__(self, sizes):
        self.frames = [FakeFrame(s, i < len(sizes) - 1) for i, s in enumerate(sizes)]
        self.read = 0

    def recv(self, copy=False):
        self.read += 1
        return self.frames[self.read - 1]


def test_bounded_receive_counts_frames_and_bytes_and_drains_the_rest():
    assert len(recv_bounded(FakeSocket([5, 32, 100, 400]), max_frames=4, max_bytes=537)) == 4
    too_many = FakeSocket([5] * 20)  # 20 frames of 5 bytes: under the size limit, over the count
    with pytest.raises(ProtocolError, match=r"oversized message: more than 4 frames or 1000 bytes "
                                            r"\(16 more frame\(s\) dropped unread\)"):
        recv_bounded(too_many, max_frames=4, max_bytes=1000)
    assert too_many.read == 20  # the whole message left the socket
    too_big = FakeSocket([5, 32, 600, 1])
    with pytest.raises(ProtocolError, match=r"\(2 more frame\(s\) dropped unread\)"):
        recv_bounded(too_big, max_frames=8, max_bytes=600)
    assert too_big.read == 4


def test_a_lag_must_be_an_integer():
    with pytest.raises(ProtocolError, match=r"wrong type or value of lag$"):
        check_fields({"op": "step", "worker": 0, "push": True, "lag": "1"}, num_workers=1)
