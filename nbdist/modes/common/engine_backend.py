"""What the backends that train on a cluster's engines share (`--mode async` and `--mode sync`):
where the hubs and workers go, and how their tasks are watched.

`EngineBackend` places them (roles, hosts, networks, each host's cores, TensorFlow threads,
--pin and --spin), starts one task per worker engine, and turns a failed task into the
nbdist error raised on its engine, naming it. Whether a run survives a worker whose engine
died is the mode's choice (`survives_worker_loss`): an async run goes on without it, a sync
run's allreduce cannot. The hub side (shards on engines, or a metrics hub in this kernel) and
the worker loop are each mode's own.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from nbdist.cluster.affinity import cores_per_host, may_spin, worker_threads
from nbdist.cluster.engines import ENGINE_TIMEOUT_S, Cluster, assign_roles, get_within
from nbdist.errors import EngineTimeoutError, RemoteCellError, from_engine
from nbdist.run.backend import returned

log = logging.getLogger(__name__)
RELEASE_GRACE_S = 2.0  # a written-off worker still running this long later is interrupted
INTERRUPT_WAIT_S = 5.0  # how long the end of a run waits for the tasks it interrupted
JOIN_MIN_S = 1.0  # and at least how long for each hub shard's engine, past its deadline


class EngineBackend:
    """Workers as ipyparallel tasks on a cluster's engines, and hubs (if any) on others.

    Worker i runs on `worker_engines[i]`; its task is `_tasks[i]`. Workers past the first
    `len(roles.workers)` were added while the run trained (async `add_workers`); such a worker
    that fails is written off whatever the cause, since an engine that joined must not end a
    run that was going well without it."""

    survives_worker_loss = False  # True: a worker whose engine died is written off, the run goes on
    cluster: Cluster  # the Run registers with it, so Cluster.stop() ends the run first

    def __init__(self, cluster: Cluster, num_servers: int, num_workers: int | None,
                 pin: bool = False, spin: bool = False):
        self.cluster, self.pin, self.spin = cluster, pin, spin
        hosts = cluster.engine_hosts()
        self.roles = assign_roles(hosts, num_servers, num_workers)
        self.hosts = hosts
        self.nets = cluster.engine_networks((*self.roles.servers, *self.roles.workers))
        self.cores = cores_per_host((hosts[e], net.cores) for e, net in self.nets.items())
        self.kernel_net = cluster.kernel_network()
        self._tasks: dict[int, object] = {}
        self.worker_engines = list(self.roles.workers)  # worker id -> engine (sync: in rank order)
        self.lost: dict[int, str] = {}  # worker -> why it is out (engine gone, written off)
        self._reported: set[int] = set()
        self._written_off: dict[int, float] = {}  # worker -> when the kernel learnt of it
        self._interrupted: set[int] = set()
        self._launched: dict[int, tuple] = {}  # worker -> (engine, fn, spec) of its task

    @property
    def num_workers(self) -> int:
        return len(self.roles.workers)

    # -- placement ----------------------------------------------------------------------------

    def host_cores(self, engine: int) -> int:
        """How many cores the engines on `engine`'s host may use (affinity.cores_per_host); this
        kernel's count where the engine could not tell."""
        return self.cores.get(self.hosts[engine]) or os.cpu_count() or 1

    def threads_for(self, engine: int, workers_here: int) -> int:
        """TensorFlow threads for a worker on `engine` beside `workers_here` workers (itself
        included): the cores its host's hub shards leave, shared."""
        hubs = sum(self.hosts[s] == self.hosts[engine] for s in self.roles.servers)
        return worker_threads(self.host_cores(engine), hubs, workers_here)

    def spin_for(self, engine: int, budget_s: float) -> float:
        """How long a hub or worker on `engine` polls before it sleeps: `budget_s` under --spin
        auto where the host has hubs and workers and leaves each hub a core
        (nbdist.cluster.affinity.may_spin, on the host's cores as `threads_for`), else 0. A worker
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

    # -- worker tasks -------------------------------------------------------------------------

    def _launch(self, worker: int, engine: int, fn, spec) -> None:
        """Run `fn(spec)` as worker `worker`'s task on `engine`."""
        self._tasks[worker] = self.cluster.client[engine].apply_async(fn, spec)
        self._launched[worker] = (engine, fn, spec)

    def failure(self) -> Exception | None:
        """The first worker that raised, as an nbdist exception naming its engine; a worker the
        run survives (see the class) is recorded in `lost` instead."""
        for i, ar in list(self._tasks.items()):
            if i in self.lost or not ar.ready() or ar.successful():
                continue
            engine = self.worker_engines[i]
            error = task_error(ar, engine, self.hosts.get(engine))
            added = i >= len(self.roles.workers)
            if not (added or self.survives_worker_loss and engine_died(ar)):
                return error
            self.lost[i] = str(error)
        return None

    def engines_died(self) -> list[int]:
        """Workers whose task failed because their engine process went away."""
        return [i for i, ar in list(self._tasks.items()) if ar.ready() and engine_died(ar)]

    def newly_lost(self) -> list[tuple[int, str]]:
        """Workers whose engine died since the last call (found by `failure()`)."""
        new = [(i, why) for i, why in self.lost.items() if i not in self._reported]
        self._reported.update(i for i, _ in new)
        return new

    def workers_running(self) -> bool:
        return any(not ar.ready() for ar in list(self._tasks.values()))

    def worker_results(self) -> dict[int, object]:
        """What each worker's task returned (async: its steps and data passes; sync: each
        rank's steps, learning rate and final parameters), for the tasks that returned."""
        return returned(self._tasks)

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

    def halt_workers(self) -> None:
        """Interrupt every worker task still running (a hub shard they all talk to is lost) and
        wait INTERRUPT_WAIT_S at most for them to end; `relaunch` starts them again."""
        running = [w for w, ar in list(self._tasks.items()) if not ar.ready()]
        self._interrupt(running)
        end = time.monotonic() + INTERRUPT_WAIT_S
        for w in running:
            self._tasks[w].wait(max(0.0, end - time.monotonic()))

    def relaunch(self, worker: int, **changes) -> None:
        """Start worker `worker`'s task again on its engine, with `changes` to its spec (new
        hub endpoints); its earlier task's end no longer counts."""
        engine, fn, spec = self._launched[worker]
        self._interrupted.discard(worker)
        self._written_off.pop(worker, None)
        self._launch(worker, engine, fn, replace(spec, **changes))

    def _wait_workers(self, timeout: float) -> None:
        """Wait up to `timeout` for the worker tasks, then interrupt those still running (stuck,
        or waiting for a hub that is gone) and wait INTERRUPT_WAIT_S more, so their engines
        take the next run; one that ignores the interrupt (native code) is named in the log."""
        deadline = time.monotonic() + timeout
        for ar in list(self._tasks.values()):
            ar.wait(max(0.0, deadline - time.monotonic()))
        stuck = [i for i, ar in list(self._tasks.items()) if not ar.ready()]
        if not stuck:
            return
        self._interrupt(stuck)
        end = time.monotonic() + INTERRUPT_WAIT_S
        for i in stuck:
            self._tasks[i].wait(max(0.0, end - time.monotonic()))
        busy = [self.worker_engines[i] for i in stuck if not self._tasks[i].ready()]
        if busy:
            log.warning("engine(s) %s still run a worker of this run after an interrupt; restart "
                        "them (%%nbdist stop, %%nbdist start N) if the next run cannot use them",
                        busy)


def get_started(ar, engine: int, what: str, host: str | None = None,
                timeout: float = ENGINE_TIMEOUT_S):
    """The value of a start-up task (`what`, e.g. "starting a hub shard") on `engine`, or the
    nbdist error it raised there."""
    try:
        return get_within(ar, engine, what, timeout)
    except EngineTimeoutError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the engine raised, named with its engine
        raise from_engine(exc, engine, host) from None


def task_error(ar, engine: int, host: str | None = None) -> BaseException:
    """The error of a failed task on `engine` (on `host`), as an nbdist exception."""
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return from_engine(exc, engine, host)
    return RemoteCellError(f"engine {engine} failed without an error", engine_id=engine, host=host)


def engine_died(ar) -> bool:
    """Whether a failed task failed because its engine process went away (killed, crashed),
    as ipyparallel reports it, rather than because the code raised."""
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return getattr(exc, "ename", type(exc).__name__) == "EngineError"
    return False
