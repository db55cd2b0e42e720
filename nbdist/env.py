"""Every `NBDIST_*` environment switch, declared once and read with one rule.

The switches are for people measuring or working around a platform (the flags of the magics
are for runs): each is declared here with its type, default and help, `switch(name)` reads it
when it is needed (each call looks again, so a test or a benchmark may set it in between),
and docs/reference.md is generated from `SWITCHES` (scripts/gen_reference.py).

One parsing rule: a boolean is on for 1/true/yes/on and off for 0/false/no/off (any case);
unset or empty means the default; anything else raises a ConfigError that names the switch,
what it received and what it takes. `nbdist.train` checks them all (`check_all`) before a
run starts, so a typo is refused in the kernel rather than in a hub on an engine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from nbdist.errors import ConfigError

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Switch:
    """One environment variable: `kind` is bool, int, float, "choice" or "path"."""

    name: str
    kind: type | str
    default: object
    help: str
    choices: tuple[str, ...] = ()
    minimum: float = 0
    shown_default: str | Callable[[], str] | None = None  # for a default that is computed

    @property
    def shown(self) -> str:
        if self.shown_default is not None:
            return self.shown_default() if callable(self.shown_default) else self.shown_default
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if self.default is None:
            return "unset"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    @property
    def takes(self) -> str:
        """What the switch accepts, as a person writes it."""
        if self.kind is bool:
            return "0 or 1 (or false/true, no/yes, off/on)"
        if self.kind in (int, float):
            return f"a {'whole ' if self.kind is int else ''}number >= {self.minimum:g}"
        return " or ".join(self.choices) if self.kind == "choice" else "a folder"

    def parse(self, text: str | None) -> object:
        """The value of `text` (the variable's content; None or blank: the default)."""
        if text is None or not text.strip():
            return self.default
        value = text.strip()
        try:
            if self.kind is bool:
                if value.lower() in ON + OFF:
                    return value.lower() in ON
            elif self.kind in (int, float):
                number = self.kind(value)
                if number >= self.minimum:
                    return number
            elif self.kind == "choice":
                if value.lower() in self.choices:
                    return value.lower()
            else:
                return value
        except ValueError:
            pass
        raise ConfigError(f"The environment variable {self.name} takes {self.takes} (Received: "
                          f"{self.name}={text!r}). Set it to one of those, or unset it for the "
                          f"default ({self.shown}).")


# NBDIST_HUB_THREADS's default cap, read by the hub's pool (nbdist.hub.threads): past 4 threads
# one shard's update is bound by memory, not by cores
HUB_THREADS_MAX = 4

SWITCHES: dict[str, Switch] = {s.name: s for s in (
    Switch("NBDIST_COURIER", bool, True,
           "workers whose arrays cross TCP may hand an overlapped step's exchange to a thread of "
           "its own, where that is measured faster; 0: never"),
    Switch("NBDIST_DASHBOARD", "choice", "auto",
           "text: the text status line instead of the widget dashboard; auto: widgets where they "
           "can render", choices=("auto", "text")),
    Switch("NBDIST_DATA", "path", None,
           "folder nbdist.datasets searches first for data sets such as Fashion-MNIST"),
    Switch("NBDIST_HUB_PROCESS", bool, True,
           "each hub shard runs as its own process on its engine; 0: as a thread inside the "
           "engine"),
    Switch("NBDIST_HUB_SNAPSHOT_S", float, 2.0,
           "seconds between the kernel's snapshots of every hub shard's state (--mode async), "
           "from which a free engine takes over a lost shard; 0: none, and a lost shard fails "
           "the run", minimum=0.0),
    Switch("NBDIST_HUB_THREADS", int, None, "update threads per hub shard (1: one pass, no pool)",
           minimum=1, shown_default=f"half the host's cores, at most {HUB_THREADS_MAX}"),
    Switch("NBDIST_KERNELS", bool, True,
           "the hub's compiled update kernel; 0: NumPy, which gives the same numbers"),
    Switch("NBDIST_LOCAL_LINE", bool, True,
           "same-host workers reach a hub shard over a Unix seqpacket socket; 0: over ZeroMQ's "
           "ipc"),
    Switch("NBDIST_MAC_THREADS_MIN_MB", float, 64.0,
           "from this many MB of arrays in one message on, the MAC hashes on BLAKE3's threads "
           "(0: always)"),
    Switch("NBDIST_MALLOPT", bool, True,
           "processes receiving large frames let glibc reuse the freed buffers (mallopt); 0: leave "
           "malloc as it is"),
    Switch("NBDIST_STATELESS", bool, True,
           "engines compute gradients with Keras's stateless_call where the model has it; 0: "
           "assign the weights, then compute"),
)}


def switch(name: str) -> object:
    """The switch's value now (its default when unset); raises ConfigError when malformed.

    Example:
        >>> switch("NBDIST_KERNELS") in (True, False)
        True
    """
    return SWITCHES[name].parse(os.environ.get(name))


def check_all() -> None:
    """Refuse any malformed switch now (one ConfigError naming it); warn of an `NBDIST_*`
    variable that is no switch (a typo would otherwise be ignored)."""
    for name in SWITCHES:
        switch(name)
    unknown = sorted(n for n in os.environ if n.startswith("NBDIST_") and n not in SWITCHES)
    if unknown:
        logging.getLogger(__name__).warning(
            "nbdist ignores the environment variable(s) %s: no such switch (Received: %s). The "
            "switches are %s (docs/reference.md).", ", ".join(unknown),
            ", ".join(f"{n}={os.environ[n]!r}" for n in unknown), ", ".join(SWITCHES))
