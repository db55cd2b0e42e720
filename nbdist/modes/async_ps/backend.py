"""Where an async run's hubs and workers live: engines of a cluster.

`ClusterBackend` starts the hub shards (processes supervised by dedicated engines) and one
worker task per worker engine, placed and watched as every engine backend's are
(nbdist/modes/common/engine_backend.py); the Run (nbdist/run/handle.py) drives it through the
`Backend` protocol (nbdist/run/backend.py), like every mode's backend. It can also start
workers on more engines while the run trains (`add_workers`, see nbdist/run/elastic.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from nbdist.cluster import affinity
from nbdist.cluster.affinity import HUB_SPIN_S, WORKER_SPIN_S, cores_per_host
from nbdist.cluster.engines import Cluster, answers, get_within
from nbdist.cluster.netaddr import LOOPBACK, check_reachable, hub_address, peer_addresses
from nbdist.errors import ClusterError, ConfigError, UnreachableHostError
from nbdist.hub.launch import join_hub, running_hubs, start_hub
from nbdist.hub.server import HubSpec
from nbdist.modes.common.engine_backend import JOIN_MIN_S, EngineBackend, get_started
from nbdist.modes.common.hub_weights import HubShardWeights
from nbdist.modes.common.worker import WorkerSpec, run_worker
from nbdist.run.backend import Backend
from nbdist.run.takeover import TAKEN

log = logging.getLogger(__name__)
PING_S = 5.0  # an engine that does not run a trivial task this fast is dead, or busy


def pin_hub_engine(place: tuple[int, int, int] | None) -> None:
    """On a hub's engine, before the hub starts: its cores under --pin auto
    (nbdist.cluster.affinity), or back to all of them."""
    if place is None:
        affinity.unpin_process()
    else:
        affinity.apply("hub", *place)


class ClusterBackend(HubShardWeights, EngineBackend, Backend):
    """Hub shards on dedicated engines; one worker task per worker engine.

    An async run survives a worker engine that dies: `failure()` skips it and `newly_lost()`
    reports it once, so the Run can tell the hub and go on with the others. A worker added
    mid-run (`add_workers`) that fails is written off the same way, whatever the cause."""

    survives_worker_loss = True

    def __init__(self, cluster: Cluster, num_servers: int, num_workers: int | None,
                 pin: bool = False, spin: bool = False):
        super().__init__(cluster, num_servers, num_workers, pin, spin)
        # each hub binds its own engine's interface towards the workers and this kernel
        peers = [self.nets[w] for w in self.roles.workers] + [self.kernel_net]
        self.bind_hosts = {s: hub_address(self.nets[s], peers) for s in self.roles.servers}
        # their addresses, where they connect from over TCP: the gates reserve their share
        self.peer_hosts = {s: peer_addresses(self.nets[s], peers) for s in self.roles.servers}
        self.seen_engines = set(cluster.client.ids)  # --elastic adds only engines that join later
        self.worker_base: WorkerSpec | None = None  # what every worker shares (start_workers)
        self._adding = threading.Lock()
        self._run_id = ""
        self.server_engines = list(self.roles.servers)  # shard -> engine (a takeover moves one)
        self.endpoints: list[dict] = []  # shard -> where it serves now
        self._hub_specs: list[HubSpec] = []  # shard -> the spec it started with

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        self._run_id = specs[0].run_id
        client = self.cluster.client
        encrypt = getattr(self.cluster, "encrypt", False)
        for e in self.roles.servers:  # the hub's process inherits its engine's cores
            client[e].apply_sync(pin_hub_engine, self._place(e, self.roles.servers))
        self._hub_specs = [replace(s, bind_host=self.bind_hosts[e], peer_hosts=self.peer_hosts[e],
                                   encrypt=encrypt, spin_s=self.spin_for(e, HUB_SPIN_S))
                           for e, s in zip(self.roles.servers, specs, strict=True)]
        pending = [client[e].apply_async(start_hub, s)
                   for e, s in zip(self.roles.servers, self._hub_specs, strict=True)]
        endpoints = [get_started(ar, e, "starting a hub shard", self.hosts.get(e))
                     for e, ar in zip(self.roles.servers, pending, strict=True)]
        for shard, (e, ep) in enumerate(zip(self.roles.servers, endpoints, strict=True)):
            address, port = ep["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
            check_reachable(address, int(port), f"hub shard {shard} (engine {e})", self.hosts[e])
        self.endpoints = list(endpoints)
        return endpoints

    # -- a lost hub shard (nbdist.run.takeover) -------------------------------------------------

    def take_over_shards(self, restores: dict[int, tuple], moved) -> list[dict] | None:
        """Start each lost shard anew from `restores` (shard -> params, non-trainable state,
        restore) on a free engine, or the engine of the run's last worker (written off), then
        every worker still in the run again towards it (see `Backend.take_over_shards`); None
        when each of them still serves after all."""
        restores = {s: r for s, r in restores.items() if not self._hub_alive(s)}
        if not restores:  # silent, but serving: slow, not lost
            return None
        self.halt_workers()  # they all talk to the lost shard: each starts again below
        moved_to: dict[int, dict] = {}
        for shard, (params, non_trainable, restore) in sorted(restores.items()):
            engine, worker = self._spare_engine(shard)
            if worker is not None:
                self.lost[worker] = f"{TAKEN} {shard}"
                self._reported.add(worker)  # the kernel tells the hub (moved)
            net = self.cluster.engine_networks([engine])[engine]
            self.nets[engine] = net
            self.hosts[engine] = net.hostname
            peers = [self.nets[w] for w in self.worker_engines if w in self.nets]
            self.bind_hosts[engine] = hub_address(net, [*peers, self.kernel_net])
            spec = replace(self._hub_specs[shard], params=params, non_trainable=non_trainable,
                           restore=restore, bind_host=self.bind_hosts[engine], spin_s=0.0)
            client = self.cluster.client
            client[engine].apply_sync(pin_hub_engine, None)
            endpoint = get_started(client[engine].apply_async(start_hub, spec), engine,
                                   f"taking over hub shard {shard}", self.hosts.get(engine))
            address, port = endpoint["tcp"].rsplit("/", 1)[-1].rsplit(":", 1)
            check_reachable(address, int(port), f"hub shard {shard} (engine {engine})",
                            self.hosts[engine])
            log.warning("hub shard %d taken over by engine %d (was engine %d)", shard, engine,
                        self.server_engines[shard])
            self.server_engines[shard], self.endpoints[shard] = engine, endpoint
            moved_to[shard] = endpoint
        added = {w: e for w, e in enumerate(self.worker_engines) if w >= len(self.roles.workers)}
        moved(moved_to, dict(self.lost), added)
        if self.worker_base is not None:  # workers added later find the shards where they are
            self.worker_base = replace(self.worker_base, shards=list(self.endpoints))
        for w in range(len(self.worker_engines)):
            if w not in self.lost:
                self.relaunch(w, shards=list(self.endpoints))
        return self.hub_places(self.endpoints)

    def _hub_alive(self, shard: int) -> bool:
        """Whether hub shard `shard`'s engine answers and says its hub still serves (a shard
        that did not answer the kernel may only be slow: a loaded host)."""
        engine = self.server_engines[shard]
        if engine not in self.cluster.client.ids:  # its engine is gone (the controller knows)
            return False
        try:
            serving = get_within(self.cluster.client[engine].apply_async(running_hubs), engine,
                                 "which hubs it serves", timeout=PING_S)
        except Exception:  # noqa: BLE001 - dead, or too stuck to say: the shard is lost
            return False
        return (self._run_id, shard) in [tuple(key) for key in serving]

    def _spare_engine(self, shard: int) -> tuple[int, int | None]:
        """An engine for lost shard `shard` (`spare_engine`), asked of the cluster now."""
        client = self.cluster.client
        return spare_engine(shard, self.server_engines, self.worker_engines, set(self.lost),
                            list(client.ids), lambda engine: answers(client, engine, PING_S))

    def start_workers(self, base: WorkerSpec) -> None:
        self.worker_base = base
        per_host = {}
        for e in self.roles.workers:
            per_host[self.hosts[e]] = per_host.get(self.hosts[e], 0) + 1
        for i, e in enumerate(self.roles.workers):
            spec = replace(base, worker=i, engine=e, local_rank=self.roles.local_rank[e],
                           threads=self.threads_for(e, per_host[self.hosts[e]]),
                           pin=self._place(e, self.roles.workers),
                           spin_s=self.spin_for(e, WORKER_SPIN_S))
            self._launch(i, e, run_worker, spec)

    def add_workers(self, engines: list[int], announce) -> list[int]:
        """Start workers on `engines` while the run trains, with the next worker ids (M, M+1,
        ...), the run's key, transport and compression, and threads and local rank as
        `start_workers` gives them. `announce(worker, engine)` tells the hub of each first (it
        refuses when the run is ending). Refused before anything starts: engines that are not
        in the cluster or already in this run, a streamed data set, a host the hubs do not
        listen towards. Returns the new worker ids."""
        with self._adding:
            engines = self.check_new_engines(engines)
            nets = self.cluster.engine_networks(engines)
            self.check_reach(nets)
            added = []
            for e in engines:
                worker, host = len(self.worker_engines), nets[e].hostname
                announce(worker, e)
                self.hosts[e], self.nets[e] = host, nets[e]
                self.cores = cores_per_host((self.hosts[n], net.cores)
                                            for n, net in self.nets.items())
                self.worker_engines.append(e)
                self.seen_engines.add(e)
                here = sum(self.hosts[w] == host for w in self.worker_engines)
                spec = replace(self.worker_base, worker=worker, engine=e, local_rank=here - 1,
                               threads=self.threads_for(e, here),
                               spin_s=self.spin_for(e, WORKER_SPIN_S))
                self._launch(worker, e, run_worker, spec)
                added.append(worker)
            return added

    def restart(self, control) -> dict | None:
        return None  # a worker whose engine died is written off; the run goes on without it

    def joined_engines(self) -> list[int]:
        """Engines that joined the cluster since the run started (or since the last call)."""
        new = sorted(e for e in self.cluster.client.ids if e not in self.seen_engines)
        self.seen_engines.update(new)
        return new

    def check_new_engines(self, engines) -> list[int]:
        """`engines` as a list, if `add_workers` may take them; else the error that says why:
        not engines of the cluster, already in the run, or a streamed data set."""
        engines = list(engines)
        known = set(self.cluster.client.ids)
        unknown = [e for e in engines
                   if isinstance(e, bool) or not isinstance(e, int) or e not in known]
        if not engines or unknown:
            raise ClusterError(
                f"run.add_workers() takes engine ids of the run's cluster (Received: {engines}; "
                f"not in the cluster: {unknown}; it has {sorted(known)}). Pick engines from "
                "`cluster.engine_ids`, or start more (ipyparallel: `start_engines`).")
        roles = {e: "a hub shard" for e in self.server_engines}
        roles.update({e: f"worker {w}" for w, e in enumerate(self.worker_engines)})
        busy = [f"engine {e} ({roles[e]})" for e in engines if e in roles]
        if busy or len(set(engines)) != len(engines):
            free = sorted(known - set(roles))
            raise ClusterError(
                f"run.add_workers() needs engines that are not in this run yet (Received: "
                f"{engines}; already in it: {', '.join(busy) or 'an engine named twice'}). Free "
                f"engines of the cluster: {free}.")
        if self.worker_base is not None and self.worker_base.stream:
            raise ConfigError(
                "This run streams its data set, cut into one shard per worker when it started "
                f"(Received: run.add_workers({engines})), so a new worker would have no shard. "
                "Start the run with all its workers (--workers N), or hold the data in memory "
                "(a larger --in-memory-limit) to add workers while it trains.")
        return engines

    def check_reach(self, nets: dict) -> None:
        """Refuse new engines (`nets`: engine -> HostNet) that cannot reach the hubs. Each hub
        listens on the one address its first peers reach (loopback when they all shared its
        host): a new engine on another host must reach that very address."""
        for s in self.server_engines:
            hub, bound = self.nets[s], self.bind_hosts[s]
            for e, net in nets.items():
                if net.same_host(hub) or (bound != LOOPBACK and hub_address(hub, [net]) == bound):
                    continue
                where = f"host {hub.hostname}" + (
                    "" if bound == LOOPBACK else f" or a host routed to {bound}")
                raise UnreachableHostError(
                    f"Engine {e} (host {net.hostname}, {net.address}) cannot reach the hub on "
                    f"engine {s}, which listens on {bound}: the address chosen for the hosts the "
                    f"run started with. Expected an engine on {where}. Add engines there, or start "
                    "the run with a worker on every host that may join.",
                    host=net.hostname, address=bound)

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        """Where each hub shard runs (`run.hubs`): shard, host, engine, and how long it polls
        before it sleeps (`spin_s`, --spin)."""
        return [{"shard": i, "host": ep.get("host", "").split(":")[0], "engine": e,
                 "spin_s": ep.get("spin_s", 0.0)}
                for i, (ep, e) in enumerate(zip(endpoints, self.server_engines, strict=True))]

    def finish(self, timeout: float) -> None:
        """Wait for the worker tasks (interrupting those still running at `timeout`), then join
        the hub shards, each within what is left of `timeout` (JOIN_MIN_S at least)."""
        deadline = time.monotonic() + timeout
        self._wait_workers(timeout)
        client = self.cluster.client
        for shard, e in enumerate(self.server_engines):
            wait = max(JOIN_MIN_S, min(30.0, deadline - time.monotonic()))  # join_hub: 15 s at most
            try:
                get_within(client[e].apply_async(join_hub, self._run_id, shard), e,
                           f"joining hub shard {shard}", timeout=wait)
            except Exception as exc:  # noqa: BLE001 - clean-up must go on
                log.warning("could not join hub shard %d on engine %d: %s", shard, e, exc)



def spare_engine(shard: int, server_engines: list[int], worker_engines: list[int], out: set[int],
                 engines: list[int], answers) -> tuple[int, int | None]:
    """Which engine takes lost hub shard `shard` over, and whose worker it was (None: a free
    one). `server_engines`: each shard's engine; `worker_engines`: each worker's, those in
    `out` no longer in the run; `engines`: the cluster's; `answers(engine)`: whether it runs a
    trivial task now (a dead or busy one does not). First a free engine that answers (the lost
    shard's own engine last: its process may have died alone); with none, the engine of the
    run's last worker, if another worker is left to train; else ClusterError saying what is
    missing.

    Example:
        >>> spare_engine(0, [0], [1, 2], set(), [0, 1, 2, 3], lambda e: e != 0)
        (3, None)
        >>> spare_engine(0, [0], [1, 2], set(), [1, 2], lambda e: True)
        (2, 1)
    """
    busy = {e for s, e in enumerate(server_engines) if s != shard}
    left = [w for w in range(len(worker_engines)) if w not in out]
    busy |= {worker_engines[w] for w in left}
    own = server_engines[shard]
    free = [e for e in sorted(engines) if e not in busy and e != own]
    free += [own] if own in engines else []
    for engine in free:
        if answers(engine):
            return engine, None
    if len(left) >= 2 and answers(worker_engines[left[-1]]):
        return worker_engines[left[-1]], left[-1]
    hubs = sorted(e for s, e in enumerate(server_engines) if s != shard)
    raise ClusterError(
        f"Hub shard {shard} was lost and no engine can take it over (Received: the cluster's "
        f"engines {sorted(engines)}; the other hub shards on {hubs}, {len(left)} worker(s) left "
        f"on {[worker_engines[w] for w in left]}, no other engine that answers). Expected a free "
        "engine, or a second worker whose engine can take the shard. Start more engines than the "
        "run uses (`%nbdist start N`), then run the cell again.")
