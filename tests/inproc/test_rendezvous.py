"""The sync rendezvous as the ranks and an attacker meet it: Horovod's own server in this
process behind nbdist's signed handler, a rank's relay, and raw HTTP from someone without the
run's key (nbdist.modes.sync.rendezvous)."""

import http.client
import importlib.util
import os
import subprocess
import threading

import pytest

from nbdist.hub.protocol import new_key
from nbdist.modes.sync.rendezvous import AUTH_HEADER, RendezvousRelay, signed_rendezvous

pytestmark = pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                                reason="horovod is not installed; build it with `make horovod`")


@pytest.fixture
def rendezvous():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    key = new_key()
    server = signed_rendezvous(("127.0.0.1", 0), key, "run1")
    server.init(get_host_assignments(parse_hosts("hostA:2"), 2))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1])}
    relays = [RendezvousRelay(key, "run1", str(rank), env) for rank in (0, 1)]
    try:
        yield server, relays
    finally:
        for relay in relays:
            relay.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


def request(port: int, method: str, path: str, body: bytes = b"",
            headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body or None,
                     headers={"Content-Length": str(len(body)), **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def port(relay) -> int:
    return int(relay.horovod_env()["HOROVOD_GLOO_RENDEZVOUS_PORT"])


def test_ranks_store_and_read_through_their_relays_and_strangers_change_nothing(rendezvous):
    server, (rank0, rank1) = rendezvous
    kernel = server.server_address[1]
    assert request(port(rank0), "PUT", "/global/rank0", b"198.18.0.11:4000") == (200, b"")
    assert request(port(rank1), "GET", "/global/rank0") == (200, b"198.18.0.11:4000")
    assert request(port(rank1), "GET", "/global/rank1")[0] == 404
    # without the key, straight to the kernel's server: refused, counted, nothing changes
    assert request(kernel, "PUT", "/global/rank0", b"6.6.6.6:4000")[0] == 403
    assert request(kernel, "GET", "/global/rank0")[0] == 403
    assert request(kernel, "PUT", "/global/rank0", b"6.6.6.6:4000",
                   {AUTH_HEADER: "0:99:" + "ab" * 32 + ":" + "cd" * 32})[0] == 403
    assert request(kernel, "DELETE", "/global/0")[0] == 403
    assert request(port(rank1), "GET", "/global/rank0") == (200, b"198.18.0.11:4000")
    assert server.rejected == {"unsigned": 3, "bad signature": 1}
    assert server.finished_list == {}  # the stranger's DELETE did not count as rank 0 finishing


def test_a_captured_delete_replayed_does_not_finish_a_scope_early(rendezvous):
    """Horovod clears a scope once each of its ranks has sent DELETE: a replayed DELETE would
    clear it while the others still read it."""
    server, (rank0, rank1) = rendezvous
    captured = []
    original = http.client.HTTPConnection.request

    def spy(self, method, url, body=None, headers=None, **kw):
        if method == "DELETE":
            captured.append((method, url, dict(headers or {})))
        return original(self, method, url, body=body, headers=headers, **kw)

    http.client.HTTPConnection.request = spy
    try:
        assert request(port(rank0), "PUT", "/global/rank0", b"a")[0] == 200
        assert request(port(rank0), "DELETE", "/global/0")[0] == 200
    finally:
        http.client.HTTPConnection.request = original
    (method, url, headers), = [c for c in captured if AUTH_HEADER in c[2]]
    assert request(server.server_address[1], method, url, b"", headers)[0] == 403  # the replay
    assert server.rejected == {"replayed": 1}
    assert request(port(rank1), "GET", "/global/rank0") == (200, b"a")  # the scope is still there


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user (setuid)")
def test_another_user_on_the_ranks_host_cannot_use_its_relay(rendezvous):
    server, (rank0, _) = rendezvous
    code = ("import http.client, sys\n"
            f"c = http.client.HTTPConnection('127.0.0.1', {port(rank0)}, timeout=10)\n"
            "try:\n"
            "    c.request('PUT', '/global/rank0', body=b'6.6.6.6:1', "
            "headers={'Content-Length': '9'})\n"
            "    print(c.getresponse().status)\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__)\n")
    # a Python the other user may run (this one may live in a folder only we can enter)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                   if os.access(p, os.X_OK)), None)
    if python is None:
        pytest.skip("no system python3 for another user to run")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                         user=65534, group=65534, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("RemoteDisconnected", "ConnectionResetError",
                                  "BrokenPipeError"), out.stdout
    assert request(port(rank0), "GET", "/global/rank0")[0] == 404  # nothing was stored
    assert request(port(rank0), "PUT", "/global/rank0", b"mine")[0] == 200  # its own user still can


# -- bounds: what strangers can make the kernel's server hold (issue 36) ---------------------------


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.slow
def test_slow_loris_connections_hold_neither_threads_nor_memory_and_a_rank_is_still_served(
        rendezvous):
    """200 connections that send a byte a second and never finish their request (and come back
    when dropped): the server's threads and memory stay bounded, each is dropped at its
    deadline, and a rank's request through its relay is answered at once meanwhile."""
    import socket
    import time

    from nbdist.modes.sync.rendezvous import REQUEST_S

    server, (rank0, rank1) = rendezvous
    address = server.server_address[:2]
    head = b"PUT /global/rank0 HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n" + b"X-Pad: a" * 999

    def connect():  # without waiting for the handshake: all 200 at once
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(address)
        return [s, 0, time.monotonic()]

    threads, rss = threading.active_count(), rss_bytes()
    peers = [connect() for _ in range(200)]
    most_threads, most_rss, served_in, held, started = threads, rss, None, [], time.monotonic()
    try:
        while time.monotonic() - started < 11:
            for peer in peers:  # one byte each, every second
                try:
                    peer[0].send(head[peer[1]:peer[1] + 1])
                    peer[1] += 1
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # dropped by the server: come back, as an attacker would
                    held.append(time.monotonic() - peer[2])  # seen a send or two after the cut
                    peer[0].close()
                    peer[:] = connect()
            most_threads = max(most_threads, threading.active_count())
            most_rss = max(most_rss, rss_bytes())
            if served_in is None and time.monotonic() - started > 2:
                t0 = time.monotonic()
                assert request(port(rank0), "PUT", "/global/rank0", b"198.18.0.11:1") == (200, b"")
                assert request(port(rank1), "GET", "/global/rank0") == (200, b"198.18.0.11:1")
                served_in = time.monotonic() - t0
            time.sleep(max(0.0, 1 - (time.monotonic() - started) % 1))
        # none still open past its deadline: the client sees a cut at its next send or two, a
        # second or more late on a loaded machine, so 4 s of slack (the loop runs 11 s)
        oldest = max(time.monotonic() - peer[2] for peer in peers)
    finally:
        for peer in peers:
            peer[0].close()
    print(f"threads {threads} -> at most {most_threads}, RSS +{(most_rss - rss) / 2**20:.1f} MB, "
          f"a rank served in {served_in:.3f} s, {len(held)} cut, held {min(held, default=0):.1f}-"
          f"{max(held, default=0):.1f} s")
    assert most_threads - threads <= 4, (threads, most_threads)  # one loop, no thread each
    assert most_rss - rss < 32 << 20, (rss, most_rss)
    assert served_in < 3, served_in
    assert len(held) >= 200 and max(held) < REQUEST_S + 4, held  # each cut at its deadline
    assert oldest < REQUEST_S + 4, oldest
    assert server.rejected["too slow"] + server.rejected["crowded"] >= 200
    assert request(port(rank1), "GET", "/global/rank0") == (200, b"198.18.0.11:1")


def test_a_request_with_a_wrong_mac_is_refused_before_its_body_is_read(rendezvous):
    """The header's MAC is checked first: a stranger who declares a large body is refused at
    once, before the server reads (or waits for) a byte of it."""
    import socket
    import time

    from nbdist.modes.sync.rendezvous import MAX_BODY, REQUEST_S

    server, (rank0, _) = rendezvous
    forged = "0:1:" + "ab" * 32 + ":" + "cd" * 32
    head = (f"PUT /global/rank0 HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY}\r\n"
            f"{AUTH_HEADER}: {forged}\r\n\r\n").encode()
    with socket.create_connection(server.server_address[:2], timeout=REQUEST_S + 5) as s:
        started = time.monotonic()
        s.sendall(head)  # and not a byte of the body
        reply = s.recv(4096)
        took = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.0 403") or reply.startswith(b"HTTP/1.1 403"), reply
    assert took < 1, took
    assert server.rejected == {"bad signature": 1}
    # a rank's own request with a body is still served
    assert request(port(rank0), "PUT", "/global/rank0", b"x" * 5000) == (200, b"")
