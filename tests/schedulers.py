"""Real schedulers on this one machine, for the launcher tests: Slurm (with munge) and Open MPI.

`SlurmCluster` configures Debian's slurm-wlm in a temporary folder and runs `munged`,
`slurmctld` and `slurmd` as root with no systemd: every key, socket, state, spool, log and
pid file lives in that folder, the ports are free ones, and each daemon runs in the
foreground in its own session, so `close()` ends exactly those process groups. Tests then
point `SLURM_CONF` at the folder's slurm.conf and call `Cluster.start(n, launcher="slurm")`.

`mpi_unavailable()` says why Open MPI engines cannot run here (None when they can); as root,
Open MPI needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), which `mpi_env()` sets.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return f"runs slurmctld, slurmd and munged as root; running as uid {os.geteuid()}"
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo")
               if not shutil.which(t)]
    if missing:
        return f"needs {', '.join(missing)} (Debian packages slurm-wlm and munge; `make system`)"
    return None


def mpi_unavailable() -> str | None:
    if not shutil.which("mpiexec"):
        return "needs mpiexec (Debian package openmpi-bin; `make system`)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "needs mpi4py (pip install mpi4py)"
    return None


def mpi_env() -> dict:
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """A single-node Slurm in `folder`; a context manager. `env` holds SLURM_CONF."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge.sock"
        self._procs: list[subprocess.Popen] = []
        self.env = {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        with open(self.folder / log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                    start_new_session=True)
        self._procs.append(proc)
        return proc

    def start(self, timeout: float = 60) -> None:
        f = self.folder
        for d in ("state", "spool", "munge"):
            (f / d).mkdir(parents=True, exist_ok=True)
        os.chmod(f, 0o755)  # noqa: S103 - Slurm's and munge's folders, as they want them
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(f / "munge", 0o700)
        self._spawn(["munged", "-F", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={key}", f"--pid-file={f / 'munge' / 'munged.pid'}",
                     f"--log-file={f / 'munge' / 'munged.log'}",
                     f"--seed-file={f / 'munge' / 'munged.seed'}"], "munged.out")
        _wait(lambda: self.munge_socket.exists(), timeout, "munged's socket",
              f / "munge" / "munged.log")
        host = socket.gethostname()
        self.conf.write_text("\n".join([
            "ClusterName=nbdist",
            f"SlurmctldHost={host}(127.0.0.1)",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmUser=root", "SlurmdUser=root", "MpiDefault=none", "ReturnToService=2",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'slurmctld.log'}", f"SlurmdLogFile={f / 'slurmd.log'}",
            "SchedulerType=sched/builtin",
            # more CPUs than the machine has (config_overrides): a test job runs 3-4 engines
            "SlurmdParameters=config_overrides",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={max(4, os.cpu_count() or 1)} State=UNKNOWN",
            f"PartitionName=nbdist Nodes={host} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:4",
            "",
        ]))
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld.out")
        self._spawn(["slurmd", "-D", "-f", str(self.conf)], "slurmd.out")
        env = {**os.environ, **self.env}

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                 env=env, timeout=10)
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed")

        _wait(idle, timeout, "the Slurm node to be idle", f / "slurmctld.log")

    def close(self) -> None:
        env = {**os.environ, **self.env}
        if self.conf.exists() and self._procs:  # end our jobs while slurmd still runs their steps
            with contextlib.suppress(Exception):
                subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True,
                               timeout=15)
                _wait(lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True,
                                                 text=True, timeout=10).stdout.strip(),
                      20, "jobs to end", self.folder / "slurmctld.log")
        for p in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        self._procs.clear()
        # slurmstepd and job processes run in sessions of their own; they carry our SLURM_CONF
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        """Job processes and step daemons of this Slurm: their environment names our slurm.conf,
        and they are either slurmstepd or carry a SLURM_JOB_ID (the daemons and this test's own
        children carry neither)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    step = f.read().startswith(b"slurmstepd")
            except OSError:
                continue
            if mark in env and (step or any(v.startswith(b"SLURM_JOB_ID=") for v in env)):
                found.append(int(pid))
        return found

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]


def _wait(condition, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise TimeoutError(f"waited {timeout:.0f}s for {what}; {log}:\n{tail}")
