"""The network of a simulated run (`--sim bandwidth=...,latency=...`): when each push and pull
arrives, from its bytes. Pure.

The model is the lab network's (tests/lab_network.py): every host has one link to a switch,
shaped in both directions as `tc netem rate R delay D` shapes it. The hub has a host of its
own, and each virtual worker another.

- A message of `B` bytes from host `a` to host `b` crosses `a`'s uplink and `b`'s downlink. It
  waits until both are free (first come, first served: four workers pushing at once queue at
  the hub's downlink), holds them for `8 B / min(R_a, R_b)` seconds, and arrives `D_a + D_b`
  after its last bit left. Messages between two processes of one host cross no link.
- Sync's ring allreduce (`ring_allreduce_s`): `2 (M - 1)` rounds, in each of which every host
  sends `B / M` bytes to the next at once; a round takes the slowest pair's time.

Why first come, first served rather than TCP's fair share: the time to drain a queue of
messages is the same under both, and the order is exact and the same on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

HUB = "hub"  # the hub's host; worker w's is str(w)


@dataclass(frozen=True)
class Link:
    """One host's link: its rate in bits per second (inf: no limit) and its one-way delay.

    Example:
        >>> Link.of(mbit=1000, ms=0.2).transfer_s(125_000)
        0.001
    """

    rate_bps: float = math.inf
    delay_s: float = 0.0

    @classmethod
    def of(cls, mbit: float, ms: float) -> Link:
        """A link from `--sim`'s units: Mbit/s (0: no limit) and milliseconds."""
        return cls(mbit * 1e6 if mbit > 0 else math.inf, ms * 1e-3)

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to put `nbytes` on this link (no delay)."""
        return 8.0 * nbytes / self.rate_bps


class Network:
    """Each host's uplink and downlink, and when each is next free.

    Example (1 Mbit/s, 1 ms links; two workers push 1,000 bytes to the hub at t = 0):
        >>> net = Network({HUB: Link(1e6, 1e-3), "0": Link(1e6, 1e-3), "1": Link(1e6, 1e-3)})
        >>> round(net.send(0.0, "0", HUB, 1000), 6), round(net.send(0.0, "1", HUB, 1000), 6)
        (0.01, 0.018)
    """

    def __init__(self, links: Mapping[str, Link]):
        self.links = dict(links)
        self._up_free = dict.fromkeys(self.links, 0.0)
        self._down_free = dict.fromkeys(self.links, 0.0)

    def send(self, now: float, source: str, to: str, nbytes: int) -> float:
        """The time a message sent at `now` arrives; its links are busy until its last bit."""
        if source == to:
            return now
        up, down = self.links[source], self.links[to]
        start = max(now, self._up_free[source], self._down_free[to])
        end = start + 8.0 * nbytes / min(up.rate_bps, down.rate_bps)
        self._up_free[source] = self._down_free[to] = end
        return end + up.delay_s + down.delay_s


def ring_allreduce_s(nbytes: int, links: list[Link]) -> float:
    """Seconds of a ring allreduce of an `nbytes` buffer over the hosts of `links` (in ring
    order): `2 (M - 1)` rounds of `nbytes / M` bytes from each host to the next.

    Example (4 hosts at 1 Gbit/s and 0.2 ms: 6 rounds of 250 kB, 2 ms plus 0.4 ms each):
        >>> round(ring_allreduce_s(1_000_000, [Link.of(1000, 0.2)] * 4), 6)
        0.0144
    """
    m = len(links)
    return _ring_rounds_s(2 * (m - 1), nbytes / max(m, 1), links)


def ring_allgather_s(nbytes: int, links: list[Link]) -> float:
    """Seconds of a ring allgather of one `nbytes` frame per host over the hosts of `links`
    (in ring order): `M - 1` rounds, each host passing one whole frame to the next.

    Example (4 hosts at 1 Gbit/s and 0.2 ms: 3 rounds of 100 kB, 0.8 ms plus 0.4 ms each):
        >>> round(ring_allgather_s(100_000, [Link.of(1000, 0.2)] * 4), 6)
        0.0036
    """
    return _ring_rounds_s(len(links) - 1, nbytes, links)


def _ring_rounds_s(rounds: int, round_bytes: float, links: list[Link]) -> float:
    """`rounds` rounds in which every host sends `round_bytes` to the next in the ring: each
    round as long as its slowest pair's transfer and delays (no ring on one host)."""
    m = len(links)
    if m < 2:
        return 0.0
    pairs = [(links[i], links[(i + 1) % m]) for i in range(m)]
    return rounds * max(8.0 * round_bytes / min(a.rate_bps, b.rate_bps) + a.delay_s + b.delay_s
                        for a, b in pairs)
