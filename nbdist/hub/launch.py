"""Engine-side entry points for hubs: start one in a background thread, join it, stop it.

A hub serves from a thread so that its engine keeps answering ipyparallel (status, stop,
joining) while it runs. The registry below is per engine process: it lets a later
ipyparallel call find the hub an earlier call started.
"""

from __future__ import annotations

import threading

from nbdist.hub.server import Hub, HubSpec

_hubs: dict[tuple[str, int], tuple[Hub, threading.Thread, dict]] = {}


def start_hub(spec: HubSpec) -> dict:
    """Bind a hub's sockets, serve from a thread, and return its endpoints."""
    hub = Hub(spec)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(hub.serve()), daemon=True,
                              name=f"nbdist-hub-{spec.run_id}-{spec.shard}")
    thread.start()
    _hubs[(spec.run_id, spec.shard)] = (hub, thread, result)
    return hub.endpoints


def join_hub(run_id: str, shard: int, timeout: float = 10.0) -> dict:
    """Wait for a hub to leave its loop (asking it to, after `timeout`); returns its summary."""
    entry = _hubs.get((run_id, shard))
    if entry is None:
        return {"shard": shard, "error": "no such hub on this engine"}
    hub, thread, result = entry
    thread.join(timeout)
    if thread.is_alive():
        hub.closing = True
        thread.join(5.0)
    del _hubs[(run_id, shard)]
    return result


def running_hubs() -> list[tuple[str, int]]:
    """(run id, shard) of every hub still serving in this engine."""
    return [key for key, (_, thread, _) in _hubs.items() if thread.is_alive()]
