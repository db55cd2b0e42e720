"""The kernel's side of a pipeline run's sockets: the stages' reports come in, stop and abort
go out. Kept apart from `link` (a stage's side), which the kernel never opens: the two ends
share only the signed framing (`nbdist.hub.protocol.Codec`), the gate and the typed messages.

Received as strictly as a stage receives (`link`): behind the gate, within `limits` (a
signed header, or with a cell's fit call the largest stage's weights: `checks.weights_limits`),
then the MAC, the envelope and the report's fields (and a `Weights` report's frame table);
whatever fails is dropped and counted.
"""

from __future__ import annotations

import threading
from collections import Counter

import zmq

from nbdist.errors import ProtocolError
from nbdist.hub.gate import curve_keys
from nbdist.hub.protocol import Codec, send_frames
from nbdist.hub.wire import recv_bounded, server_socket
from nbdist.modes.pipeline.checks import REPORT_LIMITS, arrays_of
from nbdist.modes.pipeline.messages import REPORTS, Totals, Weights, decode
from nbdist.wire.schema import Wire


class KernelLink:
    """The kernel's side: a PULL socket for the stages' reports and a PUB socket for stop and
    abort, both bound on `bind_host` behind one gate; `report_endpoint` and `control_endpoint`
    are what the stages connect to."""

    def __init__(self, key: bytes, run_id: str, bind_host: str, stages: int, encrypt: bool = False,
                 limits: tuple[int, int] = REPORT_LIMITS):
        self.limits = limits
        self.codec = Codec(key, "kernel", run_id, max_buffer_bytes=limits[1])
        self._sending = threading.Lock()  # one PUB socket, several threads
        self.stages = stages
        self.dropped: Counter[str] = Counter()  # reports refused, by reason
        self.ctx = zmq.Context()
        self.pull, self.gate = server_socket(self.ctx, key, limits[1], encrypt,
                                             kind=zmq.PULL, peers=2 * stages)
        # reads subscriptions only
        self.pub, _ = server_socket(self.ctx, key, 1024, encrypt, kind=zmq.PUB, gate=self.gate)
        curve = {"curve": curve_keys(key)["server_public"].decode()} if encrypt else {}
        try:
            self.report_endpoint, self.control_endpoint = (
                {"endpoint": f"tcp://{bind_host}:{sock.bind_to_random_port(f'tcp://{bind_host}')}",
                 "gate": self.gate.id, **curve} for sock in (self.pull, self.pub))
        except BaseException:  # e.g. an address it cannot bind: give back the sockets and the gate
            self.close()
            raise

    def drops(self) -> dict[str, int]:
        """Reports refused, and connections refused or cut at the gate, by reason."""
        return {**self.dropped, **self.gate.counts()}

    def receive(self, timeout_ms: int) -> tuple[Wire, list] | None:
        """The next verified report (`messages.REPORTS`) and its arrays (a `Weights` report's;
        [] for the others), or None (nothing within `timeout_ms`, or a message that fails the
        limits, the MAC or its fields, or names no stage of the run: dropped and counted in
        `dropped`)."""
        if not self.pull.poll(timeout_ms):
            return None
        try:
            message = self.codec.decode(recv_bounded(self.pull, *self.limits))
            report = decode(REPORTS, message.header)
            if isinstance(report, (Totals, Weights)) and not 0 <= report.stage < self.stages:
                raise ProtocolError("malformed header",
                                    f"stage {report.stage}, expected 0 to {self.stages - 1}")
            arrays = []
            if isinstance(report, Weights):
                arrays = arrays_of(report.shapes, report.dtypes, message.buffers)
                weights = sum(report.counts)
                if (weights + len(report.slot_names) != len(arrays)
                        or len(report.counts) != len(report.steps)):
                    raise ProtocolError("malformed header", f"{len(arrays)} arrays for counts "
                                        f"{report.counts[:8]} of steps {report.steps[:8]} and "
                                        f"{len(report.slot_names)} optimizer slots")
                if (len(report.slot_of) != len(report.slot_names)
                        or not all(0 <= i < weights for i in report.slot_of)):
                    raise ProtocolError("malformed header", f"slots of variables "
                                        f"{report.slot_of[:8]}, expected one each, below {weights}")
            elif message.buffers:
                raise ProtocolError("malformed header", f"{len(message.buffers)} frames on a "
                                    f"{report.OP} report, which has none")
        except ProtocolError as exc:
            self.dropped[exc.reason] += 1
            return None
        return report, arrays

    def broadcast(self, control: Wire) -> None:
        """`control` (`messages.CONTROLS`) to every stage (from any thread: the monitor's polls,
    the notebook's stop, a fit call's epoch gate)."""
        with self._sending:
            for s in range(self.stages):
                send_frames(self.pub, self.codec.encode(control.encode(), to=f"stage-{s}"))

    def close(self) -> None:
        self.pull.close(linger=0)
        self.pub.close(linger=500)
        self.gate.stop()
        self.ctx.term()
