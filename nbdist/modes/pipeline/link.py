"""The sockets of one pipeline stage: activations and gradients to and from its neighbours,
reports to the kernel, and the kernel's stop and abort.

Every message is signed with the run's key by `nbdist.hub.protocol.Codec` (the hub's framing):
a JSON header with the arrays' shapes and dtypes, then the arrays. Nothing is unpickled.
A stage binds one PULL socket (on its engine's address towards its neighbours; loopback when
they share its host) and receives both directions there; messages that arrive before the
schedule needs them wait in a buffer keyed by (kind, step, micro-batch).

Transport, per neighbour (`--transport`, default auto):
- **Same host** (the neighbour's `nbdist.hub.shm.host_id()` travels with its endpoint), like the
  hub's shared-memory path: the sender owns one segment per neighbour (`nbdist.hub.shm.create`:
  an unguessable name, mode 0600) of `slots` equal slots. It copies a message's arrays into a
  free slot and sends only the signed header, which names the segment, its generation, the slot
  and each array's offset; the receiver verifies the MAC over that header, checks the segment
  and generation and the bounds, copies the arrays out and acknowledges the slot with a small
  signed `ack`, which frees it. A slot is only reused after its ack, so it is never overwritten
  before the receiver has copied it out, whatever the schedule (GPipe, 1F1B, validation
  batches) keeps in flight; the slot count only decides how often a message must go by TCP
  instead: when every slot is still unacknowledged (acks that have arrived are read before
  giving up), or when a message is larger than a slot while others are in flight. With no
  slot in flight, a larger message replaces the segment with a bigger one (the next
  generation; the old one is unlinked, and the receiver drops it on seeing the new name), so
  the slots grow to the largest message at the cut (validation batches are the largest).
- **Other hosts**, `--transport tcp`, and the fallback above: the arrays travel as raw frames
  after the header over TCP, all of it under the MAC.
With `--encrypt` (`encrypt`), every TCP socket here is CurveZMQ (`nbdist.hub.wire.curve_server`,
`curve_client`): a stage's PULL and the kernel's PULL and PUB admit only the run's clients.
`messages` counts the messages with arrays sent to neighbours, by transport. The creator unlinks its
segments in `close` (end of run, failure, abort); a stage engine that is killed leaves them to
Python's resource tracker, which unlinks what the dead process created (as for the hub's).
"""

from __future__ import annotations

import math
import time

import numpy as np

from nbdist.errors import ConfigError, ProtocolError, TrainingError
from nbdist.hub import shm
from nbdist.hub.protocol import Codec, send_frames
from nbdist.hub.wire import curve_client, curve_server

POLL_MS = 200
ALIGN = 64  # bytes: each array in a slot starts on a cache line
PAGE = 4096


class StageAborted(Exception):
    """The kernel ended the run (a failure elsewhere, or Ctrl-C): leave at once."""


class _Outbox:
    """The sender's segment towards one neighbour: `slots` slots of `slot_bytes`, which are free."""

    def __init__(self, slots: int, slot_bytes: int, generation: int):
        self.segment = shm.create(slots * slot_bytes)
        self.slot_bytes, self.generation = slot_bytes, generation
        self.free = list(range(slots))[::-1]
        self.slots = slots

    def busy(self) -> int:
        return self.slots - len(self.free)


def _layout(arrays: list) -> tuple[list[int], int]:
    """Each array's byte offset in a slot (cache-line aligned) and the bytes the slot needs."""
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += -(-a.nbytes // ALIGN) * ALIGN
    return offsets, end


class StageLink:
    """One stage's endpoint; `bind_host` is where its neighbours reach it. `transport`: auto
    (shared memory with same-host neighbours), tcp, or shm (refuses a neighbour elsewhere);
    `slots`: shared-memory slots per neighbour; `encrypt`: CurveZMQ on every socket."""

    def __init__(self, key: bytes, run_id: str, stage: int, bind_host: str, timeout: float,
                 transport: str = "auto", slots: int = 8, encrypt: bool = False):
        import zmq

        self.stage, self.timeout = stage, timeout
        self.name = f"stage-{stage}"
        self.transport, self.slots = str(transport), max(1, slots)
        self.codec = Codec(key, self.name, run_id)
        self.key, self.encrypt = key, encrypt
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self._auth = curve_server(self.ctx, [self.pull], key) if encrypt else None
        port = self.pull.bind_to_random_port(f"tcp://{bind_host}")
        self.endpoint = f"tcp://{bind_host}:{port}"
        self.host = shm.host_id()
        self.peers: dict[str, object] = {}
        self.sub = None
        self.buffer: dict[tuple, tuple[dict, list]] = {}
        self.stop_requested = False
        self.sent_bytes = 0
        self.messages = {"shm": 0, "tcp": 0}  # messages with arrays sent to neighbours, by transport
        self.shm_peers: set[str] = set()
        self.outboxes: dict[str, _Outbox] = {}  # neighbour -> this stage's segment towards it
        self.inboxes: dict[str, tuple[str, int, object]] = {}  # neighbour -> (name, generation, segment)
        self._generation = 0

    @property
    def info(self) -> dict:
        """What the neighbours need: where to connect, and the host (to choose shared memory)."""
        return {"endpoint": self.endpoint, "host": self.host}

    def connect(self, neighbours: dict, report: str, control: str) -> None:
        """PUSH sockets to the neighbours (`{"stage-1": info, ...}`, each `info` as `self.info`
        gives it, or a bare endpoint: TCP) and the kernel's report socket; a SUB socket on the
        kernel's control socket."""
        import zmq

        endpoints = {}
        for name, info in neighbours.items():
            endpoint, host = (info, None) if isinstance(info, str) else (info["endpoint"], info.get("host"))
            endpoints[name] = endpoint
            if self.transport != "tcp" and host == self.host:
                self.shm_peers.add(name)
            elif self.transport == "shm":
                raise ConfigError(f"--transport shm needs every pipeline stage on one host, but {name} "
                                  f"is on {str(host).split(':')[0]} and {self.name} on "
                                  f"{self.host.split(':')[0]}. Use --transport auto.")
        for name, endpoint in {**endpoints, "kernel": report}.items():
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.setsockopt(zmq.SNDHWM, 0)
            if self.encrypt:
                curve_client(sock, self.key)
            sock.connect(endpoint)
            self.peers[name] = sock
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        if self.encrypt:
            curve_client(self.sub, self.key)
        self.sub.connect(control)

    def send(self, to: str, header: dict, arrays=()) -> None:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        header = {**header, "src": self.name, "shapes": [list(a.shape) for a in arrays],
                  "dtypes": [a.dtype.str for a in arrays]}
        if arrays and to in self.shm_peers and self._send_shm(to, header, arrays):
            self.messages["shm"] += 1
            return
        if arrays and to != "kernel":
            self.messages["tcp"] += 1
        self.sent_bytes += send_frames(self.peers[to], self.codec.encode(header, arrays, to=to))

    def _send_shm(self, to: str, header: dict, arrays: list) -> bool:
        """Copy `arrays` into a free slot of the segment towards `to` and send the header alone;
        False (send by TCP) when no slot is free or big enough."""
        offsets, need = _layout(arrays)
        box = self._slot_box(to, need)
        if box is None:
            return False
        slot = box.free.pop()
        base = slot * box.slot_bytes
        for a, off in zip(arrays, offsets, strict=True):
            np.ndarray(a.shape, a.dtype, buffer=box.segment.buf, offset=base + off)[...] = a
        header["shm"] = {"seg": box.segment.name, "gen": box.generation, "slot": slot,
                         "offsets": [base + off for off in offsets]}
        self.sent_bytes += send_frames(self.peers[to], self.codec.encode(header, to=to))
        return True

    def _slot_box(self, to: str, need: int) -> _Outbox | None:
        box = self.outboxes.get(to)
        if box is not None and not box.free:
            self._drain()  # acks that have arrived free their slots
        if box is not None and need <= box.slot_bytes:
            return box if box.free else None
        if box is not None and box.busy():
            self._drain()
            if box.busy():
                return None  # a bigger segment only once nothing is in flight in this one
        self._generation += 1
        size = max(need, box.slot_bytes if box else 0)
        replacement = _Outbox(self.slots, -(-size // PAGE) * PAGE, self._generation)
        if box is not None:
            shm.release(box.segment, unlink=True)
        self.outboxes[to] = replacement
        return replacement

    def report(self, header: dict) -> None:
        self.send("kernel", header)

    def wait(self, *keys: tuple) -> tuple[tuple, dict, list]:
        """The first of `keys` to arrive (kind, step, micro-batch): (key, header, arrays). Fails
        with the neighbour named when nothing comes for `timeout` seconds."""
        import zmq

        deadline = time.monotonic() + self.timeout
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.sub, zmq.POLLIN)
        while True:
            for key in keys:
                if key in self.buffer:
                    return (key, *self.buffer.pop(key))
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"Stage {self.stage} waited {self.timeout:.0f}s for {keys[0][0]} of step "
                    f"{keys[0][1]} from its neighbour and got nothing (Received: no message). The "
                    "neighbouring stage's engine may have died or stalled; see run.error and "
                    "%nbdist status, then run the cell again (raise --timeout for very slow stages).")
            ready = dict(poller.poll(POLL_MS))
            if self.sub in ready:
                self.check_control()
            if self.pull in ready:
                self._receive()

    def _drain(self) -> None:
        """Read every message already here without waiting (acks free slots; the rest wait in
        the buffer)."""
        while self.pull.poll(0):
            self._receive()

    def check_control(self) -> None:
        """Read what the kernel sent without waiting: stop (finish the step) or abort (raise)."""
        import zmq

        while self.sub.poll(0):
            try:
                msg = self.codec.decode(self.sub.recv_multipart(copy=False, flags=zmq.NOBLOCK))
            except ProtocolError:
                continue  # addressed to another stage, or not ours
            if msg.op == "abort":
                raise StageAborted(msg.header.get("reason", "aborted"))
            if msg.op == "stop":
                self.stop_requested = True

    def _receive(self) -> None:
        msg = self.codec.decode(self.pull.recv_multipart(copy=False))
        h = msg.header
        if h["op"] == "ack":
            box = self.outboxes.get(h.get("src"))
            if box is not None and h.get("seg") == box.segment.name and h.get("gen") == box.generation \
                    and 0 <= h.get("slot", -1) < box.slots and h["slot"] not in box.free:
                box.free.append(h["slot"])
            return
        if "shm" in h:
            arrays = self._copy_out(h)
        else:
            arrays = [np.frombuffer(b, dtype=np.dtype(d)).reshape(s)
                      for b, d, s in zip(msg.buffers, h["dtypes"], h["shapes"], strict=True)]
        key = (h["op"], h.get("step", 0), h.get("mb", 0))
        self.buffer[key] = (h, arrays)

    def _copy_out(self, h: dict) -> list:
        """The arrays of a verified shared-memory header, copied out of the sender's slot, which
        is then acknowledged (freed)."""
        src, where = h.get("src"), h["shm"]
        if src not in self.peers or src == "kernel":
            raise ProtocolError(f"unknown sender: shared memory from {src!r}, not a neighbour of {self.name}")
        name, gen = where["seg"], where["gen"]
        if not (isinstance(name, str) and name.startswith("nbdist-") and isinstance(gen, int)):
            raise ProtocolError(f"malformed header: segment {name!r}, generation {gen!r}")
        known = self.inboxes.get(src)
        if known is None or known[0] != name:
            if known is not None and gen <= known[1]:
                raise ProtocolError(f"stale segment: {name!r} generation {gen} from {src}, "
                                    f"already at generation {known[1]}")
            if known is not None:
                shm.release(known[2])
            known = self.inboxes[src] = (name, gen, shm.attach(name))
        elif gen != known[1]:
            raise ProtocolError(f"stale segment: {name!r} generation {gen}, registered as {known[1]}")
        segment = known[2]
        arrays = []
        for d, s, off in zip(h["dtypes"], h["shapes"], where["offsets"], strict=True):
            dtype = np.dtype(d)
            nbytes = dtype.itemsize * math.prod(s)
            if dtype.hasobject or off < 0 or off + nbytes > segment.size:
                raise ProtocolError(f"malformed header: {d} {s} at byte {off} of a {segment.size}-byte segment")
            arrays.append(np.ndarray(s, dtype, buffer=segment.buf, offset=off).copy())
        ack = {"op": "ack", "src": self.name, "seg": name, "gen": gen, "slot": where["slot"]}
        send_frames(self.peers[src], self.codec.encode(ack, to=src))
        return arrays

    def close(self) -> None:
        for sock in [self.pull, self.sub, *self.peers.values()]:
            if sock is not None:
                sock.close(linger=500)
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()
        for _, _, segment in self.inboxes.values():
            shm.release(segment)
        for box in self.outboxes.values():
            shm.release(box.segment, unlink=True)
        self.inboxes, self.outboxes = {}, {}


class KernelLink:
    """The kernel's side: a PULL socket for the stages' reports and a PUB socket for stop and
    abort, both bound on `bind_host` (CurveZMQ servers with `encrypt`)."""

    def __init__(self, key: bytes, run_id: str, bind_host: str, stages: int, encrypt: bool = False):
        import zmq

        self.codec = Codec(key, "kernel", run_id)
        self.stages = stages
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pub = self.ctx.socket(zmq.PUB)
        self._auth = curve_server(self.ctx, [self.pull, self.pub], key) if encrypt else None
        self.report_endpoint = f"tcp://{bind_host}:{self.pull.bind_to_random_port(f'tcp://{bind_host}')}"
        self.control_endpoint = f"tcp://{bind_host}:{self.pub.bind_to_random_port(f'tcp://{bind_host}')}"

    def receive(self, timeout_ms: int) -> dict | None:
        """The next verified report's header, or None (nothing within `timeout_ms`, or a
        message that is not valid: counted by nobody, dropped)."""
        if not self.pull.poll(timeout_ms):
            return None
        try:
            return self.codec.decode(self.pull.recv_multipart(copy=False)).header
        except ProtocolError:
            return None

    def broadcast(self, op: str, **fields: object) -> None:
        for s in range(self.stages):
            send_frames(self.pub, self.codec.encode({"op": op, **fields}, to=f"stage-{s}"))

    def close(self) -> None:
        self.pull.close(linger=0)
        self.pub.close(linger=500)
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()
