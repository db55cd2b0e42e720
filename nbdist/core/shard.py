"""One parameter-server shard's logic, with no sockets and no clock of its own.

`ShardCore` holds a shard's slice of the flat parameters, its version, the update rule and
optimizer (`Updater`), the group barrier, and, on shard 0, the run's `Coordinator`. It applies
pushes, answers or holds replies, follows the kernel's control, forgets workers that leave or
die, gives statistics, and exports and restores its state for checkpoints. Two drivers use it:
the socket server (`nbdist.hub.server.Hub`, wall-clock time) and the simulator
(`nbdist.modes.simulate.simulation.Simulation`, virtual time). Both hand it a `now()`, so tests
of lost workers and group timeouts move time by hand instead of waiting.

Owners of state (one each):
- learning rate: the hub optimizer (`updater`) when `plan.lr_owner == "hub"`, else the
  coordinator (`coordinator.lr`, told to the workers that apply it); `learning_rate()` reads it;
- SSP clock, group membership and group options: the coordinator (shard 0); the rule only
  validates the options. Shards 1..S-1 learn a worker's group from its push header (the
  worker is told it in each reply from shard 0), so membership passes through the worker;
- a worker's read version (for delays) and the replies held back: this core.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from nbdist.core.barrier import GroupBarrier, GroupStep
from nbdist.core.coordinator import Coordinator
from nbdist.core.plan import Plan
from nbdist.core.schedule import EpochSchedule
from nbdist.core.tail_average import TailAverage, tail_start
from nbdist.core.updater import make_updater
from nbdist.wire.messages import Reply

if TYPE_CHECKING:
    from nbdist.wire.messages import Control, EvalResult, Hello, Step

GROUP_WAIT_LIMIT_S = 5.0  # longest a group step waits for a missing member


def admit(num_workers: int, worker: int) -> int:
    """How many worker ids a shard accepts once `worker` joined mid-run (a kernel's
    `add_worker`): ids follow on from the configured M, so each shard admits just the next one.

    Example:
        >>> admit(2, 2)
        3
    """
    if worker != num_workers:
        raise ValueError(f"a worker added mid-run takes the next id, {num_workers} "
                         f"(Received: {worker})")
    return num_workers + 1


def expected_delay(recent: list[int] | tuple, num_workers: int) -> float:
    """How many updates a worker's next push will land after its read: the median of its last
    three delays (one long wait, an evaluation say, does not move it), at most 2M - 1 (an
    overlapped push reads one exchange earlier). No delay seen yet: 0, a plain read.

    Example:
        >>> expected_delay([1, 1, 30], 2), expected_delay([2, 4], 4), expected_delay([], 2)
        (1.0, 3.0, 0.0)
    """
    if not recent:
        return 0.0
    return float(min(np.median(recent), 2 * num_workers - 1))


class ShardCore:
    """One shard: parameters, version, rule + optimizer, barrier, coordinator (shard 0).

    `params` is used in place (the hub's lives in shared memory). `sync`: the simulator's sync
    mode, one group of everyone applied with plain ASGD at the plain rate.

    Example:
        >>> from nbdist.wire.messages import Hello, Step
        >>> plan = Plan(num_workers=1, num_samples=4, epochs=1, batch_size=4, lr=0.5,
        ...             has_validation=False)
        >>> core = ShardCore(plan, np.zeros(2, np.float32), np.zeros(0, np.float32),
        ...                  now=lambda: 0.0)
        >>> core.hello(Hello(0)); reply = core.reply(0, pull=True); reply.chunks
        [Chunk(id=0, epoch=0, start=0, stop=4)]
        >>> core.push(Step(0, push=True, chunks=[0], batch=4), np.ones(2, np.float32))
        False
        >>> core.settle()
        >>> core.params.tolist(), core.version
        ([-0.5, -0.5], 1)
    """

    def __init__(self, plan: Plan, params: np.ndarray, non_trainable: np.ndarray, *,
                 now: Callable[[], float], shard: int = 0, num_shards: int = 1,
                 rule_options: dict | None = None, optimizer: dict | None = None, offset: int = 0,
                 constraints: list[dict] | tuple = (), sync: bool = False, start_time: float = 0.0,
                 settle_every: int = 1):
        self.plan, self.shard, self.num_shards, self.sync, self.now = (plan, shard, num_shards,
                                                                       sync, now)
        self.size = int(params.size)
        self.params = params
        self.non_trainable = np.array(non_trainable, dtype=np.float32, copy=True)
        self.updater = make_updater(replace(plan, algorithm="asgd") if sync else plan,
                                    rule_options or {}, optimizer, self.size, offset, constraints)
        self.barrier = GroupBarrier(self.size) if plan.syncs_groups else None
        self.coordinator = Coordinator(plan, start_time) if shard == 0 else None
        self.version = 0
        self.num_workers = plan.num_workers  # worker ids accepted: grows as workers join mid-run
        self.reads: dict[int, list[int]] = {}  # worker -> the versions its last two pulls read
        self.delays: dict[int, list[int]] = {}  # worker -> its last 3 delays (--predict-weights)
        # worker -> (driver's token, pull) of a held reply
        self.held: dict[int, tuple[object, bool]] = {}
        # pushes' bookkeeping, done after their replies (`settle`)
        self._unsettled: list[tuple] = []
        # Group sync forms its groups from the accounting, so it accounts each push at once.
        self._settle_every = 1 if plan.syncs_groups else max(1, int(settle_every))
        start = None if sync else tail_start(plan.average_tail, plan.epochs, plan.num_samples)
        self.tail = TailAverage(start) if start is not None else None

    # -- workers -----------------------------------------------------------------------------

    def hello(self, hello: Hello) -> None:
        worker = hello.worker
        self.settle()
        if self.coordinator is not None:
            self.coordinator.hello(hello)
        self.reads.pop(worker, None)  # a fresh start (or a rejoin): it reads on its reply
        self.delays.pop(worker, None)
        self.heard(worker)

    def heard(self, worker: int) -> None:
        """`worker` spoke (or its held reply was just sent): its silence counts from now."""
        if self.coordinator is not None:
            self.coordinator.heard(worker, self.now())

    def written_off(self, worker: int) -> bool:
        """Counted as lost (its chunks went to others), so nothing it pushes may be applied."""
        return self.coordinator is not None and worker in self.coordinator.lost

    def push(self, step: Step, grad: np.ndarray, *, into: np.ndarray | None = None,
             non_trainable_delta: np.ndarray | None = None) -> bool:
        """Apply one push (or add it to its group's step). `into`: where the new weights are
        also written; returns whether they were. Call `settle()` once the reply is out.
        `step.group`: the members of its group step, as shard 0's coordinator told the worker
        (every shard's barrier must group the same pushes, and shards 1..S-1 hold no
        coordinator); `step.norm`: the whole gradient's norm (global clipping)."""
        worker = step.worker
        self.settle(due_only=True)  # a driver that did not settle after the last reply
        if grad.size != self.size:
            raise ValueError(f"push of {grad.size} floats to a shard of {self.size}")
        if (self.coordinator is not None and non_trainable_delta is not None
                and self.non_trainable.size):
            self.non_trainable += non_trainable_delta
        lag = 1 if step.lag == 1 else 0
        read = self.read_of(worker, lag)
        self.updater.rule.computed_at(worker, lag)
        if self.barrier is not None:  # a singleton completes at once and flushes old groups
            for done in self.barrier.add(tuple(step.group or (worker,)), worker, grad, step.batch,
                                         read, step, now=self.now(), tag=step.fragment):
                self.apply_group(done)
            return False
        delay = self.version - read
        copied = self._apply(worker, grad, delay, into=into, norm=step.norm)
        if self.tail is not None:
            self.tail.add(self.params, step.batch)
        if self.plan.predict_weights:
            recent = self.delays.setdefault(worker, [])
            recent.append(delay)
            del recent[:-3]
        if self.coordinator is not None:
            now = self.now()
            self._unsettled.append((step, self.coordinator.complete(step, now), delay, now))
        return copied

    def read_of(self, worker: int, lag: int = 0) -> int:
        """The version `worker`'s push was computed on: its latest read, or with `lag` = 1 (an
        overlapped step, computed while the last reply was in flight) the read before it."""
        reads = self.reads.get(worker)
        if not reads:
            return 0
        return reads[max(0, len(reads) - 1 - lag)]

    def settle(self, due_only: bool = False) -> None:
        """The bookkeeping (statistics, timeline, delays) of the pushes not yet accounted, in
        order. Their replies do not wait for it. `due_only`: only once `settle_every` pushes
        wait (the hub, after each reply: a batch runs on a warm cache; the hub's "settle"
        phase went from 14.6 to 7.4 us per push with it and the timeline's float row).
        Whatever reads or changes the numbers settles everything first."""
        if len(self._unsettled) >= (self._settle_every if due_only else 1):
            unsettled, self._unsettled = self._unsettled, []
            for args in unsettled:
                self.coordinator.account(*args)

    def _apply(self, worker: int, grad: np.ndarray, delay: int, scale: float = 1.0,
               into: np.ndarray | None = None, norm: float | None = None) -> bool:
        """One update (the rule decides, the optimizer steps). `norm`: the whole gradient's
        norm, which global clipping needs when a shard sees only part of it."""
        changed, copied = self.updater.push(worker, self.params, grad, delay, scale, into,
                                            norm if self.num_shards > 1 else None)
        self.version += int(changed)
        return copied

    def apply_group(self, step: GroupStep) -> None:
        """A completed group step: its batch-weighted mean at the group's rate `lr · B_g / B_ref`
        (the simulator's sync, and deltas of local steps: at the plain rate)."""
        delay = self.version - min(step.read_versions.values())
        if step.tag is not None:  # streaming-diloco: the fragment its members pushed
            self.updater.rule.select(step.tag)
        # local steps: the mean of the members' deltas, each already a whole round of steps
        scale = (1.0 if self.sync or self.plan.local_steps > 1
                 else step.batch / self.plan.batch_size)
        self._apply(min(step.members), step.mean, delay, scale=scale)
        if self.tail is not None:
            self.tail.add(self.params, step.batch)
        if self.coordinator is not None:
            for member, push in step.headers.items():
                self.coordinator.push(push, self.version - 1 - step.read_versions[member],
                                      self.now())

    def expire_groups(self, limit_s: float = GROUP_WAIT_LIMIT_S) -> bool:
        """A member that never pushes (it died, a regroup crossed its push, the data ended) must
        not stall its group: after `limit_s` the step is applied with the pushes that came."""
        steps = self.barrier.expired(limit_s, self.now()) if self.barrier is not None else []
        for step in steps:
            self.apply_group(step)
            if self.coordinator is not None and not self.sync:  # sync: the last, partial batch
                self.coordinator.stats.record_event("group_timeout", self.now(),
                                                    members=list(step.members),
                                                    pushed=sorted(step.headers))
        return bool(steps)

    def apply_gate_groups(self) -> bool:
        """At an epoch gate (or the end of the data), a group step that waits for members with
        no batch left cannot complete: they get none until the kernel opens the next epoch
        (or ever), and the kernel waits for this epoch's steps. Applied now with the pushes
        that came (True if any was). Shard 0's alone: the others have no coordinator to ask,
        and wait `GROUP_WAIT_LIMIT_S`."""
        c = self.coordinator
        # every chunk handed out: up to the gate, or of the whole run (its steps still pending)
        if (self.barrier is None or c is None or not self.barrier.pending
                or not (c.at_gate or c.schedule.samples_left() == 0)):
            return False
        idle = {w for w, chunks in c.assigned.items() if not chunks} | c.gone
        steps = self.barrier.waiting_only_for(idle)
        for step in steps:
            self.apply_group(step)
        return bool(steps)

    def eval_result(self, worker: int, result: EvalResult | None) -> None:
        if self.coordinator is not None and result is not None:
            self.settle()  # the evaluation is recorded at the step count so far
            self.coordinator.eval_result(worker, result, self.now())

    # -- replies -----------------------------------------------------------------------------

    def reply(self, worker: int, pull: bool, token: object = None) -> Reply | None:
        """The reply to `worker`'s request, or None: held (kept with `token`) until it may go
        on (SSP: too far ahead; group sync: its group's step is incomplete)."""
        if (self.barrier is not None and self.barrier.waiting(worker)) or (
                self.coordinator is not None
                and not self.coordinator.assign(worker, pull, self.version)):
            self.held[worker] = (token, pull)
            return None
        self.held.pop(worker, None)
        reply = (self.coordinator.reply_for(worker, pull, self.version) if self.coordinator
                 else Reply(self.version))
        reply.fragment = getattr(self.updater.rule, "next_fragment", None)
        if pull:
            reads = self.reads.setdefault(worker, [])
            reads.append(self.version)
            del reads[:-2]
            self.updater.rule.on_pull(worker, self.params, self.version)
        return reply

    def read_into(self, worker: int, out: np.ndarray, plain: bool = False) -> None:
        """What `worker` reads, written into `out`: the weights, or with --predict-weights the
        weights predicted for when its next push lands (`plain`: the weights themselves, for
        an evaluation)."""
        steps = 0.0 if plain else expected_delay(self.delays.get(worker, ()), self.num_workers)
        self.updater.read_ahead(self.params, steps, out)

    def release(self) -> Iterator[tuple[int, object, bool, Reply]]:
        """Held replies that may go now, as (worker, token, pull, reply), by worker id; the
        driver acts on each (which may change what the next can have) before the next."""
        for worker in sorted(self.held):
            if worker not in self.held or (self.barrier is not None
                                           and self.barrier.waiting(worker)):
                continue
            if self.coordinator is not None and self.coordinator.blocked(worker):
                continue
            token, pull = self.held[worker]
            reply = self.reply(worker, pull, token)
            if reply is not None:
                yield worker, token, pull, reply

    # -- leaving -----------------------------------------------------------------------------

    def forget(self, worker: int) -> None:
        """`worker` left or died: drop its rule state and held reply; nothing waits for it."""
        self.settle()
        self.held.pop(worker, None)
        self.reads.pop(worker, None)
        self.delays.pop(worker, None)
        self.updater.rule.forget(worker)
        if self.barrier is not None:
            for step in self.barrier.drop(worker):
                self.apply_group(step)

    def bye(self, worker: int) -> None:
        self.forget(worker)
        if self.coordinator is not None and worker not in self.coordinator.lost:
            self.coordinator.bye(worker, self.now())

    def lose(self, worker: int, reason: str) -> None:
        """`worker` died (or was written off): its chunks and jobs go to the others."""
        self.forget(worker)
        if self.coordinator is not None:
            self.coordinator.lose(worker, self.now(), reason)

    def overdue(self) -> list[tuple[int, float]]:
        """Workers silent past their deadline, with that deadline (a held reply is exempt)."""
        if self.coordinator is None:
            return []
        return [(w, self.coordinator.deadline(w))
                for w in self.coordinator.overdue(self.now(), exempt=self.held)]

    # -- the kernel's side -------------------------------------------------------------------

    def learning_rate(self) -> float | None:
        """The run's rate now, from its one owner (see the module docstring)."""
        if self.plan.lr_owner == "hub":
            return self.updater.learning_rate()
        return self.coordinator.lr if self.coordinator is not None else None

    def control(self, c: Control) -> None:
        """The kernel's control: lr, rule options, add_worker, lost, stop; the coordinator's part
        (pause, slow-down, batch policy, regroup, ...) after the shard's."""
        self.settle()  # the pushes before it are counted before the event it records
        if c.lr is not None:
            lr = float(c.lr)
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"learning rate must be positive and finite, got {lr}")
            if self.plan.lr_owner == "hub":  # else the coordinator owns it and tells the workers
                self.updater.set_learning_rate(lr)
        if c.option is not None:
            self.updater.rule.set_option(c.option[0], float(c.option[1]))
        if c.add_worker is not None:
            # a worker joins mid-run: shard 0 (asked first) may refuse, then all admit
            if self.coordinator is not None:
                self.coordinator.add_worker(c.add_worker, self.now(), c.engine)
            self.num_workers = admit(self.num_workers, c.add_worker)
        if c.lost is not None:  # the kernel saw the worker's engine die, or shard 0 wrote it off
            self.lose(c.lost, c.reason or "engine died")
        if c.stop and self.barrier is not None:
            for step in self.barrier.flush_all():
                self.apply_group(step)
        if self.coordinator is not None:
            self.coordinator.apply(c, self.now())

    def stats(self, since: int = 0, timeline: bool = False) -> dict:
        """Shard 0's statistics for the kernel (the driver adds its own error and drop counts)."""
        self.settle()
        snap = self.coordinator.snapshot(since, timeline)
        snap.update(version=self.version,
                    hub_bytes=int(self.params.nbytes + self.updater.state_nbytes),
                    rule_options=self.updater.rule.options, elapsed=self.now())
        if self.plan.lr_owner == "hub":
            snap["lr"] = self.updater.learning_rate()  # the schedule's value at this step
        return snap

    def result_weights(self) -> np.ndarray:
        """A copy of the weights the run hands the notebook: the mean over the run's tail with
        --average-tail (`nbdist.core.tail_average`; the model's constraints applied to it, since
        an average can leave a non-convex set such as UnitNorm's), else the shard's now."""
        if self.tail is None or not self.tail.count:
            return self.params.copy()
        weights = self.tail.result(self.params)
        if self.updater.constraints:
            self.updater.constraints.apply(weights)
        return weights

    # -- checkpoints -------------------------------------------------------------------------

    def export(self) -> dict:
        """Everything a checkpoint saves of this shard (`nbdist.hub.export` writes
        it as numbers and arrays): copies, so the shard may go on at once."""
        self.settle()
        rule, opt = self.updater.rule, self.updater.optimizer
        state = {"shard": self.shard, "version": self.version, "lr": self.learning_rate(),
                 "rule": rule.name, "rule_options": rule.options, "optimizer": self.updater.spec,
                 "params": self.params.copy(),
                 "rule_state": {name: _copy(getattr(rule, name)) for name in rule.state_fields},
                 "opt_state": opt.export_state() if opt is not None else {},
                 "tail_state": self.tail.state() if self.tail is not None else {}}
        c = self.coordinator
        if c is not None:
            state["non_trainable"] = self.non_trainable.copy()
            state["schedule"] = c.schedule.state()
            state["evals_pending"] = sorted({*c.eval_queue, *c.evaluating.values()})
            state["steps"] = c.steps_counted
        return state

    def restore(self, state: dict) -> None:
        """Take back a saved state (what `Checkpoint.shard_restores` gives), before serving."""
        self.version = int(state["version"])
        rule, opt = self.updater.rule, self.updater.optimizer
        _import_fields(rule, rule.state_fields, state.get("rule", {}))
        if opt is not None and state.get("opt"):  # (a sync run's metrics hub saves none)
            opt.restore_state(state["opt"])
        if self.tail is not None:
            self.tail.restore(state.get("tail", {}))
        c = self.coordinator
        if c is not None and "schedule" in state:
            c.schedule = EpochSchedule.from_state(state["schedule"], epochs=c.plan.epochs)
            if c.open_epoch is not None:  # the epoch gate opens where the saved run stood
                c.open_epoch = c.schedule.first_unfinished_epoch
            if c.plan.has_validation:
                c.eval_queue.extend(state.get("evals_pending", []))
        if c is not None and state.get("steps") is not None:  # a takeover: count on from there
            c.steps_counted = c.stats.global_step = int(state["steps"])
            if state.get("paused_at"):  # --pause-at paused the run once: not again
                c.plan = replace(c.plan, pause_at=None)


def _copy(value):
    return value.copy() if isinstance(value, np.ndarray) else value


def _import_fields(obj, fields: tuple[str, ...], values: dict) -> None:
    """Put saved fields back into `obj`, in place; arrays must match in shape."""
    if set(values) != set(fields):
        raise ValueError(f"{type(obj).__name__} state has fields {sorted(values)}, "
                         f"expected {sorted(fields)}")
    for name in fields:
        current, value = getattr(obj, name), values[name]
        if isinstance(current, np.ndarray):
            value = np.asarray(value, dtype=np.float32)
            if value.shape != current.shape:
                raise ValueError(f"{name} has shape {value.shape}, expected {current.shape}")
            np.copyto(current, value)
        else:
            setattr(obj, name, type(current)(value))
