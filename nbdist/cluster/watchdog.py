"""Engines must not outlive the kernel that started them.

ipyparallel starts the controller and engines in sessions of their own and stops them only
from the kernel (`stop_cluster`, or an atexit hook), so a kernel that is SIGKILLed or
crashes leaves them running forever (the engine's nanny watches the engine, not the kernel).
`Cluster.start` therefore starts this small watchdog process BEFORE the first cluster process
(a kernel killed at any moment of `%nbdist start` leaves nothing behind). It polls the
kernel's pid and, once the kernel is gone, ends every process that carries the cluster's id
in its environment (ipyparallel sets `IPP_CLUSTER_ID` for each process it launches) or is
in its pid list, with their children (SIGTERM, then SIGKILL after a grace period).
`Cluster.stop` ends the watchdog first.

    python -m nbdist.cluster.watchdog KERNEL_PID CLUSTER_ID [PID ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

POLL_S = 1.0  # how often the kernel's pid is checked
GRACE_S = 5.0  # between SIGTERM and SIGKILL
ENV_TAG = "IPP_CLUSTER_ID"


def spawn(cluster_id: str, pids: list[int] = ()) -> subprocess.Popen:
    """Start a watchdog for the cluster `cluster_id` (and `pids`) tied to this process."""
    return subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "nbdist.cluster.watchdog", str(os.getpid()), cluster_id,
         *map(str, pids)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the kernel's process group must not end it
    )


def tagged(cluster_id: str) -> list:
    """This user's processes whose environment names `cluster_id` (psutil.Process objects)."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.environ().get(ENV_TAG) == cluster_id:
                found.append(proc)
        except (psutil.Error, OSError):  # gone, a zombie, or another user's
            pass
    return found


def watch(parent: int, cluster_id: str, pids: list[int], poll_s: float = POLL_S) -> None:
    """Block until `parent` exits, then end the cluster's processes."""
    try:
        kernel = psutil.Process(parent)
    except (psutil.Error, ValueError):
        kernel = None
    while kernel is not None and _running(kernel):
        time.sleep(poll_s)
    for _ in range(2):  # twice: a process the kernel launched as it died is caught the second time
        end(cluster_id, pids)


def end(cluster_id: str, pids: list[int] = ()) -> None:
    """Terminate the cluster's processes and their children; kill what is left after GRACE_S."""
    procs = tagged(cluster_id)
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except (psutil.Error, ValueError):
            pass
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
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2], [int(a) for a in sys.argv[3:]])
