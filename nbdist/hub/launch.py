"""Engine-side entry points for hubs: start one, join it, stop it.

By default each shard runs as its own OS process (`nbdist.hub.process`), spawned and
supervised by its engine: the hub's loop then never shares a GIL with the ipyparallel engine's
threads. `NBDIST_HUB_PROCESS=0` on the engines serves from a thread inside the engine
instead (measured side by side in benchmarks/overhead.py --hub-modes). Either way the engine
keeps answering ipyparallel (status, stop, joining) while the hub runs. The registry below is
per engine process: it lets a later ipyparallel call find the hub an earlier call started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace

from nbdist.env import switch
from nbdist.hub.process import encode_spec
from nbdist.hub.server import Hub, HubSpec
from nbdist.hub.wire import remove_socket_files

# the folder that holds nbdist/ (this file is nbdist/hub/launch.py): the child's PYTHONPATH
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

START_TIMEOUT_S = 60.0
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
_hubs: dict[tuple[str, int], object] = {}


def hub_in_process() -> bool:
    """Whether hubs on this engine run as their own process (the default)."""
    return switch("NBDIST_HUB_PROCESS")


class _ThreadHub:
    def __init__(self, spec: HubSpec):
        self.hub = Hub(spec)
        self.endpoints, self.result = self.hub.endpoints, {}
        self.thread = threading.Thread(target=lambda: self.result.update(self.hub.serve()),
                                       daemon=True, name=f"nbdist-hub-{spec.run_id}-{spec.shard}")
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> dict:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.hub.closing = True
            self.thread.join(5.0)
        return self.result


class _ProcessHub:
    """A hub process and the thread that reads its result lines."""

    def __init__(self, spec: HubSpec):
        self.shard = spec.shard
        child_env = os.environ.copy()  # the child imports the same nbdist as this engine
        root = PACKAGE_PARENT
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, child_env.get("PYTHONPATH")) if p)
        # the shard splits its updates over its own pool (NBDIST_HUB_THREADS); NumPy's BLAS
        # (powersgd's P Q^T per push) gets one thread, not one per core spinning beside the
        # workers after every product (nbdist.engine.blas_threads)
        for name in BLAS_THREADS:
            child_env[name] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "nbdist.hub.process"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env)
        self.proc.stdin.write(encode_spec(spec))
        self.proc.stdin.close()
        self.lines: list[dict] = []
        self._got = threading.Condition()
        threading.Thread(target=self._read, daemon=True,
                         name=f"nbdist-hub-{spec.run_id}-{spec.shard}").start()
        first = self._wait(1, START_TIMEOUT_S)
        if first is None or "endpoints" not in first:
            self.proc.kill()
            self.proc.wait()
            if first and "error" in first:  # what Hub(spec) raised, as a thread hub would report it
                raise RuntimeError(f"hub shard {spec.shard} could not start: {first['error']}")
            raise RuntimeError(f"hub shard {spec.shard} did not start in its own process within "
                               f"{START_TIMEOUT_S:.0f} s (exit code {self.proc.returncode}; its "
                               "stderr is in the engine's log). Expected its endpoints. Set "
                               "NBDIST_HUB_PROCESS=0 on the engines to serve hubs from a thread.")
        self.endpoints = first["endpoints"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._got:
                self.lines.append(json.loads(line))
                self._got.notify_all()
        with self._got:
            self.lines.append({})  # end of output: the process is gone
            self._got.notify_all()

    def _wait(self, count: int, timeout: float) -> dict | None:
        with self._got:
            self._got.wait_for(lambda: len(self.lines) >= count, timeout)
            return self.lines[count - 1] if len(self.lines) >= count else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def join(self, timeout: float) -> dict:
        last = self._wait(2, timeout)
        if last is None:  # ask it to close, as a thread hub is asked
            self.proc.terminate()
            last = self._wait(2, 5.0)
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        remove_socket_files(self.endpoints)  # a killed hub could not unlink them (a clean exit has)
        if last and "summary" in last:
            return last["summary"]
        return {"shard": self.shard,
                "error": f"the hub process exited (code {self.proc.returncode}) without a summary"}


def start_hub(spec: HubSpec) -> dict:
    """Bind a hub's sockets, serve from its own process (or a thread), return its endpoints. A
    hub in a thread never polls without sleeping (--spin): it would take the GIL from the engine."""
    entry = _ProcessHub(spec) if hub_in_process() else _ThreadHub(replace(spec, spin_s=0.0))
    _hubs[(spec.run_id, spec.shard)] = entry
    return entry.endpoints


def join_hub(run_id: str, shard: int, timeout: float = 10.0) -> dict:
    """Wait for a hub to leave its loop (asking it to, after `timeout`); returns its summary."""
    entry = _hubs.get((run_id, shard))
    if entry is None:
        return {"shard": shard, "error": "no such hub on this engine"}
    result = entry.join(timeout)
    del _hubs[(run_id, shard)]
    return result


def running_hubs() -> list[tuple[str, int]]:
    """(run id, shard) of every hub still serving in this engine."""
    return [key for key, entry in _hubs.items() if entry.alive()]


def hub_process(run_id: str, shard: int) -> subprocess.Popen | None:
    """The OS process serving hub `shard` of `run_id` from this engine; None if it serves from
    a thread (NBDIST_HUB_PROCESS=0) or was not started here (for `%nbdist status`-like views)."""
    return getattr(_hubs.get((run_id, shard)), "proc", None)
