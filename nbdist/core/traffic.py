"""Each worker's traffic rate, from the running byte totals its pushes report.

The workers count the bytes that cross their sockets and the hub only stores the totals (see
`nbdist.core.stats`); the kernel turns two readings at least `window_s` apart into bytes/s, so
the rate needs no clock on the hub and costs the hub nothing. A simulated run's rate is over
its virtual time instead (`over_run`).
"""

from __future__ import annotations

__all__ = ["RATE_WINDOW_S", "TrafficRates"]

RATE_WINDOW_S = 1.0  # the shortest span a rate is measured over (the kernel polls every 0.25 s)


class TrafficRates:
    """Adds `bytes_per_s` to node rows (sent and received, TCP and shared memory together).

    Example:
        >>> rates = TrafficRates()
        >>> rates.update([{"worker": 0, "bytes_sent": 0, "bytes_received": 0}], now=10.0)
        >>> nodes = [{"worker": 0, "bytes_sent": 3_000_000, "bytes_received": 1_000_000}]
        >>> rates.update(nodes, now=12.0)
        >>> nodes[0]["bytes_per_s"]
        2000000.0
    """

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._start: dict[int, tuple[float, int]] = {}  # worker -> (time, total) of the window
        self._rate: dict[int, float] = {}

    def update(self, nodes: list[dict], now: float) -> None:
        for row in nodes:
            worker = row["worker"]
            total = int(row.get("bytes_sent") or 0) + int(row.get("bytes_received") or 0)
            start = self._start.get(worker)
            if start is None or total < start[1]:  # first reading, or a worker that restarted
                self._start[worker] = (now, total)
            elif now - start[0] >= self.window_s:
                self._rate[worker] = (total - start[1]) / (now - start[0])
                self._start[worker] = (now, total)
            row["bytes_per_s"] = self._rate.get(worker, 0.0)

    @staticmethod
    def over_run(nodes: list[dict], elapsed: float) -> None:
        """A simulated run's rates: each worker's bytes over the virtual seconds it has run
        (`elapsed`), not over the kernel's clock, which has nothing to do with the simulated
        links; for a seed, the same numbers on every run and machine.

        Example:
            >>> nodes = [{"worker": 0, "bytes_sent": 300, "bytes_received": 100}]
            >>> TrafficRates.over_run(nodes, elapsed=0.5)
            >>> nodes[0]["bytes_per_s"]
            800.0
        """
        for row in nodes:
            total = int(row.get("bytes_sent") or 0) + int(row.get("bytes_received") or 0)
            row["bytes_per_s"] = total / elapsed if elapsed > 0 else 0.0
