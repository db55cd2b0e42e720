"""The engine side of an asynchronous run: execute the cell, then pull -> compute -> push.

`run_worker(spec)` is what the kernel sends to each worker engine. It runs the user's cell in
the engine's namespace (like `%px`), finds the model and arrays by name, checks that the
model has the same variables as the kernel's, and trains on the chunks the hub hands out
until the hub says it is done. Control (pause, stop, learning rate) arrives on every reply.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from nbdist.errors import CellError, TrainingError

log = logging.getLogger(__name__)
IDLE_POLL_S = 0.02  # how often a worker with nothing to do asks the hub again


@dataclass
class WorkerSpec:
    """What one worker needs; sent to its engine by ipyparallel."""

    run_id: str
    key: bytes
    worker: int
    shards: list[dict]
    layout: dict
    model_name: str
    data: tuple[str, str]
    validation: tuple[str, str] | None
    seed: int
    num_samples: int
    batch_size: int
    source: str | None = None  # the cell; None: the namespace already holds its results
    pushed: dict = field(default_factory=dict)  # arrays the cell uses but does not define
    transport: str = "auto"
    timeout: float = 120.0
    threads: int | None = None  # TensorFlow intra-op threads; None: TensorFlow's default
    local_rank: int = 0
    engine: int | None = None


def engine_namespace() -> dict:
    """The engine's interactive namespace (what `%px` cells see), or a fresh dict."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    return shell.user_ns if shell is not None else {}


def configure_tensorflow(threads: int | None, local_rank: int) -> None:
    """Thread budget and device pinning; must run before TensorFlow executes anything."""
    import tensorflow as tf

    try:
        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:  # one device per worker on a GPU node, chosen by local rank
            tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    except RuntimeError:  # already initialised by an earlier run in this engine: keep it
        pass


def run_worker(spec: WorkerSpec, namespace: dict | None = None) -> dict:
    """Train on the hub's chunks until done; returns this worker's totals."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    configure_tensorflow(spec.threads, spec.local_rank)
    ns = engine_namespace() if namespace is None else namespace
    if spec.source is not None:
        ns.update(spec.pushed)
        exec(compile(spec.source, "<%%distribute cell>", "exec"), ns)  # noqa: S102 - the user's own cell
    model, (x, y), validation = _find(ns, spec)
    from nbdist.flatmodel import FlatModel, layout
    from nbdist.ps.client import WorkerTransport

    if layout(model) != spec.layout:
        raise CellError(
            f"The model built on engine {spec.engine} differs from the kernel's "
            f"(variables {layout(model)['trainable']} vs {spec.layout['trainable']}). "
            "The cell must build the same model every time it runs: avoid random architecture "
            "choices or state from other cells."
        )
    flat = FlatModel(model)
    # Trace the compiled step now, before saying hello, so every worker starts training at
    # the same moment; hello's pull then overwrites whatever this step changed.
    flat.gradients(x[: spec.batch_size], y[: spec.batch_size])
    transport = WorkerTransport(spec.key, spec.worker, spec.shards, flat.nt_size,
                                spec.transport, spec.timeout, spec.engine)
    try:
        return _train_loop(spec, flat, transport, x, y, validation)
    finally:
        transport.close()


def _find(ns: dict, spec: WorkerSpec):
    missing = [n for n in (spec.model_name, *spec.data, *(spec.validation or ())) if n not in ns]
    if missing:
        raise CellError(
            f"On engine {spec.engine} the cell did not define {', '.join(missing)}. "
            "Define them inside the %%distribute cell (engines do not see other cells)."
        )
    x, y = (np.asarray(ns[n]) for n in spec.data)
    if x.dtype == np.float64:  # Keras trains in float32; convert once, not per batch
        x = x.astype(np.float32)
    validation = tuple(ns[n] for n in spec.validation) if spec.validation else None
    return ns[spec.model_name], (x, y), validation


def _train_loop(spec: WorkerSpec, flat, transport, x, y, validation) -> dict:
    from nbdist.ps.schedule import epoch_permutation

    reply = transport.hello()
    flat.assign(transport.params, transport.non_trainable)
    fresh = True  # the model holds the parameters of the last pull
    permutation, perm_epoch = None, -1
    extra: dict = {}
    comm_s, steps = 0.0, 0
    while True:
        if reply.get("eval"):
            extra["eval"] = {**reply["eval"], "metrics": _evaluate(flat.model, validation, spec.batch_size)}
        if reply.get("done"):
            if extra:
                transport.step(extra, push=False, pull=False)
            break
        chunk = reply.get("chunk")
        if chunk is None or not fresh:
            pull = not fresh or bool(reply.get("eval_pending"))
            if not pull:
                time.sleep(IDLE_POLL_S)
            reply = transport.step(extra, push=False, pull=pull)
            extra = {}
            if pull:
                flat.assign(transport.params, transport.non_trainable)
                fresh = True
            elif reply.get("chunk"):
                fresh = False  # work after waiting: pull the current weights first
            continue
        chunk_id, epoch, start, stop = chunk
        if epoch != perm_epoch:
            permutation, perm_epoch = epoch_permutation(spec.num_samples, spec.seed, epoch), epoch
        index = permutation[start:stop]
        t0 = time.perf_counter()
        loss, grad, grad_norm, nt_after = flat.gradients(x[index], y[index])
        t1 = time.perf_counter()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            value = loss if what == "loss" else grad_norm
            raise TrainingError(
                f"The {what} became {value} at step {steps} on worker {spec.worker} (epoch {epoch}). "
                "Lower the learning rate (--lr), check the data for NaN/inf, or normalise inputs."
            )
        np.copyto(transport.grad, grad)
        np.subtract(nt_after, transport.non_trainable, out=transport.nt_delta)
        header = {"chunk": chunk_id, "loss": loss, "compute_s": t1 - t0, "comm_s": comm_s, **extra}
        reply = transport.step(header, push=True, pull=True)
        extra = {}
        flat.assign(transport.params, transport.non_trainable)
        comm_s = time.perf_counter() - t1
        steps += 1
    transport.bye()
    return {"worker": spec.worker, "steps": steps}


def _evaluate(model, validation, batch_size: int) -> dict:
    if validation is None:
        return {}
    xv, yv = validation
    result = model.evaluate(xv, yv, batch_size=max(256, batch_size), verbose=0, return_dict=True)
    return {k: float(v) for k, v in result.items()}
