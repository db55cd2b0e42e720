"""Hub shards as threads of this kernel: `--mode local`'s shards, and `--mode sync`'s metrics
hub (a hub without parameters that carries the ranks' metrics and the notebook's control)."""

from __future__ import annotations

import threading

from nbdist.hub.server import Hub, HubSpec


class KernelHubs:
    """Serves hub shards on threads of this kernel until they are shut down (`HubControl`)."""

    def __init__(self):
        self._threads: list[threading.Thread] = []

    def start(self, specs: list[HubSpec]) -> list[dict]:
        """Serve one shard per spec; returns their endpoints."""
        hubs = [Hub(s) for s in specs]
        for hub in hubs:
            t = threading.Thread(target=hub.serve, daemon=True, name=f"nbdist-hub-{hub.spec.shard}")
            t.start()
            self._threads.append(t)
        return [h.endpoints for h in hubs]

    def join(self, timeout: float) -> None:
        """Wait for the shards' threads to end (after the run's `HubControl.shutdown`)."""
        for t in self._threads:
            t.join(timeout)
