"""The ipyparallel engine cluster: start, connect, stop, and who does what.

`Cluster` wraps an `ipyparallel.Cluster` (or a `Client` to one already running, e.g. on
Slurm) with the few things nbdist needs: engine ids and hosts, the address a hub should bind
on, and a pure `assign_roles` that decides which engines hold parameter shards and which
train, so it is tested without processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
import weakref
from dataclasses import dataclass

from nbdist.cluster.netaddr import (
    LAUNCHERS,
    controller_address,
    host_network,
    launcher_controller_ip,
)
from nbdist.cluster.watchdog import spawn
from nbdist.errors import (
    ClusterError,
    EngineTimeoutError,
    NoClusterError,
    NotEnoughEnginesError,
    UnreachableHostError,
)

log = logging.getLogger(__name__)
ENGINE_TIMEOUT_S = 60.0  # longest nbdist waits for an engine to answer a short request
QUEUE_ASK_S = 5.0  # a timeout's message asks the controller this long about the engine
SHUTDOWN_S = 15.0  # engines asked to exit get this long before their processes are stopped


def get_within(ar, engine: int, what: str, timeout: float = ENGINE_TIMEOUT_S):
    """`ar.get(timeout)` (an ipyparallel AsyncResult), or EngineTimeoutError naming `engine`.

    Example:
        >>> hosts = get_within(client[0].apply_async(socket.gethostname), 0,  # doctest: +SKIP
        ...                    "hostname")
    """
    try:
        return ar.get(timeout)
    except TimeoutError:
        raise EngineTimeoutError(
            f"Engine {engine} did not answer {what} within {timeout:.0f}s (Received: no reply; "
            f"{_queue_of(ar, engine)}). It may be stuck or overloaded. Check it with %nbdist "
            "status; restart the cluster with %nbdist stop and %nbdist start N.",
            engine_id=engine) from None


def answers(client, engine: int, timeout: float) -> bool:
    """Whether `engine` runs a trivial task within `timeout` (it is alive and idle)."""
    try:
        get_within(client[engine].apply_async(int, 1), engine, "a ping", timeout=timeout)
    except Exception:  # noqa: BLE001 - dead, busy or gone: not an engine to use
        return False
    return True


def wait_answering(client, engines, deadline: float) -> None:
    """Wait until every engine in `engines` has answered one request, or TimeoutError at
    `deadline` (`time.monotonic()`). A registered engine may still be busy starting on a loaded
    machine: a cluster is ready only once its engines answer, so that a run's first short
    request (ENGINE_TIMEOUT_S) never pays for an engine's start."""
    pending = [client[e].apply_async(os.getpid) for e in engines]
    for ar in pending:
        ar.get(max(0.0, deadline - time.monotonic()))


def _queue_of(ar, engine: int) -> str:
    """What the controller says of `engine`'s queue, for a timeout's message: a request still
    queued means a busy or stuck engine; an engine no longer registered, a dead one."""
    import threading

    answer: dict = {}

    def ask():
        try:
            client = ar._client  # noqa: SLF001 - the AsyncResult's own client
            answer["listed"] = engine in client.ids
            answer.update(client.queue_status(targets=engine, verbose=False))
        except Exception as exc:  # noqa: BLE001 - only a message's detail
            answer["error"] = exc

    asking = threading.Thread(target=ask, daemon=True)  # a stuck controller never answers
    asking.start()
    asking.join(QUEUE_ASK_S)
    if answer.get("listed") is False:
        return "the controller no longer lists it: it has stopped"
    if "error" in answer:
        return f"its controller could not be asked about it: {answer['error']!r}"
    if "queue" not in answer:
        return f"the controller did not say within {QUEUE_ASK_S:.0f}s what it holds for it"
    return (f"the controller lists it, with {answer['queue']} request(s) queued for it and "
            f"{answer.get('tasks', 0)} running")


@dataclass(frozen=True)
class Roles:
    """Which engines serve parameter shards and which train, plus each worker's local rank."""

    servers: tuple[int, ...]
    workers: tuple[int, ...]
    local_rank: dict[int, int]  # worker engine -> its index among workers on its host


def assign_roles(engine_hosts: dict[int, str], num_servers: int, num_workers: int | None) -> Roles:
    """Shards go to different hosts first (spreading network load); workers get the rest.

    Example:
        >>> r = assign_roles({0: "a", 1: "a", 2: "b", 3: "b"}, num_servers=2, num_workers=None)
        >>> r.servers, r.workers, r.local_rank
        ((0, 2), (1, 3), {1: 0, 3: 0})
    """
    engines = sorted(engine_hosts)
    wanted = num_servers + (num_workers or 1)
    if len(engines) < wanted:
        raise NotEnoughEnginesError(
            f"This run needs {num_servers} parameter shard(s) and {num_workers or 1} worker(s), "
            f"one engine each ({wanted}), but the cluster has {len(engines)} engine(s). "
            f"Start more with %nbdist start {wanted}, or lower --workers/--servers."
        )
    by_host: dict[str, list[int]] = {}
    for e in engines:
        by_host.setdefault(engine_hosts[e], []).append(e)
    servers: list[int] = []
    while len(servers) < num_servers:  # round-robin over hosts
        for host_engines in by_host.values():
            free = [e for e in host_engines if e not in servers]
            if free and len(servers) < num_servers:
                servers.append(free[0])
    rest = [e for e in engines if e not in servers]
    workers = rest if num_workers is None else rest[:num_workers]
    local_rank, seen = {}, {}
    for e in workers:
        host = engine_hosts[e]
        local_rank[e] = seen.get(host, 0)
        seen[host] = local_rank[e] + 1
    return Roles(tuple(sorted(servers)), tuple(workers), local_rank)


def require_curve(client, encrypt: bool, which: str) -> None:
    """--encrypt on a cluster whose channel is not CurveZMQ: refuse (and disconnect)."""
    if encrypt and not getattr(client, "curve_serverkey", None):
        client.close()
        raise ClusterError(
            f"--encrypt: the ipcluster ({which}) does not use CurveZMQ (Received: no "
            "curve_serverkey in its connection file), so its channel is not encrypted. Start it "
            "with `ipcluster start --IPController.enable_curve=True` (or IPP_ENABLE_CURVE=1), or "
            "connect without --encrypt on a trusted network.")


class Cluster:
    """A handle on an ipyparallel cluster that nbdist can train on.

    Example:
        >>> cluster = Cluster.start(3)          # doctest: +SKIP
        >>> run = nbdist.train(cell, cluster=cluster, epochs=1)  # doctest: +SKIP
        >>> cluster.stop()                      # doctest: +SKIP
    """

    def __init__(self, client, ipp_cluster=None, encrypt: bool = False):
        self.client = client
        self.encrypt = encrypt  # CurveZMQ on the hub sockets of every run on this cluster
        self._ipp_cluster = ipp_cluster  # None when we only connected: never stop theirs
        self._runs: weakref.WeakSet = weakref.WeakSet()  # runs on this cluster, stopped by stop()
        self._watchdog = None  # ends our engines if this kernel dies without stop()
        self._engines: tuple[int, ...] | None = None  # a subset's engines (see `subset`)
        self._shared_client = False  # a subset shares its parent's client: never close it

    @classmethod
    def start(cls, n: int, profile: str | None = None, timeout: float = 120.0, *,
              launcher: str = "local", controller_ip: str | None = None, encrypt: bool = False,
              cluster_id: str | None = None) -> Cluster:
        """Start `n` engines through ipyparallel's own launchers, and a controller here.

        `launcher`: "local" (processes on this machine; the controller on loopback), "slurm"
        (one sbatch job of `n` tasks) or "mpi" (`mpiexec -n n`; engines are MPI ranks). With
        Slurm or MPI the engines may land on other hosts, so the controller listens on this
        host's routed address (`controller_ip` overrides it). A watchdog starts first, so a
        kernel killed at any moment leaves no process behind. `encrypt`: CurveZMQ on
        ipyparallel's channels and on nbdist's hub sockets (--encrypt).

        Example:
            >>> cluster = Cluster.start(4, launcher="slurm")   # doctest: +SKIP
        """
        import ipyparallel as ipp  # not at `import nbdist`: only to start or connect

        if launcher not in LAUNCHERS:
            raise NoClusterError(f"Unknown launcher (Received: {launcher!r}). Expected one of "
                                 f"{', '.join(LAUNCHERS)}, e.g. %nbdist start 4 --launcher slurm.")
        cluster_id = cluster_id or f"nbdist-{secrets.token_hex(6)}"
        watchdog = spawn(cluster_id)  # before the first cluster process exists
        kwargs = {"n": n, "controller_ip": controller_ip or launcher_controller_ip(launcher),
                  "log_level": logging.WARNING, "engines": launcher, "cluster_id": cluster_id}
        if profile:
            kwargs["profile"] = profile
        if encrypt:
            kwargs["controller_args"] = ["--IPController.enable_curve=True"]
        ipp_cluster = ipp.Cluster(**kwargs)
        # its batch script goes to the profile's log folder, not the notebook's
        if launcher == "slurm":
            ipp_cluster.config.SlurmEngineSetLauncher.batch_file_name = os.path.join(
                ipp_cluster.profile_dir, "log", f"nbdist-engines-{ipp_cluster.cluster_id}.sbatch")
        try:
            ipp_cluster.start_cluster_sync()
            client = ipp_cluster.connect_client_sync()
            ready_by = time.monotonic() + timeout
            client.wait_for_engines(n, timeout=timeout, interactive=False)
            wait_answering(client, client.ids, deadline=ready_by)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ipp_cluster.stop_cluster_sync()
            watchdog.terminate()
            if isinstance(exc, TimeoutError):
                raise NoClusterError(
                    f"{n} engine(s) did not start and answer within {timeout:.0f}s through the "
                    f"{launcher} launcher. {LAUNCHERS[launcher]}") from None
            if isinstance(exc, Exception):
                raise NoClusterError(f"ipyparallel's {launcher} launcher could not start {n} "
                                     f"engine(s): {exc}. {LAUNCHERS[launcher]}") from None
            raise
        handle = cls(client, ipp_cluster, encrypt=encrypt)
        handle._watchdog = watchdog
        return handle

    @classmethod
    def connect(cls, profile: str | None = None, cluster_id: str | None = None,
                timeout: float = 30.0, connection_file: str | None = None, *,
                encrypt: bool = False) -> Cluster:
        """Connect to an ipcluster already running (started by hand, Slurm or MPI).

        `connection_file` is the controller's `ipcontroller-<id>-client.json`, for a controller
        started outside the profile folders this kernel knows. `encrypt`: the cluster must use
        CurveZMQ (its connection file names a server key), and nbdist's hub sockets use it too."""
        import ipyparallel as ipp  # not at `import nbdist`: only to start or connect

        kwargs = {k: v for k, v in (("profile", profile), ("cluster_id", cluster_id)) if v}
        try:
            client = ipp.Client(*([connection_file] if connection_file else []), timeout=timeout,
                                **kwargs)
        except (OSError, TimeoutError) as exc:
            raise NoClusterError(
                f"Could not connect to an ipcluster (profile={profile!r}, "
                f"cluster_id={cluster_id!r}): {str(exc).rstrip('.')}. Start one with "
                "`ipcluster start -n 4` (or your Slurm/MPI profile), or use "
                "%nbdist start N for a local one."
            ) from None
        require_curve(client, encrypt, f"profile={profile!r}, cluster_id={cluster_id!r}")
        return cls(client, encrypt=encrypt)

    @property
    def engine_ids(self) -> list[int]:
        return list(self._engines) if self._engines is not None else list(self.client.ids)

    def subset(self, engines) -> Cluster:
        """The same cluster restricted to some engines (a run uses only these); stopping the
        subset only disconnects it.

        Example:
            >>> run = nbdist.train(CELL, cluster=cluster.subset([0, 2, 3]))  # doctest: +SKIP
        """
        missing = sorted(set(engines) - set(self.client.ids))
        if missing:
            raise NoClusterError(f"Engines {missing} are not in the cluster (Received: "
                                 f"{list(engines)}; it has {list(self.client.ids)}). Pick engines "
                                 "from `cluster.engine_ids`.")
        view = Cluster(self.client, encrypt=self.encrypt)
        view._engines = tuple(engines)  # its own class's fields
        view._shared_client = True
        return view

    def engine_hosts(self) -> dict[int, str]:
        """engine id -> hostname, asked from the engines themselves."""
        ids = self.engine_ids
        if not ids:
            raise NoClusterError("The cluster has no engines. Start some with %nbdist start N.")
        pending = {e: self.client[e].apply_async(socket.gethostname) for e in ids}
        return {e: get_within(ar, e, "a request for its hostname") for e, ar in pending.items()}

    def controller_address(self) -> str:
        """The controller's address as the engines reach it (see `nbdist.cluster.netaddr`)."""
        return controller_address(self.client._config)  # noqa: SLF001

    def engine_networks(self, engines, timeout: float = 20.0) -> dict:
        """engine id -> its host's `HostNet` (routes, addresses, address towards the controller).

        Engines that do not answer within `timeout` raise an UnreachableHostError naming them."""
        engines, controller = list(engines), self.controller_address()
        pending = {e: self.client[e].apply_async(host_network, controller) for e in engines}
        nets, silent = {}, []
        for e, ar in pending.items():
            try:
                nets[e] = ar.get(max(0.1, timeout))
            except TimeoutError:
                silent.append(e)
        if silent:
            raise UnreachableHostError(
                f"Engine(s) {silent} did not answer within {timeout:.0f}s (controller at "
                f"{controller}). Expected every engine's host to be up and to reach the "
                "controller: check the host and its link, or leave those engines out with "
                "`cluster.subset(...)`.",
                address=controller)
        return nets

    def kernel_network(self):
        """This kernel's `HostNet` (the kernel talks to hubs and serves the sync rendezvous)."""
        return host_network(self.controller_address())

    def track(self, run) -> None:
        """Remember a run on this cluster, so `stop()` ends it before the engines go."""
        self._runs.add(run)

    @property
    def runs(self) -> list:
        """The runs started on this cluster (a subset tracks its own) that have not ended."""
        return [run for run in list(self._runs) if not run.ended()]

    def busy_engines(self) -> dict[int, int]:
        """Engine id -> the tasks it runs or has queued, for every engine that is not idle
        (ipyparallel's queue status): a run's worker still training, or a task stuck in code."""
        status = self.client.queue_status(targets=self.engine_ids)
        return {e: s["queue"] + s["tasks"] for e, s in status.items()
                if isinstance(e, int) and s["queue"] + s["tasks"]}

    @property
    def connect_args(self) -> dict | None:
        """What `Cluster.connect` (`%nbdist connect --profile P --cluster-id C`) takes to attach
        another kernel to this cluster; None for a cluster this kernel only connected to."""
        if self._ipp_cluster is None:
            return None
        return {"profile": self._ipp_cluster.profile, "cluster_id": self._ipp_cluster.cluster_id}

    def start_engines(self, n: int, timeout: float = 120.0) -> list[int]:
        """Start `n` more engines into a cluster this kernel started, as ipyparallel's launcher
        started the first (an `--elastic` run takes them in); returns their ids."""
        if self._ipp_cluster is None:
            raise NoClusterError("This kernel only connected to the cluster (Received: "
                                 "start_engines on a connected cluster). Start engines where it "
                                 "was started (ipcluster engines --cluster-id ...).")
        before = set(self.client.ids)
        self._ipp_cluster.start_engines_sync(n)
        ready_by = time.monotonic() + timeout
        self.client.wait_for_engines(len(before) + n, timeout=timeout, interactive=False)
        added = sorted(set(self.client.ids) - before)
        wait_answering(self.client, added, deadline=ready_by)
        return added

    def stop(self) -> None:
        """Stop engines and controller if we started them; otherwise just disconnect.
        A run still training is stopped first (its weights reach the notebook's model)."""
        for run in list(self._runs):
            run.close(timeout=30)
        if self._watchdog is not None:  # a stop on purpose: it must not fire on reused pids
            self._watchdog.terminate()
            self._watchdog.wait(10)
            self._watchdog = None
        try:
            if self._ipp_cluster is not None and self.client.ids:
                # ask engines to exit cleanly first, so none is killed mid-write; a stuck one
                # is named and then stopped with the others below
                self.client.shutdown(targets="all", block=False)
                deadline = time.monotonic() + SHUTDOWN_S
                while self.client.ids and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self.client.ids:
                    log.warning("engine(s) %s did not shut down within %.0fs; "
                                "stopping their processes", self.client.ids, SHUTDOWN_S)
        except Exception as exc:  # noqa: BLE001 - stopping the processes below still works
            log.warning("clean engine shutdown failed (%s); stopping processes", exc)
        if self._shared_client:
            return
        try:
            self.client.close()
        finally:
            if self._ipp_cluster is not None:
                # engines stopped on purpose exit non-zero; ipyparallel would then dump their
                # logs as warnings, which reads like a failure in the notebook
                self._ipp_cluster.log.setLevel(logging.ERROR)
                self._ipp_cluster.stop_cluster_sync()
                self._ipp_cluster = None

    def launcher_output(self, lines: int = 12) -> str:
        """How the engine processes this kernel started ended, for an error that says an engine
        died: each local engine process that has exited, and the MPI or Slurm launcher (one
        `mpiexec` or one job for every rank; Open MPI writes there which rank ended and on
        which signal), each with the last `lines` lines of its output (ipyparallel's file in the
        profile's log folder) and the file's path. "" for a cluster this kernel only connected
        to: its engines' output is where they were started."""
        if self._ipp_cluster is None:
            return ""
        parts = []
        for engine_set in list(self._ipp_cluster.engines.values()):
            launchers = getattr(engine_set, "launchers", None)  # one per local engine
            for launcher in (launchers.values() if launchers else [engine_set]):
                running = _running(launcher)
                if not (running and launchers):
                    parts.append(_launcher_tail(launcher, running, lines))
        return "\n".join(parts)

    def describe(self) -> str:
        ids = self.engine_ids
        kind = "local" if self._ipp_cluster is not None else "connected"
        secured = ", encrypted (CurveZMQ)" if self.encrypt else ""
        return f"{kind} ipyparallel cluster with {len(ids)} engine(s){secured}: {ids}"


def _running(launcher) -> bool:
    """Whether a launcher's process is still running (a batch job's launcher has none: taken
    as running)."""
    import psutil  # ipyparallel's own dependency, needed only here

    process = getattr(launcher, "process", None)
    if process is None:
        return True
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _launcher_tail(launcher, running: bool, lines: int) -> str:
    """One launcher's state and its output's last `lines` lines. ipyparallel cannot give the
    exit code here: its own thread reaps the process and hands the code to an event loop that
    runs only inside its calls."""
    path = getattr(launcher, "output_file", "") or ""
    try:
        with open(path, errors="replace") as f:
            output = f.read()
    except OSError:  # ipyparallel removes it once it has logged a failed launcher's output
        output = launcher.get_output(remove=False) or ""
    said = (f"{type(launcher).__name__} {getattr(launcher, 'identifier', '')} (pid "
            f"{getattr(launcher, 'pid', '?')}) {'is running' if running else 'has exited'}")
    if path:
        said += f", its output in {path}"
    tail = "".join(f"    {line}" for line in output.splitlines(True)[-lines:]).rstrip()
    return said + ("; it ends with:\n" + tail if tail else "")
