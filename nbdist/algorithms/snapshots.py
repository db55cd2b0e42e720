"""Shared, ref-counted copies of the parameters by version (DC-ASGD's backups).

DC-ASGD needs `bak[m]`, the parameters worker m read. Keeping one copy per worker costs
M x size floats; but workers that read the same version read the same floats, so one copy
per *held version* is enough. The store copies `w` the first time a version is acquired,
hands the same read-only array to later readers of that version, and frees it when the last
holder releases it.

A freed buffer is kept as a spare (at most `spares` of them) and reused by the next new
version, so a steady stream of pulls does not allocate and page-fault a fresh
size-float buffer each time. Spares count in `nbytes`; `spares=0` frees at once.

Caller's contract: one version number always names the same parameter values (anything
that writes `w` outside a counted push must also bump the version).
"""

from __future__ import annotations

import numpy as np


class SnapshotStore:
    """Read-only copies of `w`, one per version still held by someone.

    Example:
        >>> store = SnapshotStore(size=2)
        >>> w = np.array([1, 2], np.float32)
        >>> a, b = store.acquire(5, w), store.acquire(5, w)
        >>> a is b, store.versions
        (True, [5])
        >>> store.release(5); store.release(5); store.versions
        []
    """

    def __init__(self, size: int, spares: int = 1):
        self.size = int(size)
        self.spares = int(spares)
        self._held: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # version -> (buffer, view)
        self._count: dict[int, int] = {}
        self._spare: list[np.ndarray] = []

    def acquire(self, version: int, w: np.ndarray) -> np.ndarray:
        """The snapshot of `version`, copying `w` only if nobody holds that version yet."""
        entry = self._held.get(version)
        if entry is None:
            buffer = self._spare.pop() if self._spare else np.empty(self.size, np.float32)
            np.copyto(buffer, w)
            view = buffer.view()
            view.flags.writeable = False
            entry = self._held[version] = (buffer, view)
            self._count[version] = 0
        self._count[version] += 1
        return entry[1]

    def release(self, version: int) -> None:
        """Drop one hold on `version`; the last release frees (or spares) its copy."""
        count = self._count.get(version, 0)
        if count <= 0:
            raise KeyError(f"snapshot of version {version} released more often than acquired")
        if count > 1:
            self._count[version] = count - 1
            return
        del self._count[version]
        buffer, _ = self._held.pop(version)
        if len(self._spare) < self.spares:
            self._spare.append(buffer)

    def refcount(self, version: int) -> int:
        """How many holders `version` has (0 if none)."""
        return self._count.get(version, 0)

    @property
    def versions(self) -> list[int]:
        """Versions with a live snapshot, oldest first."""
        return sorted(self._held)

    @property
    def nbytes(self) -> int:
        """Bytes held: live snapshots plus spare buffers."""
        return 4 * self.size * (len(self._held) + len(self._spare))

    def clear(self) -> None:
        """Drop every snapshot and spare."""
        self._held.clear()
        self._count.clear()
        self._spare.clear()
