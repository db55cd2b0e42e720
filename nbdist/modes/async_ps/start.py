"""`--mode async`: hub shards on their own engines, one worker per other engine."""

from __future__ import annotations

from nbdist.engine.flat_layout import rng_state
from nbdist.job import Job
from nbdist.modes.async_ps.backend import ClusterBackend
from nbdist.modes.common.launch import prepare_checkpoint_dir, start_through_hubs
from nbdist.modes.common.worker import WorkerSpec
from nbdist.run.handle import Run


def start(job: Job, *, cluster=None, wait: bool = False) -> Run:
    """Place the hubs and workers on `cluster`'s engines and start training `job`."""
    config = job.config
    prepare_checkpoint_dir(job)
    # no polling over tcp: it gains nothing there
    backend = ClusterBackend(cluster, config.servers, config.workers, pin=config.pin == "auto",
                             spin=config.spin == "auto" and config.transport != "tcp")
    job = job.for_workers(backend.num_workers)
    steps = dict(overlap=config.overlap, local_steps=config.local_steps,
                 easgd_alpha=job.easgd_alpha, rng_state=rng_state(job.model),
                 **job.streaming_fields())
    return start_through_hubs(job, backend, lambda fields: WorkerSpec(**fields, **steps), wait=wait,
                              shards=config.servers, hub_params=job.params, lease=True)
