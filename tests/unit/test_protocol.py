import json

import numpy as np
import pytest

from nbdist.errors import ProtocolError
from nbdist.hub.protocol import Codec, mac, new_key, parse_header


def pair(run="r1"):
    key = new_key()
    return Codec(key, "worker-0", run), Codec(key, "hub-0", run)


def test_signed_message_round_trips_with_zero_copy_buffers():
    a, b = pair()
    grad = np.arange(5, dtype=np.float32)
    msg = b.decode(a.encode({"op": "step", "loss": 0.5}, [grad], to="hub-0"))
    assert msg.op == "step" and msg.header["loss"] == 0.5
    assert (msg.header["run"], msg.header["to"], msg.header["seq"]) == ("r1", "hub-0", 1)
    np.testing.assert_array_equal(msg.floats(0), grad)


def test_mac_covers_header_length_header_and_every_buffer_by_hand():
    import blake3

    key, header = bytes(range(32)), b'{"op":"x"}'
    buf = np.array([1.0, 2.0], np.float32)
    by_hand = blake3.blake3(len(header).to_bytes(8, "little") + header + buf.tobytes(),
                            key=key).digest()
    assert mac(key, header, [buf]) == by_hand
    assert mac(key, header, [buf]).hex() == by_hand.hex()
    moved = mac(key, header[:-1], [header[-1:] + buf.tobytes()])  # a boundary moved
    assert moved != by_hand


def test_message_signed_with_another_key_is_refused():
    a = Codec(new_key(), "intruder", "r1")
    _, b = pair()
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode(a.encode({"op": "step"}, to="hub-0"))


def test_tampered_header_is_refused():
    a, b = pair()
    (signed,) = a.encode({"op": "step", "lr": 0.1}, to="hub-0")
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode([signed.replace(b"0.1", b"9.9")])


def test_a_flipped_byte_in_a_float_buffer_is_refused():
    a, b = pair()
    signed, grad = a.encode({"op": "step"}, [np.ones(4, np.float32)], to="hub-0")
    forged = bytearray(grad.tobytes())
    forged[5] ^= 0x40
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode([signed, bytes(forged)])


def test_unsigned_and_truncated_messages_are_refused():
    a, b = pair()
    frames = a.encode({"op": "step"}, [np.ones(4, np.float32)], to="hub-0")
    with pytest.raises(ProtocolError, match="truncated"):
        b.decode([])
    with pytest.raises(ProtocolError, match="truncated"):
        b.decode([frames[0][:32], frames[1]])  # the signature alone
    with pytest.raises(ProtocolError, match="bad signature"):
        b.decode([bytes(32) + frames[0][32:], frames[1]])
    with pytest.raises(ProtocolError, match="bad signature"):  # the buffers are in the MAC
        b.decode([frames[0], np.ones(2, np.float32)])
    with pytest.raises(ProtocolError, match="bad signature"):  # and how many there are
        b.decode([frames[0]])


def test_replayed_message_is_refused():
    a, b = pair()
    frames = a.encode({"op": "step"}, to="hub-0")
    b.decode(frames)
    with pytest.raises(ProtocolError, match="replayed"):
        b.decode(frames)


def test_message_for_another_shard_or_run_is_refused():
    key = new_key()
    worker = Codec(key, "worker-0", "r1")
    shard1 = Codec(key, "hub-1", "r1")
    with pytest.raises(ProtocolError, match="wrong recipient"):
        shard1.decode(worker.encode({"op": "step"}, to="hub-0"))
    other_run = Codec(key, "hub-0", "r2")
    with pytest.raises(ProtocolError, match="wrong run"):
        other_run.decode(worker.encode({"op": "step"}, to="hub-0"))


def test_each_direction_numbers_its_own_messages():
    key = new_key()
    worker = Codec(key, "worker-0", "r")
    seqs = [json.loads(worker.encode({"op": "s"}, to=to)[0][32:])["seq"]
            for to in ("hub-0", "hub-1", "hub-0")]
    assert seqs == [1, 1, 2]
    assert (worker.last_sent("hub-0") == 2 and worker.last_sent("hub-1") == 1
            and worker.last_sent("hub-2") == 0)


def test_a_reply_names_its_request_and_its_recipient():
    a, b = pair()
    request = b.decode(a.encode({"op": "stats"}, to="hub-0"))
    reply = a.decode(b.encode({"op": "stats"}, to=request.header["from"], re=request.header["seq"]))
    assert reply.header["re"] == 1 and reply.header["to"] == a.sender


@pytest.mark.parametrize("field,value", [("seq", "1"), ("seq", True), ("seq", 0), ("run", 3),
                                         ("nbytes", ["4"]), ("op", None), ("re", "2")])
def test_malformed_signed_envelope_is_refused(field, value):
    header = {"op": "s", "run": "r", "from": "w/1", "to": "h", "seq": 1, "nbytes": [], field: value}
    with pytest.raises(ProtocolError, match=f"malformed header: wrong type or value of {field}"):
        parse_header(json.dumps(header).encode())


def test_malformed_json_and_missing_fields_are_refused():
    with pytest.raises(ProtocolError, match="malformed header: not JSON"):
        parse_header(b"{")
    with pytest.raises(ProtocolError, match="malformed header: a JSON list"):
        parse_header(b"[]")
    with pytest.raises(ProtocolError, match="malformed header: lacks seq, nbytes"):
        parse_header(b'{"op":"s","run":"r","from":"a","to":"b"}')


def test_oversized_buffers_are_refused():
    key = new_key()
    a, b = Codec(key, "w", "r"), Codec(key, "h", "r", max_buffer_bytes=16)
    with pytest.raises(ProtocolError, match="oversized message: 32 buffer bytes, at most 16"):
        b.decode(a.encode({"op": "step"}, [np.ones(8, np.float32)], to="h"))


def test_a_header_the_receiver_would_drop_is_refused_when_sent_and_numbers_nothing():
    a, b = pair()
    with pytest.raises(ProtocolError, match="oversized header: the 'state' message's header has"):
        a.encode({"op": "state", "remaining": [10] * 40_000}, to="hub-0")
    assert a.last_sent("hub-0") == 0  # the next message is still the one the hub expects
    assert b.decode(a.encode({"op": "ping"}, to="hub-0")).header["seq"] == 1


def test_key_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="must have 32 bytes"):
        Codec(b"short", "w")


def test_restarted_sender_is_a_new_sender():
    key = new_key()
    hub = Codec(key, "hub", "r")
    first = hub.decode(Codec(key, "worker-0", "r").encode({"op": "hello"}, to="hub"))
    # a new process
    again = hub.decode(Codec(key, "worker-0", "r").encode({"op": "hello"}, to="hub"))
    assert first.header["seq"] == again.header["seq"] == 1  # taken, not refused as a replay
    assert first.header["from"] != again.header["from"]  # each process names itself apart
