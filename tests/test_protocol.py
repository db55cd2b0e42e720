import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.protocol import Codec, new_key, shard_bounds


def pair():
    key = new_key()
    return Codec(key, "worker-0"), Codec(key, "hub-0")


def test_signed_message_round_trips_with_zero_copy_buffers():
    a, b = pair()
    grad = np.arange(5, dtype=np.float32)
    msg = b.decode(a.encode({"op": "step", "loss": 0.5}, [grad]))
    assert msg.op == "step" and msg.header["loss"] == 0.5
    np.testing.assert_array_equal(msg.floats(0), grad)


def test_message_signed_with_another_key_is_refused():
    a = Codec(new_key(), "intruder")
    _, b = pair()
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode(a.encode({"op": "step"}))


def test_tampered_header_is_refused():
    a, b = pair()
    sig, header = a.encode({"op": "step", "lr": 0.1})
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode([sig, header.replace(b"0.1", b"9.9")])


def test_unsigned_and_truncated_messages_are_refused():
    a, b = pair()
    frames = a.encode({"op": "step"}, [np.ones(4, np.float32)])
    with pytest.raises(ProtocolError, match="truncated"):
        b.decode(frames[:1])
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode([b"", frames[1], frames[2]])
    with pytest.raises(ProtocolError, match="buffer sizes"):
        b.decode([frames[0], frames[1], np.ones(2, np.float32)])


def test_replayed_message_is_refused():
    a, b = pair()
    frames = a.encode({"op": "step"})
    b.decode(frames)
    with pytest.raises(ProtocolError, match="replayed"):
        b.decode(frames)


def test_oversized_buffers_are_refused():
    key = new_key()
    a, b = Codec(key, "w"), Codec(key, "h", max_buffer_bytes=16)
    with pytest.raises(ProtocolError, match="oversized"):
        b.decode(a.encode({"op": "step"}, [np.ones(8, np.float32)]))


def test_restarted_sender_is_a_new_sender():
    key = new_key()
    hub = Codec(key, "hub")
    hub.decode(Codec(key, "worker-0").encode({"op": "hello"}))
    hub.decode(Codec(key, "worker-0").encode({"op": "hello"}))  # seq 1 again, new process


@pytest.mark.parametrize("size,shards", [(100, 1), (100, 2), (1000, 3), (5, 2), (10_000_001, 4)])
def test_shard_bounds_cover_the_vector_contiguously(size, shards):
    bounds = shard_bounds(size, shards)
    assert len(bounds) == shards and bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    if size >= 16 * shards:
        assert all(lo % 16 == 0 for lo, _ in bounds)


def test_shard_bounds_by_hand():
    assert shard_bounds(100, 2) == [(0, 48), (48, 100)]
