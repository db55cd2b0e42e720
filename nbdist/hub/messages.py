"""The messages a worker and a hub shard exchange, typed: what each carries, encoded to and
decoded from the signed JSON header of `nbdist.hub.protocol`.

The wire stays as it is (JSON header + raw float32 frames + MAC); these classes only name the
fields, so no module spells header keys or indexes a chunk list by position. Unknown fields a
worker adds for the statistics (traffic, GPU readings) ride along in `Step.stats`. Field types
are checked before any decode (`nbdist.hub.wire.check_fields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nbdist.core.schedule import Chunk

_STEP_FIELDS = ("worker", "push", "pull", "chunks", "loss", "compute_s", "comm_s", "wait_s", "batch",
                "group", "norm", "eval", "seg", "lag")
_ENVELOPE = ("op", "run", "from", "to", "seq", "nbytes", "re")
_NOT_STATS = frozenset(_STEP_FIELDS + _ENVELOPE)


@dataclass
class Step:
    """A worker's `step`: a push (gradient, or a local-steps delta) and/or a pull.

    Example:
        >>> s = Step.decode({"op": "step", "worker": 1, "push": True, "chunks": [7], "traffic": [1, 2, 0, 0]})
        >>> (s.worker, s.push, s.pull, s.chunks, s.stats)
        (1, True, False, [7], {'traffic': [1, 2, 0, 0]})
    """

    worker: int
    push: bool = False
    pull: bool = False
    chunks: list[int] = field(default_factory=list)  # ids of the chunks this push completes
    loss: float = math.nan
    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0
    batch: int = 1  # samples behind the push (group sync weighs by it)
    group: list[int] | None = None  # the members of its group step (group sync)
    norm: float | None = None  # the whole gradient's norm (global clipping across shards)
    eval: dict | None = None  # an evaluation job's result
    seg: str | None = None  # the shared-memory segment it names
    lag: int = 0  # the gradient was computed on the pull before the last (1: an overlapped step)
    stats: dict = field(default_factory=dict)  # anything else: statistics the coordinator keeps

    @classmethod
    def decode(cls, header: dict) -> Step:
        known = {k: header[k] for k in _STEP_FIELDS if k in header}
        return cls(**known, stats={k: v for k, v in header.items() if k not in _NOT_STATS})

    def encode(self) -> dict:
        header = {"op": "step", **self.stats}
        for name in _STEP_FIELDS:
            value = getattr(self, name)
            if value is not None and not (name == "loss" and math.isnan(value)):
                header[name] = value
        return header

    def counted(self) -> dict:
        """What the coordinator counts of this push (its header, as the coordinator reads it)."""
        return {**self.stats, "chunks": self.chunks, "loss": self.loss, "compute_s": self.compute_s,
                "comm_s": self.comm_s, "wait_s": self.wait_s,
                **({"eval": self.eval} if self.eval is not None else {})}


@dataclass
class Reply:
    """A shard's answer to `hello` or `step`: the version, and from shard 0 the work and control.

    Example:
        >>> r = Reply.decode({"op": "reply", "version": 3, "chunks": [[0, 1, 8, 12]], "done": False})
        >>> r.chunks[0].size, r.encode()["chunks"]
        (4, [[0, 1, 8, 12]])
    """

    version: int
    chunks: list[Chunk] = field(default_factory=list)
    lr: float | None = None  # the rate, when the workers apply it
    paused: bool = False
    stop: bool = False
    done: bool = False
    slowdown: float = 1.0
    group: list[int] = field(default_factory=list)
    eval: dict | None = None  # an evaluation job: {"epoch", "version"}
    eval_pending: bool = False  # pull first, then evaluate
    lost: bool = False  # written off: leave
    params: str | None = None  # "shm" or "live": the weights are in shared memory
    seg: str | None = None
    control: bool = True  # from shard 0 (work and control); other shards send the version only

    @classmethod
    def decode(cls, header: dict) -> Reply:
        fields = {k: header[k] for k in ("version", "lr", "paused", "stop", "done", "slowdown", "group",
                                         "eval", "eval_pending", "lost", "params", "seg") if k in header}
        return cls(chunks=[Chunk.from_list(c) for c in header.get("chunks", [])],
                   control="chunks" in header, **fields)

    def encode(self) -> dict:
        header: dict = {"op": "reply", "version": self.version}
        if self.control:
            header.update(lr=self.lr, paused=self.paused, stop=self.stop, slowdown=self.slowdown,
                          group=self.group, chunks=[c.to_list() for c in self.chunks])
            if self.eval is not None:
                header["eval"] = self.eval
            if self.eval_pending:
                header["eval_pending"] = True
            header["done"] = self.done
        else:  # the version only, or a written-off worker's marching orders
            header.update({name: True for name in ("lost", "stop", "done") if getattr(self, name)})
        for name in ("params", "seg"):
            if getattr(self, name):
                header[name] = getattr(self, name)
        return header

    @staticmethod
    def wire(work: dict, params: str | None = None, seg: str | None = None) -> dict:
        """The header `Reply.decode(work)` (with `params` and `seg` set) encodes to, without
        building the `Chunk`s: `work` is `ShardCore.reply`'s dict, whose chunks are already in
        wire form (the hub's per-push path).

        Example:
            >>> work = {"version": 3, "lr": None, "paused": False, "stop": False, "slowdown": 1.0,
            ...         "group": [], "chunks": [[0, 1, 8, 12]], "done": False}
            >>> Reply.wire(work, "shm", "s") == {**Reply.decode(work).encode(), "params": "shm", "seg": "s"}
            True
        """
        header = {"op": "reply", **work}
        if "chunks" not in work:  # a shard other than 0: the version only
            header = {"op": "reply", "version": work["version"]}
        if header.get("eval") is None:
            header.pop("eval", None)
        if not header.get("eval_pending", True):
            del header["eval_pending"]
        if params:
            header["params"] = params
        if seg:
            header["seg"] = seg
        return header

    @classmethod
    def written_off(cls, version: int) -> Reply:
        """To a worker counted as lost that still pushes: leave, nothing was applied."""
        return cls(version, lost=True, stop=True, done=True, control=False)
