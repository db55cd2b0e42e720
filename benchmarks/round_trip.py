"""Where a same-host worker's round trip goes: the worker's own calls, timed against a real hub.

What it measures
    One hub shard in its own process (as nbdist runs it) and one worker in this process, with
    a 269,322-float model (the 784-256-256-10 MLP's size) and plain SGD, over shared memory
    (and over TCP for comparison). Each step pushes a gradient and pulls the weights
    (`WorkerTransport.step`), and the worker's parts of it are timed where they run: `encode`
    (header JSON + MAC; over TCP the MAC covers the 1 MB gradient), `send` (the line's send
    call), `wait + receive` (until the reply's bytes are in; the hub's whole work is in here),
    `decode` (MAC check + JSON; over TCP of the 1 MB weights too), `copy in` (over TCP: the
    weights from the received frame into the worker's buffer). Eight sides, interleaved in
    one process run:
      spin      the local line, hub and worker polling before they sleep (--spin auto, which
                nbdist uses here: the hub has a core of its own);
      local     the headers over the same-host line (nbdist.hub.localline), both sleeping;
      ipc       the same over ZeroMQ's ipc (NBDIST_LOCAL_LINE=0, as before the line);
      tcp       ZeroMQ over loopback TCP, every byte of both arrays in the messages and MAC'd
                (what a worker on another host does; no polling);
      each once back to back, and once after a TensorFlow gradient of the MLP at batch 64
      (1 intra-op thread, the worker's budget on 2 cores) before every step, as a real
      worker does: the compute is not timed into the step, but it leaves cold caches and busy
      cores behind, and the step shows what that costs.

How to read it
    step = one push + pull round trip as the worker sees it (µs, median over repeats of the
    mean over --steps steps). "x local" = the side's step over local's step with the same
    compute. The hub's own CPU per push, by phase, is `hub_throughput.py --profile`.

    python benchmarks/round_trip.py               # 3 repeats of 2,000 steps per side
    python benchmarks/round_trip.py --repeats 1 --steps 500
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections import Counter

import _common  # noqa: F401 - sys.path for a checkout; TF loads only for the compute sides
import numpy as np
from _common import median, table
from hub_throughput import _hub_base, _shutdown

from nbdist.cluster.affinity import HUB_SPIN_S, WORKER_SPIN_S
from nbdist.hub import client, launch, lines, protocol
from nbdist.hub.client import WorkerTransport
from nbdist.hub.protocol import new_key
from nbdist.wire.messages import Step

SIZE = 269_322
PARTS = ("encode", "send", "wait + receive", "decode", "copy in")
SIDES = ("spin", "local", "ipc", "tcp")


class PartClock:
    """Times the worker's calls by wrapping them (this process only; a benchmark, not nbdist)."""

    def __init__(self):
        self.spent: Counter[str] = Counter()
        self._wrap(protocol.Codec, "encode", "encode")
        self._wrap(protocol.Codec, "decode", "decode")
        for line in (lines.Line, lines.LocalLine):
            self._wrap(line, "_send_frames", "send")
            self._wrap(line, "_receive_frames", "wait + receive")
        self._wrap(client.compression, "decode_into", "copy in")

    def _wrap(self, owner, name: str, part: str) -> None:
        inner = owner.__dict__[name]
        spent = self.spent

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start

        setattr(owner, name, timed)


def gradient_function():
    """The MLP's gradient at batch 64 as one flat array, TensorFlow on 1 thread."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((64, 784), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, 64))

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        return tf.concat([tf.reshape(g, [-1])
                          for g in tape.gradient(loss, model.trainable_variables)], 0)

    for _ in range(20):
        gradient().numpy()
    return lambda: gradient().numpy()


def measure(side: str, gradient, steps: int, clock: PartClock) -> dict:
    """One side: a fresh hub process and worker; the mean per step of the last `steps` steps."""
    line, spin = (side, False) if side in ("ipc", "tcp") else ("local", side == "spin")
    os.environ["NBDIST_LOCAL_LINE"] = "1" if line == "local" else "0"  # hub (spawned) and worker
    key = new_key()
    spec = dataclasses.replace(_hub_base(key, np.zeros(SIZE, np.float32), 1, 1),
                               spin_s=HUB_SPIN_S if spin else 0.0)
    os.environ["NBDIST_HUB_PROCESS"] = "1"
    # its own process, as on an engine (its own resource tracker)
    endpoints = launch.start_hub(spec)
    transport = WorkerTransport(key, 0, [endpoints], 0, "tcp" if side == "tcp" else "auto",
                                timeout=30, spin_s=WORKER_SPIN_S if spin else 0.0)
    try:
        assert transport.line_kind == line, transport.line_kind
        reply = transport.hello()
        chunk = reply.chunks[0].id
        transport.grad[:] = 1e-6
        step_s = 0.0
        for i in range(steps + 200):  # the first 200: warm-up
            if i == 200:
                clock.spent.clear()
                step_s = 0.0
            if gradient is not None:
                np.copyto(transport.grad, gradient())
            start = time.perf_counter()
            transport.step(Step(0, push=True, pull=True, chunks=[chunk] if i == 0 else [], loss=0.5,
                                compute_s=0.001, comm_s=0.0003))
            step_s += time.perf_counter() - start
        transport.bye()
        _shutdown(key, [endpoints])
    finally:
        transport.close()
        launch.join_hub(spec.run_id, spec.shard, timeout=10)
    return {"step": step_s / steps * 1e6, **{p: clock.spent[p] / steps * 1e6 for p in PARTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                        help="default: all four (local is always run: the other sides "
                             "are read against it)")
    args = parser.parse_args()
    clock = PartClock()
    gradient = gradient_function()
    lines = [s for s in SIDES if s in {*args.sides, "local"}]
    sides = [(line, compute) for compute in (False, True) for line in lines]
    results: dict[tuple, list[dict]] = {side: [] for side in sides}
    started = time.monotonic()
    for repeat in range(args.repeats):
        for line, compute in (sides if repeat % 2 == 0 else sides[::-1]):
            r = measure(line, gradient if compute else None, args.steps, clock)
            results[(line, compute)].append(r)
            print(f"  [{repeat + 1}/{args.repeats}] {line:<5} "
                  f"{'after a gradient' if compute else 'back to back':<16} step "
                  f"{r['step']:6.1f} us", flush=True)
    rows = []
    for line, compute in sides:
        rs = results[(line, compute)]
        step = median([r["step"] for r in rs])
        local = median([r["step"] for r in results[("local", compute)]])
        rows.append([line, "after a gradient" if compute else "back to back", step,
                     *(median([r[p] for r in rs]) for p in PARTS), step / local])
    print(f"\nµs per step, {SIZE:,} floats, SGD, 1 hub process, medians of {args.repeats} "
          f"repeat(s) of {args.steps} steps; load {os.getloadavg()[0]:.2f} (1 min); total "
          f"{time.monotonic() - started:.0f}s")
    print(table(["side", "between steps", "step", *PARTS, "x local"], rows))


if __name__ == "__main__":
    main()
