"""The kernel side of `--mode sync` (synchronous training through an allreduce).

`SyncBackend` runs the ranks' rendezvous in this kernel, answering only requests signed with
the run's key (`nbdist.modes.sync.rendezvous`; bound to loopback for a local cluster): Horovod's
own server for `--collective horovod` (ranks from Horovod's `get_host_assignments`), a signed
key-value store for torch.distributed's Gloo group (`--collective torch`, ranks `host_slots`).
It gives every worker engine its rank's variables, checks every rank's network before any
starts (`nbdist.modes.sync.network`), and starts one rank per engine
(`nbdist.modes.sync.rank`), placed and watched as every engine backend's workers are
(nbdist/modes/common/engine_backend.py). A hub in its metrics-and-control role (no parameters)
runs as a thread in this kernel (nbdist/modes/common/kernel_hub.py), CurveZMQ with the cluster's
--encrypt. Only this module and the rank's import Horovod, and only for --collective horovod.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from nbdist.checkpoint.sync_state import fresh_state
from nbdist.cluster.engines import get_within
from nbdist.cluster.netaddr import kernel_address
from nbdist.errors import (
    ConfigError,
    DependencyError,
    TrainingError,
    UnreachableHostError,
    WorkersLostError,
)
from nbdist.fit.optimizer_state import OptimizerState, final_slots, shard_slots
from nbdist.hub.server import HubSpec
from nbdist.modes.common.engine_backend import EngineBackend
from nbdist.modes.common.kernel_hub import KernelHubs
from nbdist.modes.sync.network import preflight
from nbdist.modes.sync.rank import SyncSpec, run_sync_worker
from nbdist.modes.sync.rendezvous import signed_rendezvous, signed_store
from nbdist.modes.sync.restart import latest_state, rank_batch, start_at
from nbdist.run.backend import Backend, returned

RESULT_WAIT_S = 60  # for a rank's returned weights, once training has ended
GLOO_TIMEOUT_S = 30  # a rank silent this long fails the collective instead of hanging it
# how long a restart waits for the ranks left to leave their failed collective (a dead peer's
# closed connection fails it at once; Gloo's timeout bounds the rest)
RESTART_WAIT_S = GLOO_TIMEOUT_S + 15
STRANDED_GRACE_S = 10.0  # ranks stranded with no engine dead: the run fails this much later


def require_horovod() -> None:
    """Raise a DependencyError that says how to install Horovod if it is missing."""
    try:
        import horovod.tensorflow  # a probe; Horovod: only for --mode sync  # noqa: F401
    except ImportError as exc:
        raise DependencyError(
            f"--mode sync needs Horovod with TensorFlow support, which is not importable ({exc}). "
            "Build it with `make horovod` (Horovod 0.28.1, Gloo, from source), or use --mode async."
        ) from None


def choose_collective(given: str, keras_backend: str) -> str:
    """"horovod" or "torch" for `--collective given` on the kernel's Keras backend: auto is
    Horovod on TensorFlow where it is installed (its allreduce runs inside the compiled step),
    else torch.distributed. Raises what to install, or what to pick, where neither can run."""
    if given == "horovod":
        if keras_backend != "tensorflow":
            raise ConfigError(
                f"--collective horovod averages gradients inside TensorFlow graphs, and Horovod "
                f"has no {keras_backend} binding (Received: the kernel's Keras runs "
                f"{keras_backend}). Use --collective torch (torch.distributed over Gloo), the "
                f"default on {keras_backend}.")
        require_horovod()
        return "horovod"
    if given == "auto" and keras_backend == "tensorflow":
        try:
            require_horovod()
            return "horovod"
        except DependencyError:
            pass  # a machine without Horovod trains sync through torch.distributed
    if importlib.util.find_spec("torch") is None:
        raise DependencyError(
            f"--mode sync on Keras's {keras_backend} backend averages gradients with "
            f"torch.distributed (--collective {given}), but PyTorch is not installed here. "
            "Install it with `pip install 'nbdist[torch]'` (the CPU build; it brings Gloo) on "
            "the kernel's machine and the engines'"
            + (", or build Horovod with `make horovod`." if keras_backend == "tensorflow"
               else "."))
    return "torch"


def check_ranks(client, specs: list) -> None:
    """Every rank's network checks (`nbdist.modes.sync.network.preflight`) on its engine, before
    any rank starts: a refusal is raised here, in the kernel, and no engine is left waiting in
    Gloo's rendezvous for a rank that will not come (it would abort them)."""
    pending = [(s.engine, client[s.engine].apply_async(preflight, s.env)) for s in specs]
    for engine, ar in pending:
        refused = get_within(ar, engine, "the --mode sync check of its network")
        if refused is not None:
            raise UnreachableHostError(f"[engine {engine}] {refused['message']}",
                                       host=refused["host"], address=refused["address"])


def plaintext_note(encrypt: bool, rank_hosts: list[str]) -> str | None:
    """The `run.warnings` line for --encrypt when the ranks span hosts: Gloo sends gradients and
    weights between them unencrypted (Horovod has no encryption); None otherwise.

    Example:
        >>> plaintext_note(True, ["a", "a"]) is None, plaintext_note(True, ["a", "b"])[:30]
        (True, '--encrypt: the ranks on 2 host')
    """
    hosts = sorted(set(rank_hosts))
    if not encrypt or len(hosts) < 2:
        return None
    return (f"--encrypt: the ranks on {len(hosts)} hosts ({', '.join(hosts)}) exchange gradients "
            "and weights through Gloo (Horovod's or torch.distributed's), which has no "
            "encryption: those tensors cross the "
            "network in plaintext. The metrics hub uses CurveZMQ and the rendezvous is signed with "
            "the run's key. For encrypted training across hosts use --mode async (or --mode "
            "pipeline); otherwise keep sync runs on a trusted network (or one encrypted below "
            "nbdist, e.g. WireGuard).")


@dataclass(frozen=True)
class Slot:
    """One rank's place, as Horovod's `get_host_assignments` gives it (for --collective torch,
    which has no such helper)."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def host_slots(hosts: dict[str, int]) -> list[Slot]:
    """Ranks host by host, in the order given, as Horovod numbers them.

    Example:
        >>> [(s.hostname, s.rank, s.local_rank, s.cross_rank) for s in host_slots({"a": 2, "b": 1})]
        [('a', 0, 0, 0), ('a', 1, 1, 0), ('b', 2, 0, 1)]
    """
    size, slots = sum(hosts.values()), []
    for cross_rank, (host, count) in enumerate(hosts.items()):
        first = len(slots)
        slots += [Slot(host, first + local, size, local, count, cross_rank, len(hosts))
                  for local in range(count)]
    return slots


class SyncBackend(EngineBackend, Backend):
    """Horovod ranks on worker engines (no engine holds a hub); rendezvous and the metrics hub
    in this kernel. Rank r is worker r, on `worker_engines[r]`, until a rank's engine dies:
    then the ranks left start again from their state (`restart`), each keeping its worker
    id (`rank_workers`: the worker id of each rank)."""

    # an allreduce cannot go on without a rank: the run fails, or starts again on the ranks
    # left (`restart`)
    survives_worker_loss = False

    def __init__(self, cluster, num_workers: int | None, checkpoint_dir: str | None = None,
                 pin: bool = False, collective: str = "horovod",
                 batch_bounds: tuple[int, int | None] = (1, None)):
        if collective == "horovod":
            require_horovod()
        self.collective = collective
        super().__init__(cluster, num_servers=0, num_workers=num_workers, pin=pin)
        # engines started as MPI ranks (mpiexec, ipyparallel's MPI launcher) train like any
        # others: ranks and sizes come from the rendezvous below, and Gloo carries the tensors
        # Horovod's rendezvous server, signed (its `rejected` counts refusals)
        self.rendezvous = None
        self._hubs = KernelHubs()
        self.checkpoint_dir = checkpoint_dir
        self.results: dict[int, dict] = {}
        self.rank_workers: list[int] = []  # the worker id of each rank, in rank order
        self.batch_each = 0  # each rank's batch (the run's global batch is this x ranks)
        self.batch_bounds = batch_bounds  # --batch-min, --batch-max (None: none)
        self._base: SyncSpec | None = None
        self._stranded_at: float | None = None  # when a rank was first seen stranded

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        """The metrics hub (one shard, no parameters) on a thread of this kernel; CurveZMQ with
        the cluster's --encrypt (%nbdist start/connect)."""
        encrypt = bool(getattr(self.cluster, "encrypt", False))
        return self._hubs.start([replace(s, bind_host=self._kernel_bind_host(), encrypt=encrypt)
                                 for s in specs])

    def _kernel_bind_host(self) -> str:
        """This kernel's address towards the ranks (from routes; loopback if all are local)."""
        return kernel_address(self.kernel_net, [self.nets[w] for w in self.roles.workers])

    def start_workers(self, base: SyncSpec) -> None:
        self._base = base
        self.batch_each = base.batch_size
        self._start_ranks(list(self.roles.workers), None, base)

    def _start_ranks(self, engines: list[int], worker_of: dict[int, int] | None,
                     base: SyncSpec) -> None:
        """One rank on each of `engines`, numbered host by host, through a new rendezvous:
        rank r is worker r (`worker_of` None: a run's start), or keeps the hub's worker id its
        engine had (`worker_of`: engine -> worker, a restart on the ranks left).
        `rank_workers` is then each rank's worker id."""
        hosts: dict[str, list[int]] = {}
        for e in engines:
            hosts.setdefault(self.hosts[e], []).append(e)
        address = self._kernel_bind_host()
        if self.collective == "torch":  # a key-value store for Gloo, signed; no Horovod
            plan = host_slots({h: len(es) for h, es in hosts.items()})
            self.rendezvous = signed_store((address, 0), base.key, base.run_id)
        else:
            # Horovod: only for --collective horovod
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

            plan = get_host_assignments(
                parse_hosts(",".join(f"{h}:{len(es)}" for h, es in hosts.items())), len(engines))
            # Horovod's own server, bound to one address instead of all interfaces, signed
            # requests only
            self.rendezvous = signed_rendezvous((address, 0), base.key, base.run_id)
            self.rendezvous.init(plan)
        threading.Thread(target=self.rendezvous.serve_forever, daemon=True,
                         name="nbdist-sync-rendezvous").start()
        port = self.rendezvous.server_address[1]
        next_on_host = {h: iter(es) for h, es in hosts.items()}
        engines = [next(next_on_host[slot.hostname]) for slot in plan]  # rank order
        workers = worker_of or {e: rank for rank, e in enumerate(engines)}
        self.rank_workers = [workers[e] for e in engines]
        for engine, worker in zip(engines, self.rank_workers, strict=True):
            self.worker_engines[worker] = engine
        specs = []
        for slot, engine in zip(plan, engines, strict=True):
            env = {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank),
                   "HOROVOD_SIZE": str(slot.size), "HOROVOD_LOCAL_RANK": str(slot.local_rank),
                   "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                   "HOROVOD_CROSS_RANK": str(slot.cross_rank),
                   "HOROVOD_CROSS_SIZE": str(slot.cross_size), "HOROVOD_CONTROLLER": "gloo",
                   "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                   "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S),
                   "HOROVOD_GLOO_IFACE": f"route:{address}",  # resolved on the rank (rank_network)
                   "NBDIST_RENDEZVOUS_HOST": self.kernel_net.hostname,
                   "NBDIST_COLLECTIVE": self.collective,
                   "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60"}
            specs.append(replace(base, worker=workers[engine], collective=self.collective,
                                 engine=engine, local_rank=slot.local_rank, env=env,
                                 rank_workers=list(self.rank_workers),
                                 threads=max(1, self.host_cores(engine) // slot.local_size),
                                 pin=(slot.local_rank, 0, slot.local_size) if self.pin else None))
        try:
            check_ranks(self.cluster.client, specs)
        except BaseException:
            self._close_rendezvous()
            raise
        for spec in specs:
            self._launch(spec.worker, spec.engine, run_sync_worker, spec)

    def _close_rendezvous(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.shutdown()
            self.rendezvous.server_close()
            self.rendezvous = None

    @property
    def _rank0(self):
        """Rank 0's task (the source of the run's state)."""
        return self._tasks[self.rank_workers[0]]

    def _rank0_ended(self) -> bool:
        """Whether rank 0's task returned the run's final weights (not a state to start the
        ranks left from: a restart is under way, and the next rank 0 will answer)."""
        task = self._rank0
        if not task.ready():
            return False
        if not task.successful():
            return True
        return not task.get(0).get("peer_lost")

    def checkpoint_state(self, control, final: bool) -> list:
        """Rank 0's weights, optimizer slots and data position (see
        nbdist.checkpoint.sync_state)."""
        return fresh_state(control, final, ended=self._rank0_ended)

    def optimizer_state(self, control, final: bool) -> OptimizerState | None:
        """Rank 0's optimizer slots now, or what it returned at the end."""
        return final_slots(self) if final else shard_slots(self.checkpoint_state(control, False))

    def failure(self) -> Exception | None:
        """A rank whose engine died fails the run, with what to do next, unless the kernel
        starts the ranks left again (`restart`, which the run's monitor tries first). Ranks
        stranded in a failed collective with no rank's engine dead and none failed (another
        rank hangs outside it) fail the run after STRANDED_GRACE_S."""
        error = super().failure()
        dead = self._newly_dead()
        if error is None:
            return self._stranded_failure()
        if not dead:
            return error
        where = (f"nbdist.resume({self.checkpoint_dir!r}, cluster=...) (or %%distribute --resume "
                 f"{self.checkpoint_dir}) continues from the last checkpoint"
                 if self.checkpoint_dir
                 else "start the run again (with --checkpoint-dir to be able to resume)")
        engine = self.worker_engines[dead[0]]
        ended = self.cluster.launcher_output()
        left = [w for w in self.rank_workers if w not in dead]
        why = ("no rank is left" if not left else
               "the ranks left could not start again from their state")
        return WorkersLostError(
            f"Rank {self.rank_workers.index(dead[0])}'s engine ({engine}) died during a --mode "
            f"sync run, and {why}, so the run failed. Restart the engines "
            f"(%nbdist stop, %nbdist start N), then {where}."
            + (f"\nThe engine processes this kernel started: {ended}" if ended else ""))

    def _newly_dead(self) -> list[int]:
        """Workers whose engine died and that are not yet out of the run."""
        return [w for w in self.engines_died() if w not in self.lost]

    def _stranded(self) -> dict[int, dict]:
        """The ranks that returned their state from a failed collective, by worker id."""
        return {w: r for w, r in returned(self._tasks).items()
                if w not in self.lost and isinstance(r, dict) and r.get("peer_lost")}

    def _stranded_failure(self) -> TrainingError | None:
        stranded = self._stranded()
        if not stranded:
            self._stranded_at = None
            return None
        now = time.monotonic()
        self._stranded_at = self._stranded_at or now
        result = stranded[min(stranded, key=lambda w: stranded[w]["rank"])]
        if set(stranded) >= set(self.rank_workers) - set(self.lost):
            return TrainingError(  # the same step failed on every rank: no peer was lost
                f"Every rank's step failed, with no rank's engine dead: {result['peer_lost']}. "
                "Fix the cause (the error names it) and run the cell again.")
        if now - self._stranded_at < STRANDED_GRACE_S:
            return None  # the rank whose engine died shows in a moment
        return TrainingError(
            f"Rank {result['rank']}'s collective failed ({result['peer_lost'][:300]}), with no "
            "rank's engine dead and no rank failed: another rank stopped taking part (it hangs, "
            "or its network failed). Check the engines with %nbdist status, then run the cell "
            "again.")

    def restart(self, control) -> dict | None:
        """Ranks whose engine died: start the ranks left again from the state they hold, as
        the run's monitor asks (`nbdist.run.restart`), and return what to report. None when no
        rank's engine died, none is left, or a rank left returned no state (it raised, or
        hangs: the run then fails with `failure()`'s error). The hub learns at once who is out
        (ranks waiting on it, at an epoch's gate, then leave too), and each rank's batch (the
        global batch kept) before the ranks start again."""
        dead = self._newly_dead()
        if not dead or self._base is None or not set(self.rank_workers) - set(dead):
            return None
        for w in dead:  # the hub stops waiting for them, and tells the ranks left
            self._lose(w, control)
        deadline = time.monotonic() + RESTART_WAIT_S  # the ranks left leave their collective
        for w in self.rank_workers:
            if w not in self.lost:
                self._tasks[w].wait(max(0.0, deadline - time.monotonic()))
        for w in self._newly_dead():  # died meanwhile
            dead.append(w)
            self._lose(w, control)
        left = [w for w in self.rank_workers if w not in self.lost]
        self._interrupt([w for w in left if not self._tasks[w].ready()])
        done = returned(self._tasks)
        if left and all(w in done and not done[w].get("peer_lost") for w in left):
            return self._ended_without(dead)  # lost after the last step: nothing to train again
        stranded = {w: r for w, r in self._stranded().items() if w in left}
        if not left or set(stranded) != set(left):
            return None  # a rank left raised, or hangs: no common state to start from
        source, state = latest_state(stranded)
        global_batch = self.batch_each * len(self.rank_workers)
        each, warning = rank_batch(global_batch, len(left), *self.batch_bounds)
        control.control(ranks=left, rank_batch=each)
        base = self._base
        epoch, offset = start_at(state["position"], base.epoch_size or base.num_samples)
        resume = {"epoch": epoch, "offset": offset, "steps": int(state["steps"]),
                  "iterations": int(state["iterations"]), "slots": state["slot_shapes"],
                  "constant_lr": bool(state["constant_lr"]), "restarted": True}
        self._base = replace(base, initial_params=state["params"],
                             initial_non_trainable=state["non_trainable"],
                             initial_slots=state["slots"], resume=resume, batch_size=each,
                             lr=float(state["lr"]))
        self.batch_each = each
        lost_ranks = [self.rank_workers.index(w) for w in dead]
        lost_engines = [self.worker_engines[w] for w in dead]
        self._close_rendezvous()
        self._interrupted.difference_update(left)  # their new tasks may be written off again
        self._start_ranks([self.worker_engines[w] for w in left],
                          {self.worker_engines[w]: w for w in left}, self._base)
        notes = [warning] if warning else []
        if base.compression.split(":")[0] not in ("none", "fp16"):
            notes.append(f"--compression {base.compression}'s error feedback starts afresh")
        summary = (f"rank(s) {', '.join(map(str, lost_ranks))} were lost (engine(s) "
                   f"{', '.join(map(str, lost_engines))} died); the {len(left)} rank(s) left "
                   f"started again from the last step every rank had applied (epoch {epoch + 1}, "
                   f"{offset} samples into it), so no update was lost, each with a batch of "
                   f"{each}" + "".join(f"; {n}" for n in notes))
        return {"event": "ranks_restarted", "lost_ranks": lost_ranks, "engines": lost_engines,
                "ranks": len(left), "batch_size": each, "epoch": epoch, "offset": offset,
                "steps_lost": 0, "from_worker": source, "reason": "engine died",
                "summary": summary}

    def _lose(self, worker: int, control) -> None:
        """`worker`'s engine died: out of the run, on the hub too."""
        self.lost[worker] = "engine died"
        self._reported.add(worker)  # the hub is told here
        control.control(lost=worker, reason="engine died")

    def _ended_without(self, dead: list[int]) -> dict:
        """Ranks lost after the last step (every rank left returned its final weights): the run
        ends with theirs, rank 0 the first of them."""
        lost_ranks = [self.rank_workers.index(w) for w in dead]
        engines = [self.worker_engines[w] for w in dead]
        self.rank_workers = [w for w in self.rank_workers if w not in self.lost]
        return {"event": "ranks_restarted", "lost_ranks": lost_ranks, "engines": engines,
                "ranks": len(self.rank_workers), "steps_lost": 0, "reason": "engine died",
                "summary": f"rank(s) {', '.join(map(str, lost_ranks))} were lost (engine(s) "
                           f"{', '.join(map(str, engines))} died) after the last step; the run "
                           "ends with the weights of the ranks left, identical to theirs"}

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        """None: the kernel's metrics hub holds no parameters."""
        return []

    def add_workers(self, engines: list[int], announce) -> list[int]:
        raise ConfigError(f"A --mode sync run's Horovod ranks are fixed when it starts (Received: "
                          f"run.add_workers({list(engines)})). Start the run with more --workers, "
                          "or use --mode async to add workers while it trains.")

    def take_over_shards(self, restores: dict[int, tuple], moved) -> list[dict]:
        raise TrainingError("A --mode sync run's hub holds no parameters to take over "
                            f"(Received: hub shard(s) {sorted(restores)} lost). Its ranks hold "
                            "the model.")

    def joined_engines(self) -> list[int]:
        return []  # the ranks are fixed: engines that join are not taken in

    def newly_lost(self) -> list[tuple[int, str]]:
        return []  # a lost rank fails the run (`failure`) or restarts it (`restart`)

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        """Rank 0's weights (every rank holds the same)."""
        result = self._rank0.get(RESULT_WAIT_S)
        self.results = {i: ar.get(RESULT_WAIT_S) for i, ar in self._tasks.items()
                        if i not in self.lost}
        return result["params"], result["non_trainable"]

    def current_weights(self, control) -> tuple[np.ndarray, np.ndarray]:
        """Rank 0's weights now: it sends its state between two steps when asked, as for a
        checkpoint (nbdist.checkpoint.sync_state); once its task has returned (the last
        epoch ended), the weights it returned."""
        if not self._rank0_ended():
            try:
                (_header, (params, non_trainable, _slots)), = fresh_state(
                    control, final=False, ended=self._rank0_ended)
                return params, non_trainable
            except TrainingError:
                if not self._rank0_ended():
                    raise
        rank0 = self._rank0
        result = rank0.get(RESULT_WAIT_S)
        return result["params"], result["non_trainable"]

    def finish(self, timeout: float) -> None:
        self._wait_workers(timeout)
        self._hubs.join(timeout)
        self._close_rendezvous()
