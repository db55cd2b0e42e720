"""`--mode pipeline`: the cell's model cut into S stages, one per engine, with M micro-batches
in flight per mini-batch (GPipe or 1F1B), cut points chosen from measured layer costs.

`start` profiles the model on the first stage's engine (`profile`), cuts it
(`nbdist.core.partition`, `graph`), starts one stage per engine (`stage`, talking over
`link`) and returns a `PipelineRun` (`run`) whose `profile`, `partition` and `pipeline`
show what was measured, chosen and seen.
"""

from __future__ import annotations

import math
import threading
import uuid

import numpy as np
import pandas as pd

from nbdist.core.partition import (
    MEASURED,
    METHODS,
    check_stages,
    fastest_measured,
    layer_compute,
    partition,
)
from nbdist.engine.flat_layout import ensure_built, head, read_flat, write_flat
from nbdist.engine.keras_backend import backend_name
from nbdist.engine.learning_rate import schedule_name
from nbdist.engine.run_cell import portable
from nbdist.errors import ConfigError, DataError, NoClusterError, TrainingError
from nbdist.hub.protocol import new_key
from nbdist.modes.common.engine_backend import get_started
from nbdist.modes.pipeline.checks import REPORT_LIMITS, message_limits, weights_limits
from nbdist.modes.pipeline.graph import Graph
from nbdist.modes.pipeline.kernel_link import KernelLink
from nbdist.modes.pipeline.placement import bind_hosts, kernel_host, local_ranks, stage_threads
from nbdist.modes.pipeline.profile import profile_model, profile_on_engine, serve_echo
from nbdist.modes.pipeline.run import PipelineRun, partition_frame
from nbdist.modes.pipeline.runtime import PipelineBackend, PipelineControl
from nbdist.modes.pipeline.stage import VALIDATION_BATCH, StageSpec


def start(job, *, cluster=None, wait: bool = False):
    """The mode's entry (`nbdist.modes.MODES`): a pipeline run of the job's model."""
    return start_stages(job.cell, job.config, cluster, job.namespace, wait, job.contents,
                        job.warnings, keras_backend=job.keras_backend, fit=job.fit)


def start_stages(cell: str, config, cluster, namespace: dict, wait: bool, contents,
                 warnings: list[str], in_process: bool = False,
                 keras_backend: str | None = None, fit=None):
    """Start a pipeline run of the cell's model (already run in the kernel: `contents`);
    `in_process`: the stages as threads of this kernel (tests), no cluster; `keras_backend`:
    the kernel's (by default, this process's); `fit`: the cell's fit call
    (`nbdist.fit.plan.FitSpec`), whose callbacks the kernel runs at each epoch's end on the
    stages' weights (`nbdist.fit.driver`)."""
    keras_backend = keras_backend or backend_name()
    if fit is not None:
        refuse_fit_options(fit, contents)
    if cluster is None and not in_process:
        raise NoClusterError("--mode pipeline puts each stage on its own engine, and there is no "
                             f"cluster. Start one with %nbdist start {config.stages} (or "
                             f"nbdist.Cluster.start({config.stages})), or connect with "
                             "%nbdist connect --profile P.")
    if contents.streamed or contents.arrays is None:
        raise DataError(f"--mode pipeline reads the data held in memory, but {contents.data[0]} is "
                        "larger than --in-memory-limit. Raise --in-memory-limit, or train on a "
                        "part.")
    model, (x, _y) = contents.model, contents.arrays
    x = x.astype("float32") if getattr(x, "dtype", None) == "float64" else x
    ensure_built(model, head(x, 2))  # (several inputs are refused next, by name)
    graph = Graph(model)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ConfigError(
            f"--mode pipeline trains models with one input and one output (Received: "
            f"{len(graph.inputs)} inputs, {len(graph.outputs)} outputs). Combine them into one "
            "tensor each (e.g. keras.layers.Concatenate), or use --mode async or sync.")
    stages, micro = config.stages, config.micro_batches
    check_stages(len(graph.steps), stages, graph.names)
    engines = list(cluster.engine_ids) if cluster is not None else list(range(stages))
    if stages > len(engines):
        raise ConfigError(f"--stages {stages} needs {stages} engines, one per stage, but the "
                          f"cluster has {len(engines)} ({engines}). Use --stages {len(engines)} or "
                          "fewer, or start more engines (%nbdist stop, then "
                          f"%nbdist start {stages}).")
    engines = engines[:stages]
    initial = read_flat(model)
    micro_size = config.batch_size // micro
    nets = cluster.engine_networks(engines) if cluster is not None else None
    threads = stage_threads(nets, engines)
    ranks_on_host = local_ranks(nets, engines)
    pushed = _portable(contents.pushed)
    timed = stages if config.partition == MEASURED else None  # time the best cuts as stages
    bind = bind_hosts(cluster, nets, engines) if cluster is not None else ["127.0.0.1"] * stages
    if cluster is not None:
        measured = get_started(cluster.client[engines[0]].apply_async(
            profile_on_engine, cell, pushed, contents.model_name, contents.data, initial,
            micro_size, threads[0], keras_backend, timed,
            _link_to(cluster, nets, engines, bind, config.timeout)),
            engines[0], "profiling the model", timeout=max(120.0, config.timeout))
    else:
        measured = profile_model(model, x[:micro_size], stages=timed)
        write_flat(model, *initial)  # profiling trained nothing, but BatchNorm moved its statistics
    layers = measured["layers"]
    if len(layers) != len(graph.steps):
        raise TrainingError(f"The profile measured {len(layers)} layers on engine {engines[0]}, "
                            f"but the model here has {len(graph.steps)}: the cell builds a "
                            "different model there. Build the model the same way on every run of "
                            "the cell (no random choices).")
    for row, name in zip(layers, graph.names, strict=True):
        row["layer"] = name  # the engine's Keras numbers its layers itself (dense_12 for dense_171)
    overhead = measured["overhead"]
    costs = layer_compute([r["forward_s"] + r["backward_s"] for r in layers], overhead["layer"])
    link = measured["link"]
    options = dict(bandwidth=link["bandwidth"], latency=link["latency"], seed=config.seed,
                   names=graph.names, overhead=overhead["stage"])
    alternatives = {m: partition(costs, measured["cut_bytes"], stages, m, **options)
                    for m in METHODS}
    if config.partition == MEASURED:
        alternatives[MEASURED] = fastest_measured(
            [(c["bounds"], c["compute"]) for c in measured["measured"]], measured["cut_bytes"],
            len(layers), link["bandwidth"], link["latency"])
    chosen = alternatives[config.partition]
    graph.check_bounds(chosen.bounds)

    limits = message_limits(measured["cut_bytes"], measured["cut_items"],
                            [r["cut_tensors"] for r in layers], chosen.bounds,
                            measured["micro_batch"],
                            _message_samples(config.batch_size, x, contents.validation_arrays))
    key, run_id = new_key(), uuid.uuid4().hex[:12]
    encrypt = bool(getattr(cluster, "encrypt", False))  # %nbdist start/connect --encrypt
    kernel = KernelLink(key, run_id, bind[-1] if cluster is None else kernel_host(cluster, nets),
                        stages, encrypt=encrypt,
                        limits=REPORT_LIMITS if fit is None else weights_limits(
                            [_nbytes(w) for w in model.weights] + _slot_bytes(fit, model)))
    steps_per_epoch = math.ceil(contents.num_samples / config.batch_size)
    control = PipelineControl(kernel, stages, engines, config.epochs, steps_per_epoch, micro,
                              lr=_constant_rate(model.optimizer, config.lr))
    backend = PipelineBackend(cluster, engines, graph, model, namespace, control)
    backend.kernel_host = kernel_host(cluster, nets) if cluster is not None else None
    try:
        specs = [StageSpec(run_id=run_id, key=key, stage=s, stages=stages, bounds=chosen.bounds[s],
                           micro_batches=micro, schedule=config.schedule,
                           batch_size=config.batch_size, epochs=config.epochs, seed=config.seed,
                           num_samples=contents.num_samples, model_name=contents.model_name,
                           data=contents.data,
                           # with a fit call the kernel validates, on the stages' weights
                           validation=contents.validation if fit is None else None,
                           initial=initial, source=cell if cluster is not None else None,
                           pushed=pushed if cluster is not None else {}, bind_host=bind[s],
                           timeout=config.timeout, engine=engines[s], threads=threads[s],
                           lr=config.lr, own_optimizer=cluster is not None,
                           transport=str(config.transport), limits=limits[s], encrypt=encrypt,
                           local_rank=ranks_on_host[s], keras_backend=keras_backend,
                           gated=fit is not None, shuffle=fit.shuffle if fit is not None else True,
                           send_optimizer=fit is not None and fit.call.saves_whole_model)
                 for s in range(stages)]
        backend.start_workers(specs)
    except BaseException:
        control.failed = True
        control.close()
        raise
    run = PipelineRun(config, model, contents.model_name, contents.warnings + warnings,
                      contents.notes)
    run.profile = pd.DataFrame(layers)
    run.source = cell
    run.state.write_model = fit is None  # a fit call: the kernel writes each epoch's weights
    if fit is not None:  # ... and its History is the run's result (Run.fit_call_returned)
        run.state.fit_call_returned = threading.Event()
    run.partition = partition_frame(graph, chosen, layers)
    run.partitions = alternatives
    how = (f"the fastest of {len(measured['measured'])} cuts timed as whole stages: slowest "
           f"stage {chosen.slowest * 1e3:.2f} ms per micro-batch, where the profile alone "
           f"predicted {alternatives['optimal'].slowest * 1e3:.2f} ms for its best cut"
           if config.partition == MEASURED else
           f"predicted slowest stage {chosen.slowest * 1e3:.2f} ms per micro-batch; optimal "
           f"{alternatives['optimal'].slowest * 1e3:.2f} ms")
    run.note(f"pipeline: {stages} stages on engines {engines}, --partition {config.partition} "
             f"({how}), --schedule {config.schedule}, {micro} micro-batches of {micro_size}")
    run.begin(backend, control, run_id)
    if wait:
        run.wait()
    return run


def refuse_fit_options(fit, contents) -> None:
    """Refuse what a fit call asks that the pipeline cannot do as `fit` does, naming it."""
    asked = []
    if len(contents.data) == 3:
        asked.append("sample_weight= or class_weight= (per-sample weights)")
    if fit.epoch_size is not None or fit.placed.take_batches is not None:
        asked.append(f"steps_per_epoch={fit.call.steps_per_epoch} (epochs of part of the data)")
    if asked:
        raise ConfigError(
            f"--mode pipeline trains each epoch on every sample of (x, y), with no per-sample "
            f"weights, but the cell's model.fit(...) asks for {' and '.join(asked)}. Remove "
            "that argument, or train with --mode async, sync or local, which take it.")


def _constant_rate(optimizer, lr: float | None) -> float | None:
    """The rate the stages step with: --lr's, else the cell optimizer's constant one (None for
    a schedule: it changes every step, on each stage)."""
    if lr is not None:
        return float(lr)
    if schedule_name(optimizer) is not None:
        return None
    return float(np.asarray(optimizer.learning_rate))


def _slot_bytes(fit, model) -> list[int]:
    """The bytes of each variable of the cell's optimizer (a copy, built here and dropped)
    where the stages send their slots with their weights (a callback saves the whole model)."""
    if fit is None or not fit.call.saves_whole_model:
        return []
    optimizer = type(model.optimizer).from_config(model.optimizer.get_config())
    optimizer.build(model.trainable_variables)
    return [_nbytes(v) for v in optimizer.variables]


def _nbytes(variable) -> int:
    return math.prod(variable.shape) * np.dtype(variable.dtype).itemsize


def _message_samples(batch_size: int, x, validation_arrays) -> float:
    """Samples in the largest message between stages (a validation batch), counted in training
    samples: scaled up where a validation sample is larger than a training one."""
    samples = max(VALIDATION_BATCH, batch_size)
    xv = validation_arrays[0] if validation_arrays else None
    if getattr(xv, "shape", None) is not None and getattr(x, "shape", None) is not None:
        samples *= max(1.0, math.prod(xv.shape[1:]) / max(1, math.prod(x.shape[1:])))
    return samples


def _portable(pushed: dict) -> dict:
    return portable(pushed)


def _link_to(cluster, nets: dict, engines: list, bind: list[str], timeout: float):
    """Where the stages span hosts: the far end of a link probe on the second stage's engine
    (`profile.serve_echo`) and its key, so the profile measures the link activations will
    cross (between the first two stages' hosts); None on one host (loopback is measured)."""
    if len(engines) < 2 or nets[engines[0]].hostname == nets[engines[1]].hostname:
        return None
    key = new_key()
    peer = get_started(cluster.client[engines[1]].apply_async(serve_echo, key, bind[1]),
                       engines[1], "starting the link probe", timeout=max(60.0, timeout))
    return peer, key
