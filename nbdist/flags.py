"""Every flag of both magics, declared once: its spelling, what it takes, its default, the modes
it applies to and its help.

Responsible for:
- `option(...)`: a `TrainConfig` field with its flag's declaration in the field's metadata;
  the training options of `%%distribute` are exactly TrainConfig's fields.
- `Flag`: one declaration, from which the magic's parser (`add_to_parser`), `%%distribute?`,
  the checks on `nbdist.train(**options)` (`check_option_names`) and `docs/reference.md`
  (scripts/gen_reference.py) are derived.
- `distribute_flags()` / `nbdist_flags()`: the flags of each magic, in the order shown.
- `given_options(args)`: which training options a magic line gave; a flag not given is absent,
  so TrainConfig (or a resumed checkpoint) supplies the value.

Pure standard library: `import nbdist` loads this module through `nbdist.config`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from nbdist.errors import ConfigError

if TYPE_CHECKING:
    import argparse


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag of a magic. `option`: a `TrainConfig` field (an `nbdist.train` keyword);
    otherwise the magic handles it itself (display, the `Run`'s variable, resume)."""

    name: str  # the TrainConfig field or the parsed attribute
    help: str
    modes: tuple[str, ...] | None = None  # the modes it applies to (None: every mode; (): no run's)
    flag: str | None = None  # its spelling, if not "--" + name with "-" for "_"
    short: str | None = None  # a one-letter alias ("-o")
    type: Callable | None = None  # converts the text on the line (None: kept as text)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None  # callable: late
    switch: bool = False  # takes no value: given means True
    negatable: bool = False  # --name and --no-name
    positional: bool = False
    optional_value: bool = False  # a positional that may be left out
    metavar: str | None = None
    default: object = None  # what a run gets when the flag is not given
    shown_default: str | Callable[[], str] | None = None  # for a default that is not a plain value
    option: bool = True
    actions: tuple[str, ...] | None = None  # %nbdist: the actions that take it (None: every one)

    @property
    def spelling(self) -> tuple[str, ...]:
        if self.positional:
            return (self.name,)
        long = self.flag or "--" + self.name.replace("_", "-")
        return (self.short, long) if self.short else (long,)

    @property
    def choice_values(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    @property
    def shown(self) -> str | None:
        """The default as a person writes it, or None where there is nothing to show."""
        if self.shown_default is not None:
            return self.shown_default() if callable(self.shown_default) else self.shown_default
        if self.default is None or self.switch or self.positional:
            return None
        return format_value(self.default)

    def help_line(self, modes: bool = True) -> str:
        """The help with its default and, unless it applies to every mode, its modes."""
        notes = [f"default: {self.shown}"] if self.shown is not None else []
        if modes and self.modes:
            notes.append("modes: " + ", ".join(self.modes))
        if self.actions:
            notes.append("%nbdist " + " or ".join(self.actions))
        return self.help + (f" ({'; '.join(notes)})" if notes else "")

    def parser_arguments(self) -> tuple[tuple[str, ...], dict]:
        """`ArgumentParser.add_argument`'s arguments. A training option not given is left out
        of the parsed namespace (argparse.SUPPRESS), so it can be told from its default."""
        import argparse  # here, not at `import nbdist`

        kwargs: dict = {"help": self.help_line().replace("%", "%%")}
        if self.switch:
            kwargs["action"] = "store_true"
        elif self.negatable:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=self.type, choices=self.choice_values, metavar=self.metavar)
            if self.optional_value:
                kwargs["nargs"] = "?"
        if not self.positional:
            kwargs["dest"] = self.name  # --algo-opt fills algo_options
        if self.option:
            kwargs["default"] = argparse.SUPPRESS
        elif not self.positional or self.optional_value:
            kwargs["default"] = False if self.switch else self.default
        return self.spelling, {k: v for k, v in kwargs.items() if v is not None or k == "default"}


def format_value(value: object) -> str:
    """A default as it is written on the magic line: 'x_train,y_train', 'async', '2GiB'."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def option(default: object, help: str,  # noqa: A002 - argparse's name for it
           modes: Iterable[str] | None = None, *, choices=None,
           **declaration) -> dataclasses.Field:
    """A TrainConfig field declared with its flag. `choices` may be an Enum class (its
    values); `declaration` takes `Flag`'s other fields (type, flag, shown_default, ...)."""
    if isinstance(choices, type) and issubclass(choices, enum.Enum):
        choices = tuple(str(m.value) for m in choices)
    modes = None if modes is None else tuple(map(str, modes))
    declaration.update(help=help, modes=modes, choices=choices)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default),
                                 metadata={"flag": declaration})
    return dataclasses.field(default=default, metadata={"flag": declaration})


def late(module: str, name: str) -> Callable[[], object]:
    """`module.name` (called, if a function) when a parser or docs/reference.md is built, for a
    declaration whose value lives in a module `import nbdist` must not load (NumPy's)."""
    def look_up() -> object:
        value = getattr(importlib.import_module(module), name)
        return value() if callable(value) else value
    return look_up


def auto_or_int(text: str) -> str | int:
    """--groups: 'auto' or a whole number."""
    import argparse

    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expects 'auto' or a whole number (Received: {text!r})") from None


@functools.cache
def config_flags() -> tuple[Flag, ...]:
    """The training options, from TrainConfig's fields, in their order."""
    from nbdist.config import TrainConfig

    flags = []
    for field in dataclasses.fields(TrainConfig):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        flags.append(Flag(name=field.name, default=default, **field.metadata["flag"]))
    return tuple(flags)


# The magic's own flags: what it shows and where it puts the Run. Not options of nbdist.train.
MAGIC_FLAGS = (
    Flag("resume", "continue from this checkpoint folder (nbdist.resume); flags given here "
                   "override the saved ones", ("async", "local", "sync"), option=False,
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
    from nbdist.cluster.netaddr import LAUNCHERS  # standard library only

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
    """Declare `flags` on an argparse parser (or an IPython MagicArgumentParser)."""
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
    import difflib

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
