"""`nbdist.train` and `nbdist.resume`: everything `%%distribute` does, as plain functions.

Both run the cell in the kernel first (`_start`; a cell with its own `model.fit(...)` call runs
up to that call), so mistakes show before any engine is touched and the notebook's own model
exists; then `nbdist.job.prepare_job` decides the job from what the cell left, and the mode's
`start` (looked up through `nbdist.modes.MODES`) starts the hubs and workers and returns a Run
at once. `resume` first loads and verifies a checkpoint, so a missing or corrupt
one is refused before anything starts.
"""

from __future__ import annotations

import dataclasses
import os

from nbdist.algorithms import RULES, rule_class
from nbdist.algorithms.custom import register_named
from nbdist.checkpoint.store import load
from nbdist.config import TrainConfig
from nbdist.engine.cell_traceback import compile_cell
from nbdist.engine.fit_call import fit_intercepted
from nbdist.engine.keras_backend import when_imported
from nbdist.env import check_all as check_switches
from nbdist.errors import CheckpointError, ConfigError
from nbdist.fit.launch import FitLauncher, Presenter, start_function
from nbdist.flags import check_option_names
from nbdist.job import prepare_job
from nbdist.modes import check_cluster, mode_spec
from nbdist.run.handle import Run


def train(cell: str, *, cluster=None, namespace: dict | None = None, wait: bool = False,
          config: TrainConfig | None = None, presenter=None, **options) -> Run:
    """Train the model defined by `cell` (ordinary single-machine Keras code) distributed.

    `options` are TrainConfig's fields (mode, algorithm, workers, servers, epochs, batch_size,
    lr, model, data, validation, ...; every one is listed in docs/reference.md), each one the
    `%%distribute` flag of the same name; an unknown one is refused, naming the close ones.
    `config`: a TrainConfig to start from (`options` then override it). `namespace` is where
    the cell runs in the kernel (the notebook's namespace from the magic; a fresh dict by
    default).

    A cell that calls `model.fit(...)` itself is trained by that call's settings (epochs,
    batch size, validation, callbacks, ...; `options` override them): the call blocks while
    the run trains and returns Keras's `History`, then the rest of the cell runs on the
    trained model, so `train` returns the finished Run. `presenter` (`nbdist.fit.launch.Presenter`)
    is how the magic shows the run and keeps its dashboard live while the call waits.

    Example:
        >>> cluster = nbdist.Cluster.start(3)                              # doctest: +SKIP
        >>> run = nbdist.train(CELL, cluster=cluster, workers=2, epochs=2)  # doctest: +SKIP
        >>> run.wait().history.tail()                                      # doctest: +SKIP
    """
    check_option_names(options)
    given = dict(options)
    register_named(namespace, options.get("algorithm"), set(RULES))  # a rule of the user's
    config = config.replace(**options) if config is not None else TrainConfig(**options)
    return _start(cell, config, cluster, namespace, wait, given=given, presenter=presenter)


# Options a resumed run must keep: they decide what the saved state means.
RESUME_FIXED = ("mode", "algorithm", "servers", "seed", "local_steps", "server_optimizer")
# Options of the run that took the checkpoint alone: a resumed run gets them only if given again.
# The folder above all: a checkpoint read from a shared folder, or another run's, names that
# folder, and a run that adopted it would rotate and delete the files there.
RESUME_DROPPED = ("pause_at", "checkpoint_dir", "checkpoint_every")


def resume(checkpoint: str | os.PathLike, cell: str | None = None, *, cluster=None,
           namespace: dict | None = None, wait: bool = False, trust_cell: bool = False,
           presenter=None, **options) -> Run:
    """Continue a run from a checkpoint: weights, update-rule state, versions, learning rate
    and data position are restored, and only the samples not yet trained on are trained on.

    `checkpoint` is a --checkpoint-dir folder (or the path `run.checkpoint()` returned);
    `cell` is the code that builds the model (the magic passes its own cell). A checkpoint's
    stored cell is code like any other: it runs only with `trust_cell=True`, for a checkpoint
    you made yourself. `options` override the saved options (e.g. `epochs=5` to train
    longer, `workers=3`), except those in RESUME_FIXED. The checkpoint's own folder is never
    written to unless it is given again: without `checkpoint_dir=`, the resumed run takes no
    checkpoints (`run.warnings` says so; `run.checkpoint(folder)` still works).

    Example:
        >>> run = nbdist.resume("ckpt", CELL, cluster=cluster, wait=True)   # doctest: +SKIP
    """
    check_option_names(options)
    if cell is None and not trust_cell:  # before anything is read: a shared folder is not code
        raise CheckpointError(
            f"nbdist.resume({os.fspath(checkpoint)!r}) got no cell (Received: cell=None). A "
            "checkpoint's stored cell is code, and nbdist runs it only when you say you trust it. "
            "Pass the cell that builds the model, nbdist.resume(path, cell, ...), or, for a "
            "checkpoint you made yourself, nbdist.resume(path, trust_cell=True, ...).")
    ckpt = load(checkpoint)  # verified whole before anything starts
    register_named(namespace, ckpt.meta["config"].get("algorithm"), set(RULES))
    config = _resumed_config(ckpt, options)
    source = ckpt.meta.get("cell") if cell is None else cell
    if not isinstance(source, str):
        raise CheckpointError(f"The checkpoint {ckpt.path} holds no cell source; pass the cell "
                              "that builds the model: nbdist.resume(path, cell, ...).")
    return _start(source, config, cluster, namespace, wait, ckpt, given=dict(options),
                  presenter=presenter)


def _resumed_config(ckpt, options: dict) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    saved = {k: v for k, v in ckpt.meta["config"].items() if k in known and k not in RESUME_DROPPED}
    if options.get("checkpoint_dir") is not None and "checkpoint_every" not in options:
        # the same folder given again, or another: the saved interval carries over
        saved["checkpoint_every"] = ckpt.meta["config"].get("checkpoint_every")
    shard0 = ckpt.meta["shards"][0]
    if (mode_spec(saved.get("mode", "async")).lr_owner == "workers"
            or int(saved.get("local_steps", 1)) > 1):
        saved["lr"] = shard0["lr"]  # the live rate of the ranks or the local-step workers
    # (the hub optimizer's live rate, a set_lr included, comes back with its saved state)
    # rule options changed from their defaults (given, or set live) carry over; defaults that
    # depend on the number of workers (softsync's n, easgd's alpha) follow the new run's
    defaults = rule_class(shard0["rule"]).default_options(int(ckpt.meta.get("num_workers") or 1))
    saved["algo_options"] = {k: v for k, v in shard0["rule_options"].items()
                             if defaults.get(k) != v}
    for flag, option in (("staleness", "staleness"), ("n", "n"), ("groups", "num_groups")):
        if option in saved["algo_options"]:  # the live value wins over the flag it came from
            saved[flag] = "auto" if flag == "groups" else None
    try:
        base = TrainConfig(**saved)
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"The checkpoint {ckpt.path} holds options this nbdist refuses: "
                              f"{exc}") from None
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


def _resume_notice(job):
    """A resumed job without a checkpoint folder, told so in run.warnings (it takes none)."""
    if job.checkpoint is None or job.config.checkpoint_dir is not None:
        return job
    return job.told([
        f"resumed from {job.checkpoint.path} with no --checkpoint-dir: this run takes no "
        "checkpoints, periodic or final, and writes nothing into the checkpoint's folder. Pass "
        "checkpoint_dir=FOLDER (--checkpoint-dir FOLDER; the same folder to go on there) to keep "
        "checkpointing, or call run.checkpoint(FOLDER)."])


def _shown(value: object) -> str:
    return str(getattr(value, "value", value))


def _start(cell: str, config: TrainConfig, cluster, namespace: dict | None, wait: bool,
           ckpt=None, *, given: dict | None = None, presenter=None) -> Run:
    """Run the cell in the kernel, then the mode's start (`nbdist.modes.MODES`) on the job it
    describes. A cell that reaches its own `model.fit(...)` call is trained from inside that
    call (`nbdist.fit.launch`; one run per call), and the last call's Run is returned once the
    whole cell has run."""
    check_switches()  # a malformed NBDIST_* switch is refused here, not on an engine
    check_cluster(config.mode, cluster)  # before the cell runs
    ns = {} if namespace is None else namespace
    presenter = presenter or Presenter()
    start = start_function(config.mode)
    launcher = FitLauncher(cell, config, ns, cluster, ckpt, dict(given or {}), presenter,
                           lambda job, **kw: start(_resume_notice(job), **kw))
    # --seed also fixes the cell's initial weights (simulate), as soon as the cell imports Keras
    seed = mode_spec(config.mode).seeds_cell
    with fit_intercepted(launcher.on_fit), \
            when_imported(lambda keras: seed and keras.utils.set_random_seed(config.seed)):
        exec(compile_cell(cell), ns)  # noqa: S102 - the user's own cell
    launcher.check_resumed()
    if launcher.run is not None:  # trained inside the cell's fit call, and the cell has finished
        return launcher.run
    job = prepare_job(cell, config, ns, ckpt)
    run = launcher.start(job, cluster=cluster, wait=False)
    presenter.started(run)
    if wait:
        presenter.wait(run, lambda: None)  # raises the run's error, if it failed
    return run
