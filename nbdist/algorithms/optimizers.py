"""The cell's Keras optimizer, reproduced on the hub: one `optimizer.apply` per applied gradient.

Responsible for (the kernel's reading of the cell's optimizer into a spec, and its refusals,
is `optimizer_spec.describe_optimizer`):
- `server_optimizer_spec`: the same kind of spec for `--server-optimizer` with `--local-steps`;
- `HubOptimizer`: what one hub shard applies: clipping, weight decay, the learning rate (a
  constant, a schedule at the hub's step, or the notebook's override) and the class's update
  formula (`optimizer_rules`), with its slots per shard, exportable for checkpoints.

Formulas and their order follow Keras 3's source (`keras/src/optimizers/base_optimizer.py`
`apply` and the TensorFlow backend's clipping and weight decay), in float32 like Keras.
Importing this module loads NumPy only.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from nbdist.algorithms.blocks import BLOCK, Ranges, Runner, intersect, run_serial
from nbdist.algorithms.optimizer_rules import FORMULAS, UpdateFormula
from nbdist.algorithms.schedules import schedule_value
from nbdist.choices import ServerOptimizer
from nbdist.errors import CheckpointError, ConfigError, UnsupportedOptimizerError

__all__ = [
    "SUPPORTED_OPTIMIZERS",
    "HubOptimizer",
    "initial_rate",
    "momentum_setting",
    "server_optimizer_spec",
    "sum_of_squares",
]

_F = np.float32

SUPPORTED_OPTIMIZERS: tuple[str, ...] = tuple(FORMULAS)

# Settings every Keras optimizer has, with their Keras defaults (AdamW decays by 0.004).
BASE_DEFAULTS: dict[str, float | None] = {
    "weight_decay": None, "clipnorm": None, "clipvalue": None, "global_clipnorm": None}
_CLASS_BASE_DEFAULTS: dict[str, dict[str, float | None]] = {"AdamW": {"weight_decay": 0.004}}
_DEFAULT_LR = {"SGD": 0.01}  # the others' Keras default is 0.001

_PROCEED = "Pass --server-optimizer sgd to train with SGD at the cell's learning rate on purpose."
# What each --server-optimizer applies (its names: nbdist.choices.ServerOptimizer, which
# tests/unit/test_rules.py keeps in step): the Keras class, its config, the rate when none is given
SERVER_OPTIMIZERS: dict[str, tuple[str, dict, float]] = {
    ServerOptimizer.SGD: ("SGD", {}, 1.0),  # rate 1: the hub replays the worker's K steps
    ServerOptimizer.MOMENTUM: ("SGD", {"momentum": 0.9}, 1.0),
    # Adam moves each weight by about lr per push whatever the delta's size: 1.0 is far too large
    ServerOptimizer.ADAM: ("Adam", {}, 1e-2),
    # DiLoCo's outer optimizer (Douillard et al. 2023): Nesterov momentum 0.9 at rate 0.7
    ServerOptimizer.NESTEROV: ("SGD", {"momentum": 0.9, "nesterov": True}, 0.7),
}


def unsupported(what: str, received: str) -> UnsupportedOptimizerError:
    return UnsupportedOptimizerError(
        f"nbdist cannot reproduce the cell's optimizer on the hub: {what}. Received: {received}. "
        f"Supported: keras.optimizers.{', '.join(SUPPORTED_OPTIMIZERS)} (exactly these classes), "
        f"with clipnorm, clipvalue, global_clipnorm, weight_decay and a built-in learning-rate "
        f"schedule. {_PROCEED}")


def server_optimizer_spec(name: str, lr: float | None, segments: list[int]) -> dict:
    """The spec of nbdist's own `--server-optimizer` choice, applied to `--local-steps` deltas.

    `name` is one of SERVER_OPTIMIZERS ('sgd', 'momentum', 'adam'), at `lr` or its own default.

    Example:
        >>> server_optimizer_spec("momentum", None, [4])["config"]
        {'momentum': 0.9}
    """
    if name not in SERVER_OPTIMIZERS:
        raise ConfigError(f"Unknown server optimizer. Received: {name!r}. Expected one of: "
                          f"{', '.join(SERVER_OPTIMIZERS)}.")
    class_name, config, default_lr = SERVER_OPTIMIZERS[name]
    spec = {"class_name": class_name, "config": dict(config),
            "learning_rate": default_lr if lr is None else float(lr),
            "segments": checked_segments(segments)}
    HubOptimizer(spec, 0)
    return spec


def momentum_setting(spec: dict) -> tuple[str, float] | None:
    """The spec's momentum hyper-parameter and the cell's value of it ('momentum' for SGD and
    RMSprop, 'beta_1' for the Adam family), or None where it has none.

    Example:
        >>> momentum_setting(server_optimizer_spec("momentum", None, [4]))
        ('momentum', 0.9)
        >>> momentum_setting({"class_name": "Adam", "config": {}, "learning_rate": 1e-3})
        ('beta_1', 0.9)
    """
    name, config = _checked_spec(spec)
    key = FORMULAS[name].momentum_key
    return (key, float(config[key])) if key is not None and config[key] > 0 else None


def initial_rate(spec: dict) -> float:
    """The learning rate of the spec's first step (a schedule's value at step 0).

    Example:
        >>> initial_rate(server_optimizer_spec("sgd", 0.5, [4]))
        0.5
    """
    lr = spec.get("learning_rate")
    if isinstance(lr, dict):
        return schedule_value(lr, 0)
    name, _ = _checked_spec(spec)
    return float(_DEFAULT_LR.get(name, 0.001) if lr is None else lr)


def sum_of_squares(g: np.ndarray) -> float:
    """`Σ g²` of a flat float32 gradient (a shard's part of the global norm: the hub adds the
    shards' sums and passes `sqrt` of the total as `HubOptimizer.apply(global_norm=...)`)."""
    return float(np.dot(g, g))


def checked_segments(segments: Any) -> list[int]:
    try:
        sizes = [int(s) for s in segments]
    except (TypeError, ValueError):
        sizes = None
    if sizes is None or any(s < 0 for s in sizes) or sizes != list(segments):
        raise ConfigError(f"segments must be the sizes (non-negative integers) of the model's "
                          f"trainable variables in flat order. Received: {segments!r}.")
    return sizes


# floats from which the formula runs cache block by cache block (one thread, loaded 2-core
# machine: Adam 27.7 -> 19.1 ms at 10M, 10.1 -> 7.6 at 4M, 4.2 -> 3.9 at 2M, 2.5 -> 2.6 at 1M)
CACHE_BLOCKED_MIN = 1 << 21


class HubOptimizer:
    """The optimizer a hub shard applies; slot state per shard.

    The shard holds floats `[offset, offset + size)` of the model's flat vector. `spec["segments"]`
    gives the variable boundaries of the whole vector; the shard intersects them with its range.
    Everything except per-variable clipping is per element, so shards reproduce Keras exactly.
    `clipnorm` clips each variable's gradient by its own norm: a variable cut by a shard
    boundary is clipped per part (each part by the norm of that part), which differs from Keras
    when the whole variable's norm exceeds `clipnorm`. `global_clipnorm` needs the norm over
    all shards: pass it as `global_norm` (else the shard's own norm is used).

    Example:
        >>> spec = server_optimizer_spec("sgd", 0.5, [2])
        >>> opt = HubOptimizer(spec, size=2)
        >>> w = np.array([1, 2], np.float32); opt.apply(w, np.array([0.5, -1], np.float32))
        False
        >>> w.tolist(), opt.iterations
        ([0.75, 2.5], 1)
    """

    def __init__(self, spec: dict, size: int, offset: int = 0):
        self.name, self.config = _checked_spec(spec)
        self._cell_config = dict(self.config)  # `config` is this shard's own: set_momentum
        self.size, self.offset = int(size), int(offset)
        segments = checked_segments(spec.get("segments", ()))
        if self.size < 0 or self.offset < 0 or sum(segments) < self.offset + self.size:
            raise ConfigError(f"The shard [{offset}, {offset} + {size}) is not inside the model's "
                              f"{sum(segments)} floats (segments {segments}). Expected "
                              f"0 <= offset and offset + size <= sum(segments).")
        lr = spec.get("learning_rate")
        self._schedule = lr if isinstance(lr, dict) else None
        if self._schedule is not None:
            schedule_value(self._schedule, 0)  # refuses an unknown or incomplete schedule now
            self._lr = math.nan
        else:
            self._lr = self._checked_lr(_DEFAULT_LR.get(self.name, 0.001) if lr is None else lr)
        self._override: float | None = None
        self.iterations = 0
        # the shard's parts of each variable, as local [start, end), for clipnorm and decay
        self._pieces: list[tuple[int, int, int]] = []
        start = 0
        for index, length in enumerate(segments):
            lo, hi = max(start, self.offset), min(start + length, self.offset + self.size)
            if lo < hi:
                self._pieces.append((lo - self.offset, hi - self.offset, index))
            start += length
        self._decay_runs = self._decayed_runs(spec.get("decay_mask"), len(segments))
        cfg = self.config
        # Keras's precedence in `_clip_gradients`; a non-positive value means off
        self._clip = next((k for k in ("clipnorm", "global_clipnorm", "clipvalue")
                           if cfg[k] is not None and cfg[k] > 0), None)
        self._clipped = np.empty(self.size if self._clip else 0, _F)
        scratch = (np.empty(self.size, _F), np.empty(self.size, _F))
        self._scratch = scratch
        self._formula = FORMULAS[self.name](cfg, self.size, scratch)
        self._run: Runner = run_serial
        self._ranges: list[tuple[int, int]] = [(0, self.size)]
        # per range of `_ranges`: its cache blocks (lo, hi, the formula on them, decay runs);
        # None: one pass over the whole shard (small shards, and Nadam)
        self._parts: (dict[int, list[tuple[int, int, UpdateFormula, list[tuple[int, int]]]]]
                      | None) = None
        if self.size >= CACHE_BLOCKED_MIN and not self._formula.scalars:
            self._parts = self._cache_blocks(self._ranges)

    @property
    def cache_blocked(self) -> bool:
        """Whether each update runs in cache-sized pieces (large shards), rather than as one
        pass over the whole shard (small shards, and Nadam): the same numbers either way."""
        return self._parts is not None

    def use_blocks(self, run: Runner, ranges: Ranges) -> None:
        """Apply weight decay and the formula as the blocks `ranges` of the shard, run by `run`
        (`nbdist.algorithms.blocks`): the same numbers. Nadam stays in one pass: its
        `u_product` advances once per update, not once per block."""
        if self._formula.scalars or len(ranges) <= 1:
            return
        self._run, self._ranges = run, list(ranges)
        self._parts = self._cache_blocks(self._ranges)

    def _cache_blocks(self, ranges: Ranges) -> dict:
        """Each range cut into `BLOCK`-float pieces, each with the formula on its views: every
        pass of the formula over one piece runs while it is in cache (the same numbers)."""
        return {lo: [(a, min(a + BLOCK, hi), _formula_part(self._formula, a, min(a + BLOCK, hi)),
                      intersect(self._decay_runs, a, min(a + BLOCK, hi)))
                     for a in range(lo, hi, BLOCK)]
                for lo, hi in ranges}

    def _decayed_runs(self, mask: Any, num_segments: int) -> list[tuple[int, int]]:
        """Local [start, end) runs that weight decay touches, adjacent pieces merged."""
        if self.config["weight_decay"] is None:
            return []
        if mask is None:
            mask = [True] * num_segments
        if len(mask) != num_segments:
            raise ConfigError(f"decay_mask needs one flag per segment. Received: {len(mask)} flags "
                              f"for {num_segments} segments.")
        runs: list[tuple[int, int]] = []
        for start, end, index in self._pieces:
            if not mask[index]:
                continue
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((start, end))
        return runs

    @staticmethod
    def _checked_lr(lr: Any) -> float:
        value = float(lr)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"A learning rate must be a finite number >= 0. Received: {lr!r}.")
        return float(_F(value))  # Keras keeps it in a float32 variable

    # -- the learning rate ----------------------------------------------------------------

    def learning_rate(self) -> float:
        """The rate the next `apply` uses: the override, else the schedule at `iterations`,
        else the constant."""
        if self._override is not None:
            return self._override
        if self._schedule is not None:
            return schedule_value(self._schedule, self.iterations)
        return self._lr

    def set_learning_rate(self, lr: float) -> None:
        """A constant rate from the notebook; from now on it replaces the schedule, if any."""
        self._override = self._checked_lr(lr)

    @property
    def has_schedule(self) -> bool:
        return self._schedule is not None

    # -- the momentum (nbdist.algorithms.momentum lowers it under staleness) ---------------

    @property
    def momentum_key(self) -> str | None:
        """The setting that carries past gradients into a step ('momentum' for SGD and
        RMSprop, 'beta_1' for the Adam family), or None where the cell set none (plain SGD,
        RMSprop without momentum, Adagrad)."""
        key = self._formula.momentum_key
        return key if key is not None and self._cell_config[key] > 0 else None

    @property
    def cell_momentum(self) -> float:
        """The cell's own value of `momentum_key` (0.0 where there is none)."""
        key = self.momentum_key
        return float(self._cell_config[key]) if key is not None else 0.0

    @property
    def momentum(self) -> float:
        """The value of `momentum_key` the next `apply` uses."""
        key = self.momentum_key
        return float(self.config[key]) if key is not None else 0.0

    def set_momentum(self, value: float) -> None:
        """Use `value` in place of the cell's momentum (or β1) from the next `apply` on, every
        cache block alike (they share this config). No-op where the optimizer has none."""
        key = self.momentum_key
        if key is not None:
            self.config[key] = float(value)

    @property
    def needs_global_norm(self) -> bool:
        """True when `apply` clips by the global norm (`global_clipnorm`): with several shards,
        pass the norm over all of them."""
        return self._clip == "global_clipnorm"

    # -- one update -----------------------------------------------------------------------

    def apply(self, w: np.ndarray, g: np.ndarray, lr_scale: float = 1.0,
              global_norm: float | None = None, into: np.ndarray | None = None) -> bool:
        """One Keras `optimizer.apply(grads, variables)` on the shard, in place on `w`; `g` is
        not modified. Order as Keras 3: clip, weight decay `w −= w·wd·lr`, the class's formula,
        `iterations += 1`. `lr = learning_rate()·lr_scale` for both the decay and the formula,
        as Keras uses one rate for both. `into`: where the new `w` is also written, block by
        block while in cache; returns whether it was (not on the one-pass path)."""
        if w.shape != (self.size,) or g.shape != (self.size,):
            raise ValueError(f"w and g must be flat float32 arrays of {self.size} floats. "
                             f"Received: shapes {w.shape} and {g.shape}.")
        lr = _F(self.learning_rate() * lr_scale)
        if self._clip is not None:
            g = self._clip_into(g, global_norm)
        wd = self.config["weight_decay"]
        wd = _F(wd) if wd else None  # None and 0: no decay
        parts = self._parts
        if parts is None:
            self._decay(w, wd, lr, self._decay_runs)
            self._formula.apply(w, g, lr, self.iterations)
        else:
            step = self.iterations

            def block(lo: int, hi: int) -> None:
                for a, b, formula, runs in parts[lo]:
                    self._decay(w, wd, lr, runs)
                    formula.apply(w[a:b], g[a:b], lr, step)
                    if into is not None:
                        np.copyto(into[a:b], w[a:b])

            self._run(block, self._ranges)
        self.iterations += 1
        return parts is not None and into is not None

    def _decay(self, w: np.ndarray, wd: np.float32 | None, lr: np.float32,
               runs: list[tuple[int, int]]) -> None:
        """Keras's decoupled weight decay `w −= w·wd·lr` on the decayed runs (local indices)."""
        if wd is None:
            return
        a = self._scratch[0]
        for start, end in runs:
            part, tmp = w[start:end], a[start:end]
            np.multiply(part, wd, out=tmp)
            np.multiply(tmp, lr, out=tmp)
            np.subtract(part, tmp, out=part)

    def _clip_into(self, g: np.ndarray, global_norm: float | None) -> np.ndarray:
        out, cfg = self._clipped, self.config
        if self._clip == "clipnorm":  # tf.clip_by_norm per variable: g·c / max(‖g‖, c)
            clip = _F(cfg["clipnorm"])
            np.multiply(g, clip, out=out)
            for start, end, _ in self._pieces:
                part = g[start:end]
                norm = np.sqrt(_F(np.dot(part, part)))
                np.divide(out[start:end], max(norm, clip), out=out[start:end])
        elif self._clip == "global_clipnorm":  # keras clip_by_global_norm; NaN if ‖g‖ is not finite
            clip = cfg["global_clipnorm"]
            norm = _F(np.sqrt(_F(sum_of_squares(g)))) if global_norm is None else _F(global_norm)
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = _F(clip) * min(_F(1) / norm, _F(1.0 / clip)) + (norm - norm)
            np.multiply(g, scale, out=out)
        else:
            value = _F(cfg["clipvalue"])
            np.clip(g, -value, value, out=out)
        return out

    # -- checkpoints ----------------------------------------------------------------------

    def export_state(self) -> dict[str, np.ndarray | float | int]:
        """Copies of everything that continues the run exactly: the slots (float32 arrays of
        `size`), scalar slots (Nadam's `u_product`), `iterations` and the rate override."""
        state: dict[str, np.ndarray | float | int] = {
            "iterations": self.iterations,
            "has_lr_override": int(self._override is not None),
            "lr_override": 0.0 if self._override is None else self._override,
        }
        state.update({k: v.copy() for k, v in self._formula.slots.items()})
        state.update(self._formula.scalars)
        return state

    def restore_state(self, state: dict) -> None:
        """Continue from `export_state()`'s values (bit-identically)."""
        expected = {"iterations", "has_lr_override", "lr_override", *self._formula.slots,
                    *self._formula.scalars}
        if set(state) != expected:
            raise CheckpointError(f"The {self.name} optimizer state does not fit this run. "
                                  f"Received: fields {sorted(state)}. "
                                  f"Expected: {sorted(expected)}.")
        for name, slot in self._formula.slots.items():
            value = np.asarray(state[name], dtype=_F)
            if value.shape != slot.shape:
                raise CheckpointError(f"The {self.name} slot {name!r} has the wrong shape. "
                                      f"Received: {value.shape}. Expected: {slot.shape}.")
            np.copyto(slot, value)
        for name in self._formula.scalars:
            self._formula.scalars[name] = float(_F(state[name]))
        self.iterations = int(state["iterations"])
        self._override = float(state["lr_override"]) if int(state["has_lr_override"]) else None

    @property
    def state_nbytes(self) -> int:
        """Bytes of the slots and scratch buffers (the hub's memory beyond the weights)."""
        arrays = [*self._formula.slots.values(), *self._scratch, self._clipped]
        return sum(a.nbytes for a in arrays)


def _formula_part(formula: UpdateFormula, lo: int, hi: int) -> UpdateFormula:
    """The same formula on `[lo, hi)` only: its slot and scratch arrays replaced by views."""
    part, size = copy.copy(formula), formula._a.size  # noqa: SLF001 - a formula's own slot
    for name, value in vars(formula).items():
        if isinstance(value, np.ndarray) and value.shape == (size,):
            setattr(part, name, value[lo:hi])
    part.slots = {k: v[lo:hi] for k, v in formula.slots.items()}
    return part


def _checked_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """(class name, config with Keras's defaults filled in), or a clear refusal."""
    name = spec.get("class_name") if isinstance(spec, dict) else None
    if name not in FORMULAS:
        raise unsupported("the optimizer class is not one nbdist reproduces", repr(name))
    defaults = {**BASE_DEFAULTS, **_CLASS_BASE_DEFAULTS.get(name, {}), **FORMULAS[name].defaults}
    given = dict(spec.get("config") or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"Unknown setting(s) {', '.join(unknown)} for the {name} optimizer. "
                          f"Valid: {', '.join(defaults)}.")
    config = {**defaults, **given}
    for key, value in config.items():
        numeric = isinstance(value, (int, float)) and math.isfinite(value)
        if not (numeric or (value is None and key in BASE_DEFAULTS)):
            raise ConfigError(f"The {name} optimizer's {key} must be a finite number"
                              f"{' or None' if key in BASE_DEFAULTS else ''}. "
                              f"Received: {value!r}.")
    clips = [k for k in ("clipnorm", "clipvalue", "global_clipnorm") if config[k] is not None]
    if len(clips) > 1:
        raise ConfigError(f"Only one of clipnorm, clipvalue and global_clipnorm can be set, as in "
                          f"Keras. Received: {', '.join(f'{k}={config[k]}' for k in clips)}.")
    if name == "AdamW" and config["weight_decay"] is None:
        raise ConfigError("AdamW needs a weight_decay (Keras's default is 0.004). Received: None.")
    return name, config
