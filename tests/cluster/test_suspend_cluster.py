"""A laptop's suspend, on real processes: every process of a run, the kernel's included (here a
child process that plays the notebook kernel, so that the test can stop it), is stopped with
SIGSTOP for twice --timeout mid-run, then continued. The run goes on and finishes, with no
worker written off and no lost hub (before: the hub wrote both workers off on its wall clock,
and the kernel's watch gave the hub up)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.helpers import alive, wait_for

TIMEOUT_S = 5.0  # --timeout; the stop lasts twice as long, and past every worker's 5 s floor
ROOT = Path(__file__).resolve().parents[2]
RESULT = "@@"

KERNEL = '''
import json, sys, time
import nbdist
from nbdist.cluster.engines import Cluster
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for, wait_paused

cluster = Cluster.start(3)  # one hub shard, two workers
try:
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, batch_size=8,
                       epochs=6, timeout=float(sys.argv[1]), pause_at=20)
    wait_paused(run)
    run.resume()
    wait_for(lambda: run.status != "paused", 60)
    print("@@" + json.dumps({"ready": True}), flush=True)  # the test stops every process now
    seen = [(time.monotonic(), global_step(run))]
    while not run.done():
        time.sleep(0.05)
        seen.append((time.monotonic(), global_step(run)))
    gaps = [(b[0] - a[0], a[1]) for a, b in zip(seen, seen[1:])]
    gap, step_at_gap = max(gaps)
    lost = run.events[run.events["event"] == "worker_lost"]
    print("@@" + json.dumps({"status": run.status, "error": repr(run.error),
                             "lost": [int(w) for w in lost.get("worker", [])], "gap_s": gap,
                             "step_at_gap": step_at_gap, "final_step": global_step(run),
                             "epoch_samples": run.stats["epoch_samples"]}), flush=True)
finally:
    cluster.stop()
'''


def _result(kernel) -> dict:
    for line in kernel.stdout:
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise AssertionError(f"the kernel ended without a result (exit code {kernel.wait(30)})")


def _signal(procs, sig) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def test_a_run_suspended_whole_for_twice_its_timeout_goes_on_and_loses_nobody(tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    kernel = subprocess.Popen([sys.executable, str(script), str(TIMEOUT_S)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    family: list[psutil.Process] = []
    try:
        assert _result(kernel) == {"ready": True}
        me = psutil.Process(kernel.pid)
        family = [me, *me.children(recursive=True)]  # controller, engines, nannies, hub, watchdog
        assert len(family) >= 6, [p.cmdline()[:3] for p in family]
        _signal(family, signal.SIGSTOP)
        time.sleep(2 * TIMEOUT_S)
        _signal(family, signal.SIGCONT)
        result = _result(kernel)
        assert result["gap_s"] >= 2 * TIMEOUT_S, result  # the stop landed mid-run ...
        assert result["step_at_gap"] < result["final_step"], result  # ... and training went on
        assert result["status"] == "finished", result
        assert result["lost"] == [] and result["epoch_samples"] == [900] * 6, result
        assert kernel.wait(120) == 0
    finally:
        _signal(family, signal.SIGCONT)
        try:  # it stops its cluster itself; killed in that, it would leave it to the watchdog
            kernel.wait(180)
        except subprocess.TimeoutExpired:
            kernel.kill()  # the cluster's watchdog ends the rest
            kernel.wait(30)
        wait_for(lambda: not [p for p in family if alive(p)], 60,
                 what=lambda: f"exit of every process (left: "
                              f"{[p.pid for p in family if alive(p)]})")

