"""A worker's transport to all hub shards (`WorkerTransport`), in typed messages
(`nbdist.wire.messages`) over one signed line per shard (`nbdist.hub.lines`).

It moves one flat gradient buffer to every shard and one flat parameter buffer back per step.
On the same host it uses one shared segment `[gradient | parameters]` that every shard reads
and writes at its own offset, so only signed headers cross the line; across hosts the slices
travel as zero-copy frames over TCP. No TensorFlow here: benchmarks drive it with NumPy.
The kernel's line to the shards is `nbdist.hub.control.HubControl`.
"""

from __future__ import annotations

import contextlib

import numpy as np
import zmq

from nbdist.algorithms.streaming import fragment_span
from nbdist.cluster.netaddr import check_reachable, host_id
from nbdist.core.compression import Codec, PushEncoder, apply_pull, decode_into, encode, parse
from nbdist.engine.gpu import GpuMonitor
from nbdist.errors import TrainingError
from nbdist.hub import shm
from nbdist.hub.lines import choose_line, open_lines
from nbdist.hub.memory import reuse_large_buffers
from nbdist.wire.messages import Bye, Hello, Reply, Step


class WorkerTransport:
    """A worker's connection to all hub shards.

    `grad` is where the worker writes its flat gradient before a pushing `step`; after a
    pull, `params` holds the flat parameters and `non_trainable` the merged non-trainable state.
    Shard 0 hears, in each step, the bytes that crossed this worker's sockets so far
    (`traffic`), and every few seconds the GPU's load (`nbdist.engine.gpu`).
    """

    def __init__(self, key: bytes, worker: int, shards: list[dict], non_trainable_size: int,
                 transport: str = "auto", timeout: float = 120.0, engine: int | None = None,
                 compression: str = "none", spin_s: float = 0.0, seed: int = 0,
                 shapes: list | tuple = (), fragments: int = 0):
        self.worker, self.engine = worker, engine
        self.fragments = fragments  # streaming-diloco's P: a step may carry one fragment
        self.bounds = []
        start = 0
        for s in shards:
            self.bounds.append((start, start + s["size"]))
            start += s["size"]
        self.total = start
        here = host_id()
        self.use_shm = transport != "tcp" and all(s["host"] == here for s in shards)
        if transport == "shm" and not self.use_shm:
            raise TrainingError("transport 'shm' needs every hub shard on this worker's host; "
                                "use 'auto'.")
        # a full /dev/shm: TCP instead, and hello says why (run.warnings shows it)
        self._segment, self.shm_fallback = self._shared_segment(transport)
        # what the run asked for; shared memory has no bytes to save, so its frames go as is
        requested = parse(compression)
        self.compression = str(requested)
        self.codec = Codec("none") if self.use_shm else requested
        if not self.use_shm:  # across hosts: a host that does not answer fails here, named
            for i, s in enumerate(shards):
                address, port = s["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
                check_reachable(address, int(port), f"hub shard {i}", s["host"].split(":")[0])
            reuse_large_buffers(4 * max(hi - lo for lo, hi in self.bounds))  # see nbdist.hub.memory
        self._ctx = zmq.Context()
        # headers only on a local line; a worker beside its shards without shared memory sends
        # its arrays over ipc (its gate counts ipc as the run's own, nbdist.hub.gate)
        self.line_kind = ("ipc" if self.shm_fallback is not None
                          else choose_line(self.use_shm, shards, non_trainable_size))
        self.lines = open_lines(self._ctx, key, shards, f"worker-{worker}", timeout, self.line_kind,
                                spin_s)
        if self._segment is not None:
            self.grad = shm.floats(self._segment, 0, self.total)
            self.params = shm.floats(self._segment, self.total, self.total)
        else:
            self.grad = np.zeros(self.total, dtype=np.float32)
            self.params = np.zeros(self.total, dtype=np.float32)
        self._live = [None] * len(shards)  # hogwild: attached hub segments, read without lock
        self._live_names = [s["params_shm"] for s in shards]
        # each push's frame to each shard (with its error feedback; a random codec's own stream)
        # (powersgd: the matrices of each shard's slice, among the trainable variables' `shapes`)
        self._pushes = [PushEncoder(self.codec.bind(shapes, lo, hi), hi - lo,
                                    np.random.default_rng([seed, worker, i]))
                        for i, (lo, hi) in enumerate(self.bounds)]
        # a lossy codec's pulls are changes to the copy this worker holds (PullEncoder's twin)
        self._held = np.zeros(self.total, dtype=np.float32) if self.codec.lossy else None
        # over TCP: the bytes of the weight and gradient frames sent and received, and of the
        # float32 arrays they stand for (their ratio is the codec's, as run.traffic shows it)
        self.frames = [0, 0]
        self.arrays = [0, 0]
        self.non_trainable = np.zeros(non_trainable_size, dtype=np.float32)
        self.nt_delta = np.zeros(non_trainable_size, dtype=np.float32)
        self.link = "shm" if self.use_shm else "tcp"  # shm: only headers cross ZeroMQ
        self.gpu = GpuMonitor()

    def _shared_segment(self, transport: str):
        """This worker's segment `[gradient | parameters]` and None, or, where `/dev/shm` has no
        room for it, None and why (this worker then goes over TCP; with --transport shm, an
        error)."""
        if not self.use_shm:
            return None, None
        try:
            return shm.create(8 * self.total), None
        except OSError as exc:
            why = shm.unavailable(exc, 8 * self.total)
            if transport == "shm":
                raise TrainingError(f"--transport shm, but worker {self.worker}'s {why}. Or pass "
                                    "--transport auto to fall back to TCP.") from None
            self.use_shm = False
            return None, why

    def hello(self) -> Reply:
        """Register with every shard and pull the parameters; returns shard 0's reply."""
        self.send_hello()
        return self._collect(pull=True)

    def send_hello(self) -> None:
        """First half of `hello`: send it to every shard."""
        for i, line in enumerate(self.lines):
            hello = Hello(self.worker, engine=self.engine, host=host_id().split(":")[0],
                          compression=self.compression, link=self.link,
                          shm_fallback=self.shm_fallback, **self.gpu.info())
            if self._segment is not None:
                hello.shm, hello.offset, hello.total = (self._segment.name, self.bounds[i][0],
                                                        self.total)
            line.send(hello)

    def step(self, step: Step) -> Reply:
        """Push `grad` (and `nt_delta`) and/or pull, as `step` says; returns shard 0's reply.
        Shard 0 gets all of `step`, the others what they apply (`Step.for_other_shard`)."""
        self.send_step(step)
        return self.receive_step(step)

    def send_step(self, step: Step) -> None:
        """First half of `step`: send to every shard (used alone to overlap with compute)."""
        if not step.push and not step.pull:  # a bare wait: only the coordinator has anything to say
            self.lines[0].send(step)
            return
        if self._segment is not None:  # the segment's generation: a stale one is never read
            step.seg = self._segment.name
        other = step.for_other_shard() if len(self.lines) > 1 else None
        step.traffic = self.traffic()
        gpu = self.gpu.sample()  # every few seconds
        if gpu:
            step.gpu_util, step.gpu_mem = gpu["gpu_util"], gpu["gpu_mem"]
        for i, line in enumerate(self.lines):
            buffers = []
            if step.push and self._segment is None:
                lo, hi = self.span(i, step.fragment)
                frame = (self._pushes[i].encode(self.grad[lo:hi]) if step.fragment is None
                         else encode(self.grad[lo:hi], self.codec))  # a stateless codec
                buffers.append(frame)
                self.frames[0] += frame.nbytes
                self.arrays[0] += 4 * (hi - lo)
            if step.push and i == 0 and self.nt_delta.size:
                buffers.append(self.nt_delta)
            line.send(step if i == 0 else other, buffers)

    def traffic(self) -> list[int]:
        """[bytes sent, bytes received] so far over TCP, then over the shared-memory link's
        sockets (headers only: the arrays go through the segment), then the weight and gradient
        frames' bytes [sent, received] and those of the float32 arrays they stand for (see
        `nbdist.core.stats.traffic_row`). A push carries the totals before itself, so the hub's
        figures lag by one message."""
        sent, received = (sum(line.sent for line in self.lines),
                          sum(line.received for line in self.lines))
        sockets = [sent, received, 0, 0] if self.link == "tcp" else [0, 0, sent, received]
        return sockets + self.frames + self.arrays

    def receive_step(self, step: Step) -> Reply:
        """Second half of `step`: the replies; returns shard 0's."""
        if not step.push and not step.pull:
            return self.lines[0].recv(Reply)[0]
        return self._collect(pull=step.pull, fragment=step.fragment)

    def span(self, i: int, fragment: int | None) -> tuple[int, int]:
        """[lo, hi) of shard `i`'s slice in the flat buffer, or of `fragment` of it."""
        lo, hi = self.bounds[i]
        if fragment is None:
            return lo, hi
        start, stop = fragment_span(hi - lo, self.fragments, fragment)
        return lo + start, lo + stop

    def _collect(self, pull: bool, fragment: int | None = None) -> Reply:
        """Every shard's reply, with its weights on a pull (of one `fragment`, where the push
        held one and the reply is no evaluation's: the hub sends that fragment alone);
        returns shard 0's."""
        first = None
        for i, line in enumerate(self.lines):
            reply, msg = line.recv(Reply)
            if pull and not reply.lost:  # a worker written off gets no parameters
                spanned = fragment is not None and reply.eval is None
                if reply.params == "live":
                    lo, hi = self.bounds[i]
                    np.copyto(self.params[lo:hi], self._live_view(i))
                elif reply.params == "shm":
                    if reply.seg != self._segment.name:
                        raise TrainingError(f"hub shard {i} wrote the parameters into segment "
                                            f"{reply.seg!r}, not this worker's "
                                            f"{self._segment.name!r}; it has a stale registration. "
                                            "Run the cell again.")
                elif spanned:  # a fragment: its float32 weights alone
                    self._take_fragment(*self.span(i, fragment), msg.buffers[0])
                else:
                    self._take_pull(i, reply, msg.buffers[0])
                if i == 0 and self.non_trainable.size:
                    np.copyto(self.non_trainable, msg.floats(len(msg.buffers) - 1))
            if i == 0:
                first = reply
        return first

    def _take_fragment(self, lo: int, hi: int, frame) -> None:
        """One fragment's weights (streaming-diloco), into `params` and the copy a lossy
        codec's pulls of changes build on (the hub's twin takes them too)."""
        self.frames[1] += memoryview(frame).nbytes
        self.arrays[1] += 4 * (hi - lo)
        decode_into(frame, "none", self.params[lo:hi])
        if self._held is not None:
            np.copyto(self._held[lo:hi], self.params[lo:hi])

    def _take_pull(self, i: int, reply: Reply, frame) -> None:
        """Shard `i`'s weights from its frame: the weights themselves, or (a lossy codec, after
        the first) the change to add to this worker's copy."""
        lo, hi = self.bounds[i]
        self.frames[1] += memoryview(frame).nbytes
        self.arrays[1] += 4 * (hi - lo)
        full = reply.params == "full" or self._held is None
        try:
            if full:
                decode_into(frame, "none" if reply.params == "full" else self.codec,
                            self.params[lo:hi])
                if self._held is not None:
                    np.copyto(self._held[lo:hi], self.params[lo:hi])
            else:
                apply_pull(frame, self.codec, self._held[lo:hi], self.params[lo:hi])
        except ValueError as exc:
            raise TrainingError(f"hub shard {i} sent weights this worker cannot read ({exc}); "
                                "the shard and the worker disagree on --compression. Run the "
                                "cell again.") from None

    def _live_view(self, i: int) -> np.ndarray:
        if self._live[i] is None:
            self._live[i] = shm.attach(self._live_names[i])
        lo, hi = self.bounds[i]
        return shm.floats(self._live[i], 0, hi - lo)

    def bye(self) -> None:
        for line in self.lines:
            with contextlib.suppress(TrainingError):
                line.request(Bye(self.worker))

    def close(self) -> None:
        for line in self.lines:
            line.close()
        self._ctx.term()
        self.grad = self.params = None
        for seg in self._live:
            shm.release(seg)
        shm.release(self._segment, unlink=True)
