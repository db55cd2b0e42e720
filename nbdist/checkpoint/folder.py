"""One run at a time per checkpoint folder.

Each save removes the array files no kept `meta.json` names (`nbdist.checkpoint.store`), so two
runs saving into one folder would delete each other's newest arrays and rotate each other's
checkpoints away. A run therefore takes its `--checkpoint-dir` for itself when it starts: an
exclusive `flock` on `<folder>/.nbdist-lock`, which names the run, released when the run ends
(and by the operating system when its kernel dies, so a crash leaves nothing to clean). A
second run given the same folder is refused before any engine is used, and nothing in the
folder changes. A save into a folder the run does not hold (`run.checkpoint("elsewhere")`)
takes that folder for the save alone, and is refused the same way while another run holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from nbdist.checkpoint.store import prepare_dir
from nbdist.errors import CheckpointError

LOCK_FILE = ".nbdist-lock"


class FolderLock:
    """The exclusive claim of the run named `owner` on checkpoint folder `directory` (which
    exists), or CheckpointError naming the run that holds it.

    Example:
        >>> lock = FolderLock("ckpt", owner="3f2a9c01b7de")        # doctest: +SKIP
        >>> FolderLock("ckpt", owner="another")                     # doctest: +SKIP
        Traceback (most recent call last):
        CheckpointError: The checkpoint folder ... is in use by run 3f2a9c01b7de ...
    """

    def __init__(self, directory: str, owner: str):
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, LOCK_FILE)
        self._fd: int | None = None
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise self._refusal(holder) from None
            if _same_file(fd, self.path):
                self._fd = fd
            else:  # its holder removed it as we opened it: take the next one
                os.close(fd)
        os.ftruncate(self._fd, 0)
        holder = {"run": owner, "pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.write(self._fd, json.dumps(holder).encode())

    def holds(self, directory: str) -> bool:
        """Whether this claim covers `directory`."""
        return self._fd is not None and os.path.abspath(directory) == self.directory

    def release(self) -> None:
        """Give the folder back (the lock file goes first, so nobody takes a stale one)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    def _refusal(self, holder: dict) -> CheckpointError:
        who = (f"run {holder.get('run')} (process {holder.get('pid')} on {holder.get('host')}, "
               f"since {holder.get('since')})" if holder else "another run")
        return CheckpointError(
            f"The checkpoint folder {self.directory} is in use by {who}. Two runs saving into "
            "one folder would delete each other's checkpoints, so nothing was saved or started "
            "here and nothing in the folder was changed. Expected a folder no running run uses: "
            "pass another --checkpoint-dir (checkpoint_dir=...), or wait for that run to end "
            "(run.wait(), run.stop()).")


@contextlib.contextmanager
def claimed(directory: str, owner: str, held: FolderLock | None) -> Iterator[None]:
    """Inside: `directory` (created if need be) is this run's to save into, through the claim
    it `held` since it started, or one taken for this save alone."""
    directory = prepare_dir(directory)
    if held is not None and held.holds(directory):
        yield
        return
    lock = FolderLock(directory, owner)
    try:
        yield
    finally:
        lock.release()


def _read(fd: int) -> dict:
    """What the holder wrote into the lock file ({} if it had not yet, or it is not JSON)."""
    with contextlib.suppress(OSError, ValueError):
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if isinstance(holder, dict):
            return holder
    return {}


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
