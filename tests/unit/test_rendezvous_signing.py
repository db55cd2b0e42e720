"""The signatures on the sync rendezvous (nbdist.modes.sync.rendezvous): what a request and a
reply cover, replays, and who may use a rank's relay (pure functions, no sockets)."""

import pytest

from nbdist.errors import ProtocolError
from nbdist.modes.sync.rendezvous import (
    check_reply,
    check_request,
    rendezvous_key,
    sign_reply,
    sign_request,
    socket_owner,
)

KEY = rendezvous_key(bytes(range(32)))


def test_a_signed_request_passes_once_and_its_replay_is_refused():
    last = {}
    auth = sign_request(KEY, "run1", "0", 1, "PUT", "/global/0", b"addr")
    assert check_request(KEY, "run1", auth, "PUT", "/global/0", b"addr", last) == ("0", 1)
    with pytest.raises(ProtocolError, match="^replayed"):
        check_request(KEY, "run1", auth, "PUT", "/global/0", b"addr", last)
    later = sign_request(KEY, "run1", "0", 2, "DELETE", "/global/0")
    assert check_request(KEY, "run1", later, "DELETE", "/global/0", b"", last) == ("0", 2)
    other = sign_request(KEY, "run1", "1", 1, "GET", "/global/0")  # counters are per sender
    assert check_request(KEY, "run1", other, "GET", "/global/0", b"", last) == ("1", 1)
    assert last == {"0": 2, "1": 1}


@pytest.mark.parametrize("change", ["run", "method", "path", "body", "counter", "sender", "key"])
def test_the_signature_covers_run_method_path_body_counter_and_sender(change):
    fields = {"run": "run1", "method": "PUT", "path": "/global/0", "body": b"198.18.0.11:4000",
              "counter": 5, "sender": "0", "key": KEY}
    auth = sign_request(fields["key"], fields["run"], fields["sender"], fields["counter"],
                        fields["method"], fields["path"], fields["body"])
    forged = {"run": "run2", "method": "GET", "path": "/global/1", "body": b"6.6.6.6:4000",
              "counter": 6, "sender": "1", "key": rendezvous_key(bytes(32))}
    fields[change] = forged[change]
    if change in ("counter", "sender"):  # the attacker rewrites the header's own fields
        sender, counter, *signature = auth.split(":")
        auth = ":".join([fields["sender"], str(fields["counter"]), *signature])
    with pytest.raises(ProtocolError, match="^bad signature"):
        check_request(fields["key"], fields["run"], auth, fields["method"], fields["path"],
                      fields["body"], {})


@pytest.mark.parametrize("value", ["", "nothing", "0:1:zz", "0:x:" + "0" * 64, "0:1:" + "0" * 63,
                                   "0:1:" + "0" * 64, "0:1:" + "0" * 64 + ":" + "0" * 63])
def test_unsigned_or_malformed_headers_are_refused(value):
    with pytest.raises(ProtocolError, match="^unsigned"):
        check_request(KEY, "run1", value, "GET", "/global/0", b"", {})


def test_a_reply_is_bound_to_its_request_status_and_body():
    good = sign_reply(KEY, "run1", "0", 7, 200, b"value")
    check_reply(KEY, "run1", "0", 7, 200, b"value", good)
    for args in [("0", 8, 200, b"value"), ("0", 7, 404, b"value"), ("0", 7, 200, b"other"),
                 ("1", 7, 200, b"value")]:
        with pytest.raises(ProtocolError, match="^unsigned"):
            check_reply(KEY, "run1", *args, good)
    with pytest.raises(ProtocolError, match="^unsigned"):
        check_reply(KEY, "run1", "0", 7, 200, b"value", None)


TCP = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
       " inode\n"
       """\
   0: 0100007F:9A01 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 49904 1
   1: 0100007F:C26A 0100007F:CFC3 01 00000000:00000000 00:00000000 00000000  1001        0 51638 2
   2: 0100007F:CFC3 0100007F:C26A 01 00000000:00000000 00:00000000 00000000     0        0 51639 1
   3: 0B1212C6:D000 0112C6C6:0050 01 00000000:00000000 00:00000000 00000000    33        0 51640 1
""")


def test_the_owner_of_a_relay_client_is_read_from_proc_net_tcp():
    relay = ("127.0.0.1", 0xCFC3)
    # the client's end, not the relay's
    assert socket_owner(TCP, ("127.0.0.1", 0xC26A), relay) == 1001
    assert socket_owner(TCP, relay, ("127.0.0.1", 0xC26A)) == 0
    assert socket_owner(TCP, ("198.18.18.11", 0xD000), ("198.198.18.1", 0x50)) == 33
    assert socket_owner(TCP, ("127.0.0.1", 1), relay) is None


def test_a_reply_header_with_any_characters_is_refused_not_raised():
    with pytest.raises(ProtocolError, match="^unsigned"):
        check_reply(KEY, "run1", "0", 7, 200, b"", "é" * 64)
