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

import os

from nbdist.cluster.affinity import cores_per_host, may_spin
from nbdist.cluster.engines import Cluster, assign_roles, get_within
from nbdist.errors import EngineTimeoutError, NbdistError, RemoteCellError


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
        self.lost: dict[int, str] = {}  # worker -> why its engine is gone
        self._reported: set[int] = set()

    @property
    def num_workers(self) -> int:
        return len(self.roles.workers)

    # -- placement ----------------------------------------------------------------------------

    def host_cores(self, engine: int) -> int:
        """How many cores the engines on `engine`'s host may use (affinity.cores_per_host); this
        kernel's count where the engine could not tell."""
        return self.cores.get(self.hosts[engine]) or os.cpu_count() or 1

    def _threads(self, engine: int, workers_here: int) -> int:
        """TensorFlow threads for a worker: the cores its host's hub shards leave, shared."""
        from nbdist.cluster.affinity import worker_threads

        hubs = sum(self.hosts[s] == self.hosts[engine] for s in self.roles.servers)
        return worker_threads(self.host_cores(engine), hubs, workers_here)

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

    # -- worker tasks -------------------------------------------------------------------------

    def _launch(self, worker: int, engine: int, fn, spec) -> None:
        """Run `fn(spec)` as worker `worker`'s task on `engine`."""
        self._tasks[worker] = self.cluster.client[engine].apply_async(fn, spec)

    def failure(self) -> Exception | None:
        """The first worker that raised, as an nbdist exception naming its engine; a worker the
        run survives (see the class) is recorded in `lost` instead."""
        for i, ar in list(self._tasks.items()):
            if i in self.lost or not ar.ready() or ar.successful():
                continue
            error = task_error(ar, self.worker_engines[i])
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

    def _wait_workers(self, timeout: float) -> None:
        for ar in list(self._tasks.values()):
            ar.wait(timeout)


def get_started(ar, engine: int, what: str):
    """The value of a start-up task (`what`, e.g. "starting a hub shard") on `engine`, or the
    nbdist error it raised there."""
    try:
        return get_within(ar, engine, what)
    except EngineTimeoutError:
        raise
    except Exception as exc:
        raise as_nbdist(exc, engine) from None


def task_error(ar, engine: int) -> Exception:
    """The error of a failed task on `engine`, as an nbdist exception."""
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return as_nbdist(exc, engine)
    return RemoteCellError(f"engine {engine} failed without an error")


def engine_died(ar) -> bool:
    """Whether a failed task failed because its engine process went away (killed, crashed),
    as ipyparallel reports it, rather than because the code raised."""
    try:
        ar.get(0)
    except Exception as exc:  # noqa: BLE001
        return getattr(exc, "ename", type(exc).__name__) == "EngineError"
    return False


def as_nbdist(exc: Exception, engine: int) -> Exception:
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
