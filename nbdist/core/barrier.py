"""Group-sync barrier for one shard: collect a group's pushes, hand back their weighted mean.

Members of a group (from the coordinator, named in every push header) each push one
gradient per step; when all have pushed, the shard applies `Σ b_i g_i / Σ b_i` as one update
and releases them together. If a member shows up with a different member list (the groups
were re-formed) or leaves, any pending barrier it belonged to is flushed with what it has,
so nobody waits for a push that will never come. A step may carry a `tag` (streaming-diloco's
fragment): pushes of different tags never share a step. Pure NumPy; no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Pending:
    total: np.ndarray
    batch: int = 0
    headers: dict[int, dict] = field(default_factory=dict)  # worker -> its push header
    read_versions: dict[int, int] = field(default_factory=dict)
    since: float = 0.0  # when its first push came (the shard core's clock)


@dataclass
class GroupStep:
    """One completed (or flushed) group step, ready to apply."""

    members: tuple[int, ...]
    mean: np.ndarray
    batch: int  # the group's total batch B_g
    headers: dict[int, dict]
    read_versions: dict[int, int]
    tag: int | None = None  # what its pushes were tagged with (streaming-diloco's fragment)


class GroupBarrier:
    """Pending group steps keyed by their member tuple.

    Example:
        >>> b = GroupBarrier(size=2)
        >>> b.add((0, 1), 0, np.array([1.0, 0.0], np.float32), batch=1, read_version=3, header={})
        []
        >>> [s.mean.tolist() for s in b.add((0, 1), 1, np.array([0.0, 3.0], np.float32), batch=2,
        ...                                 read_version=3, header={})]
        [[0.3333333432674408, 2.0]]
    """

    def __init__(self, size: int):
        self.size = size
        # (members, tag) -> the step they are filling
        self._pending: dict[tuple[tuple[int, ...], int | None], _Pending] = {}

    def waiting(self, worker: int) -> bool:
        """True while `worker`'s push sits in an incomplete group step."""
        return any(worker in p.headers for p in self._pending.values())

    def add(self, members: tuple[int, ...], worker: int, g: np.ndarray, batch: int,
            read_version: int, header: dict, now: float = 0.0,
            tag: int | None = None) -> list[GroupStep]:
        """Add one member's gradient at time `now`; returns the steps now ready (possibly none)."""
        key = (members, tag)
        ready = [self._take(k) for k in list(self._pending)
                 if k != key and worker in k[0] and self._pending[k].headers]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(np.zeros(self.size, dtype=np.float32),
                                                    since=now)
        if worker in pending.headers:  # a second push before the step completed: flush first
            ready.append(self._take(key))
            pending = self._pending[key] = _Pending(np.zeros(self.size, dtype=np.float32),
                                                    since=now)
        pending.total += np.float32(batch) * g
        pending.batch += batch
        pending.headers[worker] = header
        pending.read_versions[worker] = read_version
        if len(pending.headers) == len(members):
            ready.append(self._take(key))
        return ready

    def drop(self, worker: int) -> list[GroupStep]:
        """`worker` left: flush every pending step that waits for it."""
        return [self._take(k) for k in list(self._pending)
                if worker in k[0] and self._pending[k].headers]

    def expired(self, limit_s: float, now: float) -> list[GroupStep]:
        """Steps that have waited `limit_s` or longer at time `now` for a member: applied with
        what came (0: every pending step)."""
        return [self._take(k) for k in list(self._pending)
                if self._pending[k].headers and now - self._pending[k].since >= limit_s]

    def waiting_only_for(self, idle: set[int]) -> list[GroupStep]:
        """Steps whose members yet to push are all in `idle` (they have nothing to push, as at
        an epoch gate): applied with what came.

        Example:
            >>> b = GroupBarrier(size=1)
            >>> _ = b.add((0, 1, 2), 0, np.ones(1, np.float32), batch=2, read_version=0, header={})
            >>> b.waiting_only_for({2}), len(b.waiting_only_for({1, 2}))
            ([], 1)
        """
        return [self._take(k) for k in list(self._pending)
                if self._pending[k].headers
                and set(k[0]) - set(self._pending[k].headers) <= idle]

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def flush_all(self) -> list[GroupStep]:
        """Everything pending, e.g. when the run stops."""
        return [self._take(k) for k in list(self._pending) if self._pending[k].headers]

    def _take(self, key: tuple[tuple[int, ...], int | None]) -> GroupStep:
        p = self._pending.pop(key)
        p.total /= np.float32(max(p.batch, 1))
        return GroupStep(key[0], p.total, p.batch, p.headers, p.read_versions, key[1])
