"""The `Rule` base class: hyper-parameters by name, checked once, changeable live.

A rule is what the hub applies to each push. The base class owns what every rule shares,
so each rule only writes its update:
- `options`: the rule's hyper-parameters, seeded from `default_options(num_workers)`;
- `set_option(name, value)`: a live change from the notebook, validated the same way as at
  construction (unknown name or bad value -> `ConfigError`, a `ValueError`);
- no-op `on_pull` and `forget` for rules that keep no per-worker state.

Rules are used by one thread (the hub's loop); they are not locked.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from nbdist.algorithms.kernels import STREAM_MIN, copy_out
from nbdist.errors import ConfigError

Option = float | int


def unknown_option(name: str, owner: str, valid: dict[str, Option]) -> ConfigError:
    """"Unknown option 'lamda' for dc-asgd. Valid: lambda0=0.04." """
    listed = ", ".join(f"{k}={v:g}" for k, v in valid.items()) or "(none)"
    return ConfigError(f"Unknown option {name!r} for {owner}. Valid: {listed}.")


class Rule:
    """Base of the update rules. Subclasses set `name` and override `on_push`. Public as
    `nbdist.Rule`: a rule written in the notebook is one too (`nbdist.algorithms.custom`,
    docs/rules.md "A rule of your own").

    Example:
        >>> from nbdist.algorithms import make_rule
        >>> rule = make_rule("asgd", size=2, num_workers=1)
        >>> w = np.array([1, 2], np.float32)
        >>> rule.on_push(0, w, np.array([0.5, -1], np.float32), lr=0.5, delay=0)
        True
        >>> w.tolist()
        [0.75, 2.5]
    """

    name: ClassVar[str] = ""
    consistent_reads: ClassVar[bool] = True
    # attributes a checkpoint saves to continue exactly (float32 arrays or numbers); per-worker
    # state that a worker's next pull rebuilds (DC backups, SSP clocks) is not listed
    state_fields: ClassVar[tuple[str, ...]] = ()
    reads_kept = 1  # reads per worker a rule that keeps them holds: 2 with --overlap (make_updater)
    # The catalogue: what a rule can be combined with, which nbdist.config, the coordinator's
    # plan and docs/reference.md read. Every rule states each itself, not by inheritance
    # (tests/unit/test_rules.py); its options and their defaults are `default_options`.
    # --predict-weights works: a push is one gradient applied as it comes, read from a buffer
    # the hub writes (DC-ASGD's compensation assumes the plain read; buffering rules apply later)
    predicts_weights: ClassVar[bool] = False
    # --momentum-correction works: each push, as it lands, is one step of the cell's optimizer
    # (ddc-asgd is its own momentum; softsync and group average pushes first; easgd pushes none)
    corrects_momentum: ClassVar[bool] = False
    # the rule corrects a late push itself (DC-ASGD's curvature term), so a push one update old
    # does not lower the largest stable learning rate as it does plain ASGD's
    compensates_delay: ClassVar[bool] = False
    # --local-steps works: the update is linear in what is pushed, so a K-step delta is treated
    # like a gradient
    takes_local_steps: ClassVar[bool] = False
    # the workers step with the cell's own optimizer, so they own the learning rate
    workers_step: ClassVar[bool] = False
    # the hub holds a group's pushes at a barrier and applies their mean as one update (the
    # coordinator's speed groups say who steps with whom: nbdist.core.speed_groups)
    syncs_groups: ClassVar[bool] = False
    # with --local-steps, a worker's round takes at most its share of an epoch's samples (the
    # others' batches beside its own), as in a synchronous group: no worker takes the epoch alone
    shares_rounds: ClassVar[bool] = False
    # options the workers (not only the hub) act on from the run's start: `run.set_option`
    # refuses to change them live
    fixed_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, size: int, num_workers: int, **options: Option):
        if size < 0 or num_workers < 1:
            raise ConfigError(f"A rule needs size >= 0 and num_workers >= 1. "
                              f"Received: size={size}, num_workers={num_workers}.")
        self.size = int(size)
        self.num_workers = int(num_workers)
        self._options: dict[str, Option] = dict(self.default_options(self.num_workers))
        for key, value in options.items():
            self._options[key] = self._checked(key, value)

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        """Hyper-parameters and their defaults; an int default makes an integer option."""
        return {}

    @property
    def options(self) -> dict[str, Option]:
        """The current hyper-parameters by name (a copy)."""
        return dict(self._options)

    def set_option(self, name: str, value: float) -> None:
        """Change one hyper-parameter; it takes effect at the next push."""
        self._options[name] = self._checked(name, value)

    def _checked(self, name: str, value: float) -> Option:
        if name not in self._options:
            raise unknown_option(name, self.name, self._options)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                or not math.isfinite(value):
            raise ConfigError(f"Option {name!r} of {self.name} must be a finite number. "
                              f"Received: {value!r}.")
        if isinstance(self._options[name], int):
            if value != int(value):
                raise ConfigError(f"Option {name!r} of {self.name} must be a whole number. "
                                  f"Received: {value!r}.")
            value = int(value)
        else:
            value = float(value)
        low, high = self._bounds(name)
        if not low <= value <= high:
            raise ConfigError(f"Option {name!r} of {self.name} must be in [{low:g}, {high:g}]. "
                              f"Received: {value!r}.")
        return value

    def _bounds(self, name: str) -> tuple[float, float]:
        """Allowed closed range of an option; subclasses narrow it."""
        return 0.0, math.inf

    def on_pull(self, worker: int, w: np.ndarray, version: int) -> None:
        """Called when `worker` reads `w` at `version`; most rules need nothing."""

    def computed_at(self, worker: int, lag: int) -> None:
        """`worker`'s next push was computed on the weights it read `lag` pulls before its
        latest (1 for an overlapped step, which computes while the last reply is in flight);
        rules that keep what a worker read (DC-ASGD's backups) use that read."""

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        """Apply `g` (read `delay` versions ago) to `w` in place; True if `w` changed."""
        raise NotImplementedError

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        """What the hub's optimizer applies for this push: a gradient and its rate scale, or
        None while the rule holds the push back. This is how a rule composes with any Keras
        optimizer (`nbdist.core.updater`); plain rules pass `g` and `scale` through. The result
        may be the rule's own scratch: use it before the next push."""
        return g, scale

    def push_and_read(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int,
                      out: np.ndarray) -> bool:
        """`on_push`, then a copy of the new `w` into `out` (the worker's pull). Rules whose
        update is one pass over memory override this to do both in that pass."""
        changed = self.on_push(worker, w, g, lr, delay)
        copy_out(out, w, out.size >= STREAM_MIN)
        return changed

    def forget(self, worker: int) -> None:
        """`worker` left: free whatever the rule holds for it."""

    @property
    def state_nbytes(self) -> int:
        """Bytes the rule holds beyond `w` (scratch, backups, moments)."""
        return 0
