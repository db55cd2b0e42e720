"""Engines must not outlive the kernel that started them.

ipyparallel starts the controller and engines in sessions of their own and stops them only
from the kernel (`stop_cluster`, or an atexit hook), so a kernel that is SIGKILLed or
crashes leaves them running forever (the engine's nanny watches the engine, not the kernel).
`Cluster.start` therefore starts this small watchdog process: it polls the kernel's pid
and, once the kernel is gone, terminates the cluster's processes and their children (then
kills what is left after a grace period). `Cluster.stop` ends the watchdog first.

    python -m nbdist.watchdog KERNEL_PID PID [PID ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_S = 1.0  # how often the kernel's pid is checked
GRACE_S = 5.0  # between SIGTERM and SIGKILL


def spawn(pids: list[int]) -> subprocess.Popen:
    """Start a watchdog for `pids` (controller and engines) tied to this process."""
    return subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "nbdist.watchdog", str(os.getpid()), *map(str, pids)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the kernel's process group must not end it
    )


def watch(parent: int, pids: list[int], poll_s: float = POLL_S) -> None:
    """Block until `parent` exits (or every watched process has), then end the others."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))  # remembers the start time: no pid-reuse mistakes
        except (psutil.Error, ValueError):
            pass
    try:
        kernel = psutil.Process(parent)
    except (psutil.Error, ValueError):
        kernel = None
    while kernel is not None and _running(kernel) and any(_running(p) for p in procs):
        time.sleep(poll_s)
    family = []
    for p in procs:
        try:
            family += [p, *p.children(recursive=True)]  # before the parents go: orphans move away
        except psutil.Error:
            pass
    for p in family:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(family, timeout=GRACE_S)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def _running(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    watch(int(sys.argv[1]), [int(a) for a in sys.argv[2:]])
