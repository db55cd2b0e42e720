"""`streaming-diloco` (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication"): DiLoCo with the model synced one fragment at a time, the exchange overlapped
with the next inner steps, and the fragment merged into what the worker trained meanwhile.

The flat weights are cut into P fragments (`fragment_span`: P contiguous, near-equal runs of
every hub shard's slice, so consecutive layers share a fragment). Each worker trains rounds of
K = ceil(H / P) inner steps with the cell's optimizer; after round r it sends fragment
p = r mod P's outer gradient, the change since that fragment was last merged, so every fragment
is synced once every H inner steps, as in DiLoCo, but never all at once:

    Δ_m,p = θ̃_m,p − θ_m,p              θ̃_m,p: what worker m merged last for p
    g_p   = mean over the workers of Δ_m,p
    u_p   ← β u_p + g_p                 the hub: Nesterov on fragment p only
    θ_p   ← θ_p − η (g_p + β u_p)

While the exchange is in flight the worker takes τ more inner steps (`overlap`); then it
merges the new global fragment into its own: `θ_m,p ← α θ_m,p + (1 − α) θ_p`, and θ̃_m,p ← θ_p.
With τ = 0 and α = 0 a round is DiLoCo's on one fragment. Defaults: P = 4 (`fragments`),
τ = 1 (`overlap`), α = 0.5 (`mix`), β = 0.9 (`momentum`), η = 0.7 (`outer_lr`), H = 100 inner
steps (`--local-steps`; a fragment is synced every P K steps, H where P divides H).
Pushes may travel low-bit (`--compression fp16` or `int8`); the hub sums in float32.
"""

from __future__ import annotations

import math

import numpy as np

from nbdist.algorithms.base import Option, Rule


def fragment_span(size: int, parts: int, index: int) -> tuple[int, int]:
    """Fragment `index` of `parts` over a slice of `size` floats: [lo, hi), contiguous, the
    first `size mod parts` fragments one float longer.

    Example:
        >>> [fragment_span(10, 4, i) for i in range(4)]
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"fragment {index} of {parts} does not exist")
    base, extra = divmod(int(size), int(parts))
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def round_steps(inner_steps: int, parts: int) -> int:
    """K: the inner steps between two fragment exchanges, so that each fragment is synced
    every P K steps: `inner_steps` (H) where `parts` (P) divides it, a few more otherwise.

    Example:
        >>> round_steps(100, 4), round_steps(10, 4), round_steps(2, 4)
        (25, 3, 1)
    """
    return max(1, -(-int(inner_steps) // int(parts)))


def overlap_steps(inner_steps: int, parts: int, overlap: int) -> int:
    """τ as a run uses it: at most a round's steps but one, since the overlapped steps train on
    the next round's chunks.

    Example:
        >>> overlap_steps(100, 4, 1), overlap_steps(8, 4, 5), overlap_steps(4, 4, 1)
        (1, 1, 0)
    """
    return min(int(overlap), round_steps(inner_steps, parts) - 1)


def merge_fragment(local: np.ndarray, merged: np.ndarray, alpha: float) -> None:
    """`local ← α local + (1 − α) merged`, in place (α = 0: take the global fragment).

    Example:
        >>> local = np.array([1.0, 3.0], np.float32)
        >>> merge_fragment(local, np.array([3.0, 3.0], np.float32), 0.5); local.tolist()
        [2.0, 3.0]
    """
    if alpha == 0.0:
        np.copyto(local, merged)
        return
    np.multiply(local, np.float32(alpha), out=local)
    local += np.float32(1.0 - alpha) * merged


class StreamingDiLoCo(Rule):
    """One fragment's outer Nesterov step per group step (see the module docstring). The hub
    tells the rule which fragment the group pushed (`select`), from the pushes' headers, and
    every worker which one to push next (`next_fragment`)."""

    name = "streaming-diloco"
    predicts_weights = False  # a push is a fragment's outer gradient
    corrects_momentum = False  # the outer momentum is the recipe's own
    compensates_delay = False
    takes_local_steps = True
    workers_step = False
    syncs_groups = True  # every worker's fragment in one synchronous round, as DiLoCo's
    shares_rounds = True
    state_fields = ("_momentum", "next_fragment")
    # the workers cut their pushes by these from the run's start: not changeable live
    fixed_options = ("fragments", "overlap", "mix")

    def __init__(self, size: int, num_workers: int, **options: Option):
        super().__init__(size, num_workers, **options)
        self._momentum = np.zeros(size, np.float32)
        self._scratch = np.empty(size, np.float32)
        self.fragment = 0  # the fragment of the group step being applied (`select`)
        # the fragment every worker's next push holds; the hub says it in each reply
        self.next_fragment = 0

    @classmethod
    def default_options(cls, num_workers: int) -> dict[str, Option]:
        return {"fragments": 4, "overlap": 1, "mix": 0.5, "momentum": 0.9, "outer_lr": 0.7,
                "num_groups": 1}

    def _bounds(self, name: str) -> tuple[float, float]:
        if name == "fragments":
            return 1, 1024
        if name == "num_groups":
            return 1, 1  # every worker in one round
        if name in ("mix", "momentum"):
            return 0.0, 0.999 if name == "momentum" else 1.0
        return 0.0, math.inf

    def select(self, fragment: int) -> None:
        """The fragment the next push to apply holds (the pushes' `Step.fragment`)."""
        parts = int(self._options["fragments"])
        if not 0 <= fragment < parts:
            raise ValueError(f"a push of fragment {fragment}, but the run has {parts} fragments")
        self.fragment = fragment

    def on_push(self, worker: int, w: np.ndarray, g: np.ndarray, lr: float, delay: int) -> bool:
        lo, hi = fragment_span(self.size, int(self._options["fragments"]), self.fragment)
        beta = np.float32(self._options["momentum"])
        eta = np.float32(lr * self._options["outer_lr"])
        u, grad, scratch = self._momentum[lo:hi], g[lo:hi], self._scratch[lo:hi]
        np.multiply(u, beta, out=u)
        np.add(u, grad, out=u)
        np.multiply(u, beta, out=scratch)
        np.add(scratch, grad, out=scratch)
        np.multiply(scratch, eta, out=scratch)
        np.subtract(w[lo:hi], scratch, out=w[lo:hi])
        # the cursor moves on once the fragment it names is applied; a late push of an earlier
        # one (its group step timed out without it) is applied alone and leaves the cursor, so
        # the workers push the same fragment again from the next reply on
        if self.fragment == self.next_fragment:
            self.next_fragment = (self.fragment + 1) % int(self._options["fragments"])
        return True

    def gradient(self, worker: int, w: np.ndarray, g: np.ndarray, delay: int,
                 scale: float) -> tuple[np.ndarray, float] | None:
        raise TypeError("streaming-diloco is its own outer optimizer (Nesterov on one fragment "
                        "at a time) on plain SGD; it does not hand its pushes to another "
                        "optimizer (nbdist.core.updater refuses that)")

    @property
    def state_nbytes(self) -> int:
        return self._momentum.nbytes + self._scratch.nbytes
