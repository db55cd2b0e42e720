"""Where an async run's hubs and workers live: engines of a cluster.

`ClusterBackend` starts the hub shards (threads on dedicated engines) and one worker task per
worker engine, reports a worker failure, and cleans up; the Run (nbdist/run/handle.py) drives
it through the `Backend` protocol (nbdist/run/backend.py), like every mode's backend. It can
also start workers on more engines while the run trains (`add_workers`, see
nbdist/modes/async_ps/elastic.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace

import numpy as np

from nbdist.cluster.affinity import HUB_SPIN_S, WORKER_SPIN_S, cores_per_host, may_spin
from nbdist.cluster.engines import Cluster, assign_roles, get_within
from nbdist.cluster.netaddr import LOOPBACK, check_reachable, hub_address
from nbdist.errors import (
    ClusterError,
    ConfigError,
    EngineTimeoutError,
    NbdistError,
    RemoteCellError,
    UnreachableHostError,
)
from nbdist.hub.protocol import shard_bounds
from nbdist.hub.server import HubSpec
from nbdist.modes.async_ps.worker import WorkerSpec, run_worker
from nbdist.run.backend import Backend

log = logging.getLogger(__name__)
RELEASE_GRACE_S = 2.0  # a written-off worker still running this long later is interrupted
INTERRUPT_WAIT_S = 5.0  # finish() waits this long for the tasks it interrupted to end
JOIN_MIN_S = 1.0  # and at least this long for each hub's engine, past its deadline


def pin_hub_engine(place: tuple[int, int, int] | None) -> None:
    """On a hub's engine, before the hub starts: its cores under --pin auto (nbdist.cluster.affinity),
    or back to all of them."""
    from nbdist.cluster import affinity

    if place is None:
        affinity.unpin_process()
    else:
        affinity.apply("hub", *place)


def hub_specs(base: HubSpec, params: np.ndarray, num_shards: int) -> list[HubSpec]:
    """One spec per shard, each with its slice; non-trainable state lives on shard 0."""
    empty = np.zeros(0, dtype=np.float32)
    return [replace(base, shard=i, num_shards=num_shards, params=params[lo:hi].copy(), offset=lo,
                    non_trainable=base.non_trainable if i == 0 else empty)
            for i, (lo, hi) in enumerate(shard_bounds(params.size, num_shards))]


class ClusterBackend(Backend):
    """Hubs as threads on dedicated engines; one worker task per worker engine.

    An async run survives a worker engine that dies: `failure()` skips it and `newly_lost()`
    reports it once, so the Run can tell the hub and go on with the others. A worker added
    mid-run (`add_workers`) that fails is written off the same way, whatever the cause: an
    engine that joined must not end a run that was going well without it."""

    survives_worker_loss = True
    cluster: Cluster  # the Run registers with it, so Cluster.stop() ends the run first

    def __init__(self, cluster: Cluster, num_servers: int, num_workers: int | None, pin: bool = False,
                 spin: bool = False):
        self.cluster, self.pin, self.spin = cluster, pin, spin
        hosts = cluster.engine_hosts()
        self.roles = assign_roles(hosts, num_servers, num_workers)
        self.hosts = hosts
        self.nets = cluster.engine_networks((*self.roles.servers, *self.roles.workers))
        self.cores = cores_per_host((hosts[e], net.cores) for e, net in self.nets.items())
        self.kernel_net = cluster.kernel_network()
        # each hub binds its own engine's interface towards the workers and this kernel
        peers = [self.nets[w] for w in self.roles.workers] + [self.kernel_net]
        self.bind_hosts = {s: hub_address(self.nets[s], peers) for s in self.roles.servers}
        self._tasks: dict[int, object] = {}
        self.worker_engines = list(self.roles.workers)  # worker id -> engine; add_workers appends
        self.seen_engines = set(cluster.client.ids)  # --elastic adds only engines that join later
        self._base: WorkerSpec | None = None
        self._adding = threading.Lock()
        self._run_id = ""
        self.lost: dict[int, str] = {}  # worker -> why it is out (engine gone, written off)
        self._reported: set[int] = set()
        self._written_off: dict[int, float] = {}  # worker -> when the kernel learnt of it
        self._interrupted: set[int] = set()

    @property
    def num_workers(self) -> int:
        return len(self.roles.workers)

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        from nbdist.hub.launch import start_hub

        self._run_id = specs[0].run_id
        client = self.cluster.client
        encrypt = getattr(self.cluster, "encrypt", False)
        for e in self.roles.servers:  # the hub's process inherits its engine's cores
            client[e].apply_sync(pin_hub_engine, self._place(e, self.roles.servers))
        pending = [client[e].apply_async(start_hub, replace(s, bind_host=self.bind_hosts[e], encrypt=encrypt,
                                                            spin_s=self._spin(e, HUB_SPIN_S)))
                   for e, s in zip(self.roles.servers, specs, strict=True)]
        endpoints = [_get(ar, e) for e, ar in zip(self.roles.servers, pending, strict=True)]
        for shard, (e, ep) in enumerate(zip(self.roles.servers, endpoints, strict=True)):
            address, port = ep["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
            check_reachable(address, int(port), f"hub shard {shard} (engine {e})", self.hosts[e])
        return endpoints

    def start_workers(self, base: WorkerSpec) -> None:
        self._base = base
        per_host = {}
        for e in self.roles.workers:
            per_host[self.hosts[e]] = per_host.get(self.hosts[e], 0) + 1
        for i, e in enumerate(self.roles.workers):
            spec = replace(base, worker=i, engine=e, local_rank=self.roles.local_rank[e],
                           threads=self._threads(e, per_host[self.hosts[e]]),
                           pin=self._place(e, self.roles.workers), spin_s=self._spin(e, WORKER_SPIN_S))
            self._tasks[i] = self.cluster.client[e].apply_async(run_worker, spec)

    def add_workers(self, engines: list[int], announce) -> list[int]:
        """Start workers on `engines` while the run trains, with the next worker ids (M, M+1,
        ...), the run's key, transport and compression, and threads and local rank as
        `start_workers` gives them. `announce(worker, engine)` tells the hub of each first (it
        refuses when the run is ending). Refused before anything starts: engines that are not
        in the cluster or already in this run, a streamed data set, a host the hubs do not
        listen towards. Returns the new worker ids."""
        with self._adding:
            engines = self._check_new(engines)
            nets = self.cluster.engine_networks(engines)
            self._check_reach(nets)
            added = []
            for e in engines:
                worker, host = len(self.worker_engines), nets[e].hostname
                announce(worker, e)
                self.hosts[e], self.nets[e] = host, nets[e]
                self.cores = cores_per_host((self.hosts[n], net.cores) for n, net in self.nets.items())
                self.worker_engines.append(e)
                self.seen_engines.add(e)
                here = sum(self.hosts[w] == host for w in self.worker_engines)
                spec = replace(self._base, worker=worker, engine=e, local_rank=here - 1,
                               threads=self._threads(e, here), spin_s=self._spin(e, WORKER_SPIN_S))
                self._tasks[worker] = self.cluster.client[e].apply_async(run_worker, spec)
                added.append(worker)
            return added

    def _threads(self, engine: int, workers_here: int) -> int:
        """TensorFlow threads for a worker: the cores its host's hub shards leave, shared."""
        from nbdist.cluster.affinity import worker_threads

        hubs = sum(self.hosts[s] == self.hosts[engine] for s in self.roles.servers)
        return worker_threads(self.host_cores(engine), hubs, workers_here)

    def host_cores(self, engine: int) -> int:
        """How many cores the engines on `engine`'s host may use (affinity.cores_per_host); this
        kernel's count where the engine could not tell."""
        return self.cores.get(self.hosts[engine]) or os.cpu_count() or 1

    def _spin(self, engine: int, budget_s: float) -> float:
        """How long a hub or worker on `engine` polls before it sleeps: `budget_s` under --spin
        auto where the host has hubs and workers and leaves each hub a core
        (nbdist.cluster.affinity.may_spin, on the host's cores as `_threads`), else 0. A worker
        added mid-run counts with the others, but the hubs keep what they were started with."""
        host = self.hosts[engine]
        hubs = sum(self.hosts[s] == host for s in self.roles.servers)
        workers = sum(self.hosts[w] == host for w in self.worker_engines)
        return budget_s if self.spin and may_spin(self.host_cores(engine), hubs, workers) else 0.0

    def _place(self, engine: int, same_role: list[int]) -> tuple[int, int, int] | None:
        """(index among `same_role` on its host, hubs there, workers there) for --pin auto."""
        if not self.pin:
            return None
        host = self.hosts[engine]
        on_host = [e for e in same_role if self.hosts[e] == host]
        hubs = sum(self.hosts[e] == host for e in self.roles.servers)
        workers = sum(self.hosts[e] == host for e in self.roles.workers)
        return on_host.index(engine), hubs, workers

    def joined_engines(self) -> list[int]:
        """Engines that joined the cluster since the run started (or since the last call)."""
        new = sorted(e for e in self.cluster.client.ids if e not in self.seen_engines)
        self.seen_engines.update(new)
        return new

    def _check_new(self, engines) -> list[int]:
        engines = list(engines)
        known = set(self.cluster.client.ids)
        unknown = [e for e in engines if isinstance(e, bool) or not isinstance(e, int) or e not in known]
        if not engines or unknown:
            raise ClusterError(
                f"run.add_workers() takes engine ids of the run's cluster (Received: {engines}; "
                f"not in the cluster: {unknown}; it has {sorted(known)}). Pick engines from "
                "`cluster.engine_ids`, or start more (ipyparallel: `start_engines`).")
        roles = {e: "a hub shard" for e in self.roles.servers}
        roles.update({e: f"worker {w}" for w, e in enumerate(self.worker_engines)})
        busy = [f"engine {e} ({roles[e]})" for e in engines if e in roles]
        if busy or len(set(engines)) != len(engines):
            free = sorted(known - set(roles))
            raise ClusterError(
                f"run.add_workers() needs engines that are not in this run yet (Received: "
                f"{engines}; already in it: {', '.join(busy) or 'an engine named twice'}). Free "
                f"engines of the cluster: {free}.")
        if self._base is not None and self._base.stream:
            raise ConfigError(
                "This run streams its data set, cut into one shard per worker when it started "
                f"(Received: run.add_workers({engines})), so a new worker would have no shard. "
                "Start the run with all its workers (--workers N), or hold the data in memory "
                "(a larger --in-memory-limit) to add workers while it trains.")
        return engines

    def _check_reach(self, nets: dict) -> None:
        """Each hub listens on the one address its first peers reach (loopback when they all
        shared its host): a new engine on another host must reach that very address."""
        for s in self.roles.servers:
            hub, bound = self.nets[s], self.bind_hosts[s]
            for e, net in nets.items():
                if net.same_host(hub) or (bound != LOOPBACK and hub_address(hub, [net]) == bound):
                    continue
                where = f"host {hub.hostname}" + ("" if bound == LOOPBACK else f" or a host routed to {bound}")
                raise UnreachableHostError(
                    f"Engine {e} (host {net.hostname}, {net.address}) cannot reach the hub on engine "
                    f"{s}, which listens on {bound}: the address chosen for the hosts the run started "
                    f"with. Expected an engine on {where}. Add engines there, or start the run with a "
                    "worker on every host that may join.", host=net.hostname, address=bound)

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The trained flat parameters and non-trainable state (from the hub shards)."""
        return control.params()

    def checkpoint_state(self, control, final: bool) -> list:
        """Every hub shard's state, for a checkpoint (nbdist.checkpoint.store)."""
        return control.state()

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        """Where each hub shard runs (`run.hubs`): shard, host, engine, and how long it polls
        before it sleeps (`spin_s`, --spin)."""
        return [{"shard": i, "host": ep.get("host", "").split(":")[0], "engine": e, "spin_s": ep.get("spin_s", 0.0)}
                for i, (ep, e) in enumerate(zip(endpoints, self.roles.servers, strict=True))]

    def failure(self) -> Exception | None:
        """The first worker that raised, as an nbdist exception naming its engine."""
        for i, ar in list(self._tasks.items()):
            if i in self.lost or not ar.ready() or ar.successful():
                continue
            error = _get_error(ar, self.worker_engines[i])
            added = i >= len(self.roles.workers)
            if not (added or self.survives_worker_loss and _engine_died(ar)):
                return error
            self.lost[i] = str(error)
        return None

    def written_off(self, worker: int) -> None:
        """The hub wrote `worker` off: its task's end, an error included, no longer fails the
        run, and a task still running RELEASE_GRACE_S after the first call (hung in its step, or
        waiting for a reply the hub could not deliver) is interrupted, so its engine is free for
        the next run. Called on every poll while the hub lists it as lost."""
        if worker not in self._tasks or worker in self._interrupted:
            return
        if worker not in self.lost:
            self.lost[worker] = "written off by the hub"
            self._reported.add(worker)  # the hub knows: nothing to tell it
            self._written_off[worker] = time.monotonic()
        since = self._written_off.get(worker)
        if since is not None and time.monotonic() - since >= RELEASE_GRACE_S:
            self._interrupt([worker])

    def _interrupt(self, workers: list[int]) -> None:
        """SIGINT to the engines of these workers whose task still runs (ipyparallel's nanny
        relays it): the task ends with KeyboardInterrupt at its next Python instruction."""
        running = [w for w in workers if not self._tasks[w].ready()]
        self._interrupted.update(workers)
        if not running:
            return
        engines = [self.worker_engines[w] for w in running]
        log.warning("interrupting worker(s) %s on engine(s) %s: out of the run, still busy",
                    running, engines)
        try:
            self.cluster.client.send_signal("SIGINT", targets=engines, block=False)
        except Exception as exc:  # noqa: BLE001 - e.g. engines without a nanny: they stay busy
            log.warning("could not interrupt engine(s) %s: %s", engines, exc)

    def engines_died(self) -> list[int]:
        """Workers whose task failed because their engine process went away."""
        return [i for i, ar in list(self._tasks.items()) if ar.ready() and _engine_died(ar)]

    def newly_lost(self) -> list[tuple[int, str]]:
        """Workers whose engine died since the last call (found by `failure()`)."""
        new = [(i, why) for i, why in self.lost.items() if i not in self._reported]
        self._reported.update(i for i, _ in new)
        return new

    def workers_running(self) -> bool:
        return any(not ar.ready() for ar in list(self._tasks.values()))

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` for the worker tasks, interrupt those still running (stuck, or
        waiting for a hub that is gone) so their engines take the next run, then join the hubs.
        Takes at most `timeout` + INTERRUPT_WAIT_S + JOIN_MIN_S per hub shard."""
        from nbdist.hub.launch import join_hub

        deadline = time.monotonic() + timeout
        for ar in list(self._tasks.values()):
            ar.wait(max(0.0, deadline - time.monotonic()))
        stuck = [i for i, ar in list(self._tasks.items()) if not ar.ready()]
        if stuck:
            self._interrupt(stuck)
            end = time.monotonic() + INTERRUPT_WAIT_S
            for i in stuck:
                self._tasks[i].wait(max(0.0, end - time.monotonic()))
            busy = [self.worker_engines[i] for i in stuck if not self._tasks[i].ready()]
            if busy:
                log.warning("engine(s) %s still run a worker of this run after an interrupt; "
                            "restart them (%%nbdist stop, %%nbdist start N) if the next run cannot "
                            "use them", busy)
        client = self.cluster.client
        for shard, e in enumerate(self.roles.servers):
            wait = max(JOIN_MIN_S, min(30.0, deadline - time.monotonic()))  # join_hub: 15 s at most
            try:
                get_within(client[e].apply_async(join_hub, self._run_id, shard), e,
                           f"joining hub shard {shard}", timeout=wait)
            except Exception as exc:  # noqa: BLE001 - clean-up must go on
                log.warning("could not join hub shard %d on engine %d: %s", shard, e, exc)


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
