"""Virtual time for `--mode simulate`: the cost model, its options and the event order. Pure.

Responsible for:
- `CostModel`: a step of `b` samples on a worker slowed down `k` times takes
  `k · (per_step_s + per_sample_s · b)` virtual seconds, times an optional jitter factor
  `exp(jitter · N(0, 1))` drawn from a stream seeded by (seed, worker), so noise is the same
  on every machine. An evaluation of `n` samples in batches of `B` takes
  `k · (ceil(n / B) · per_step_s + per_sample_s · n / 3)`: each batch pays the fixed cost of a
  call, and a forward pass is about a third of a training step's work per sample (the
  backward pass costs about twice it).
  The hub spends `per_push_s` on each push it applies (decode, apply, answer), one at a time.
- `SimOptions` / `parse_sim`: the `--sim` option (`per_step=1e-3,per_sample=2e-5,per_push=5e-4,
  jitter=0.1,calibrate=1,eval_every=0.5,sync=1,bandwidth=1000,latency=0.2`), validated once.
  `bandwidth` (Mbit/s) and `latency` (ms) give every host's link (`nbdist.core.links`);
  `bandwidth.hub`, `latency.2` and the like give one host's: the hub's, or virtual worker 2's.
- `fit_cost`: a cost model from measured step times, rounded to two significant digits so a
  calibrated run can be repeated exactly by passing the printed numbers back.
- `EventQueue`: pending step completions, popped by (virtual time, worker id): ties go to
  the lower worker id, so the order never depends on the host.

Why fixed default constants: the simulation must give the same result for a seed on any
machine; timing the model would make the event order depend on the host. Calibration is
therefore opt-in (`calibrate=1`), and the fitted numbers are recorded in `run.events`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nbdist.core.links import HUB, Link, Network
from nbdist.errors import ConfigError

DEFAULT_PER_STEP_S = 1e-3  # fixed cost of one step (call, assignment), about the MLP's on a laptop
DEFAULT_PER_SAMPLE_S = 2e-5  # cost of one sample in the batch
FORWARD_SHARE = 1 / 3  # an evaluated sample's cost against a trained one's (forward, no backward)
_BOOLEAN = ("calibrate", "sync")
_BOUNDS = {"per_step": (0.0, 3600.0), "per_sample": (0.0, 3600.0), "per_push": (0.0, 3600.0),
           "jitter": (0.0, 2.0),
           "eval_every": (0.0, math.inf), "calibrate": (0, 1), "sync": (0, 1),
           "bandwidth": (0.0, 1e7), "latency": (0.0, 1e4)}  # Mbit/s (0: no limit), ms
_PER_HOST = ("bandwidth", "latency")  # also `bandwidth.hub`, `latency.3`: one host's link


@dataclass(frozen=True)
class CostModel:
    """Virtual seconds per step: `slowdown · (per_step_s + per_sample_s · batch)`; per
    evaluation of `samples` in batches of `batch`: `slowdown · (ceil(samples / batch) ·
    per_step_s + per_sample_s · samples / 3)` (`FORWARD_SHARE`).

    Example:
        >>> CostModel(per_step_s=0.001, per_sample_s=0.0001).step_time(10, slowdown=2)
        0.004
        >>> round(CostModel(per_step_s=0.001, per_sample_s=0.0003).eval_time(1000, 250), 9)
        0.104
    """

    per_step_s: float = DEFAULT_PER_STEP_S
    per_sample_s: float = DEFAULT_PER_SAMPLE_S
    jitter: float = 0.0

    def step_time(self, batch: int, slowdown: float = 1.0, noise: float = 1.0) -> float:
        return slowdown * (self.per_step_s + self.per_sample_s * batch) * noise

    def eval_time(self, samples: int, batch: int, slowdown: float = 1.0) -> float:
        batches = -(-samples // max(1, batch))
        return slowdown * (batches * self.per_step_s + self.per_sample_s * samples * FORWARD_SHARE)


class Jitter:
    """Per-worker multiplicative noise `exp(j · N(0,1))`, reproducible for (seed, worker).

    Example:
        >>> Jitter(0.0, seed=1, num_workers=2).factor(1)
        1.0
    """

    def __init__(self, jitter: float, seed: int, num_workers: int):
        self.jitter = float(jitter)
        self._rngs = [np.random.default_rng([seed, 7919, w]) for w in range(num_workers)]

    def factor(self, worker: int) -> float:
        if self.jitter == 0:
            return 1.0
        return float(math.exp(self.jitter * self._rngs[worker].standard_normal()))


@dataclass(frozen=True)
class SimOptions:
    """What `--sim` sets: the cost model, calibration, periodic evaluation, simulated sync."""

    per_step_s: float = DEFAULT_PER_STEP_S
    per_sample_s: float = DEFAULT_PER_SAMPLE_S
    per_push_s: float = 0.0  # the hub's work on each push, one push at a time (0: none)
    jitter: float = 0.0
    calibrate: bool = False  # time the model once instead of the default constants
    eval_every: float = 0.0  # > 0: also evaluate the hub's weights every this many virtual seconds
    sync: bool = False  # simulate --mode sync (mean of all workers' gradients per step)
    bandwidth_mbit: float = 0.0  # each host's link (0: no limit)
    latency_ms: float = 0.0  # each link's one-way delay
    host_links: tuple[tuple[str, float], ...] = ()  # ("bandwidth.hub", 10000.0): one host's

    @property
    def cost(self) -> CostModel:
        return CostModel(self.per_step_s, self.per_sample_s, self.jitter)

    @property
    def has_links(self) -> bool:
        """Whether pushes and pulls take virtual time (a rate or a delay was given)."""
        return bool(self.bandwidth_mbit or self.latency_ms
                    or any(value for _, value in self.host_links))

    def links(self, num_workers: int) -> dict[str, Link]:
        """Each host's link: the hub's (`HUB`) and each virtual worker's (`"0"`, `"1"`, ...).

        Example:
            >>> SimOptions(bandwidth_mbit=1000, host_links=(("latency.1", 5.0),)).links(2)["1"]
            Link(rate_bps=1000000000.0, delay_s=0.005)
        """
        given = dict(self.host_links)
        hosts = [HUB, *map(str, range(num_workers))]
        unknown = sorted({name.partition(".")[2] for name in given} - set(hosts))
        if unknown:
            raise ConfigError(
                f"--sim names the link of host(s) {', '.join(unknown)}, but the run has virtual "
                f"workers 0..{num_workers - 1} and the hub. Name a worker's host by its number "
                "(latency.0) or the hub's as hub (bandwidth.hub).")
        return {host: Link.of(given.get(f"bandwidth.{host}", self.bandwidth_mbit),
                              given.get(f"latency.{host}", self.latency_ms)) for host in hosts}

    def network(self, num_workers: int) -> Network | None:
        """The run's simulated network, or None where pushes and pulls take no time."""
        return Network(self.links(num_workers)) if self.has_links else None


def parse_sim(value: str | Mapping[str, float] | None) -> dict:
    """'per_step=1e-3,sync=1' -> {'per_step': 0.001, 'sync': 1}; checked against the known
    names and ranges (numbers only, never evaluated).

    Example:
        >>> parse_sim("per_sample=2e-5,sync=1")
        {'per_sample': 2e-05, 'sync': 1}
    """
    if not value:
        return {}
    items = (value.items() if isinstance(value, Mapping)
             else (p.partition("=")[::2] for p in value.split(",")))
    out: dict = {}
    for name, raw in items:
        name = str(name).strip()
        base, dot, host = name.partition(".")
        if not (name in _BOUNDS or (base in _PER_HOST and dot and (host == HUB or host.isdigit()))):
            raise ConfigError(f"Unknown --sim option {name!r}. Valid: {', '.join(_BOUNDS)}, and "
                              f"{' and '.join(f'{n}.HOST' for n in _PER_HOST)} for one host's "
                              "link (HOST: hub, or a virtual worker's number). Example: --sim "
                              "per_step=1e-3,per_sample=2e-5,bandwidth=1000,latency.hub=0.5")
        name = base if not dot else f"{base}.{host}"
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"--sim expects name=number pairs (Received: {name}={raw!r}). "
                              "Example: --sim jitter=0.1,sync=1") from None
        low, high = _BOUNDS[base]
        if (not (math.isfinite(number) and low <= number <= high)
                or (name in _BOOLEAN and number not in (0, 1))):
            raise ConfigError(f"--sim {name} must be "
                              f"{'0 or 1' if name in _BOOLEAN else f'in [{low:g}, {high:g}]'} "
                              f"(Received: {raw!r}).")
        out[name] = int(number) if name in _BOOLEAN else number
    return out


SIM_FIELDS = {"per_step": "per_step_s", "per_sample": "per_sample_s",  # --sim name: field
              "per_push": "per_push_s", "jitter": "jitter",
              "calibrate": "calibrate", "eval_every": "eval_every", "sync": "sync",
              "bandwidth": "bandwidth_mbit", "latency": "latency_ms"}


def sim_options(parsed: Mapping[str, float]) -> SimOptions:
    """The `SimOptions` of a `parse_sim` result (what it leaves out keeps SimOptions' default)."""
    hosts = tuple(sorted((name, float(value)) for name, value in parsed.items() if "." in name))
    return SimOptions(host_links=hosts,
                      **{SIM_FIELDS[name]: bool(value) if name in _BOOLEAN else float(value)
                         for name, value in parsed.items() if "." not in name})


def sim_defaults() -> str:
    """The defaults as `--sim` is written: 'per_step=0.001,per_sample=2e-05,...'."""
    defaults = SimOptions()
    return ",".join(f"{name}={float(getattr(defaults, field)):g}"
                    for name, field in SIM_FIELDS.items())


def round2(x: float) -> float:
    """Two significant digits: what a calibration keeps (timing noise is larger than that)."""
    return float(f"{x:.2g}")


def fit_cost(points: Sequence[tuple[int, float]], jitter: float = 0.0) -> CostModel:
    """Least-squares `T(b) = c + s·b` through (batch, seconds) points, rounded to two digits;
    a negative or negligible intercept or slope (noise) is 0, keeping the other term's fit.

    Example:
        >>> fit_cost([(10, 0.002), (30, 0.004), (30, 0.004)])
        CostModel(per_step_s=0.001, per_sample_s=0.0001, jitter=0.0)
    """
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    if len(points) < 2 or np.ptp(b) == 0:
        raise ValueError(f"fit_cost needs at least two different batch sizes (Received: "
                         f"{list(points)}).")
    slope, intercept = np.polyfit(b, t, 1)
    if intercept < 0:
        intercept, slope = 0.0, float((b @ t) / (b @ b))
    if slope < 0:
        intercept, slope = float(t.mean()), 0.0
    # least squares leaves rounding noise (a flat fit's slope comes out as 1e-19, not 0, and
    # differently on another CPU): a term worth under 0.1% of the longest step is zero
    floor = 1e-3 * float(t.max())
    intercept = intercept if intercept >= floor else 0.0
    slope = slope if slope * float(b.max()) >= floor else 0.0
    return CostModel(round2(intercept), round2(slope), jitter)


class EventQueue:
    """Pending step completions, popped in (virtual time, worker id) order; at most one per
    worker (a worker computes one step at a time).

    Example:
        >>> q = EventQueue()
        >>> q.schedule(0.5, 2); q.schedule(0.5, 1); q.schedule(0.2, 3)
        >>> [q.pop() for _ in range(3)]
        [(0.2, 3), (0.5, 1), (0.5, 2)]
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._pending: set[int] = set()

    def schedule(self, time: float, worker: int) -> None:
        if worker in self._pending:
            raise ValueError(f"worker {worker} already has a step in flight")
        if not math.isfinite(time) or time < 0:
            raise ValueError(f"event time must be finite and >= 0 (Received: {time})")
        heapq.heappush(self._heap, (float(time), int(worker)))
        self._pending.add(worker)

    def pop(self) -> tuple[float, int]:
        time, worker = heapq.heappop(self._heap)
        self._pending.discard(worker)
        return time, worker

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pending(self, worker: int) -> bool:
        return worker in self._pending

    def __len__(self) -> int:
        return len(self._heap)
