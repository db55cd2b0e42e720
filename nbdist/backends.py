"""Where a run's hubs and workers live: engines of a cluster, or threads in this kernel.

A backend starts the hub shards and the workers, reports a worker failure, and cleans up.
The Run (nbdist/run.py) drives either one the same way.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

import numpy as np

from nbdist.cluster import Cluster, assign_roles, get_within
from nbdist.errors import EngineTimeoutError, NbdistError, RemoteCellError
from nbdist.netaddr import check_reachable, hub_address
from nbdist.protocol import shard_bounds
from nbdist.ps.hub import Hub, HubSpec
from nbdist.worker import WorkerSpec, run_worker

log = logging.getLogger(__name__)


def hub_specs(base: HubSpec, params: np.ndarray, num_shards: int) -> list[HubSpec]:
    """One spec per shard, each with its slice; non-trainable state lives on shard 0."""
    empty = np.zeros(0, dtype=np.float32)
    return [replace(base, shard=i, num_shards=num_shards, params=params[lo:hi].copy(), offset=lo,
                    non_trainable=base.non_trainable if i == 0 else empty)
            for i, (lo, hi) in enumerate(shard_bounds(params.size, num_shards))]


class ClusterBackend:
    """Hubs as threads on dedicated engines; one worker task per worker engine.

    An async run survives a worker engine that dies: `failure()` skips it and `newly_lost()`
    reports it once, so the Run can tell the hub and go on with the others."""

    survives_worker_loss = True

    def __init__(self, cluster: Cluster, num_servers: int, num_workers: int | None):
        self.cluster = cluster
        hosts = cluster.engine_hosts()
        self.roles = assign_roles(hosts, num_servers, num_workers)
        self.hosts = hosts
        self.nets = cluster.engine_networks((*self.roles.servers, *self.roles.workers))
        self.kernel_net = cluster.kernel_network()
        # each hub binds its own engine's interface towards the workers and this kernel
        peers = [self.nets[w] for w in self.roles.workers] + [self.kernel_net]
        self.bind_hosts = {s: hub_address(self.nets[s], peers) for s in self.roles.servers}
        self._tasks: dict[int, object] = {}
        self._run_id = ""
        self.lost: dict[int, str] = {}  # worker -> why its engine is gone
        self._reported: set[int] = set()

    @property
    def num_workers(self) -> int:
        return len(self.roles.workers)

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        from nbdist.ps.launch import start_hub

        self._run_id = specs[0].run_id
        client = self.cluster.client
        encrypt = getattr(self.cluster, "encrypt", False)
        pending = [client[e].apply_async(start_hub, replace(s, bind_host=self.bind_hosts[e], encrypt=encrypt))
                   for e, s in zip(self.roles.servers, specs, strict=True)]
        endpoints = [_get(ar, e) for e, ar in zip(self.roles.servers, pending, strict=True)]
        for shard, (e, ep) in enumerate(zip(self.roles.servers, endpoints, strict=True)):
            address, port = ep["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
            check_reachable(address, int(port), f"hub shard {shard} (engine {e})", self.hosts[e])
        return endpoints

    def start_workers(self, base: WorkerSpec) -> None:
        per_host = {}
        for e in self.roles.workers:
            per_host[self.hosts[e]] = per_host.get(self.hosts[e], 0) + 1
        for i, e in enumerate(self.roles.workers):
            spec = replace(base, worker=i, engine=e, local_rank=self.roles.local_rank[e],
                           threads=max(1, (os.cpu_count() or 1) // per_host[self.hosts[e]]))
            self._tasks[i] = self.cluster.client[e].apply_async(run_worker, spec)

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The trained flat parameters and non-trainable state (from the hub shards)."""
        return control.params()

    def failure(self) -> Exception | None:
        """The first worker that raised, as an nbdist exception naming its engine."""
        for i, ar in self._tasks.items():
            if i in self.lost or not ar.ready() or ar.successful():
                continue
            error = _get_error(ar, self.roles.workers[i])
            if not (self.survives_worker_loss and _engine_died(ar)):
                return error
            self.lost[i] = str(error)
        return None

    def newly_lost(self) -> list[tuple[int, str]]:
        """Workers whose engine died since the last call (found by `failure()`)."""
        new = [(i, why) for i, why in self.lost.items() if i not in self._reported]
        self._reported.update(i for i, _ in new)
        return new

    def workers_running(self) -> bool:
        return any(not ar.ready() for ar in self._tasks.values())

    def finish(self, timeout: float) -> None:
        """Wait for worker tasks, then join the hub threads."""
        from nbdist.ps.launch import join_hub

        for ar in self._tasks.values():
            ar.wait(timeout)
        client = self.cluster.client
        for shard, e in enumerate(self.roles.servers):
            try:
                get_within(client[e].apply_async(join_hub, self._run_id, shard), e,
                           f"joining hub shard {shard}", timeout=30.0)  # join_hub gives up after 15 s
            except Exception as exc:  # noqa: BLE001 - clean-up must go on
                log.warning("could not join hub shard %d on engine %d: %s", shard, e, exc)


class LocalBackend:
    """Hub shards and one worker as threads in this kernel (`--mode local`)."""

    num_workers = 1

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self._threads: list[threading.Thread] = []
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        hubs = [Hub(s) for s in specs]
        for hub in hubs:
            t = threading.Thread(target=hub.serve, daemon=True, name=f"nbdist-hub-{hub.spec.shard}")
            t.start()
            self._threads.append(t)
        return [h.endpoints for h in hubs]

    def start_workers(self, base: WorkerSpec) -> None:
        def work() -> None:
            try:
                run_worker(replace(base, worker=0, source=None), namespace=self.namespace)
            except BaseException as exc:  # noqa: BLE001 - reported by failure()
                self._error = exc

        self._worker = threading.Thread(target=work, daemon=True, name="nbdist-local-worker")
        self._worker.start()

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        return control.params()

    def failure(self) -> Exception | None:
        return self._error

    def newly_lost(self) -> list[tuple[int, str]]:
        return []  # the worker is a thread of this kernel: it cannot die alone

    def workers_running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def finish(self, timeout: float) -> None:
        if self._worker is not None:
            self._worker.join(timeout)
        for t in self._threads:
            t.join(timeout)


def _get(ar, engine: int):
    try:
        return get_within(ar, engine, "starting a hub shard")
    except EngineTimeoutError:
        raise
    except Exception as exc:
        raise _as_nbdist(exc, engine) from None


def _get_error(ar, engine: int) -> Exception:
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return _as_nbdist(exc, engine)
    return RemoteCellError(f"engine {engine} failed without an error")


def _engine_died(ar) -> bool:
    """Whether a failed task failed because its engine process went away (killed, crashed),
    as ipyparallel reports it, rather than because the code raised."""
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return getattr(exc, "ename", type(exc).__name__) == "EngineError"
    return False


def _as_nbdist(exc: Exception, engine: int) -> Exception:
    """An ipyparallel RemoteError -> the nbdist exception raised there, or RemoteCellError."""
    import nbdist.errors as errors

    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    remote_tb = getattr(exc, "traceback", "") or ""
    if isinstance(exc, NbdistError):
        return exc
    cls = getattr(errors, ename, None)
    if isinstance(cls, type) and issubclass(cls, NbdistError) and cls is not RemoteCellError:
        return cls(f"[engine {engine}] {evalue}")
    return RemoteCellError(f"The cell raised {ename} on engine {engine}: {evalue}",
                           engine_id=engine, remote_traceback=remote_tb)
