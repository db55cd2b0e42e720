"""`nbdist.train`: everything `%%distribute` does, as a plain function.

It runs the cell in the kernel (so mistakes show before any engine is touched and the
notebook's own model exists), checks what the cell provides, starts the hub shards and the
workers, and returns a Run at once.
"""

from __future__ import annotations

import uuid

from nbdist.cell import inspect_cell
from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.errors import ConfigError, NoClusterError
from nbdist.protocol import new_key
from nbdist.run import Run


def train(cell: str, *, cluster=None, namespace: dict | None = None, wait: bool = False,
          config: TrainConfig | None = None, **options) -> Run:
    """Train the model defined by `cell` (ordinary single-machine Keras code) distributed.

    `options` are TrainConfig's fields (mode, algorithm, workers, servers, epochs, batch_size,
    lr, model, data, validation, ...). `namespace` is where the cell runs in the kernel (the
    notebook's namespace from the magic; a fresh dict by default).

    Example:
        >>> cluster = nbdist.Cluster.start(3)                              # doctest: +SKIP
        >>> run = nbdist.train(CELL, cluster=cluster, workers=2, epochs=2)  # doctest: +SKIP
        >>> run.wait().history.tail()                                      # doctest: +SKIP
    """
    config = config.replace(**options) if config is not None else TrainConfig(**options)
    if config.mode in (Mode.ASYNC, Mode.SYNC) and cluster is None:
        raise NoClusterError(
            "No cluster to train on. Start one with %nbdist start 3 (or nbdist.Cluster.start(3)), "
            "connect with %nbdist connect --profile P, or use --mode local to train in this kernel."
        )
    ns = {} if namespace is None else namespace
    exec(compile(cell, "<%%distribute cell>", "exec"), ns)  # noqa: S102 - the user's own cell
    contents = inspect_cell(cell, ns, config)

    from nbdist.backends import ClusterBackend, LocalBackend, hub_specs
    from nbdist.flatmodel import layout, read_flat
    from nbdist.ps.client import HubControl
    from nbdist.ps.hub import HubSpec
    from nbdist.worker import WorkerSpec, portable

    model = contents.model
    if config.mode is Mode.LOCAL:
        backend = LocalBackend(ns)
    elif config.mode is Mode.SYNC:
        from nbdist.sync import SyncBackend

        backend = SyncBackend(cluster, config.workers)
    else:
        backend = ClusterBackend(cluster, config.servers, config.workers)
    params, non_trainable = read_flat(model)
    lr = config.lr if config.lr is not None else float(model.optimizer.learning_rate.numpy())
    plan, options, easgd_alpha = _plan(config, contents, lr, backend.num_workers)
    algorithm = plan.algorithm
    key, run_id = new_key(), uuid.uuid4().hex[:12]
    local = config.local_steps > 1 and algorithm != "easgd"
    base = HubSpec(run_id=run_id, key=key, shard=0, num_shards=config.servers, plan=plan,
                   params=params, non_trainable=non_trainable, rule_options=options,
                   local_steps=config.local_steps,
                   server_optimizer=config.server_optimizer.value if local else None,
                   idle_timeout=config.timeout)
    sync = config.mode is Mode.SYNC
    hub_params = params[:0] if sync else params  # in sync mode the hub holds no parameters
    endpoints = backend.start_hubs(hub_specs(base, hub_params, 1 if sync else config.servers))
    control = HubControl(key, endpoints)
    fields = dict(
        run_id=run_id, key=key, worker=0, shards=endpoints, layout=layout(model),
        model_name=contents.model_name, data=contents.data, validation=contents.validation,
        seed=config.seed, num_samples=contents.num_samples, batch_size=config.batch_size,
        source=cell, pushed=portable(contents.pushed), transport=config.transport.value,
        timeout=config.timeout,
    )
    steps = dict(overlap=config.overlap, local_steps=config.local_steps, easgd_alpha=easgd_alpha)
    try:
        if sync:
            from nbdist.sync import SyncSpec

            backend.start_workers(SyncSpec(**fields, epochs=config.epochs, lr=lr, initial_params=params,
                                           initial_non_trainable=non_trainable))
        else:
            backend.start_workers(WorkerSpec(**fields, **steps))
    except BaseException:
        control.shutdown()  # nothing may be left serving
        control.close()
        raise
    run = Run(config, model, contents.model_name)
    run._begin(backend, control, run_id)  # noqa: SLF001
    if wait:
        run.wait()
    return run


def _plan(config: TrainConfig, contents, lr: float, num_workers: int):
    """The coordinator's plan, the rule's options and EASGD's alpha for this run."""
    from nbdist.ps.coordinator import Plan

    if config.slowdown is not None and len(config.slowdown) != num_workers:
        raise ConfigError(
            f"--slowdown gives {len(config.slowdown)} factor(s) for {num_workers} worker(s). "
            f"Give one per worker, e.g. --slowdown {','.join(['1'] * num_workers)}."
        )
    algorithm = config.algorithm.value
    options = config.rule_options()
    easgd_alpha = 0.0
    if config.algorithm is Algorithm.EASGD:
        from nbdist.algorithms import make_rule

        easgd_alpha = float(make_rule(algorithm, 0, num_workers, options).options["alpha"])
    plan = Plan(
        num_workers=num_workers, num_samples=contents.num_samples, epochs=config.epochs,
        batch_size=config.batch_size, lr=lr, has_validation=contents.validation is not None,
        algorithm=algorithm, staleness=(options.get("staleness", 3) if algorithm == "ssp" else None),
        groups=int(options.get("num_groups", 0)),
        chunks_ahead=config.local_steps if config.local_steps > 1 else (2 if config.overlap else 1),
        # default floor: a quarter of the batch. When a slow node's fixed cost per step alone
        # is as long as a fast node's whole step, equal step times would mean 1-sample batches,
        # whose gradients are mostly noise; --batch-min 1 allows that if wanted.
        dbs=config.dbs, batch_min=config.batch_min or max(1, config.batch_size // 4),
        batch_max=config.batch_max,
        slowdown=list(config.slowdown or [1.0] * num_workers), staleness_lr=config.staleness_lr,
        metrics=config.metrics.value)
    return plan, options, easgd_alpha
