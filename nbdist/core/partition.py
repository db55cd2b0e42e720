"""Cutting a model's layers into pipeline stages (`--mode pipeline --partition ...`).

Pure: NumPy and the standard library. The input is a profile of L layers in topological
order: `costs[l]` = layer l's forward + backward time at the micro-batch size (seconds), and
`cut_bytes[c]` = the bytes of every tensor live across the cut after layer c (c < L - 1; skip
connections count). A cut's link time is `cut_bytes[c] / bandwidth + latency`.

A stage is a half-open range `(start, end)` of layers. Its time per micro-batch is its layers'
compute plus the link times of its two boundary cuts (activations sent forward on its right
cut, gradients sent backward on its left one). A pipeline goes as fast as its slowest stage,
so every method below is judged by `max(stage_times(...))`.

Methods (see docs/guide.md, "Model parallelism"):
- `measured` (the default): the cost model's few best cuts (`candidates`), then each timed as
  whole stages on an engine before training (`nbdist.modes.pipeline.profile`), the fastest
  kept (`fastest_measured`): the profile times each layer as a call of its own, which a stage
  compiled as one function does not pay per layer;
- `optimal`: exact minimum of the slowest stage by dynamic programming over prefix sums,
  O(L^2 S) (as torchgpipe's `balance_by_time` does with its block partition);
- `greedy`: the TensorFlow thesis's greedy walk (`greedy_bounds` says exactly what it does);
- `uniform`: equal layer counts (`L // S`, the first `L % S` stages one more);
- `random`: S - 1 distinct cut points drawn uniformly with a seeded generator (the thesis's
  baseline).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from nbdist.errors import ConfigError

METHODS = ("optimal", "greedy", "uniform", "random")  # cuts from the profile alone (pure)
MEASURED = "measured"  # the default: candidates from the profile, timed as whole stages
PARTITIONS = (MEASURED, *METHODS)  # what --partition takes
CANDIDATES = 4  # cuts the cost model ranks best, timed as whole stages (with greedy's, uniform's)
ENUMERATE_AT_MOST = 20_000  # cut choices enumerated exhaustively up to this many
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Partition:
    """The chosen stages (half-open layer ranges) and each one's predicted time."""

    method: str
    bounds: tuple[tuple[int, int], ...]
    stage_times: tuple[float, ...]

    @property
    def slowest(self) -> float:
        return max(self.stage_times)


def link_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to send `nbytes` over a link of `bandwidth` bytes/s and `latency` seconds."""
    return nbytes / bandwidth + latency


def stage_times(costs, cut_bytes, bounds, bandwidth: float = math.inf,
                latency: float = 0.0, overhead: float = 0.0) -> tuple[float, ...]:
    """Each stage's compute plus the link times of its boundary cuts, plus `overhead`, the fixed
    cost of a stage's call (its forward and backward pass as one compiled function each).

    Example:
        >>> stage_times([1, 2, 3], [10, 20], [(0, 1), (1, 3)], bandwidth=10)
        (2.0, 6.0)
        >>> stage_times([1, 2, 3], [10, 20], [(0, 1), (1, 3)], bandwidth=10, overhead=0.5)
        (2.5, 6.5)
    """
    out = []
    for start, end in bounds:
        t = overhead + float(sum(costs[start:end]))
        if start > 0:
            t += link_time(cut_bytes[start - 1], bandwidth, latency)
        if end < len(costs):
            t += link_time(cut_bytes[end - 1], bandwidth, latency)
        out.append(t)
    return tuple(out)


def check_stages(num_layers: int, stages: int, names=None) -> None:
    """Refuse S stages for fewer than S layers, saying which layers there are."""
    if stages < 1 or stages > num_layers:
        shown = f": {', '.join(names)}" if names else ""
        raise ConfigError(
            f"--stages {stages} needs at least {stages} layers to cut, one per stage, but the "
            f"model has {num_layers}{shown}. Use --stages {max(1, min(num_layers, stages))} or "
            "fewer, or a model with more layers.")


def partition(costs, cut_bytes, stages: int, method: str = "optimal", *,
              bandwidth: float = math.inf, latency: float = 0.0, seed: int = 0,
              names=None, overhead: float = 0.0) -> Partition:
    """Cut the layers into `stages` contiguous stages by `method` (one of METHODS); each
    stage's predicted time counts `overhead` once (`stage_times`).

    Example:
        >>> partition([4, 1, 1, 1, 1], [0, 0, 0, 0], 2).bounds
        ((0, 1), (1, 5))
    """
    costs = [float(c) for c in costs]
    if len(cut_bytes) != max(0, len(costs) - 1):
        raise ValueError(f"cut_bytes needs one entry per cut ({len(costs) - 1}), got "
                         f"{len(cut_bytes)}.")
    check_stages(len(costs), stages, names)
    if method == "optimal":
        bounds = optimal_bounds(costs, cut_bytes, stages, bandwidth, latency)
    elif method == "greedy":
        bounds = greedy_bounds(costs, stages)
    elif method == "uniform":
        bounds = uniform_bounds(len(costs), stages)
    elif method == "random":
        bounds = random_bounds(len(costs), stages, seed)
    else:
        raise ConfigError(f"--partition must be one of {', '.join(METHODS)} (Received: "
                          f"{method!r}).")
    return Partition(method, bounds, stage_times(costs, cut_bytes, bounds, bandwidth, latency,
                                                 overhead))


def layer_compute(costs, call_overhead: float) -> list[float]:
    """Each layer's compute alone: its measured time less the fixed cost that timing it as a
    call of its own added (`call_overhead`, the time of such a call that computes nothing),
    never below zero. A stage compiled as one function pays a call's cost once, not per layer
    (`stage_times`'s `overhead`).

    Example:
        >>> layer_compute([0.003, 0.0005, 0.0012], 0.001)
        [0.002, 0.0, 0.0002]
    """
    return [round(max(0.0, float(c) - call_overhead), 12) for c in costs]


def candidates(costs, cut_bytes, stages: int, *, bandwidth: float = math.inf,
               latency: float = 0.0, overhead: float = 0.0,
               count: int = CANDIDATES) -> list[tuple[tuple[int, int], ...]]:
    """The cuts worth timing as whole stages: the `count` the cost model (`stage_times` with
    `overhead`) predicts fastest, then greedy's and uniform's if not among them, without
    repeats. Every choice of cuts is ranked where there are at most ENUMERATE_AT_MOST of them;
    beyond that, the optimal cut and those one cut point away from it.

    Example:
        >>> candidates([4, 1, 1, 1, 1], [0, 0, 0, 0], 2, count=2)
        [((0, 1), (1, 5)), ((0, 2), (2, 5)), ((0, 3), (3, 5))]
    """
    n = len(costs)
    check_stages(n, stages)
    if math.comb(n - 1, stages - 1) <= ENUMERATE_AT_MOST:
        choices = [_from_cuts(list(c), n)
                   for c in itertools.combinations(range(1, n), stages - 1)]
    else:
        best = [b for _, b in optimal_bounds(costs, cut_bytes, stages, bandwidth, latency)]
        choices = [optimal_bounds(costs, cut_bytes, stages, bandwidth, latency)]
        for i in range(stages - 1):
            for step in (-1, 1):
                cuts = [*best[:-1]]
                cuts[i] += step
                if cuts == sorted(set(cuts)) and cuts[0] > 0 and cuts[-1] < n:
                    choices.append(_from_cuts(cuts, n))

    def slowest(bounds) -> float:
        return max(stage_times(costs, cut_bytes, bounds, bandwidth, latency, overhead))

    ranked = sorted(dict.fromkeys(choices), key=lambda b: (slowest(b), b))[:count]
    for extra in (greedy_bounds(costs, stages), uniform_bounds(n, stages)):
        if extra not in ranked:
            ranked.append(extra)
    return ranked


def fastest_measured(measured: list[tuple[tuple, list[float]]], cut_bytes, num_layers: int,
                     bandwidth: float = math.inf, latency: float = 0.0) -> Partition:
    """The `measured` partition: of the candidates timed as whole stages ((bounds, each
    stage's measured compute) pairs), the one whose slowest stage, its links counted, is
    fastest (ties: the first).

    Example:
        >>> fastest_measured([(((0, 1), (1, 3)), [2.0, 1.0]), (((0, 2), (2, 3)), [1.5, 1.2])],
        ...                  [0, 0], 3).bounds
        ((0, 2), (2, 3))
    """
    best = None
    for bounds, compute in measured:
        times = stage_times([0.0] * num_layers, cut_bytes, bounds, bandwidth, latency)
        total = tuple(float(c) + t for c, t in zip(compute, times, strict=True))
        if best is None or max(total) < max(best.stage_times):
            best = Partition(MEASURED, tuple(tuple(b) for b in bounds), total)
    if best is None:
        raise ValueError("no measured candidate to choose from")
    return best


def min_max_cuts(n: int, parts: int, cost) -> list[int]:
    """Where to cut items 0..n-1 into `parts` contiguous, non-empty runs so that the largest
    `cost(i, j)` of a run [i, j) is least: the sorted `parts - 1` cut points. Exact dynamic
    programming, `best[s][j] = min_i max(best[s-1][i], cost(i, j))`; ties go to the earliest
    cut. Used for pipeline stages here and for speed groups (`nbdist.algorithms.group`)."""
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    choice = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for s in range(1, parts + 1):
        for j in range(s, n - (parts - s) + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], cost(i, j))
                if value < best[s][j]:
                    best[s][j], choice[s][j] = value, i
    cuts, j = [], n
    for s in range(parts, 1, -1):
        j = choice[s][j]
        cuts.append(j)
    return sorted(cuts)


def _from_cuts(cuts, num_layers: int) -> tuple[tuple[int, int], ...]:
    edges = [0, *cuts, num_layers]
    return tuple(zip(edges[:-1], edges[1:], strict=False))


def optimal_bounds(costs, cut_bytes, stages: int, bandwidth: float = math.inf,
                   latency: float = 0.0) -> tuple[tuple[int, int], ...]:
    """The cuts minimising the slowest stage: `best[s][j]` = the least slowest-stage time of
    layers 0..j-1 in s stages; `best[s][j] = min_i max(best[s-1][i], time(i, j))`. Ties go to
    the earliest cut."""
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(costs, dtype=float)])
    link = [link_time(b, bandwidth, latency) for b in cut_bytes]

    def time(i: int, j: int) -> float:  # layers i..j-1 as one stage
        t = prefix[j] - prefix[i]
        return t + (link[i - 1] if i > 0 else 0.0) + (link[j - 1] if j < n else 0.0)

    return _from_cuts(min_max_cuts(n, stages, time), n)


def greedy_bounds(costs, stages: int) -> tuple[tuple[int, int], ...]:
    """The thesis's greedy walk, on compute alone. `target = sum(costs) / S`. Layers join the
    current stage in order while it stays at or under `target`; when the next layer would push
    it over, the stage closes before that layer or after it, whichever leaves the stage's time
    closer to `target` (a tie closes before; an empty stage always takes the layer). A stage
    also closes when exactly as many layers are left as stages still to fill, and the last
    stage takes the rest, so no stage is ever empty.

    Example:
        >>> greedy_bounds([1, 1, 1, 10], 3)
        ((0, 2), (2, 3), (3, 4))
    """
    n, target = len(costs), sum(costs) / stages
    cuts, load, start = [], 0.0, 0
    for layer, cost in enumerate(costs):
        if len(cuts) == stages - 1:
            break
        if layer > start and load + cost > target:
            after = load + cost
            if abs(load - target) <= abs(after - target):  # close before this layer
                cuts.append(layer)
                start, load = layer, 0.0
                if len(cuts) == stages - 1:
                    break
            else:  # close after it
                cuts.append(layer + 1)
                start, load = layer + 1, 0.0
                continue
        load += cost
        if n - (layer + 1) == stages - 1 - len(cuts):  # exactly one layer left per stage
            cuts.append(layer + 1)
            start, load = layer + 1, 0.0
    while len(cuts) < stages - 1:  # only when the walk ended with stages still to open
        cuts.append(cuts[-1] + 1 if cuts else 1)
    return _from_cuts(cuts, n)


def uniform_bounds(num_layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Equal layer counts; the first `L % S` stages get one more.

    Example:
        >>> uniform_bounds(7, 3)
        ((0, 3), (3, 5), (5, 7))
    """
    size, extra = divmod(num_layers, stages)
    cuts, at = [], 0
    for s in range(stages - 1):
        at += size + (1 if s < extra else 0)
        cuts.append(at)
    return _from_cuts(cuts, num_layers)


def random_bounds(num_layers: int, stages: int, seed: int = 0) -> tuple[tuple[int, int], ...]:
    """S - 1 distinct cut points in 1..L-1, uniformly at random from `seed`."""
    rng = np.random.default_rng(seed)
    cuts = sorted(int(c) + 1 for c in rng.choice(num_layers - 1, size=stages - 1, replace=False))
    return _from_cuts(cuts, num_layers)


def ideal_bubble(stages: int, micro_batches: int) -> float:
    """The idle share of a GPipe or 1F1B pipeline with equal stages: (S - 1) / (M + S - 1).

    Example:
        >>> ideal_bubble(4, 4)
        0.42857142857142855
    """
    return (stages - 1) / (micro_batches + stages - 1)


def schedule(kind: str, stages: int, micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order of one stage's work in a mini-batch: ("F", i) forward and ("B", i) backward of
    micro-batch i. `gpipe`: all forwards, then all backwards (in micro-batch order). `1f1b`
    (PipeDream-Flush): `min(S - stage - 1, M)` forwards to fill the pipe, then one forward and
    one backward in turn, then the backwards left; at most S micro-batches in flight.

    Example:
        >>> schedule("1f1b", 2, 3, 0)
        [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    """
    m = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind != "1f1b":
        raise ConfigError(f"--schedule must be gpipe or 1f1b (Received: {kind!r}).")
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def check_pipeline_options(*, stages: object, micro_batches: object, method: object, kind: object,
                           batch_size: int) -> None:
    """The `--mode pipeline` flags' values, checked before anything runs (TrainConfig calls this;
    the flags a pipeline does not take are refused from its spec, nbdist.modes)."""
    for flag, value in (("--stages", stages), ("--micro-batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a whole number >= 1 (Received: {value!r}). "
                              f"Example: {flag} 2.")
    if method not in PARTITIONS:
        raise ConfigError(f"--partition must be one of {', '.join(PARTITIONS)} (Received: "
                          f"{method!r}).")
    if kind not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)} (Received: {kind!r}).")
    if batch_size % micro_batches:
        raise ConfigError(
            f"--batch-size {batch_size} does not split into --micro-batches {micro_batches} equal "
            f"micro-batches. Use a batch size that is a multiple of {micro_batches} (e.g. "
            f"{max(micro_batches, batch_size // micro_batches * micro_batches)}), or another "
            "--micro-batches.")
