"""Every message on the hub's sockets, typed: one dataclass each, the one statement of its
fields and their types. From the annotations `nbdist.wire.schema` derives the checks on
receipt and the header written; `nbdist.hub.protocol` frames and signs that header;
`nbdist.hub.wire` receives a hub's messages within limits and decodes each by its op
(`HUB_REQUESTS`).

    worker -> every shard   Hello -> Reply (with the weights), Step -> Reply, Bye -> Ok
    sync rank -> shard 0    Report -> ReportReply
    kernel -> every shard   Stats -> StatsReply (shard 0), Control -> Ok, Params -> ParamsReply,
                            State -> ShardState, Peers -> Ok (shard 0), Shutdown -> Ok
    a request that failed   -> Error

Arrays travel in the buffers after the header, never in it: a push's gradient, a pull's
weights, a `Report`'s `SyncState` arrays, `ShardState`'s arrays, `StatsReply`'s JSON.

Example:
    >>> header = Step(1, push=True, chunks=[7], loss=0.5).encode()
    >>> header
    {'op': 'step', 'worker': 1, 'loss': 0.5, 'push': True, 'chunks': [7]}
    >>> Step.decode(header) == Step(1, push=True, chunks=[7], loss=0.5)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from nbdist.wire.schema import EpochKey, Wire, message

# -- parts nested in messages ------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """One batch worth of an epoch: positions `[start, stop)` of that epoch's permutation. The
    epoch schedule (`nbdist.core.schedule`) hands chunks out; replies and steps carry them."""

    id: int
    epoch: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def to_list(self) -> list[int]:
        """The wire form, `[id, epoch, start, stop]` (replies carry chunks as JSON lists)."""
        return [self.id, self.epoch, self.start, self.stop]

    @classmethod
    def from_list(cls, fields) -> Chunk:
        """A chunk from its wire form (`to_list`)."""
        chunk_id, epoch, start, stop = fields
        return cls(int(chunk_id), int(epoch), int(start), int(stop))


@message()
class EvalJob(Wire):
    """A validation job a reply hands out: evaluate the weights of `version` for `epoch`."""

    epoch: int
    version: int


@message()
class EvalResult(Wire):
    """A validation's result, in a step or report (`version`: of the weights evaluated), or
    one the kernel ran itself (a cell's fit call; version -1)."""

    epoch: int
    metrics: dict[str, float]
    version: int = -1


@message()
class SyncState(Wire):
    """Rank 0's data position and optimizer (`nbdist.checkpoint.sync_state`); its weights and
    slots travel in the `Report`'s buffers."""

    seq: int
    epoch: int
    offset: int
    steps: int
    final: bool
    lr: float
    iterations: int
    optimizer: str
    slots: list[list[int]]  # the optimizer slots' shapes


# -- replies ---------------------------------------------------------------------------------


@message("reply")
class Reply(Wire):
    """A shard's answer to `Hello` or `Step`: the version, and from shard 0 the work and control.

    Example:
        >>> r = Reply.decode({"op": "reply", "version": 3, "chunks": [[0, 1, 8, 12]]})
        >>> r.chunks[0].size, r.encode()
        (4, {'op': 'reply', 'version': 3, 'chunks': [[0, 1, 8, 12]]})
    """

    version: int
    chunks: list[Chunk] = field(default_factory=list)
    lr: float | None = None  # the rate, when the workers apply it
    paused: bool = False
    stop: bool = False
    done: bool = False
    slowdown: float = 1.0
    group: list[int] = field(default_factory=list)
    eval: EvalJob | None = None
    eval_pending: bool = False  # pull first, then evaluate
    lost: bool = False  # written off: leave
    # "shm" or "live": the weights are in shared memory, not a buffer; "full": the frame holds
    # them as float32 where the worker's codec sends changes (nbdist.core.compression)
    params: str | None = None
    seg: str | None = None  # the segment they were written into ("shm")
    fragment: int | None = None  # streaming-diloco: the fragment the worker's next push holds

    @classmethod
    def written_off(cls, version: int) -> Reply:
        """To a worker counted as lost that still pushes: leave, nothing was applied."""
        return cls(version, lost=True, stop=True, done=True)


@message("reply")
class ReportReply(Wire):
    """Shard 0's answer to a sync rank's `Report`: the control rank 0 shares in the allreduce."""

    lr: float | None = None  # None: the ranks keep their optimizer's schedule
    paused: bool = False
    stop: bool = False
    slowdown: float = 1.0
    batches: list[int] = field(default_factory=list)  # every rank's batch size (DBS)
    send_state: int = 0  # checkpoints asked for so far: rank 0 sends its state when it grows
    open_epoch: int | None = None  # a cell's fit call: the epochs before this may start (the gate)
    lost: list[int] = field(default_factory=list)  # workers out of the run (a rank's engine died)


@message("params")
class ParamsReply(Wire):
    """A shard's parameters (buffer 0) and non-trainable state (buffer 1), at `version`."""

    version: int


@message("state")
class ShardState(Wire):
    """Everything a checkpoint saves of one shard (`nbdist.hub.export`: the shard's own, or in
    sync mode rank 0's latest state); the arrays `names` lists are its buffers."""

    shard: int
    version: int
    names: list[str]
    lr: float | None = None
    rule: str = ""
    rule_options: dict = field(default_factory=dict)
    optimizer: dict | None = None
    numbers: dict = field(default_factory=dict)  # rule and optimizer state that is not an array
    schedule: dict | None = None  # shard 0: the data position (EpochSchedule.state)
    evals_pending: list[int] = field(default_factory=list)
    # shard 0: the steps its coordinator counted (a takeover goes on counting from there)
    steps: int | None = None
    state_seq: int | None = None  # sync mode: rank 0's state number (None: none yet)
    final: bool = False  # sync mode: the state rank 0 sent when training ended
    sync: dict | None = None  # sync mode: optimizer class, slot shapes, iterations, steps


@message("stats")
class StatsReply(Wire):
    """Shard 0's statistics, as JSON in buffer 0 (`nbdist.core.shard.ShardCore.stats`)."""


@message("ok")
class Ok(Wire):
    """Done (control, peers, bye, shutdown)."""


@message("error")
class Error(Wire):
    """The hub failed on the request; `message` says why."""

    message: str


# -- requests --------------------------------------------------------------------------------


@dataclass
class _FromWorker(Wire):
    worker: int


@message("hello")
class Hello(_FromWorker):
    """A worker registers with a shard (again, after a restart); the reply carries the weights."""

    REPLY: ClassVar[type[Wire]] = Reply
    engine: int | None = None
    host: str = ""
    link: str = ""  # "shm" or "tcp"
    compression: str = "none"  # the run's --compression; its frames over TCP take it
    gpu: str | None = None
    gpu_mem_total: int | None = None
    shm: str | None = None  # same host: its segment [gradient | parameters]
    offset: int = 0  # where this shard's slice starts in each half of it
    total: int = 0  # floats in each half
    shm_fallback: str | None = None  # same host, yet over TCP: why (/dev/shm had no room)


@dataclass
class _Measured(_FromWorker):
    """What the coordinator counts of a worker's step or a rank's report."""

    loss: float = math.nan
    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0
    # the metric increments per epoch (engine.step_metrics)
    metrics: dict[EpochKey, list[float]] | None = None
    eval: EvalResult | None = None
    traffic: list[int] | None = None  # bytes [sent, received] over TCP, then over shared memory
    gpu_util: int | None = None
    gpu_mem: int | None = None


@message("step")
class Step(_Measured):
    """A worker's push (a gradient, or a local-steps delta) and/or pull; neither: it waits for
    work (shard 0 only). Shard 0 gets all of it, the other shards `for_other_shard()`."""

    REPLY: ClassVar[type[Wire]] = Reply
    SHARED: ClassVar[tuple[str, ...]] = ("push", "pull", "batch", "group", "norm", "seg", "lag",
                                         "fragment")
    push: bool = False
    pull: bool = False
    chunks: list[int] = field(default_factory=list)  # ids of the chunks this push completes
    batch: int = 1  # samples behind the push (group sync weighs by it)
    group: list[int] | None = None  # the members of its group step (group sync)
    norm: float | None = None  # the whole gradient's norm (global clipping across shards)
    seg: str | None = None  # the shared-memory segment it names (its generation)
    lag: int = 0  # computed on the pull before the last (1: an overlapped step)
    # streaming-diloco: the push holds this fragment of each shard's slice and its pull asks
    # for the same fragment only (nbdist.algorithms.streaming)
    fragment: int | None = None

    def for_other_shard(self) -> Step:
        """What a shard other than 0 applies the push with (no statistics: shard 0 counts)."""
        return Step(self.worker, **{name: getattr(self, name) for name in self.SHARED})


@message("report")
class Report(_Measured):
    """A sync rank's step (metrics only: the weights move in Horovod's allreduce), its end of
    an epoch, or rank 0's state for a checkpoint (the arrays in its buffers)."""

    REPLY: ClassVar[type[Wire]] = ReportReply
    samples: int = 0
    batch: int = 0  # this rank's batch size (0: the report of no step)
    epoch: float = 0.0  # epochs done, with the fraction of the current one
    epoch_end: int | None = None  # this rank finished that epoch
    state: SyncState | None = None


@message("bye")
class Bye(_FromWorker):
    """A worker leaves."""

    REPLY: ClassVar[type[Wire]] = Ok


@message("stats")
class Stats(Wire):
    """The kernel asks every shard at once: shard 0 answers with its statistics (history rows
    from `since` on), the others that they are alive, with their version and error."""

    REPLY: ClassVar[type[Wire]] = StatsReply
    since: int = 0
    timeline: bool = False


@message("control")
class Control(Wire):
    """The kernel's control: each field set is one change (None: unchanged). Every shard
    applies `ALL_SHARDS` (`for_other_shards`), shard 0 the rest too."""

    REPLY: ClassVar[type[Wire]] = Ok
    ALL_SHARDS: ClassVar[tuple[str, ...]] = ("lr", "option", "stop", "lost", "reason", "add_worker")
    lr: float | None = None
    by: str | None = None  # who set the rate (a callback's name), for the event
    paused: bool | None = None
    stop: bool = False
    slowdown: tuple[int, float] | None = None  # (worker, factor)
    batch_policy: str | None = None
    option: tuple[str, float] | None = None  # (name, value) of the update rule's options
    regroup: bool = False
    add_worker: int | None = None  # a worker joins mid-run, on engine `engine`
    engine: int | None = None
    lost: int | None = None  # a worker died (its engine), or shard 0 wrote it off
    reason: str | None = None
    send_state: bool = False  # sync mode: rank 0, send your state (a checkpoint)
    # sync mode: the workers that train on as ranks after a restart (the others are lost), and
    # each one's batch (the global batch kept)
    ranks: list[int] | None = None
    rank_batch: int | None = None
    epoch_done: int | None = None  # a cell's fit call ran that epoch's callbacks: open the next
    eval: EvalResult | None = None  # a validation the kernel ran itself

    def for_other_shards(self) -> Control | None:
        """The part of this control that shards 1..S-1 apply (None: nothing)."""
        fields = {name: getattr(self, name) for name in self.ALL_SHARDS}
        changes = Control(**fields)
        return changes if changes != Control() else None


@message("params")
class Params(Wire):
    """The kernel asks a shard for its parameters."""

    REPLY: ClassVar[type[Wire]] = ParamsReply


@message("state")
class State(Wire):
    """The kernel asks a shard for its checkpoint state."""

    REPLY: ClassVar[type[Wire]] = ShardState


@message("peers")
class Peers(Wire):
    """The kernel tells shard 0 the other shards' endpoints (it relays write-offs to them)."""

    REPLY: ClassVar[type[Wire]] = Ok
    shards: list[dict]


@message("shutdown")
class Shutdown(Wire):
    """The kernel ends a shard's serve loop."""

    REPLY: ClassVar[type[Wire]] = Ok


HUB_REQUESTS: dict[str, type[Wire]] = {m.OP: m for m in (Hello, Step, Report, Bye, Stats, Control,
                                                         Params, State, Peers, Shutdown)}
WORKER_REQUESTS = (Hello, Step, Report, Bye)  # from a worker, named by its `worker` id
