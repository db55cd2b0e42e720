"""Momentum compensation: an async run keeps the cell's total momentum, not more.

Asynchrony begets momentum (Mitliagkas et al. 2016): when each push lands τ updates after the
read it was computed on, with τ spread about a mean τ̄ as M workers pushing in turn spread it,
ASGD moves in expectation like SGD with an extra momentum of τ̄ / (1 + τ̄) (1 − 1/M for M
workers in turn, τ̄ = M − 1). A cell's own momentum μ comes on top of it, and the total
overshoots: two async workers on an MLP with `SGD(0.1, momentum=0.9)` landed 0.60-0.68 where
`model.fit` landed 0.78-0.80 (Fashion-MNIST, `benchmarks/parity_matrix.py`). So the hub's
optimizer runs with

    μ' = max(0, μ − τ̄ / (1 + τ̄))

in place of the cell's μ (SGD's and RMSprop's `momentum`, the Adam family's `beta_1`), the
learning rate unchanged, where τ̄ is the moving average of the shard's delays
(`DelayAverage`), starting at M − 1. With one worker τ̄ stays 0 and μ' = μ: the cell's optimizer
unchanged, bit for bit. Adam's bias correction then uses `1 − μ'^t`, as a constant β1 = μ'
would (μ' moves slowly, and the correction is 1 after the first few dozen steps); Nadam's
momentum product takes each step's μ' as it comes.

It helps where the cell trains at the edge of stability, and costs where it does not: with two
workers, `SGD(0.1, momentum=0.9)` (an effective step lr / (1 − μ) of 1.0) went from 0.60-0.68 to
parity with it, while the MaxNorm MLP at `SGD(0.01, momentum=0.9)` (0.1), which async trains as
`fit` does without it (0.805 against 0.810), fell to 0.714 with it: μ' shortens the long-run step
lr / (1 − μ') as much as it takes out the overshoot. More workers make it worth more: with four,
`SGD(0.1, momentum=0.5)` (0.2) fell to 0.37-0.50 without it and trained to 0.77-0.78 with it
(fit 0.81), while `SGD(0.01, momentum=0.5)` (0.02) lost 0.025 with it. So by default
(`worth_correcting`) it runs for SGD with momentum (Nesterov or not) whose effective step times
(M − 1)², the delay's weight, is at least `EFFECTIVE_STEP_MIN`;
`--momentum-correction` asks for it with any optimizer that has a momentum (RMSprop's, the Adam
family's β1, which predicted weights already serve well: docs/rules.md).

Where the workers' asynchrony alone adds more than μ (1 − 1/M > μ: many workers, a low
momentum), μ' = 0 cannot take it away: `saturated` says so, and the run warns at its start.

Pure Python; the updater (`nbdist.core.updater`) asks for μ' on every push.
"""

from __future__ import annotations

from dataclasses import dataclass

# the smallest effective step lr / (1 − μ), times (M − 1)², of a momentum SGD that the
# correction runs for by default: with two workers measured helpful at 1.0 and harmful at 0.1;
# with three helpful at 0.2 (x4), with four helpful at 0.2 (x9), neutral at 0.1 (x9), harmful at
# 0.02 (x9) (docs/rules.md)
EFFECTIVE_STEP_MIN = 0.5
# weight of each new delay in the moving average: about the last 20 pushes count
SMOOTHING = 0.05
# a delay counts at most this many times M (one long wait, an evaluation say, moves τ̄ little)
DELAY_CAP_PER_WORKER = 4


def implicit_momentum(mean_delay: float) -> float:
    """The momentum asynchrony adds when pushes land `mean_delay` updates late on average.

    Example:
        >>> implicit_momentum(0.0), implicit_momentum(1.0), implicit_momentum(3.0)
        (0.0, 0.5, 0.75)
    """
    tau = max(0.0, float(mean_delay))
    return tau / (1.0 + tau)


def compensated_momentum(momentum: float, mean_delay: float) -> float:
    """μ' = max(0, μ − τ̄ / (1 + τ̄)): the explicit momentum that keeps the total at μ.

    Example:
        >>> compensated_momentum(0.9, 1.0), compensated_momentum(0.9, 0.0)
        (0.4, 0.9)
        >>> compensated_momentum(0.5, 3.0)  # saturated: 0.75 of asynchrony alone
        0.0
    """
    if mean_delay <= 0:
        return float(momentum)
    return max(0.0, float(momentum) - implicit_momentum(mean_delay))


def worth_correcting(optimizer: str, momentum: float, learning_rate: float,
                     num_workers: int = 2) -> bool:
    """Whether the correction runs by default for the cell's optimizer and M = `num_workers`:
    SGD with momentum whose effective step `learning_rate / (1 − momentum)`, weighed by the
    square of the delay M − 1 its pushes land with (the delay both adds momentum and shrinks
    the largest stable step), is at least EFFECTIVE_STEP_MIN.

    Example:
        >>> worth_correcting("SGD", 0.9, 0.1), worth_correcting("SGD", 0.9, 0.01)
        (True, False)
        >>> worth_correcting("SGD", 0.5, 0.1), worth_correcting("SGD", 0.5, 0.1, num_workers=4)
        (False, True)
        >>> worth_correcting("Adam", 0.9, 0.1), worth_correcting("SGD", 0.0, 1.0)
        (False, False)
    """
    if optimizer != "SGD" or not 0 < momentum < 1 or num_workers < 2:
        return False
    delay = num_workers - 1
    return learning_rate / (1.0 - momentum) * delay * delay >= EFFECTIVE_STEP_MIN


def saturated(momentum: float, num_workers: int) -> bool:
    """Whether M workers pushing in turn add more momentum (1 − 1/M) than the cell's own μ, so
    that no μ' >= 0 brings the total back to μ.

    Example:
        >>> saturated(0.9, 2), saturated(0.5, 4), saturated(0.0, 1)
        (False, True, False)
    """
    return implicit_momentum(max(0, num_workers - 1)) > momentum


@dataclass
class DelayAverage:
    """The moving average τ̄ of a shard's push delays, starting at `num_workers − 1` (what M
    workers pushing in turn see).

    Example:
        >>> avg = DelayAverage(num_workers=2)
        >>> avg.mean, avg.add(3), round(avg.mean, 4)
        (1.0, None, 1.1)
    """

    num_workers: int
    mean: float = -1.0

    def __post_init__(self) -> None:
        if self.mean < 0:
            self.mean = float(max(0, self.num_workers - 1))

    def add(self, delay: int) -> None:
        capped = min(max(0, int(delay)), DELAY_CAP_PER_WORKER * max(1, self.num_workers))
        self.mean += SMOOTHING * (capped - self.mean)


def correction_notice(optimizer: str, key: str, momentum: float,
                      num_workers: int) -> tuple[str, str | None]:
    """What a run with momentum compensation tells the user at its start: a note for
    run.events and run.warnings, and a second warning where compensation saturates (None
    otherwise). `optimizer`: the cell's optimizer class, `key` and `momentum` its setting.

    Example:
        >>> note, extra = correction_notice("SGD", "momentum", 0.9, 2)
        >>> note.split(" on the hub")[0], extra
        ("--momentum-correction: the cell's SGD momentum=0.9 runs as 0.4", None)
    """
    tau = max(0, num_workers - 1)
    lowered = compensated_momentum(momentum, tau)
    note = (f"--momentum-correction: the cell's {optimizer} {key}={momentum:g} runs as "
            f"{lowered:.2g} on the hub while {num_workers} workers push in turn: their asynchrony "
            f"adds about {implicit_momentum(tau):.2g} of momentum of its own (a mean delay of "
            f"{tau} update{'s' if tau != 1 else ''}), so the total stays "
            f"{'as near the cell' if saturated(momentum, num_workers) else 'the cell'}'s. The hub "
            f"re-estimates it from the measured delays on every push. --no-momentum-correction "
            f"keeps {key}={momentum:g}.")
    if not saturated(momentum, num_workers):
        return note, None
    extra = (f"{num_workers} async workers add about {implicit_momentum(tau):.2g} of momentum, "
             f"more than the cell's {optimizer} {key}={momentum:g}: even at {key}=0 the run "
             f"moves with more momentum than model.fit, and may land below it. To train as "
             f"fit does, pick --mode sync, fewer workers (at most {max_workers(momentum)} for "
             f"{key}={momentum:g}), or --algorithm ssp --staleness 0.")
    return note, extra


def max_workers(momentum: float) -> int:
    """The most workers whose asynchrony (1 − 1/M) does not exceed `momentum`.

    Example:
        >>> max_workers(0.9), max_workers(0.5), max_workers(0.0)
        (10, 2, 1)
    """
    workers = 1
    while not saturated(momentum, workers + 1):
        workers += 1
    return workers
