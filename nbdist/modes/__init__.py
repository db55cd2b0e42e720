"""One package per training mode, each with a `start(job, *, cluster, wait) -> Run`, and one
`ModeSpec` per mode saying, as plain data, what the mode takes and can do:

- `async_ps`: the hub (parameter-server shards) and one worker per engine of a cluster;
- `local`: the same hub and one worker as threads of this kernel, no cluster needed;
- `sync`: Horovod allreduce between ranks on the cluster's engines;
- `simulate`: a virtual cluster on a virtual clock, in this kernel;
- `pipeline`: the model cut into stages, one per engine, micro-batches in flight.

What they share lives below them in `common/`, which is no mode; no mode package imports
another (tests/unit/test_layering.py).

`MODES` is the table of specs. Everything that differs by mode reads it: the refusal of a flag
a mode does not take (`refuse_flags`), each flag's modes in help and docs/reference.md
(`modes_taking`), the Keras backends a mode trains on, who owns the learning rate, whether
checkpoints, `--resume` or `run.add_workers` apply. (Every mode takes a cell's own
`model.fit(...)` call.) Only rules
between several options' values stay hand-written (nbdist.config).

This module is plain data on the standard library (`nbdist.config` reads it at
`import nbdist`); it names each mode's package (`ModeSpec.module`) and imports none: the entry
layer imports one when a run uses it (`nbdist.fit.launch.start_function`).
A new mode is one entry here (and its `--mode` value in `nbdist.config.Mode`) plus its package.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nbdist.errors import ConfigError, NoClusterError

BACKENDS = ("tensorflow", "jax", "torch")  # the Keras backends nbdist trains on
# the options every mode takes; every other TrainConfig field is taken only by the modes whose
# `ModeSpec.takes` names it (tests/unit/test_modes.py: each field is one or the other)
EVERY_MODE = frozenset({"mode", "epochs", "batch_size", "lr", "model", "data", "validation",
                        "in_memory_limit", "no_validation", "seed"})
# what the Run may ask of a mode's backend beyond starting, watching and ending the run
# ("take_over": start a lost hub shard anew from the kernel's snapshot, nbdist.run.takeover;
# "restart": start the workers again on the engines left when one's engine dies,
# nbdist.run.restart)
OPERATIONS = ("checkpoint", "add_workers", "take_over", "restart")

_RULE = frozenset({"algorithm", "algo_options", "staleness_lr", "predict_weights",
                   "momentum_correction", "precise_bn", "average_tail", "staleness",
                   "n", "groups", "server_optimizer"})  # the hub applies an update rule
_COORDINATED = frozenset({"dbs", "batch_min", "batch_max", "slowdown", "metrics", "pause_at"})
_CHECKPOINTS = frozenset({"checkpoint_dir", "checkpoint_every"})
_PIPELINE = frozenset({"stages", "micro_batches", "partition", "schedule"})


@dataclass(frozen=True)
class ModeSpec:
    """What one `--mode` is, takes and supports. Plain data: nothing here runs the mode."""

    name: str  # the --mode value
    module: str  # the module with `start(job, *, cluster=None, wait=False) -> Run`
    summary: str  # what it is, after "--mode NAME ..." in messages and docs
    takes: frozenset[str]  # the TrainConfig options it takes beyond EVERY_MODE
    # refused at once, before the cell runs, without a cluster (pipeline says itself that it
    # needs one, with the number of engines its stages need)
    needs_cluster: bool
    # who applies the optimizer, and so the learning rate: "hub" (the hub's copy of the cell's
    # optimizer, or --server-optimizer) or "workers" (each applies the cell's own)
    lr_owner: str
    operations: frozenset[str]  # the OPERATIONS its backend supports
    backends: tuple[str, ...] = BACKENDS  # the Keras backends it trains on
    backends_why: str = ""  # why not the others: "--mode NAME {backends_why}, so ..."
    # the workers are threads of this kernel: with a fit call they train a private copy of the
    # model, so the notebook's holds each epoch's weights
    in_kernel: bool = False
    # the workers build the data by running the cell on engines: the kernel cannot send them an
    # object such as a tf.data.Dataset from another cell
    cell_on_engines: bool = False
    seeds_cell: bool = False  # --seed also fixes the cell's initial weights (bit-identical runs)

    @property
    def checkpoints(self) -> bool:
        """Whether it keeps checkpoints (--checkpoint-dir, run.checkpoint(), --resume)."""
        return "checkpoint" in self.operations

    def supports(self, operation: str) -> bool:
        if operation not in OPERATIONS:
            raise ValueError(f"Unknown backend operation {operation!r}; known: {OPERATIONS}.")
        return operation in self.operations


MODES: dict[str, ModeSpec] = {spec.name: spec for spec in (
    ModeSpec(
        "async", "nbdist.modes.async_ps.start",
        "trains on nbdist's parameter server, on the cluster's engines",
        _RULE | _COORDINATED | _CHECKPOINTS | {
            "workers", "servers", "transport", "compression", "timeout", "local_steps", "overlap",
            "pin", "spin", "elastic"},
        needs_cluster=True, lr_owner="hub",
        operations=frozenset({"checkpoint", "add_workers", "take_over"}),
        cell_on_engines=True),
    ModeSpec(
        "local", "nbdist.modes.local.start",
        "trains with one worker thread and the hub inside this kernel",
        _RULE | _COORDINATED | _CHECKPOINTS | {
            "workers", "servers", "transport", "timeout", "local_steps", "overlap"},
        needs_cluster=False, lr_owner="hub",
        operations=frozenset({"checkpoint"}), in_kernel=True),
    ModeSpec(
        "sync", "nbdist.modes.sync.start",
        "averages gradients with an allreduce between the cluster's engines (Horovod, or "
        "torch.distributed), with no parameter server",
        _COORDINATED | _CHECKPOINTS | {
            "workers", "compression", "timeout", "pin", "sync_batchnorm", "precise_bn",
            "collective"},
        needs_cluster=True, lr_owner="workers",
        operations=frozenset({"checkpoint", "restart"}), cell_on_engines=True),
    ModeSpec(
        "simulate", "nbdist.modes.simulate.start",
        "runs virtual workers on a virtual clock in this kernel, and replays a run from its "
        "seed instead of checkpointing it",
        _RULE | _COORDINATED | {"workers", "sim", "compression", "local_steps"},
        needs_cluster=False, lr_owner="hub", operations=frozenset(),
        in_kernel=True, seeds_cell=True),
    ModeSpec(
        "pipeline", "nbdist.modes.pipeline.start",
        "cuts the model into stages, one engine each, with micro-batches in flight",
        _PIPELINE | {"transport", "timeout"},
        needs_cluster=False, lr_owner="workers", operations=frozenset({"restart"}),
        cell_on_engines=True),
)}


def mode_spec(mode: object) -> ModeSpec:
    """The spec of `mode` (a `nbdist.config.Mode` or its string)."""
    name = str(getattr(mode, "value", mode))
    if name not in MODES:
        raise ConfigError(f"Unknown --mode {name!r}. Expected one of: {', '.join(MODES)}. "
                          f"Pass one of those, e.g. --mode {next(iter(MODES))}.")
    return MODES[name]


def modes_taking(option: str) -> tuple[str, ...] | None:
    """The modes that take TrainConfig option `option`, in MODES's order; None: every mode."""
    if option in EVERY_MODE:
        return None
    return tuple(name for name, spec in MODES.items() if option in spec.takes)


def modes_that(operation: str) -> tuple[str, ...]:
    """The modes whose backend supports `operation` (one of OPERATIONS)."""
    return tuple(name for name, spec in MODES.items() if spec.supports(operation))


def refuse_flags(mode: object, given: Iterable[tuple[str, str, str]]) -> None:
    """Refuse the options `mode` does not take, in one message naming each flag, the modes it
    works with and how to fix it. `given`: (option, its flag, the value shown) for each option
    set away from its default."""
    spec = mode_spec(mode)
    refused = [(option, flag, shown) for option, flag, shown in given
               if option not in EVERY_MODE and option not in spec.takes]
    if not refused:
        return
    received = ", ".join(f"{flag} {shown}".rstrip() for _, flag, shown in refused)
    by_modes: dict[tuple[str, ...], list[str]] = {}  # flags that work with the same modes
    for option, flag, _ in refused:
        by_modes.setdefault(modes_taking(option), []).append(flag)
    where = [f"{_and(flags)} {'works' if len(flags) == 1 else 'work'} with --mode "
             f"{', '.join(modes) or 'none'}" for modes, flags in by_modes.items()]
    one = len(refused) == 1
    raise ConfigError(
        f"{_and([flag for _, flag, _ in refused])} {'does' if one else 'do'} not apply to --mode "
        f"{spec.name}, which {spec.summary} (Received: {received}). {'; '.join(where)}. Drop "
        f"{'the flag' if one else 'them'}, or pick one of those modes.")


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def refuse_operation(mode: object, operation: str, what: str) -> None:
    """Refuse `what` (e.g. "run.add_workers([3])") when `mode`'s backend lacks `operation`."""
    spec = mode_spec(mode)
    if spec.supports(operation):
        return
    raise ConfigError(
        f"{what} does not apply to --mode {spec.name}, which {spec.summary} (Received: {what} on "
        f"a --mode {spec.name} run). It works with --mode {', '.join(modes_that(operation))}: "
        "start the run in one of those.")


def refuse_backend(mode: object, backend: str) -> str | None:
    """Why `mode` cannot train on Keras backend `backend`, or None where it can."""
    spec = mode_spec(mode)
    if backend in spec.backends:
        return None
    names = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
    takes = " or ".join(names[b] for b in spec.backends)
    return (f"--mode {spec.name} {spec.backends_why}, so it trains only on Keras's {takes} "
            f"backend (Received: this kernel's Keras backend is {backend}).")


def check_cluster(mode: str, cluster) -> None:
    """Refuse a mode that trains on a cluster when there is none, before the cell runs."""
    if mode_spec(mode).needs_cluster and cluster is None:
        raise NoClusterError(
            "No cluster to train on. Start one with %nbdist start 3 (or nbdist.Cluster.start(3)), "
            "connect with %nbdist connect --profile P, or use --mode local to train in this kernel."
        )
