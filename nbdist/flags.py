"""Every flag of both magics, gathered from their declarations (`nbdist.declarations`): the
training options are exactly TrainConfig's fields, the modes each applies to come from the
modes' specs (`nbdist.modes`).

Responsible for:
- `config_flags()`: one `Flag` per TrainConfig field, from which the magic's parser (each
  flag's `parser_arguments`, as `magic_arguments` decorators: `nbdist.magic.declared`),
  `%%distribute?`, the checks on `nbdist.train(**options)` (`check_option_names`) and
  `docs/reference.md` (scripts/gen_reference.py) are derived.
- `distribute_flags()` / `nbdist_flags()`: the flags of each magic, in the order shown.
- `given_options(args)`: which training options a magic line gave; a flag not given is absent,
  so TrainConfig (or a resumed checkpoint) supplies the value.

Pure standard library; `nbdist.api` and the magic load it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nbdist.cluster.netaddr import LAUNCHERS
from nbdist.config import TrainConfig
from nbdist.declarations import Flag
from nbdist.errors import ConfigError
from nbdist.modes import modes_taking, modes_that

if TYPE_CHECKING:
    import argparse


@functools.cache
def config_flags() -> tuple[Flag, ...]:
    """The training options, from TrainConfig's fields, in their order, each with the modes
    that take it."""
    flags = []
    for field in dataclasses.fields(TrainConfig):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        flags.append(Flag(name=field.name, default=default, modes=modes_taking(field.name),
                          **field.metadata["flag"]))
    return tuple(flags)


# The magic's own flags: what it shows and where it puts the Run. Not options of nbdist.train.
MAGIC_FLAGS = (
    Flag("resume", "continue from this checkpoint folder (nbdist.resume); flags given here "
                   "override the saved ones", modes_that("checkpoint"), option=False,
         metavar="FOLDER"),
    Flag("wait", "block until training ends", switch=True, option=False),
    Flag("no_dashboard", "do not show the live dashboard", switch=True, option=False),
    Flag("top_k", "dashboard: draw only the k slowest workers and the mean of the others", type=int,
         shown_default="all workers; the slowest few when there are many", option=False,
         metavar="K"),
    Flag("output", "variable that receives the Run", short="-o", default="_nbdist_run",
         option=False, metavar="NAME"),
)


def distribute_flags() -> tuple[Flag, ...]:
    """`%%distribute`'s flags: the training options, then the magic's own."""
    return config_flags() + MAGIC_FLAGS


@functools.cache
def nbdist_flags() -> tuple[Flag, ...]:
    """`%nbdist`'s arguments: the cluster's lifecycle (no training options)."""
    return (
        Flag("action", "start N engines, connect to a running ipcluster, show status, or stop", (),
             positional=True, choices=CLUSTER_ACTIONS, option=False),
        Flag("n", "number of engines", (), positional=True, optional_value=True, type=int,
             option=False, metavar="N", actions=("start",)),
        Flag("profile", "ipyparallel profile (e.g. one set up for Slurm)", (), option=False,
             shown_default="ipyparallel's default", actions=("start", "connect")),
        Flag("cluster_id", "cluster id of a running ipcluster", (), option=False,
             actions=("connect",)),
        Flag("encrypt", "CurveZMQ on ipyparallel's channel and on nbdist's hub sockets "
                        "(untrusted networks)", (), switch=True, option=False,
             actions=("start", "connect")),
        Flag("launcher", "how the engines are started (ipyparallel's launchers): local "
                         "processes, one Slurm job (sbatch), or MPI ranks (mpiexec)", (),
             choices=tuple(LAUNCHERS), default="local", option=False, actions=("start",)),
    )


CLUSTER_ACTIONS = ("start", "connect", "status", "stop")


def misplaced(args: argparse.Namespace, flags: Iterable[Flag]) -> list[Flag]:
    """The `%nbdist` arguments given (not at their default) to an action that does not take
    them, which it would ignore."""
    return [flag for flag in flags if flag.actions is not None and args.action not in flag.actions
            and getattr(args, flag.name) != (False if flag.switch else flag.default)]


def add_to_parser(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Declare `flags` on a plain argparse parser, as the magic's own parser has them (which
    `nbdist.magic.declared` builds from the same `parser_arguments`, as IPython's
    `magic_arguments` decorators): for tests and scripts that parse a magic line."""
    for flag in flags:
        names, kwargs = flag.parser_arguments()
        parser.add_argument(*names, **kwargs)


def given_options(args: argparse.Namespace) -> dict:
    """The training options a parsed `%%distribute` line gave explicitly, as `nbdist.train`
    keywords. A flag not given is absent: TrainConfig, a resumed checkpoint (or whatever else
    supplies the run's settings) decides its value.

    Example:
        >>> import argparse
        >>> parser = argparse.ArgumentParser()
        >>> add_to_parser(parser, distribute_flags())
        >>> given_options(parser.parse_args(["--epochs", "1", "--dbs", "--wait"]))
        {'epochs': 1, 'dbs': True}
    """
    names = {flag.name for flag in config_flags()}
    return {name: value for name, value in vars(args).items() if name in names}


def check_option_names(names: Iterable[str]) -> None:
    """Refuse a keyword that is no training option, naming the close ones."""
    known = [flag.name for flag in config_flags()]
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    name = unknown[0]
    if name == "resume":
        hint = "To continue from a checkpoint, call nbdist.resume(path, cell, ...)."
    elif name in {flag.name for flag in MAGIC_FLAGS}:
        hint = (f"{name} is a display flag of the %%distribute magic, not a training option: drop "
                "it (nbdist.train(..., wait=True) blocks until the run ends).")
    else:
        close = difflib.get_close_matches(name, known, n=3)
        hint = (f"Did you mean {' or '.join(close)}?" if close else
                f"Expected one of TrainConfig's fields: {', '.join(known)}.")
    raise ConfigError(f"Unknown training option {name!r} (Received: {', '.join(unknown)}). {hint} "
                      "docs/reference.md lists every option.")
