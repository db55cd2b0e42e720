"""What the modes' `start`s share once their backend exists: start the hub shards and the
workers from a `Job` (async, local and sync modes), and hand the running job to a `Run`
(`begin_run`; pipeline builds its own Run and calls `Run.begin`). Kernel side; it only reads
the job."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from nbdist.algorithms.constraints import constrained_ranges
from nbdist.checkpoint.folder import FolderLock
from nbdist.checkpoint.store import prepare_dir
from nbdist.core.liveness import lease_term
from nbdist.core.sharding import shard_bounds
from nbdist.engine.rule_by_value import custom_rule
from nbdist.engine.run_cell import portable
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import HubSpec
from nbdist.job import Job
from nbdist.run.backend import Backend
from nbdist.run.handle import Run

# how often the kernel renews its lease while it starts the workers (a short lease: 4 per term)
RENEW_EVERY_S = 1.0


def prepare_checkpoint_dir(job: Job) -> None:
    """Check (and create) --checkpoint-dir before any engine is used."""
    if job.config.checkpoint_dir is not None:
        prepare_dir(job.config.checkpoint_dir)


def hub_specs(base: HubSpec, params: np.ndarray, num_shards: int) -> list[HubSpec]:
    """One spec per shard, each with its slice (no constrained variable cut); non-trainable
    state lives on shard 0."""
    empty = np.zeros(0, dtype=np.float32)
    bounds = shard_bounds(params.size, num_shards, whole=constrained_ranges(base.constraints))
    return [replace(base, shard=i, num_shards=num_shards, params=params[lo:hi].copy(), offset=lo,
                    non_trainable=base.non_trainable if i == 0 else empty)
            for i, (lo, hi) in enumerate(bounds)]


def start_through_hubs(job: Job, backend: Backend, make_worker_spec: Callable[[dict], object], *,
                       wait: bool,
                       shards: int, hub_params: np.ndarray, extra_bytes: int = 0,
                       preloaded: tuple | None = None, lease: bool = False) -> Run:
    """Start `shards` hub shards holding `hub_params` (restored from the job's checkpoint when
    resuming), then the workers from `make_worker_spec(fields)`, and return the running Run.
    `job` has its plan (`Job.for_workers`). A failed start leaves nothing serving. `lease`: the
    hubs live on engines, which may outlive this kernel, so they end the run once it has been
    silent for --timeout, with a last checkpoint into --checkpoint-dir (`nbdist.hub.orphan`)."""
    config = job.config
    key, run_id = new_key(), uuid.uuid4().hex[:12]
    base = HubSpec(run_id=run_id, key=key, shard=0, num_shards=config.servers, plan=job.plan,
                   params=job.params, non_trainable=job.non_trainable,
                   rule_options=job.rule_options, local_steps=config.local_steps,
                   optimizer=job.optimizer, constraints=job.constraints,
                   idle_timeout=config.timeout, extra_bytes=extra_bytes,
                   rule=custom_rule(job.plan.algorithm), shapes=job.layout["trainable"])
    if lease:
        base = replace(base, lease_s=lease_term(config.timeout), last_checkpoint=(
            None if config.checkpoint_dir is None else
            {"dir": os.path.abspath(config.checkpoint_dir), "info": job.checkpoint_info(run_id)}))
    specs = hub_specs(base, hub_params, shards)
    if job.checkpoint is not None:
        specs = [replace(s, restore=r)
                 for s, r in zip(specs, job.checkpoint.shard_restores(), strict=True)]
    folder = hold_checkpoint_dir(job, run_id)  # another run's folder: refused before any hub starts
    try:
        control, endpoints = _start_hubs_and_workers(job, backend, make_worker_spec, specs, key,
                                                     preloaded)
    except BaseException:
        if folder is not None:
            folder.release()
        raise
    return begin_run(job, backend, control, run_id, wait=wait, hubs=backend.hub_places(endpoints),
                     folder=folder)


def _start_hubs_and_workers(job: Job, backend, make_worker_spec, specs: list[HubSpec], key: bytes,
                            preloaded) -> tuple[HubControl, list[dict]]:
    config, run_id = job.config, specs[0].run_id
    endpoints = backend.start_hubs(specs)
    # a lost hub fails the run within --timeout
    control = HubControl(key, endpoints, timeout=min(30.0, config.timeout), transport="auto")
    fields = dict(
        run_id=run_id, key=key, worker=0, shards=endpoints, layout=job.layout,
        batch_size=config.batch_size, source=job.cell, pushed=portable(job.contents.pushed),
        transport=config.transport.value, timeout=config.timeout,
        compression=config.compression,
        num_workers=backend.num_workers, preloaded=preloaded, **job.worker_fields(),
    )
    # hubs on engines hold this kernel to a lease, renewed by what it says: its silence while
    # the workers start must not keep them training long after a kernel that died meanwhile
    lease_s = specs[0].lease_s
    renewing = (control.renewing(min(RENEW_EVERY_S, lease_s / 4)) if lease_s is not None
                else contextlib.nullcontext())
    try:
        with renewing:
            backend.start_workers(make_worker_spec(fields))
    except BaseException:
        control.shutdown()  # nothing may be left serving
        control.close()
        raise
    return control, endpoints


def hold_checkpoint_dir(job: Job, run_id: str):
    """This run's claim on --checkpoint-dir (`nbdist.checkpoint.folder`), or None without one;
    CheckpointError if another run holds it."""
    if job.config.checkpoint_dir is None:
        return None
    return FolderLock(job.config.checkpoint_dir, run_id)


def begin_run(job: Job, backend: Backend, control, run_id: str, *, wait: bool,
              hubs: list[dict] | None = None, folder=None) -> Run:
    """The Run of a job whose hubs (or simulation) and workers have started; it waits for the
    end when `wait`. `folder`: its claim on --checkpoint-dir, given back when it ends."""
    run = Run(job.config, job.model, job.model_name, job.warnings, job.contents.notes)
    run.state.write_model = job.fit is None  # a fit call: the kernel writes each epoch's weights
    if job.fit is not None:  # ... and its History is the run's result (Run.fit_call_returned)
        run.state.fit_call_returned = threading.Event()
    run.state.settle_model = job.settle_model if job.precise_bn else None
    run.begin(backend, control, run_id, hubs=hubs, checkpoint_info=job.checkpoint_info(run_id),
              checkpoint_folder=folder)
    if wait:
        run.wait()
    return run
