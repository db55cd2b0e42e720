"""The run's coordinator, kept by hub shard 0: who does what next. No sockets.

It hands out data chunks (global epochs), counts each push into the statistics and the
per-worker timeline (`nbdist.core.push_log`), decides batch sizes (DBS-SGD), holds the control
state (pause, stop, slow-down, batch policy; the kernel changes it through `apply`), queues
validation jobs at epoch ends, gates workers that run too far ahead (SSP), forms speed groups
(group sync), and takes in workers added mid-run. For each
worker request the shard core (`nbdist.core.shard`) calls `assign` (the state changes: chunks
handed out, an evaluation job taken, the node's state; False: hold the reply), then the pure
`reply_for`, which reads the reply off that state.

It owns the run's one SSP clock (`clock`), the speed groups and their options (`groups`,
`nbdist.core.speed_groups`; the rule only validates them), and the learning rate when
the workers apply it (`lr`; else the hub optimizer owns it and `lr` stays None). Shards 1..S-1
learn a worker's group from its push header: shard 0 tells the worker in every reply.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from nbdist.algorithms.ssp import StalenessClock
from nbdist.core.dbs import BatchSizer
from nbdist.core.epoch_metrics import EpochSums
from nbdist.core.liveness import Liveness
from nbdist.core.plan import Plan  # (defined there; importable from here too)
from nbdist.core.push_log import PushLog
from nbdist.core.schedule import EpochSchedule
from nbdist.core.speed_groups import SpeedGroups
from nbdist.core.stats import Completed, RunStats
from nbdist.wire.messages import Chunk, EvalJob, Reply, ReportReply

if TYPE_CHECKING:
    from nbdist.wire.messages import Control, EvalResult, Hello, Report, Step

GROUP_WARMUP_PUSHES = 5  # pushes per worker measured before speed groups are formed
DBS_WARMUP_STEPS = 2  # first steps of each worker that DBS does not measure


class Coordinator:
    """State machine of one run, driven by the hub's message handlers."""

    def __init__(self, plan: Plan, start_time: float = 0.0):
        self.plan = plan
        n = plan.num_workers
        self.schedule = EpochSchedule(plan.num_samples, plan.epochs)
        self.stats = RunStats(n, start_time=start_time)
        self.epoch_metrics = EpochSums()  # the pushes' metric increments, per epoch
        self.sizer = BatchSizer(n, plan.batch_size, b_min=plan.batch_min,
                                b_max=plan.batch_max or max(plan.batch_size * n, plan.batch_size),
                                policy="dbs" if plan.dbs else "fixed", warmup=DBS_WARMUP_STEPS)
        # the run's one SSP clock, and the speed groups: decided here, followed live (control)
        self.clock = StalenessClock(n, plan.staleness) if plan.staleness is not None else None
        self.groups = SpeedGroups(plan)
        self.pushes = PushLog(self.stats, plan.metrics, self.groups)  # stats, delays, timeline
        # (the hub's rate is its optimizer's)
        self.lr = plan.lr if plan.lr_owner == "workers" else None
        self.paused = False
        self.steps_counted = 0  # pushes (sync: rank steps) completed; --pause-at counts them
        self._count_step(start_time, by=0)  # --pause-at 0: the run starts paused
        self.stopping = False
        self.slowdown = list(plan.slowdown) or [1.0] * n
        # chunks a worker holds
        self.assigned: dict[int, deque[Chunk]] = {w: deque() for w in range(n)}
        self._eval_job: dict[int, EvalJob] = {}  # the evaluation job `assign` gave a worker last
        self.eval_queue: deque[int] = deque()
        self.evaluating: dict[int, int] = {}
        self.arrived: set[int] = set()
        self._all_here = False  # latched once the configured M workers have all said hello
        self.joining: set[int] = set()  # added mid-run, not yet said hello
        self.gone: set[int] = set()
        self.lost: set[int] = set()
        self.liveness = Liveness()  # who is silent past their deadline
        self.reported_epochs = 0.0
        # epoch gate (a cell's fit call): chunks of an epoch are handed out only once the kernel
        # has run the callbacks of the one before (`epoch_done`); None: no gate
        self.open_epoch: int | None = 0 if plan.epoch_gate else None
        self.state_wanted = 0  # sync mode: +1 per checkpoint request, passed on to rank 0
        for w in range(n):
            self.stats.workers[w].batch_size = self.sizer.batch_for(w)

    # -- workers ----------------------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """Workers of the run so far: the configured M plus those added mid-run."""
        return len(self.stats.workers)

    def add_worker(self, worker: int, now: float, engine: int | None = None) -> None:
        """Bring worker `worker` into the running job (`Run.add_workers`); ids follow on from M.

        What depends on the configured M keeps `plan.num_workers` (softsync's c, EASGD's α, the
        start barrier: nobody waits for a newcomer still starting). Everything kept per worker
        gets an entry: assigned chunks, a stats row ("starting" until its hello), a DBS batch of
        b0 (B = active · b0; the others keep theirs until the next rebalance), slow-down 1, a
        group of its own until the next regroup. SSP counts it from its hello, at the slowest
        clock then, so a worker still starting holds nobody back.
        """
        if worker != self.num_workers:
            raise ValueError(f"a worker added mid-run takes the next id, {self.num_workers} "
                             f"(Received: {worker})")
        if self.stopping or self.finished or self.schedule.finished:
            raise ValueError("the run is ending (stopped, or every sample of every epoch trained "
                             "on), so it takes no new worker; start a new run to train more")
        self.assigned[worker] = deque()
        self.stats.add_worker(engine)
        self.sizer.add(worker)
        self.stats.workers[worker].batch_size = self.sizer.batch_for(worker)
        self.slowdown.append(1.0)
        self.groups.add(worker)
        if self.clock is not None:
            self.clock.add(worker)  # known, not waited for: it joins on hello
        self.joining.add(worker)
        self.stats.record_event("worker_added", now, worker=worker, engine=engine,
                                batch_size=self.sizer.batch_for(worker))

    def hello(self, hello: Hello) -> None:
        worker = hello.worker
        self.stats.workers[worker].hello(hello)
        # a hello is a new process (started again after a takeover, or a rejoin): the evaluation
        # its earlier process held is gone with it, so someone evaluates it again
        self._eval_job.pop(worker, None)
        epoch = self.evaluating.pop(worker, None)
        if epoch is not None and not self.stopping:
            self.eval_queue.appendleft(epoch)
        self.gone.discard(worker)
        self.arrived.add(worker)
        if worker in self.joining:  # added mid-run and here now: SSP counts it from the slowest
            self.joining.discard(worker)
            if self.clock is not None:
                self.clock.join(worker)
        if worker in self.lost:  # it came back (rejoin): train on from the slowest clock
            self.lost.discard(worker)
            self.liveness.rejoined(worker)
            if self.clock is not None:
                self.clock.join(worker)

    def bye(self, worker: int, now: float) -> None:
        self.gone.add(worker)
        self.stats.workers[worker].state = "done"
        for chunk in self.assigned[worker]:  # stopped mid-chunk: another worker may take it
            self.schedule.requeue(chunk.id)
        self.assigned[worker].clear()
        self._eval_job.pop(worker, None)
        epoch = self.evaluating.pop(worker, None)
        if epoch is not None and not self.stopping and self.arrived - self.gone:
            self.eval_queue.appendleft(epoch)  # left before reporting: someone else evaluates
        if self.clock is not None:
            self.clock.drop(worker)

    def push(self, step: Step, delay: int, now: float) -> None:
        """Count one applied push: `complete` (what the next reply depends on), then `account`."""
        self.account(step, self.complete(step, now), delay, now)

    def complete(self, step: Step, now: float) -> Completed:
        """The part of a push the next reply depends on: its chunks done (epoch ends, eval
        jobs), its speed (DBS, loss deadline), its SSP clock. Returns what `account` takes,
        read now so that accounting later (in a batch) records the same numbers."""
        worker = step.worker
        assigned = self.assigned[worker]
        samples = 0
        ended = []
        for chunk_id in step.chunks:
            chunk = next((c for c in assigned if c.id == chunk_id), None)
            if chunk is None:
                raise ValueError(f"worker {worker} pushed chunk {chunk_id}, which it does not hold")
            assigned.remove(chunk)
            samples += chunk.size
            finished_epoch = self.schedule.complete(chunk.id)
            if finished_epoch is not None:
                ended.append(finished_epoch)
                if self.plan.has_validation:
                    self.eval_queue.append(finished_epoch)
        self.liveness.pushed(worker, now, self.slowdown[worker])
        self.sizer.observe(worker, samples, float(step.compute_s))
        if self.clock is not None:
            self.clock.tick(worker)
        batch_size = self.sizer.batch_for(worker)  # before a rebalance: what this push trained with
        rebalanced = list(self.sizer.batches) if self.sizer.maybe_rebalance() else None
        self._count_step(now)
        return Completed(samples, batch_size, rebalanced, self.epochs_done, ended)

    def account(self, step: Step, done: Completed, delay: int, now: float) -> None:
        """The bookkeeping of a push (statistics, timeline, delays; speed groups once measured),
        which a reply does not wait for, except under group sync (groups form from it)."""
        if step.metrics is not None:
            # before the epoch end it may complete: the epoch's sums are whole
            self.epoch_metrics.add(step.metrics)
        for epoch in done.ended:
            self.stats.record_event("epoch_end", now, epoch=epoch)
        self.pushes.count(step, done.samples, done.batch_size, delay, now, done.epoch,
                          self.slowdown[step.worker])
        if done.rebalanced is not None:
            self.stats.record_event("rebalance", now, batches=done.rebalanced)
        if not self.groups.formed and self.plan.syncs_groups and all(
                self.stats.workers[w].steps >= GROUP_WARMUP_PUSHES
                for w in self.arrived - self.gone):
            self.regroup(now)

    def report(self, report: Report, now: float) -> ReportReply:
        """A synchronous rank's step (metrics only); returns the control for rank 0 to share."""
        worker = report.worker
        self.heard(worker, now)  # a rank that reports is alive (without this, lost after 30 s)
        if report.metrics is not None:
            self.epoch_metrics.add(report.metrics)
        if report.epoch_end is not None and self.epoch_metrics.rank_ended(
                report.epoch_end, worker, set(range(self.num_workers)) - self.lost):
            self.stats.record_event("epoch_end", now, epoch=report.epoch_end)
        if report.batch:
            self.reported_epochs = max(self.reported_epochs, float(report.epoch))
            self.sizer.observe(worker, report.samples, float(report.compute_s))
            self.pushes.count(report, report.samples, self.sizer.batch_for(worker), 0, now,
                              self.epochs_done, self.slowdown[worker])
            first = min(w for w in range(self.num_workers) if w not in self.lost)
            if worker == first and self.sizer.maybe_rebalance():  # rank 0's report (or the
                # first rank left's, after a restart) paces the rebalancing
                self.stats.record_event("rebalance", now, batches=list(self.sizer.batches))
            self._count_step(now)
        self.eval_result(worker, report.eval, now)
        self.stats.workers[worker].state = "paused" if self.paused else "running"
        return ReportReply(lr=self.lr, paused=self.paused, stop=self.stopping,
                           send_state=self.state_wanted, batches=list(self.sizer.batches),
                           slowdown=self.slowdown[worker], open_epoch=self.open_epoch,
                           lost=sorted(self.lost))

    def eval_result(self, worker: int, result: EvalResult | None, now: float) -> None:
        if result is not None:
            self.evaluating.pop(worker, None)
            self.stats.record_eval(result.metrics, epoch=result.epoch, version=result.version,
                                   now=now)

    def blocked(self, worker: int) -> bool:
        """Whether `worker`'s reply must wait (SSP: too far ahead of the slowest). Pure."""
        return self.clock is not None and self.clock.blocked(worker) and not self.stopping

    def assign(self, worker: int, pulled: bool, version: int) -> bool:
        """On a request of `worker`: hand out chunks, take an evaluation job (with the weights
        it pulls, `version`), set its node state. False: hold the reply (SSP), nothing handed
        out."""
        self._eval_job.pop(worker, None)
        if self.blocked(worker):
            self.stats.workers[worker].state = "blocked"
            return False
        plan, assigned = self.plan, self.assigned[worker]
        if not self._all_here:  # the configured workers start together; added ones need not wait
            self._all_here = self.arrived.issuperset(range(plan.num_workers))
        while (self._all_here and len(assigned) < self._chunks_ahead(worker)
               and not (self.paused or self.stopping)):
            chunk = self.schedule.next_chunk(self.sizer.batch_for(worker), self.open_epoch)
            if chunk is None:
                break
            assigned.append(chunk)
        if pulled and self.eval_queue and worker not in self.evaluating and not self.stopping:
            epoch = self.eval_queue.popleft()
            self.evaluating[worker] = epoch
            self._eval_job[worker] = EvalJob(epoch, version)
        state = "paused" if self.paused else ("running" if assigned else "waiting")
        self.stats.workers[worker].state = state if self._all_here else "starting"
        return True

    def _chunks_ahead(self, worker: int) -> int:
        """The chunks `worker` may hold. A round of local steps takes at most the worker's
        share of an epoch (the batches of those who train beside it over the epoch's samples:
        its synchronous group's, or, asynchronous, every worker's), so that the first to ask
        does not take the epoch and leave the others idle (at the barrier, or without data).

        Example:
            >>> c = Coordinator(Plan(num_workers=2, num_samples=100, epochs=1, batch_size=10,
            ...                      lr=0.1, has_validation=False, algorithm="diloco",
            ...                      groups=1, chunks_ahead=500, local_steps=500))
            >>> c._chunks_ahead(0)
            5
        """
        ahead = self.plan.chunks_ahead
        if self.plan.local_steps > 1 and self.plan.shares_rounds:
            if self.plan.syncs_groups:
                members = [m for m in self.groups.of[worker] if m not in self.gone]
            else:
                members = sorted(set(range(len(self.assigned))) - self.gone)
            round_batch = sum(self.sizer.batch_for(m) for m in members or [worker])
            ahead = min(ahead, max(1, -(-self.plan.num_samples // round_batch)))
        return ahead

    def reply_for(self, worker: int, pulled: bool, version: int) -> Reply:
        """Control, chunks, eval job and done-flag for `worker` at the shard's `version`, read
        off the state `assign` left. Pure: asking twice gives the same reply."""
        job = self._eval_job.get(worker)
        return Reply(version, lr=self.lr, paused=self.paused, stop=self.stopping,
                     slowdown=self.slowdown[worker], group=self._group_now(worker),
                     # a paused worker keeps its chunks but must not train on them until resumed
                     chunks=[] if self.paused else list(self.assigned[worker]), eval=job,
                     # pull first, then evaluate those weights
                     eval_pending=job is None and not pulled and bool(self.eval_queue)
                     and worker not in self.evaluating and not self.stopping,
                     done=self.stopping or (self.schedule.finished and not self.eval_queue
                                            and not self.evaluating))

    def work_for(self, worker: int, pulled: bool, version: int) -> Reply | None:
        """`assign`, then `reply_for`, in one call; None: hold the reply."""
        return (self.reply_for(worker, pulled, version) if self.assign(worker, pulled, version)
                else None)

    # -- lost workers (nbdist.core.liveness) -------------------------------------------------

    def heard(self, worker: int, now: float) -> None:
        """`worker` spoke (or its held reply was just sent): its silence starts now."""
        self.liveness.heard(worker, now)

    def deadline(self, worker: int) -> float:
        """Seconds of silence after which `worker` counts as lost (`Liveness.deadline`)."""
        return self.liveness.deadline(worker, self.slowdown[worker], worker in self.evaluating)

    def overdue(self, now: float, exempt=()) -> list[int]:
        """Workers silent past their deadline. Nobody is overdue while the run is paused, nor
        while the hub holds its reply (`exempt`: SSP or a group barrier keeps it waiting), nor
        in sync mode (`silence_is_loss`)."""
        if self.paused or not self.plan.silence_is_loss:
            return []
        return [w for w, t in self.liveness.last_heard.items()
                if w not in self.gone and w not in exempt and now - t > self.deadline(w)]

    def lose(self, worker: int, now: float, reason: str) -> None:
        """`worker` died: give its chunks and validation job to the others, stop waiting for
        it (SSP clock), and show it as lost."""
        if worker in self.lost:
            return
        silent = self.liveness.silent(worker, now)
        self.arrived.add(worker)  # died before hello: the others must not wait for it either
        self.bye(worker, now)
        self.lost.add(worker)
        self.stats.workers[worker].state = "lost"
        self.stats.record_event("worker_lost", now, worker=worker, reason=reason,
                                silent_s=round(silent, 2))
        # sync: an epoch every rank left has ended is over, though the lost rank never said so
        for epoch in self.epoch_metrics.ended_by(set(range(self.num_workers)) - self.lost):
            self.stats.record_event("epoch_end", now, epoch=epoch)

    # -- groups -----------------------------------------------------------------------------

    def regroup(self, now: float) -> None:
        """Form speed groups from measured throughput (now, and again on demand)."""
        active = sorted(self.arrived - self.gone)
        if active:
            groups = self.groups.form(active, [self.stats.workers[w].samples_per_s for w in active])
            self.stats.record_event("regroup", now, groups=groups)

    def _group_now(self, worker: int) -> list[int]:
        """The worker's group for its next push; alone when the data left cannot give every
        member a chunk (the end of the run), so no barrier waits for a push that won't come."""
        # nobody waits for the lost
        members = [m for m in self.groups.of[worker] if m not in self.gone]
        if len(members) > 1 and self.schedule.samples_left(self.open_epoch) < sum(
                self.sizer.batch_for(m) for m in members):
            return [worker]
        return members

    # -- control from the kernel ------------------------------------------------------------

    def _count_step(self, now: float, by: int = 1) -> None:
        """One more step completed; at --pause-at N the run pauses itself, as the kernel's
        `run.pause()` would, and the reply to this very push already says so (its accounting,
        and so `stats.global_step`, may follow later: `ShardCore.settle`)."""
        self.steps_counted += by
        if self.steps_counted == self.plan.pause_at and not self.paused:
            self.paused = True
            self.stats.record_event("pause", now, step=self.steps_counted, reason="--pause-at")

    def apply(self, c: Control, now: float) -> None:
        """Apply the kernel's control: the learning rate, pause and stop, a worker's slow-down,
        the batch policy, the rules' live options, regrouping, checkpoint requests and the epoch
        gate (one `Control`, from `Run.pause`, `Run.set_lr`, ...), at `now` (the shard's clock),
        each change recorded as an event for the views. The per-request logic only reads this
        state on every reply."""
        if c.lr is not None:
            if self.plan.lr_owner == "workers":
                self.lr = float(c.lr)
            self.stats.record_event("set_lr", now, lr=float(c.lr),
                                     **({"by": c.by} if c.by is not None else {}))
        if c.paused is not None and c.paused != self.paused:
            self.paused = c.paused
            self.stats.record_event("pause" if self.paused else "resume", now)
        if c.stop and not self.stopping:
            self.stopping = True
            self.stats.record_event("stop", now)
        if c.slowdown is not None:
            worker, factor = c.slowdown[0], float(c.slowdown[1])
            self.slowdown[worker] = factor
            self.stats.record_event("set_slowdown", now, worker=worker, factor=factor)
        if c.batch_policy is not None:
            self.sizer.set_policy(c.batch_policy)
            self.stats.record_event("set_batch_policy", now, policy=c.batch_policy)
        if c.option is not None:  # validated by the rule first (the hub asks it)
            name, value = c.option
            if name == "staleness" and self.clock is not None:
                self.clock.staleness = int(value)
            elif name == "max_ratio":
                self.groups.max_ratio = float(value)
            elif name == "num_groups":
                self.groups.wanted = int(value)
            self.stats.record_event("set_option", now, name=name, value=value)
        if c.regroup:
            self.regroup(now)
        if c.ranks is not None:  # sync: the ranks left after a restart share the global batch
            self.sizer.reshare(c.ranks, int(c.rank_batch or self.sizer.base_batch))
            for w in c.ranks:  # (the kernel reports the restart: nbdist.run.restart)
                self.stats.workers[w].batch_size = self.sizer.batch_for(w)
        if c.send_state:
            self.state_wanted += 1
        if c.epoch_done is not None and self.open_epoch is not None:
            # the kernel ran the epoch's callbacks
            self.open_epoch = max(self.open_epoch, c.epoch_done + 1)
        if c.eval is not None:
            # a validation the kernel ran itself (a cell's fit call), for the views
            self.eval_result(-1, c.eval, now)

    # -- what the kernel reads --------------------------------------------------------------

    @property
    def epochs_done(self) -> float:
        return max(self.schedule.epochs_done, self.reported_epochs)

    @property
    def finished(self) -> bool:
        return len(self.gone) == self.num_workers

    @property
    def at_gate(self) -> bool:
        """Every chunk up to the open epoch is handed out, and the kernel has not opened the
        next (the epoch gate; never without one, nor once stopping)."""
        return (self.open_epoch is not None and not self.stopping and not self.schedule.finished
                and self.schedule.current_epoch > self.open_epoch)

    def snapshot(self, since: int, with_timeline: bool = False) -> dict:
        snap = self.stats.snapshot(since=since)
        for w in snap["nodes"]:
            i = w["worker"]
            w.update(self.pushes.delays.stats(i) if self.plan.metrics == "full" else {})
            w.update(slowdown=self.slowdown[i],
                     group=self.groups.index(i) if self.plan.syncs_groups else None,
                     batch_size=self.sizer.batch_for(i) if i not in self.gone else w["batch_size"])
        snap.update(finished=self.finished, lost=sorted(self.lost), open_epoch=self.open_epoch,
                    epoch_samples=self.schedule.samples_per_begun_epoch, paused=self.paused,
                    stopping=self.stopping, lr=self.lr, epochs_done=self.epochs_done,
                    batch_policy=self.sizer.policy, epoch_metrics=self.epoch_metrics.to_wire(),
                    delays={str(w): self.pushes.delays.histogram(w)
                            for w in range(self.num_workers)})
        if with_timeline:
            snap["timeline"] = self.pushes.timeline.to_records(include_open=True)
        return snap
