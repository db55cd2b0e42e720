"""One package per training mode, each with a `start(job, *, cluster, wait) -> Run`:

- `async_ps`: the hub (parameter-server shards) and one worker per engine of a cluster;
- `local`: the same hub and one worker as threads of this kernel, no cluster needed;
- `sync`: Horovod allreduce between ranks on the cluster's engines;
- `simulate`: a virtual cluster on a virtual clock, in this kernel;
- `pipeline`: the model cut into stages, one per engine, micro-batches in flight.

What they share lives below them in `common/`, which is no mode; no mode package imports
another (tests/unit/test_layering.py).

`MODES` is the table `nbdist.train` looks a mode up in. A new mode is one entry here (and its
`--mode` value in `nbdist.config.Mode`) plus its package; the package is imported only when a
run uses it, so `import nbdist` stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from nbdist.errors import NoClusterError


@dataclass(frozen=True)
class ModeEntry:
    """Where a mode's `start` lives, and what the kernel must know before running the cell."""

    module: str  # the module with `start(job, *, cluster=None, wait=False) -> Run`
    needs_cluster: bool  # refused at once, before the cell runs, without a cluster
    # --seed also fixes the cell's initial weights (simulate: bit-identical runs)
    seeds_cell: bool = False


MODES: dict[str, ModeEntry] = {
    "async": ModeEntry("nbdist.modes.async_ps.start", needs_cluster=True),
    "local": ModeEntry("nbdist.modes.local.start", needs_cluster=False),
    "sync": ModeEntry("nbdist.modes.sync.start", needs_cluster=True),
    "simulate": ModeEntry("nbdist.modes.simulate.start", needs_cluster=False, seeds_cell=True),
    # pipeline says itself that it needs a cluster, with the number of engines its stages need
    "pipeline": ModeEntry("nbdist.modes.pipeline.start", needs_cluster=False),
}


def mode_entry(mode: str) -> ModeEntry:
    """The table's entry for `mode` (a `nbdist.config.Mode` or its string)."""
    name = str(getattr(mode, "value", mode))
    if name not in MODES:
        from nbdist.errors import ConfigError

        raise ConfigError(f"No start for --mode {name} (Received: {name!r}). Known modes: "
                          f"{', '.join(MODES)}.")
    return MODES[name]


def check_cluster(mode: str, cluster) -> None:
    """Refuse a mode that trains on a cluster when there is none, before the cell runs."""
    if mode_entry(mode).needs_cluster and cluster is None:
        raise NoClusterError(
            "No cluster to train on. Start one with %nbdist start 3 (or nbdist.Cluster.start(3)), "
            "connect with %nbdist connect --profile P, or use --mode local to train in this kernel."
        )


def start_function(mode: str) -> Callable:
    """The mode's `start(job, *, cluster, wait) -> Run`, its package imported now."""
    return importlib.import_module(mode_entry(mode).module).start
