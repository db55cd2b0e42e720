"""`--mode local`: the hub shards and one worker as threads of this kernel."""

from __future__ import annotations

from nbdist.engine.flat_layout import rng_state
from nbdist.job import Job
from nbdist.modes.common.launch import prepare_checkpoint_dir, start_through_hubs
from nbdist.modes.common.worker import WorkerSpec
from nbdist.modes.local.backend import LocalBackend
from nbdist.run.handle import Run


def start(job: Job, *, cluster=None, wait: bool = False) -> Run:
    """Train `job` in this kernel (`cluster` is not used); the worker trains on the arrays the
    kernel already holds, in the notebook's namespace."""
    config = job.config
    prepare_checkpoint_dir(job)
    backend = LocalBackend(job.namespace if job.trainer_namespace is None
                           else job.trainer_namespace)
    job = job.for_workers(backend.num_workers)
    steps = dict(overlap=config.overlap, local_steps=config.local_steps,
                 easgd_alpha=job.easgd_alpha, rng_state=rng_state(job.model),
                 **job.streaming_fields())
    return start_through_hubs(job, backend, lambda fields: WorkerSpec(**fields, **steps), wait=wait,
                              shards=config.servers, hub_params=job.params,
                              preloaded=job.contents.arrays)
