"""Measuring a model for partitioning: each layer's forward and backward time and the bytes
live across each cut, at the micro-batch size, and the link's bandwidth (`run.profile`); what a
call that computes nothing costs; and, for `--partition measured`, the cost model's best
partitions timed as whole stages (`time_partitions`), since the per-layer times each include a
call's cost that a stage compiled as one function pays once.

Each step runs on its own, several times after a warm-up, and its fastest time is kept (the
first calls of a layer include building and tracing; on a shared machine the other processes
only ever add time, so the minimum is the steadiest estimate). On TensorFlow a step runs
eagerly and its backward time is that of `tape.gradient` of its outputs with respect to its
float inputs and its variables; on JAX and PyTorch it runs as a one-step stage runs
(`stage_pass`: compiled on JAX), its backward pass with gradients of ones.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from nbdist.core.partition import candidates, layer_compute
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
        rows.append(_row(step, seen, fwd, bwd))
    return _cut_sizes(graph, rows, values)


def _profile_passes(graph, x_micro, repeats: int) -> tuple[list[dict], dict]:
    """The rows of `profile_graph` and the values at every cut, each step timed as a stage of
    one step (JAX, PyTorch)."""
    values = dict(zip(graph.inputs, _as_list(x_micro), strict=True))
    rows, seen = [], set()
    for k, step in enumerate(graph.steps):
        sub = StageModel(graph, k, k + 1)
        passes = stage_pass(sub, graph.model, input_grads=True)
        inputs = [np.asarray(values[t]) for t in sub.in_ids]
        fwd, bwd = [], []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            outs = passes.forward(inputs, r)
            t1 = time.perf_counter()
            passes.backward(r, _ones_for(outs))
            t2 = time.perf_counter()
            if r:  # the first call builds and compiles
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        values.update(zip(sub.out_ids, outs, strict=True))
        rows.append(_row(step, seen, fwd, bwd))
    return rows, values


def _row(step, seen: set, fwd: list[float], backward: list[float]) -> dict:
    """A step's profile row: its fastest forward and backward times, and its parameters (those
    of a layer called before count once, at its first call)."""
    params = (sum(int(np.prod(w.shape)) for w in op_weights(step.op))
              if id(step.op) not in seen else 0)
    seen.add(id(step.op))
    return {"layer": step.name, "kind": type(step.op).__name__, "forward_s": float(min(fwd)),
            "backward_s": float(min(backward)), "params": params}


def _ones_for(outs: list) -> list[np.ndarray]:
    """Upstream gradients for timing a backward pass: ones (float32 zeros for a non-float)."""
    return [np.ones_like(o, np.float32) if o.dtype.kind == "f" else np.zeros(o.shape, np.float32)
            for o in outs]


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

        def round_trip(payload: bytes) -> None:
            a.send(payload, copy=False)
            b.send(b.recv(copy=False), copy=False)
            a.recv(copy=False)

        try:
            return _link_figures(round_trip, nbytes, repeats)
        except zmq.Again:
            raise TrainingError(
                f"The pipeline's bandwidth probe on {host} got no answer within {timeout:.0f} s "
                f"(gate: {gate.counts() or 'nothing refused'}). Expected its two sockets to reach "
                "each other over TCP on that address: check that this host allows it (a "
                "firewall rule on it?), then run the cell again.") from None
    finally:
        a.close(linger=0)
        if b is not None:
            b.close(linger=0)
        gate.stop()
        ctx.term()


def _link_figures(round_trip, nbytes: int, repeats: int) -> dict:
    """Bandwidth (bytes/s) and latency (s) from `round_trip(payload)` (one message there and
    back): a small and a large message, each the fastest of `repeats` trips halved, after one
    untimed trip."""
    def trip(payload: bytes) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            round_trip(payload)
            best = min(best, time.perf_counter() - t0)
        return best / 2

    trip(b"x")
    latency = trip(b"x")
    big = trip(bytes(nbytes))
    return {"bandwidth": nbytes / max(big - latency, 1e-9), "latency": latency}


_ECHOES: list[threading.Thread] = []  # this engine's far ends of a link probe, while they run


def serve_echo(key: bytes, host: str, nbytes: int = 4 << 20,
               timeout: float = PROBE_TIMEOUT_S) -> dict:
    """On the second stage's engine, where the stages span hosts: the far end of
    `measure_link_to`, a gated PAIR socket on `host` that sends back each message, in a thread
    of its own, until an empty message or `timeout` seconds without one. Returns where to
    reach it (the endpoint and its gate)."""
    ctx = zmq.Context()
    sock, gate = server_socket(ctx, key, nbytes + 1024, False, kind=zmq.PAIR, peers=1)
    try:
        port = sock.bind_to_random_port(f"tcp://{host}")
    except BaseException:
        sock.close(linger=0)
        gate.stop()
        ctx.term()
        raise

    def echo() -> None:
        try:
            while sock.poll(int(timeout * 1000)):
                message = sock.recv(copy=False)
                if not len(message):
                    break
                sock.send(message, copy=False)
        finally:
            sock.close(linger=0)
            gate.stop()
            ctx.term()
            _ECHOES.remove(threading.current_thread())

    thread = threading.Thread(target=echo, daemon=True, name="nbdist-link-echo")
    _ECHOES.append(thread)
    thread.start()
    return {"endpoint": f"tcp://{host}:{port}", "gate": gate.id}


def measure_link_to(peer: dict, key: bytes, nbytes: int = 4 << 20, repeats: int = 3,
                    timeout: float = PROBE_TIMEOUT_S) -> dict:
    """`measure_link` across hosts: bandwidth and latency of round trips to `serve_echo`'s
    socket on another engine (`peer`, under `key`), as the stages' activations will cross."""
    ctx = zmq.Context()
    sock = client_socket(ctx, peer, key, zmq.PAIR)
    try:
        sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        sock.connect(peer["endpoint"])

        def round_trip(payload: bytes) -> None:
            sock.send(payload, copy=False)
            sock.recv(copy=False)

        try:
            figures = _link_figures(round_trip, nbytes, repeats)
            sock.send(b"")  # the far end stops
        except zmq.Again:
            raise TrainingError(
                f"The pipeline's bandwidth probe to {peer['endpoint']} (the second stage's "
                f"engine) got no answer within {timeout:.0f} s. Expected the stages' hosts to "
                "reach each other over TCP on that address: check the firewall between them, "
                "then run the cell again.") from None
        return {**figures, "to": peer["endpoint"]}
    finally:
        sock.close(linger=0)
        ctx.term()


def time_stage(sub, model, inputs: list, repeats: int, first: bool) -> tuple[list, float]:
    """A stage model's outputs for `inputs` and its fastest forward plus backward pass (its
    outputs' gradients ones), as a stage runs them (`stage_pass`), after one untimed call (it
    compiles)."""
    passes = stage_pass(sub, model, input_grads=not first)
    best = float("inf")
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        outs = passes.forward(inputs, r)
        passes.backward(r, _ones_for(outs))
        if r:
            best = min(best, time.perf_counter() - t0)
    return outs, best  # (no optimizer step: the variables stay as they were)


def time_partitions(graph, x_micro, choices: list, repeats: int = 3) -> list[list[float]]:
    """Each partition of `choices` (bounds) timed as whole stages, one after another on this
    engine: each stage's forward and backward pass at the micro-batch (seconds), its inputs the
    stage before's outputs."""
    timed = []
    for bounds in choices:
        inputs, times = [np.asarray(x) for x in _as_list(x_micro)], []
        for s, (start, end) in enumerate(bounds):
            inputs, seconds = time_stage(StageModel(graph, start, end), graph.model, inputs,
                                         repeats, first=s == 0)
            times.append(seconds)
        timed.append(times)
    return timed


def call_overheads(graph, x_micro, repeats: int = REPEATS) -> dict:
    """What a call costs that computes nothing: `stage` for a stage's passes (an empty stage,
    timed as `time_stage` times a stage), `layer` for one layer timed as `profile_graph` times
    it (eagerly under a tape on TensorFlow; elsewhere as a stage of its own)."""
    inputs = [np.asarray(x) for x in _as_list(x_micro)]
    _, stage = time_stage(StageModel(graph, 0, 0), graph.model, inputs, repeats, first=False)
    if backend_name() != "tensorflow":
        return {"stage": stage, "layer": stage}
    import tensorflow as tf  # TensorFlow: only to profile

    value, best = tf.convert_to_tensor(inputs[0]), float("inf")
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        with tf.GradientTape() as tape:
            tape.watch(value)
            out = tf.identity(value)
        tape.gradient(out, [value], output_gradients=[tf.ones_like(out)])
        if r:
            best = min(best, time.perf_counter() - t0)
    return {"stage": stage, "layer": best}


def profile_model(model, x_micro, repeats: int = REPEATS, host: str = "127.0.0.1",
                  stages: int | None = None, link_to: tuple | None = None) -> dict:
    """The profile of `model` at the micro-batch `x_micro`, the link, and what a call costs;
    with `stages`, also the cost model's best partitions into that many stages timed as whole
    stages (`measured`: [{"bounds", "compute"}], for `--partition measured`). The link is this
    host's loopback, or with `link_to` ((peer, key): `serve_echo`'s on the second stage's
    engine) the one to that host. Plain data (it comes back from an engine)."""
    ensure_built(model, x_micro[:2] if not isinstance(x_micro, (list, tuple))
                 else [x[:2] for x in x_micro])
    graph = Graph(model)
    result = profile_graph(graph, x_micro, repeats)
    result["link"] = measure_link(host=host) if link_to is None else measure_link_to(*link_to)
    result["micro_batch"] = len(_as_list(x_micro)[0])
    result["overhead"] = call_overheads(graph, x_micro, repeats)
    if stages is not None:
        costs = layer_compute([r["forward_s"] + r["backward_s"] for r in result["layers"]],
                              result["overhead"]["layer"])
        choices = [b for b in candidates(costs, result["cut_bytes"], stages,
                                         bandwidth=result["link"]["bandwidth"],
                                         latency=result["link"]["latency"],
                                         overhead=result["overhead"]["stage"])
                   if graph.places(b)]
        result["measured"] = [{"bounds": [list(b) for b in bounds], "compute": times}
                              for bounds, times in zip(choices,
                                                       time_partitions(graph, x_micro, choices),
                                                       strict=True)]
    return result


def profile_on_engine(source: str | None, pushed: dict, model_name: str, data: tuple,
                      initial: tuple, micro_batch: int, threads: int | None,
                      keras_backend: str = "tensorflow", stages: int | None = None,
                      link_to: tuple | None = None) -> dict:
    """`profile_model` on an engine: run the cell there (on the kernel's Keras backend), take
    the first micro-batch of inputs; `stages`: time the best partitions into that many;
    `link_to`: measure the link to the second stage's engine (`serve_echo`)."""
    ns = execute_cell(source, pushed, threads, backend=keras_backend)
    model = ns[model_name]
    spec = StageSpec("", bytes(32), 0, 1, (0, 0), 1, "gpipe", micro_batch, 1, 0, 0, model_name,
                     data, None, initial)
    x, _, _ = stage_data(ns, spec, model)
    ensure_built(model, x[:2])
    write_flat(model, *initial)
    return profile_model(model, x[:micro_batch], stages=stages, link_to=link_to)


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _nbytes(value) -> int:
    dtype = value.dtype  # NumPy's, or TensorFlow's (its `size`)
    itemsize = dtype.itemsize if isinstance(dtype, np.dtype) else dtype.size
    return int(np.prod(value.shape)) * itemsize
