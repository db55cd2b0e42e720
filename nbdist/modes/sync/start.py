"""`--mode sync`: one rank per worker engine (Horovod or torch.distributed, `--collective`); a
metrics-and-control hub (no weights) in this kernel."""

from __future__ import annotations

from dataclasses import replace

from nbdist.checkpoint.sync_state import check_optimizer, resume_fields
from nbdist.errors import ConfigError
from nbdist.fit.plan import sync_batches
from nbdist.job import Job, cell_rate
from nbdist.modes.common.launch import prepare_checkpoint_dir, start_through_hubs
from nbdist.modes.sync.backend import SyncBackend, choose_collective, plaintext_note
from nbdist.modes.sync.rank import SyncSpec
from nbdist.run.handle import Run

COLLECTIVE_NOTES = {  # run.events says what averaged the gradients
    "horovod": "Horovod's allreduce (Gloo) inside the compiled TensorFlow step",
    "torch": "torch.distributed's allreduce (a Gloo group) on the flat gradient buffer, then the "
             "cell's optimizer on Keras's backend"}


def start(job: Job, *, cluster=None, wait: bool = False) -> Run:
    """Start the ranks of `job` on `cluster`'s worker engines."""
    config, ckpt = job.config, job.checkpoint
    if ckpt is not None:  # the saved slots must fit the cell's optimizer, before any engine is used
        check_optimizer(ckpt, job.model)
    collective = choose_collective(config.collective.value, job.keras_backend)
    if collective == "torch" and config.sync_batchnorm and job.keras_backend == "tensorflow":
        raise ConfigError(
            "--sync-batchnorm allreduces BatchNorm statistics inside the forward pass: with "
            "--collective torch on Keras's PyTorch and JAX backends (over the Gloo group), with "
            "Horovod's ops on TensorFlow, but not inside TensorFlow's graph through torch "
            f"(Received: --sync-batchnorm with --collective "
            f"{config.collective.value}, which runs torch.distributed on Keras's "
            f"{job.keras_backend} backend). Drop --sync-batchnorm (each rank keeps its own "
            "statistics, averaged at the end), use --collective horovod on TensorFlow, or "
            "KERAS_BACKEND=torch or jax.")
    prepare_checkpoint_dir(job)
    backend = SyncBackend(cluster, config.workers, config.checkpoint_dir, pin=config.pin == "auto",
                          collective=collective,
                          batch_bounds=(config.batch_min or 1, config.batch_max))
    if job.fit is not None and job.fit.split_batch:  # the ranks share the cell's fit batch
        each, warning = sync_batches(job.fit.batch, backend.num_workers)
        config = config.replace(batch_size=each)
        job = replace(job, config=config, warnings=[*job.warnings, *([warning] if warning else [])])
    job = job.for_workers(backend.num_workers)
    said = COLLECTIVE_NOTES[collective]
    job = replace(job, contents=replace(job.contents, notes=[
        *job.contents.notes, f"--collective {config.collective.value}: {said}"]))
    note = plaintext_note(bool(getattr(cluster, "encrypt", False)),
                          [backend.hosts[e] for e in backend.roles.workers])
    if note is not None:
        job.warnings.append(note)
    params, non_trainable = job.params, job.non_trainable
    lr = config.lr if config.lr is not None else cell_rate(job.model.optimizer)
    rank = dict(epochs=config.epochs, lr=lr, initial_params=params,
                initial_non_trainable=non_trainable, checkpoint=config.checkpoint_dir is not None,
                sync_batchnorm=config.batchnorm_synced, collective=collective,
                **resume_fields(ckpt, config.epochs))
    return start_through_hubs(job, backend, lambda fields: SyncSpec(**fields, **rank), wait=wait,
                              shards=1, hub_params=params[:0],  # the ranks hold the weights
                              extra_bytes=8 * params.nbytes + non_trainable.nbytes)
