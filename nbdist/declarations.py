"""How a flag is declared: `Flag`, one flag's declaration, and `option(...)`, a `TrainConfig`
field that carries its flag's declaration in the field's metadata.

Below both `nbdist.config` (whose fields are declared with `option`) and `nbdist.flags` (which
gathers each magic's flags): pure standard library, loaded by `import nbdist`.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag of a magic. `option`: a `TrainConfig` field (an `nbdist.train` keyword);
    otherwise the magic handles it itself (display, the `Run`'s variable, resume)."""

    name: str  # the TrainConfig field or the parsed attribute
    help: str
    # the modes it applies to (None: every mode; (): no run's); a training option's come from
    # nbdist.modes (`modes_taking`)
    modes: tuple[str, ...] | None = None
    flag: str | None = None  # its spelling, if not "--" + name with "-" for "_"
    short: str | None = None  # a one-letter alias ("-o")
    type: Callable | None = None  # converts the text on the line (None: kept as text)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None  # callable: late
    # other values are taken too, and TrainConfig checks them (--algorithm: a rule of yours)
    open_choices: bool = False
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
        kwargs: dict = {"help": self.help_line().replace("%", "%%")}
        if self.switch:
            kwargs["action"] = "store_true"
        elif self.negatable:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=self.type, metavar=self.metavar,
                          choices=None if self.open_choices else self.choice_values)
            if self.open_choices and self.metavar is None:
                kwargs["metavar"] = "{" + ",".join(self.choice_values or ()) + ",...}"
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


def option(default: object, help: str, *,  # noqa: A002 - argparse's name for it
           choices=None, **declaration) -> dataclasses.Field:
    """A TrainConfig field declared with its flag. `choices` may be an Enum class (its
    values); `declaration` takes `Flag`'s other fields (type, flag, shown_default, ...). The
    modes that take it are not declared here: `nbdist.modes.ModeSpec.takes` says."""
    if isinstance(choices, type) and issubclass(choices, enum.Enum):
        choices = tuple(str(m.value) for m in choices)
    declaration.update(help=help, choices=choices)
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
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expects 'auto' or a whole number (Received: {text!r})") from None
