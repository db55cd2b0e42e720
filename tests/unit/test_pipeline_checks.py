"""What a pipeline stage accepts, checked without sockets: its message limits from the profile's
cuts, the typed messages (op, fields, sender), the frame table of arrays in frames and in
shared memory; and the gate's
count of young connections."""

import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.hub.gate import Young, _token, credentials
from nbdist.hub.protocol import MAX_HEADER_BYTES, SIGNATURE_BYTES
from nbdist.modes.pipeline.checks import arrays_of, message_limits, slot_table, stage_message
from nbdist.modes.pipeline.messages import Forward, Slot

HEADER = SIGNATURE_BYTES + MAX_HEADER_BYTES


def test_message_limits_cover_both_cuts_of_a_stage_and_float32_gradients_of_small_dtypes():
    # three stages over five steps; cuts after steps 0..3 for a micro-batch of 4 samples
    cut_bytes = [4 * 10 * 4, 4 * 6 * 1, 4 * 20 * 4, 4 * 2 * 4]  # the cut after step 1 holds uint8
    cut_items = [4 * 10, 4 * 6, 4 * 20, 4 * 2]
    cut_tensors = [1, 1, 2, 1]
    limits = message_limits(cut_bytes, cut_items, cut_tensors, [(0, 2), (2, 3), (3, 5)],
                            micro_batch=4, samples=256)
    # stage 0: only its output cut (after step 1): uint8 forward, float32 gradients back:
    # 4 B/element
    assert limits[0] == (2, HEADER + 2 * 6 * 4 * 256)
    # stage 1: the cut after step 1 (6 elements) and after step 2 (20 float32, two tensors)
    assert limits[1] == (3, HEADER + 2 * 20 * 4 * 256)
    assert limits[2] == (3, HEADER + 2 * 20 * 4 * 256)


def test_stage_message_refuses_unknown_ops_senders_and_wrongly_typed_fields():
    neighbours = {"stage-0", "stage-2"}
    forward = {"op": "F", "step": 3, "mb": 1, "src": "stage-0", "shapes": [[2]], "dtypes": ["<f4"]}
    assert stage_message(forward, neighbours) == Forward(3, 1, "stage-0", [[2]], ["<f4"])
    end = {"op": "end", "step": 4, "src": "stage-2"}
    assert stage_message(end, neighbours).key == ("end", 4, 0)
    slot = {"seg": "nbdist-x", "gen": 1, "slot": 0, "offsets": [0]}
    assert stage_message({**forward, "shm": slot}, neighbours).shm == Slot("nbdist-x", 1, 0, [0])
    for bad in ({"op": "G", "step": 1, "src": "stage-0"},
                {"op": "F", "step": "3", "src": "stage-0"},
                {"op": "F", "step": 1, "mb": [0], "src": "stage-0"},
                {"op": "F", "step": 1, "src": "kernel"}, {"op": "F", "step": 1, "src": "stage-5"},
                {"op": "B", "step": True, "src": "stage-0"}, {"op": "F", "src": "stage-0"},
                {**forward, "shapes": "2,3"}, {**forward, "dtypes": [["a", "<f4"]]},
                {**forward, "shm": {**slot, "offsets": [0, "64"]}},
                {**forward, "shm": {"offsets": [0]}}, {**forward, "extra": 1},
                {"op": "ack", "src": "stage-0", "slot": [0]}):
        with pytest.raises(ProtocolError, match="^malformed header"):
            stage_message(bad, neighbours)


def test_arrays_of_checks_the_frame_table():
    frames = [np.ones((2, 3), np.float32).tobytes(), np.array([7]).tobytes()]
    a, b = arrays_of([[2, 3], [1]], ["<f4", "<i8"], frames)
    assert a.shape == (2, 3) and b.tolist() == [7]
    buffers = [bytes(24), bytes(8)]
    for shapes, dtypes in (([[2, 3]], ["<f4"]),  # fewer entries than frames
                           ([[2, 4], [1]], ["<f4", "<i8"]),  # 32 bytes described, 24 sent
                           ([[2, 3], [1]], ["O", "<i8"]),  # Python objects
                           ([[2, 3], [1]], ["nonsense", "<i8"]),
                           ([[2, -3], [1]], ["<f4", "<i8"]), ([], [])):
        with pytest.raises(ProtocolError, match="^malformed header"):
            arrays_of(shapes, dtypes, buffers)


def test_slot_table_keeps_every_array_inside_the_segment():
    table = ([[4], [2, 2]], ["<f4", "<f8"])
    assert [(str(d), s, o) for d, s, o in slot_table(*table, [0, 64], 96)] == [
        ("float32", (4,), 0), ("float64", (2, 2), 64)]
    with pytest.raises(ProtocolError, match="at byte 64 of a 95-byte segment"):
        slot_table(*table, [0, 64], 95)
    for offsets in ([0, -8], [0]):
        with pytest.raises(ProtocolError, match="^malformed header"):
            slot_table(*table, offsets, 96)


def test_young_connections_are_capped_within_the_handshake_window():
    young = Young(limit=2, window_s=3.0)
    assert young.admit(10, now=0.0) and young.admit(11, now=1.0)
    assert not young.admit(12, now=2.0)  # a third within 3 s: cut
    young.gone(10)
    assert young.admit(13, now=2.5)  # one closed: room again
    assert not young.admit(14, now=2.9)
    assert young.admit(15, now=4.1)  # 11 and 13 are past the window: authenticated by now
    assert young.count(now=4.1) == 2 and young.count(now=100.0) == 0


def test_the_planned_peers_share_of_young_connections_stays_theirs():
    """limit 6, 4 reserved: connections from elsewhere (another user's flood) hold 2 slots at
    most, the run's own peers may take all 6."""
    young = Young(limit=6, window_s=3.0, reserved=4)
    flood = [young.admit(fd, now=0.0) for fd in range(100, 110)]
    assert flood == [True, True] + [False] * 8
    assert [young.admit(fd, now=0.5, planned=True) for fd in range(5)] == [True] * 4 + [False]
    assert young.count(0.5, planned=True) == 4 and young.count(0.5, planned=False) == 2
    young.gone(0)  # a peer finished its handshake: its slot is free again, for a peer
    assert not young.admit(111, now=0.6) and young.admit(5, now=0.6, planned=True)
    assert young.admit(112, now=3.1)  # the flood's slots are past the window


def test_tokens_are_fresh_and_bound_to_the_key_and_the_gate():
    key = bytes(range(32))
    (u1, p1), (u2, p2) = credentials(key, "gate-a"), credentials(key, "gate-a")
    assert u1 != u2 and p1 != p2  # a fresh nonce each time
    assert u1.startswith(b"gate-a:") and p1 == _token(key, u1)
    assert _token(bytes(32), u1) != p1  # another key, another token
