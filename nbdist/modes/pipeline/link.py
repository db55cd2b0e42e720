"""The sockets of one pipeline stage: activations and gradients to and from its neighbours,
reports to the kernel, and the kernel's stop and abort.

Every message is signed with the run's key by `nbdist.hub.protocol.Codec` (the hub's framing):
a JSON header with the arrays' shapes and dtypes, then the raw arrays. Nothing is unpickled.
A stage binds one PULL socket (on its engine's address towards its neighbours; loopback when
they share its host) and receives both directions there; messages that arrive before the
schedule needs them wait in a buffer keyed by (kind, step, micro-batch). Same-host stages
use TCP on loopback too (no shared memory yet).
"""

from __future__ import annotations

import time

import numpy as np

from nbdist.errors import ProtocolError, TrainingError
from nbdist.hub.protocol import Codec, send_frames

POLL_MS = 200


class StageAborted(Exception):
    """The kernel ended the run (a failure elsewhere, or Ctrl-C): leave at once."""


class StageLink:
    """One stage's endpoint; `bind_host` is where its neighbours reach it."""

    def __init__(self, key: bytes, run_id: str, stage: int, bind_host: str, timeout: float):
        import zmq

        self.stage, self.timeout = stage, timeout
        self.codec = Codec(key, f"stage-{stage}", run_id)
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        port = self.pull.bind_to_random_port(f"tcp://{bind_host}")
        self.endpoint = f"tcp://{bind_host}:{port}"
        self.peers: dict[str, object] = {}
        self.sub = None
        self.buffer: dict[tuple, tuple[dict, list]] = {}
        self.stop_requested = False
        self.sent_bytes = 0

    def connect(self, neighbours: dict[str, str], report: str, control: str) -> None:
        """PUSH sockets to the neighbours (`{"stage-1": endpoint, ...}`) and the kernel's report
        socket; a SUB socket on the kernel's control socket."""
        import zmq

        for name, endpoint in {**neighbours, "kernel": report}.items():
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(endpoint)
            self.peers[name] = sock
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(control)

    def send(self, to: str, header: dict, arrays=()) -> None:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        header = {**header, "shapes": [list(a.shape) for a in arrays], "dtypes": [a.dtype.str for a in arrays]}
        self.sent_bytes += send_frames(self.peers[to], self.codec.encode(header, arrays, to=to))

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
        arrays = [np.frombuffer(b, dtype=np.dtype(d)).reshape(s)
                  for b, d, s in zip(msg.buffers, h["dtypes"], h["shapes"], strict=True)]
        key = (h["op"], h.get("step", 0), h.get("mb", 0))
        self.buffer[key] = (h, arrays)

    def close(self) -> None:
        for sock in [self.pull, self.sub, *self.peers.values()]:
            if sock is not None:
                sock.close(linger=500)
        self.ctx.term()


class KernelLink:
    """The kernel's side: a PULL socket for the stages' reports and a PUB socket for stop and
    abort, both bound on `bind_host`."""

    def __init__(self, key: bytes, run_id: str, bind_host: str, stages: int):
        import zmq

        self.codec = Codec(key, "kernel", run_id)
        self.stages = stages
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pub = self.ctx.socket(zmq.PUB)
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
        self.ctx.term()
