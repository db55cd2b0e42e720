"""Measuring a model for partitioning: each layer's forward and backward time and the bytes
live across each cut, at the micro-batch size, and the link's bandwidth (`run.profile`).

Each step runs on its own, several times after a warm-up, and its fastest time is kept (the
first calls of a layer include building and tracing; on a shared machine the other processes
only ever add time, so the minimum is the steadiest estimate). On TensorFlow a step runs
eagerly and its backward time is that of `tape.gradient` of its outputs with respect to its
float inputs and its variables; on JAX and PyTorch it runs as a one-step stage runs
(`stage_pass`: compiled on JAX), its backward pass with gradients of ones.
"""

from __future__ import annotations

import time

import numpy as np
import zmq

from nbdist.engine.flat_layout import ensure_built, write_flat
from nbdist.engine.keras_backend import backend_name
from nbdist.engine.run_cell import execute_cell
from nbdist.errors import TrainingError
from nbdist.hub.protocol import new_key
from nbdist.hub.wire import client_socket, server_socket
from nbdist.modes.pipeline.graph import Graph, StageModel, call_step, op_weights
from nbdist.modes.pipeline.stage import StageSpec, stage_data
from nbdist.modes.pipeline.stage_pass import stage_pass

REPEATS = 5
PROBE_TIMEOUT_S = 30.0  # the bandwidth probe's longest wait for one message


def profile_graph(graph, x_micro, repeats: int = REPEATS) -> dict:
    """Per step: name, forward_s, backward_s, params; per cut: the live bytes and elements after
    each step (the elements bound a gradient message, float32 where a tensor is not a float)."""
    if backend_name() != "tensorflow":
        return _cut_sizes(graph, *_profile_passes(graph, x_micro, repeats))
    import tensorflow as tf  # TensorFlow: only to profile

    values = {t: tf.convert_to_tensor(v)
              for t, v in zip(graph.inputs, _as_list(x_micro), strict=True)}
    rows, seen = [], set()
    for step in graph.steps:
        inputs = {t: values[t] for t in step.inputs}
        sources = [v for v in inputs.values() if v.dtype.is_floating]
        variables = (list(getattr(step.op, "trainable_variables", [])) if id(step.op) not in seen
                     else [])
        fwd, bwd = [], []
        for r in range(repeats + 1):
            scratch = dict(inputs)
            t0 = time.perf_counter()
            with tf.GradientTape() as tape:
                tape.watch(sources)
                call_step(step, scratch, training=True)
            t1 = time.perf_counter()
            outs = [scratch[t] for t in step.outputs]
            if sources or variables:
                tape.gradient(outs, [*sources, *variables],
                              output_gradients=[tf.ones_like(o) for o in outs],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
            t2 = time.perf_counter()
            if r:  # the first call builds and traces
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        values.update({t: scratch[t] for t in step.outputs})
        params = (sum(int(np.prod(w.shape)) for w in op_weights(step.op))
                  if id(step.op) not in seen else 0)
        seen.add(id(step.op))
        rows.append({"layer": step.name, "kind": type(step.op).__name__,
                     "forward_s": float(min(fwd)), "backward_s": float(min(bwd)),
                     "params": params})
    return _cut_sizes(graph, rows, values)


def _profile_passes(graph, x_micro, repeats: int) -> tuple[list[dict], dict]:
    """The rows of `profile_graph` and the values at every cut, each step timed as a stage of
    one step (JAX, PyTorch)."""
    values = dict(zip(graph.inputs, _as_list(x_micro), strict=True))
    rows, seen = [], set()
    for k, step in enumerate(graph.steps):
        sub = StageModel(graph, k, k + 1)
        passes = stage_pass(sub, graph.model, last=False, input_grads=True)
        inputs = [np.asarray(values[t]) for t in sub.in_ids]
        fwd, bwd = [], []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            outs = passes.forward(inputs, r)
            t1 = time.perf_counter()
            passes.backward(r, [np.ones_like(o, np.float32) if o.dtype.kind == "f"
                                else np.zeros(o.shape, np.float32) for o in outs])
            t2 = time.perf_counter()
            if r:  # the first call builds and compiles
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        values.update(zip(sub.out_ids, outs, strict=True))
        params = (sum(int(np.prod(w.shape)) for w in op_weights(step.op))
                  if id(step.op) not in seen else 0)
        seen.add(id(step.op))
        rows.append({"layer": step.name, "kind": type(step.op).__name__,
                     "forward_s": float(min(fwd)), "backward_s": float(min(bwd)),
                     "params": params})
    return rows, values


def _cut_sizes(graph, rows: list[dict], values: dict) -> dict:
    """`profile_graph`'s result from its rows and the values at every cut."""
    cut_bytes = [int(sum(_nbytes(values[t]) for t in graph.live(k)))
                 for k in range(len(graph.steps) - 1)]
    cut_items = [int(sum(np.prod(values[t].shape) for t in graph.live(k)))
                 for k in range(len(graph.steps) - 1)]
    for k, row in enumerate(rows):
        row["cut_bytes"] = cut_bytes[k] if k < len(cut_bytes) else 0
        row["cut_tensors"] = len(graph.live(k)) if k < len(cut_bytes) else 0
    return {"layers": rows, "cut_bytes": cut_bytes, "cut_items": cut_items}


def measure_link(nbytes: int = 4 << 20, repeats: int = 3, host: str = "127.0.0.1",
                 timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Bandwidth (bytes/s) and latency (s) of a ZeroMQ TCP link on `host`: a small and a large
    message, each the fastest of `repeats` round trips halved. The probe's port is behind a
    gate like every socket nbdist binds (`nbdist.hub.gate`, a key of its own): a peer without
    it never gets in (before, the first peer to connect took the PAIR socket and the probe
    waited forever), and no wait is longer than `timeout` (TrainingError)."""
    key = new_key()
    ctx = zmq.Context()
    a, gate = server_socket(ctx, key, nbytes + 1024, False, kind=zmq.PAIR, peers=1)
    b = None
    try:
        port = a.bind_to_random_port(f"tcp://{host}")
        b = client_socket(ctx, {"gate": gate.id}, key, zmq.PAIR)
        b.connect(f"tcp://{host}:{port}")
        for sock in (a, b):
            sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
            sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))

        def trip(payload: bytes) -> float:
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                a.send(payload, copy=False)
                b.send(b.recv(copy=False), copy=False)
                a.recv(copy=False)
                best = min(best, time.perf_counter() - t0)
            return best / 2

        try:
            trip(b"x")
            latency = trip(b"x")
            big = trip(bytes(nbytes))
        except zmq.Again:
            raise TrainingError(
                f"The pipeline's bandwidth probe on {host} got no answer within {timeout:.0f} s "
                f"(gate: {gate.counts() or 'nothing refused'}). Expected its two sockets to reach "
                "each other over TCP on that address: check that this host allows it (a "
                "firewall rule on it?), then run the cell again.") from None
        return {"bandwidth": nbytes / max(big - latency, 1e-9), "latency": latency}
    finally:
        a.close(linger=0)
        if b is not None:
            b.close(linger=0)
        gate.stop()
        ctx.term()


def profile_model(model, x_micro, repeats: int = REPEATS, host: str = "127.0.0.1") -> dict:
    """The profile of `model` at the micro-batch `x_micro`, and the link; plain data (it comes
    back from an engine)."""
    ensure_built(model, x_micro[:2] if not isinstance(x_micro, (list, tuple))
                 else [x[:2] for x in x_micro])
    result = profile_graph(Graph(model), x_micro, repeats)
    result["link"] = measure_link(host=host)
    result["micro_batch"] = len(_as_list(x_micro)[0])
    return result


def profile_on_engine(source: str | None, pushed: dict, model_name: str, data: tuple,
                      initial: tuple, micro_batch: int, threads: int | None,
                      keras_backend: str = "tensorflow") -> dict:
    """`profile_model` on an engine: run the cell there (on the kernel's Keras backend), take
    the first micro-batch of inputs."""
    ns = execute_cell(source, pushed, threads, backend=keras_backend)
    model = ns[model_name]
    spec = StageSpec("", bytes(32), 0, 1, (0, 0), 1, "gpipe", micro_batch, 1, 0, 0, model_name,
                     data, None, initial)
    x, _, _ = stage_data(ns, spec, model)
    ensure_built(model, x[:2])
    write_flat(model, *initial)
    return profile_model(model, x[:micro_batch])


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _nbytes(value) -> int:
    dtype = value.dtype  # NumPy's, or TensorFlow's (its `size`)
    itemsize = dtype.itemsize if isinstance(dtype, np.dtype) else dtype.size
    return int(np.prod(value.shape)) * itemsize
