"""`nbdist.train` and `nbdist.resume`: everything `%%distribute` does, as plain functions.

They run the cell in the kernel (so mistakes show before any engine is touched and the
notebook's own model exists), check what the cell provides, start the hub shards and the
workers, and return a Run at once. `resume` first loads and verifies a checkpoint, so a
missing or corrupt one is refused before anything starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
from dataclasses import replace

from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.engine.cell import inspect_cell
from nbdist.errors import CheckpointError, ConfigError, NoClusterError
from nbdist.hub.protocol import new_key
from nbdist.run.handle import Run


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
    return _start(cell, config, cluster, namespace, wait)


# Options a resumed run must keep: they decide what the saved state means.
RESUME_FIXED = ("mode", "algorithm", "servers", "seed", "local_steps", "server_optimizer")


def resume(checkpoint: str | os.PathLike, cell: str | None = None, *, cluster=None,
           namespace: dict | None = None, wait: bool = False, trust_cell: bool = False,
           **options) -> Run:
    """Continue a run from a checkpoint: weights, update-rule state, versions, learning rate
    and data position are restored, and only the samples not yet trained on are trained on.

    `checkpoint` is a --checkpoint-dir folder (or the path `run.checkpoint()` returned);
    `cell` is the code that builds the model (the magic passes its own cell). A checkpoint's
    stored cell is code like any other: it runs only with `trust_cell=True`, for a checkpoint
    you made yourself. `options` override the saved options (e.g. `epochs=5` to train
    longer, `workers=3`), except those in RESUME_FIXED.

    Example:
        >>> run = nbdist.resume("ckpt", CELL, cluster=cluster, wait=True)   # doctest: +SKIP
    """
    from nbdist.checkpoint.store import load

    if cell is None and not trust_cell:  # before anything is read: a shared folder is not code
        raise CheckpointError(
            f"nbdist.resume({os.fspath(checkpoint)!r}) got no cell (Received: cell=None). A "
            "checkpoint's stored cell is code, and nbdist runs it only when you say you trust it. "
            "Pass the cell that builds the model, nbdist.resume(path, cell, ...), or, for a "
            "checkpoint you made yourself, nbdist.resume(path, trust_cell=True, ...).")
    ckpt = load(checkpoint)  # verified whole before anything starts
    config = _resumed_config(ckpt, options)
    source = ckpt.meta.get("cell") if cell is None else cell
    if not isinstance(source, str):
        raise CheckpointError(f"The checkpoint {ckpt.path} holds no cell source; pass the cell "
                              "that builds the model: nbdist.resume(path, cell, ...).")
    return _start(source, config, cluster, namespace, wait, ckpt)


def _resumed_config(ckpt, options: dict) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    saved = {k: v for k, v in ckpt.meta["config"].items() if k in known}
    shard0 = ckpt.meta["shards"][0]
    if saved.get("mode") == "sync" or int(saved.get("local_steps", 1)) > 1:
        saved["lr"] = shard0["lr"]  # the live rate of the ranks or the local-step workers
    # (the hub optimizer's live rate, a set_lr included, comes back with its saved state)
    # rule options changed from their defaults (given, or set live) carry over; defaults that
    # depend on the number of workers (softsync's n, easgd's alpha) follow the new run's
    from nbdist.algorithms import RULES

    defaults = RULES[shard0["rule"]].default_options(int(ckpt.meta.get("num_workers") or 1))
    saved["algo_options"] = {k: v for k, v in shard0["rule_options"].items() if defaults.get(k) != v}
    for flag, option in (("staleness", "staleness"), ("n", "n"), ("groups", "num_groups")):
        if option in saved["algo_options"]:  # the live value wins over the flag it came from
            saved[flag] = "auto" if flag == "groups" else None
    try:
        base = TrainConfig(**saved)
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"The checkpoint {ckpt.path} holds options this nbdist refuses: {exc}") from None
    for name in RESUME_FIXED:  # before the other options, which may only fit the saved ones
        if name in options and _shown(options[name]).lower() != _shown(getattr(base, name)):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} is {_shown(options[name])} here but the checkpoint was taken with "
                f"{_shown(getattr(base, name))}; the saved state only means something with the "
                f"same value. Drop {flag} to keep the checkpoint's.")
    config = base.replace(**options)
    if config.epochs < ckpt.meta["schedule"]["epochs"]:
        raise ConfigError(f"--epochs {config.epochs} is fewer than the checkpointed run's "
                          f"{ckpt.meta['schedule']['epochs']}; a resumed run can train longer, not "
                          "shorter. Drop --epochs, or pass a larger number.")
    return config


def _shown(value: object) -> str:
    return str(getattr(value, "value", value))


def _start(cell: str, config: TrainConfig, cluster, namespace: dict | None, wait: bool, ckpt=None) -> Run:
    if config.mode in (Mode.ASYNC, Mode.SYNC) and cluster is None:
        raise NoClusterError(
            "No cluster to train on. Start one with %nbdist start 3 (or nbdist.Cluster.start(3)), "
            "connect with %nbdist connect --profile P, or use --mode local to train in this kernel."
        )
    ns = {} if namespace is None else namespace
    if config.mode is Mode.SIMULATE:  # the seed also fixes the cell's initial weights
        import keras

        keras.utils.set_random_seed(config.seed)
    exec(compile(cell, "<%%distribute cell>", "exec"), ns)  # noqa: S102 - the user's own cell
    contents = inspect_cell(cell, ns, config)
    from nbdist.engine.flatmodel import layout

    model = contents.model
    shape = layout(model)
    from nbdist.engine.learning_rate import check_lr

    check_lr(config.lr if ckpt is None else None, model.optimizer)  # a resume keeps the saved rate
    optimizer, warnings = _hub_optimizer(config, model, shape)
    if config.mode is Mode.SIMULATE:
        from nbdist.modes.simulate.simulation import start_simulation

        return start_simulation(config, contents, ns, wait, optimizer, warnings, cluster)

    from nbdist.engine.flatmodel import read_flat
    from nbdist.hub.client import HubControl
    from nbdist.hub.server import HubSpec
    from nbdist.modes.async_ps.backend import ClusterBackend, LocalBackend, hub_specs
    from nbdist.modes.async_ps.worker import WorkerSpec, portable

    params, non_trainable = read_flat(model)
    if ckpt is not None:  # checked before any engine is used
        ckpt.check_fits(shape, contents.num_samples, config.servers)
        ckpt.check_optimizer(optimizer)
        params, non_trainable = ckpt.params, ckpt.non_trainable
        if config.mode is Mode.SYNC:
            from nbdist.checkpoint.sync_state import check_optimizer

            check_optimizer(ckpt, model)
    if config.checkpoint_dir is not None:
        from nbdist.checkpoint.store import prepare_dir

        prepare_dir(config.checkpoint_dir)
    if config.mode is Mode.LOCAL:
        backend = LocalBackend(ns)
    elif config.mode is Mode.SYNC:
        from nbdist.modes.sync.backend import SyncBackend

        backend = SyncBackend(cluster, config.workers, config.checkpoint_dir)
    else:
        backend = ClusterBackend(cluster, config.servers, config.workers)
    plan, options, easgd_alpha = _plan(config, contents, _workers_rate(config, model.optimizer),
                                       backend.num_workers)
    key, run_id = new_key(), uuid.uuid4().hex[:12]
    sync = config.mode is Mode.SYNC
    base = HubSpec(run_id=run_id, key=key, shard=0, num_shards=config.servers, plan=plan,
                   params=params, non_trainable=non_trainable, rule_options=options,
                   local_steps=config.local_steps, optimizer=optimizer,
                   idle_timeout=config.timeout,
                   extra_bytes=8 * params.nbytes + non_trainable.nbytes if sync else 0)
    hub_params = params[:0] if sync else params  # in sync mode the hub holds no parameters
    specs = hub_specs(base, hub_params, 1 if sync else config.servers)
    if ckpt is not None:
        specs = [replace(s, restore=r) for s, r in zip(specs, ckpt.shard_restores(), strict=True)]
    endpoints = backend.start_hubs(specs)
    control = HubControl(key, endpoints, timeout=min(30.0, config.timeout))  # a lost hub fails the run within --timeout
    fields = dict(
        run_id=run_id, key=key, worker=0, shards=endpoints, layout=shape,
        model_name=contents.model_name, data=contents.data, validation=contents.validation,
        seed=config.seed, num_samples=contents.num_samples, batch_size=config.batch_size,
        source=cell, pushed=portable(contents.pushed), transport=config.transport.value,
        timeout=config.timeout, compression=config.compression.value, stream=contents.streamed,
        num_workers=backend.num_workers, preloaded=contents.arrays if config.mode is Mode.LOCAL else None,
    )
    steps = dict(overlap=config.overlap, local_steps=config.local_steps, easgd_alpha=easgd_alpha)
    try:
        if sync:
            from nbdist.checkpoint.sync_state import resume_fields
            from nbdist.modes.sync.backend import SyncSpec

            lr = config.lr if config.lr is not None else _cell_rate(model.optimizer)
            backend.start_workers(SyncSpec(**fields, epochs=config.epochs, lr=lr, initial_params=params,
                                           initial_non_trainable=non_trainable,
                                           checkpoint=config.checkpoint_dir is not None,
                                           sync_batchnorm=config.batchnorm_synced,
                                           **resume_fields(ckpt, config.epochs)))
        else:
            backend.start_workers(WorkerSpec(**fields, **steps))
    except BaseException:
        control.shutdown()  # nothing may be left serving
        control.close()
        raise
    run = Run(config, model, contents.model_name, contents.warnings + warnings, contents.notes)
    run._checkpoint_info = {  # noqa: SLF001 - what every checkpoint of this run records
        "run_id": run_id, "config": config.to_dict(), "cell": cell, "model_name": contents.model_name,
        "layout": shape, "num_samples": contents.num_samples, "num_workers": backend.num_workers,
        "resumed_from": ckpt.path if ckpt is not None else None}
    servers = list(getattr(getattr(backend, "roles", None), "servers", ()))  # none in local mode
    run.hubs = [] if sync else [  # sync: the kernel's metrics hub holds no parameters
        {"shard": i, "host": ep.get("host", "").split(":")[0], "engine": servers[i] if i < len(servers) else None}
        for i, ep in enumerate(endpoints)]
    run._begin(backend, control, run_id)  # noqa: SLF001
    if wait:
        run.wait()
    return run


def _hub_optimizer(config: TrainConfig, model, shape: dict) -> tuple[dict | None, list[str]]:
    """The optimizer the hubs apply (None in sync mode, where each rank keeps the cell's)."""
    if config.mode is Mode.SYNC:
        return None, []
    from nbdist.engine.optimizer_spec import choose_optimizer

    segments = [math.prod(s) for s in shape["trainable"]]
    return choose_optimizer(config, model.optimizer, segments, list(model.trainable_variables))


def _cell_rate(optimizer) -> float:
    """The cell optimizer's rate now (a schedule's value at its current step)."""
    import numpy as np

    return float(np.asarray(optimizer.learning_rate))


def lr_owner(config: TrainConfig) -> str:
    """Who applies the learning rate: the sync ranks and the --local-steps (and easgd) workers
    with the cell's own optimizer, or else the hub's optimizer."""
    workers = config.mode is Mode.SYNC or config.local_steps > 1 or config.algorithm is Algorithm.EASGD
    return "workers" if workers else "hub"


def _workers_rate(config: TrainConfig, cell_optimizer) -> float | None:
    """The rate the coordinator tells workers that own it (None: they keep their optimizer's
    own rate or schedule); unused when the hub owns the rate."""
    from nbdist.engine.learning_rate import schedule_name

    if config.lr is None and schedule_name(cell_optimizer) is not None:
        return None
    return config.lr if config.lr is not None else _cell_rate(cell_optimizer)


def _plan(config: TrainConfig, contents, lr: float | None, num_workers: int):
    """The coordinator's plan, the rule's options and EASGD's alpha for this run."""
    from nbdist.core.coordinator import Plan

    if config.slowdown is not None and len(config.slowdown) != num_workers:
        raise ConfigError(
            f"--slowdown gives {len(config.slowdown)} factor(s) for {num_workers} worker(s). "
            f"Give one per worker, e.g. --slowdown {','.join(['1'] * num_workers)}."
        )
    from nbdist.algorithms import make_rule

    algorithm = config.algorithm.value
    options = config.rule_options()
    rule = make_rule(algorithm, 0, num_workers, options)  # bounds that depend on the workers
    easgd_alpha = float(rule.options["alpha"]) if config.algorithm is Algorithm.EASGD else 0.0
    plan = Plan(
        num_workers=num_workers, num_samples=contents.num_samples, epochs=config.epochs,
        batch_size=config.batch_size, lr=lr, has_validation=contents.validation is not None,
        algorithm=algorithm, staleness=(options.get("staleness", 3) if algorithm == "ssp" else None),
        groups=int(options.get("num_groups", 0)), max_group_ratio=float(options.get("max_ratio", 1.5)),
        chunks_ahead=config.local_steps if config.local_steps > 1 else (2 if config.overlap else 1),
        # default floor: a quarter of the batch. When a slow node's fixed cost per step alone
        # is as long as a fast node's whole step, equal step times would mean 1-sample batches,
        # whose gradients are mostly noise; --batch-min 1 allows that if wanted.
        dbs=config.dbs, batch_min=config.batch_min or max(1, config.batch_size // 4),
        batch_max=config.batch_max,
        slowdown=list(config.slowdown or [1.0] * num_workers), staleness_lr=config.staleness_lr,
        metrics=config.metrics.value, lr_owner=lr_owner(config))
    return plan, options, easgd_alpha
