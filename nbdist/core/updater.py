"""What a shard does to its parameters on a push: the rule decides, the cell's optimizer steps.

The update rule (`nbdist.algorithms`) decides which gradient is applied and when: ASGD passes a
push through, DC-ASGD compensates it for its delay, softsync averages c pushes, group sync the
members of a group. The optimizer the cell compiled (Adam, RMSprop, SGD with momentum, ...,
re-implemented exactly in `nbdist.algorithms.optimizers`) then takes the step, with its slots
per shard and its learning-rate schedule evaluated at the shard's number of applied updates:

    g', s = rule.gradient(worker, w, g, τ, scale)      # None: held back (softsync's buffer)
    w ← optimizer.apply(w, g', lr(step) · s)           # clipping and weight decay as Keras does

`scale` is `1 / max(1, τ)` with `--staleness-lr`, and `B_g / B_ref` for a group's step.
With `--predict-weights` the updater also keeps the last update `Δ = w_after − w_before`, and a
worker reads `w + d·Δ` (`read_ahead`): where `w` will be when its push lands, d updates later.
With `--momentum-correction` the optimizer's momentum (SGD's and RMSprop's `momentum`, the Adam
family's `beta_1`) is lowered by the momentum the run's asynchrony adds, τ̄ / (1 + τ̄) for a mean
delay τ̄ (`nbdist.algorithms.momentum`), re-estimated on every push.
After every update that changed `w` (the optimizer's step, a group step, a local-steps delta,
an EASGD elastic sum), the model's Keras constraints (`nbdist.algorithms.constraints`: MaxNorm,
NonNeg, ...) are applied to the variables they constrain, as `optimizer.apply` ends.

Plain SGD (no momentum, clipping or weight decay) takes the rule's own fused pass instead: one pass
over memory for the update and the reply copy, the same numbers (with constraints, the constrained
variables are then constrained and copied again: the rest keeps its one pass). Two rules are defined
on SGD only: `ddc-asgd` (its delay-weighted momentum is the optimizer) and `easgd` (a push is an
elastic difference, not a gradient; the cell's optimizer runs on the workers, the hub only adds the
difference). `check_composition` refuses ddc-asgd with anything but plain SGD.

Used by the hub (`nbdist.hub.server`) and the simulator (`nbdist.modes.simulate.simulation`) alike,
so both apply a push the same way. Pure NumPy; `nbdist.engine.optimizer_spec.choose_optimizer`
(kernel side) reads the Keras optimizer.
"""

from __future__ import annotations

import numpy as np

from nbdist.algorithms import CUSTOM, make_rule, rule_class
from nbdist.algorithms.base import Rule
from nbdist.algorithms.blocks import Runner, block_ranges, run_serial
from nbdist.algorithms.constraints import ShardConstraints
from nbdist.algorithms.kernels import STREAM_MIN, copy_out
from nbdist.algorithms.momentum import DelayAverage, compensated_momentum
from nbdist.algorithms.optimizers import HubOptimizer, server_optimizer_spec
from nbdist.errors import ConfigError

CLIPPING = ("clipnorm", "clipvalue", "global_clipnorm")


def plain_sgd(spec: dict | None) -> bool:
    """Whether `spec` is SGD with no momentum, clipping or weight decay (a schedule is fine)."""
    if spec is None or spec["class_name"] != "SGD":
        return False
    config = spec["config"]
    return not (config.get("momentum") or config.get("weight_decay")
                or any(config.get(k) is not None for k in CLIPPING))


def describe_spec(spec: dict) -> str:
    """'Adam (lr 0.001)', 'SGD (lr ExponentialDecay)': how messages name an optimizer."""
    lr = spec["learning_rate"]
    rate = lr["class_name"] if isinstance(lr, dict) else f"{lr:g}"
    return f"{spec['class_name']} (lr {rate})"


def check_composition(algorithm: str, spec: dict | None) -> None:
    """Refuse a rule that cannot hand its gradient to this optimizer."""
    rule = rule_class(algorithm)
    if algorithm in CUSTOM and rule.gradient is Rule.gradient and not plain_sgd(spec):
        raise ConfigError(
            f"Your rule {algorithm} defines on_push, a step of plain SGD, but the cell compiles "
            f"{describe_spec(spec)}, which the hub applies to what a rule's gradient() decides "
            "(on_push runs with plain SGD only). Define gradient(self, worker, w, g, delay, "
            "scale) returning (the gradient to apply, scale), or None to hold the push back, "
            "so the cell's optimizer steps on it; or pass --server-optimizer sgd --lr 0.05 to "
            "run your on_push with plain SGD.")
    if algorithm == "ddc-asgd" and not plain_sgd(spec):
        raise ConfigError(
            f"--algorithm ddc-asgd is its own delay-weighted momentum on plain SGD, so it cannot "
            f"run with the cell's {describe_spec(spec)} (momentum, clipping and weight decay "
            "included). Use --algorithm dc-asgd-a (delay compensation that works with any "
            "optimizer), or pass --server-optimizer sgd --lr 0.05 to run ddc-asgd with plain SGD "
            "on purpose.")


class Updater:
    """One shard's update: `rule` + the optimizer `spec` describes (None: none, for easgd),
    then the `constraints` (entries as `nbdist.algorithms.constraints` describes them) on the
    variables of this shard, which holds floats [offset, offset + rule.size) of the flat vector.

    Example:
        >>> from nbdist.algorithms import make_rule
        >>> up = Updater(make_rule("easgd", 2, 1), None)
        >>> w = np.array([1, 2], np.float32)
        >>> up.push(0, w, np.array([1, 1], np.float32), delay=0)
        (True, False)
        >>> w.tolist()
        [2.0, 3.0]
    """

    def __init__(self, rule: Rule, spec: dict | None, offset: int = 0, staleness_lr: bool = False,
                 constraints: list[dict] | tuple = (), predict: bool = False,
                 momentum_correction: bool = False, num_workers: int = 1):
        self.rule, self.spec, self.staleness_lr = rule, spec, staleness_lr
        self.optimizer = HubOptimizer(spec, rule.size, offset) if spec is not None else None
        self.constraints = ShardConstraints(constraints, offset, rule.size)
        self.fused = spec is None or plain_sgd(spec)
        self._run: Runner = run_serial
        self._ranges: list[tuple[int, int]] = [(0, rule.size)]
        # --predict-weights: the last update, and the weights before it while it is applied
        self.last_step = np.zeros(rule.size, np.float32) if predict else None
        self._before = np.empty(rule.size, np.float32) if predict else None
        # --momentum-correction: the delays' moving average, where the optimizer has a momentum
        self.delays = (DelayAverage(num_workers) if momentum_correction and self.optimizer
                       is not None and self.optimizer.momentum_key is not None else None)
        if self.delays is not None:
            self._compensate()

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The blocks each update is split into: [(0, size)], one pass, unless `use_blocks`
        split it (what `nbdist.hub.threads.split_updates` decided, for its callers to read)."""
        return list(self._ranges)

    def use_blocks(self, run: Runner, parts: int) -> None:
        """Split each large update (>= `blocks.MIN_SPLIT` floats) into `parts` contiguous blocks
        run by `run` (a thread pool at the edge, `nbdist.hub.threads`); bit-identical results.
        Rules that keep per-push state other than elementwise arrays stay in one pass."""
        ranges = block_ranges(self.rule.size, parts)
        if len(ranges) <= 1:
            return
        self._run, self._ranges = run, ranges
        if hasattr(self.rule, "use_blocks"):
            self.rule.use_blocks(run, ranges)
        if self.optimizer is not None:
            self.optimizer.use_blocks(run, ranges)

    def learning_rate(self) -> float | None:
        """The rate the next update uses (None: the hub applies no optimizer)."""
        return self.optimizer.learning_rate() if self.optimizer is not None else None

    def set_learning_rate(self, lr: float) -> None:
        """A constant rate from the notebook; it replaces a schedule from now on."""
        if self.optimizer is not None:
            self.optimizer.set_learning_rate(lr)

    def push(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int, scale: float = 1.0,
             into: np.ndarray | None = None, global_norm: float | None = None) -> tuple[bool, bool]:
        """Apply one push read `delay` versions ago; returns (w changed, `into` holds the new w)."""
        if self.staleness_lr:
            scale /= max(1, delay)
        if self.delays is not None:
            self.delays.add(delay)
            self._compensate()
        if self._before is not None:  # the reply is written once the update is known
            into = None
            np.copyto(self._before, w)
        changed, copied = self._update(worker, w, g, delay, scale, into, global_norm)
        # as Keras's apply ends; `into` then gets those parts again
        if changed and self.constraints:
            self.constraints.apply(w, into if copied else None)
        if changed and self.last_step is not None:
            np.subtract(w, self._before, out=self.last_step)
        if into is not None and changed and not copied:
            stream = into.size >= STREAM_MIN  # a reply past the cache: streaming stores
            self._run(lambda lo, hi: copy_out(into[lo:hi], w[lo:hi], stream), self._ranges)
            copied = True
        return changed, copied

    def _compensate(self) -> None:
        opt = self.optimizer
        opt.set_momentum(compensated_momentum(opt.cell_momentum, self.delays.mean))

    @property
    def momentum(self) -> float | None:
        """The momentum (or β1) the next update uses; None where the optimizer has none."""
        opt = self.optimizer
        return opt.momentum if opt is not None and opt.momentum_key is not None else None

    def read_ahead(self, w: np.ndarray, steps: float, out: np.ndarray) -> None:
        """`out = w + steps · Δ`, Δ the last update: the weights `steps` updates from now if
        they move as the last one did (a momentum optimizer's steps change slowly). Without
        --predict-weights, or for `steps` = 0, `out = w`.

        Example:
            >>> from nbdist.algorithms import make_rule
            >>> from nbdist.algorithms.optimizers import server_optimizer_spec
            >>> sgd = server_optimizer_spec("sgd", 0.5, [2])
            >>> up = Updater(make_rule("asgd", 2, 2), sgd, predict=True)
            >>> w, out = np.zeros(2, np.float32), np.empty(2, np.float32)
            >>> _ = up.push(0, w, np.array([1, -2], np.float32), delay=0)
            >>> up.read_ahead(w, 1.0, out); w.tolist(), out.tolist()
            ([-0.5, 1.0], [-1.0, 2.0])
        """
        if self.last_step is None or steps <= 0:
            np.copyto(out, w)
            return
        if steps == 1:  # two workers' usual delay: one pass
            np.add(w, self.last_step, out=out)
            return
        np.multiply(self.last_step, np.float32(steps), out=out)
        out += w

    def _update(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int, scale: float,
                into: np.ndarray | None, global_norm: float | None) -> tuple[bool, bool]:
        """The rule and the optimizer: (w changed, `into` already holds the new w)."""
        opt = self.optimizer
        if self.fused:  # one pass: the rule's SGD (or easgd's sum), and the reply copy
            lr = opt.learning_rate() * scale if opt is not None else 0.0
            if into is None:
                changed = self.rule.on_push(worker, w, g, lr, delay)
            else:
                changed = self.rule.push_and_read(worker, w, g, lr, delay, into)
            if changed and opt is not None:
                opt.iterations += 1
            return changed, into is not None
        decided = self.rule.gradient(worker, w, g, delay, scale)
        if decided is None:
            return False, False
        gradient, scale = decided
        # large shards: fused copy-out
        return True, opt.apply(w, gradient, scale, global_norm, into)

    @property
    def state_nbytes(self) -> int:
        """Bytes the rule and the optimizer hold beyond the parameters."""
        predicting = 2 * self.last_step.nbytes if self.last_step is not None else 0
        return self.rule.state_nbytes + predicting + (self.optimizer.state_nbytes
                                                      if self.optimizer is not None else 0)


def make_updater(plan, rule_options: dict, optimizer: dict | None, size: int, offset: int = 0,
                 constraints: list[dict] | tuple = ()) -> Updater:
    """A shard's rule, optimizer and constraints for `plan` (a `Plan`), as the hub and the
    simulator build them. No `optimizer` (easgd, or a hub built by hand): plain SGD at `plan.lr`."""
    rule = make_rule(plan.algorithm, size, plan.num_workers, rule_options)
    # an overlapped push is one read behind
    rule.reads_kept = 2 if getattr(plan, "overlap", False) else 1
    if optimizer is None:
        optimizer = server_optimizer_spec("sgd", plan.lr, [offset + size])
    return Updater(rule, optimizer, offset, plan.staleness_lr, constraints,
                   predict=getattr(plan, "predict_weights", False),
                   momentum_correction=getattr(plan, "momentum_correction", False),
                   num_workers=plan.num_workers)
