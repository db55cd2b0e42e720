"""A dead kernel stops its run. The engines of a cluster the kernel only connected to (as with
`%nbdist connect`, Slurm or MPI) are not the local watchdog's to end, so the run's hub shards
hold the kernel to a lease (`nbdist.hub.orphan`): a kernel silent past --timeout is taken for
dead, the workers are told to stop, shard 0 writes a last checkpoint into --checkpoint-dir, and
the engines are idle again. Here the kernel is a child process that connects to the session's
cluster and is killed (SIGKILL) mid-run (before: the workers trained on, for all 500 epochs,
and nothing was saved after the kill). A pipeline run's stages hold the kernel to the same lease
(renewed by its `Alive` broadcasts) and leave."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbdist
from nbdist.checkpoint.store import load
from nbdist.hub.launch import running_hubs
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for

TIMEOUT_S = 8.0  # --timeout: the kernel's lease lapses 2 s sooner, so the workers leave in time
HUBS_EXIT_S = 5.0  # after that: shard 0's last checkpoint, then every shard leaves
ROOT = Path(__file__).resolve().parents[2]
RESULT = "@@"

KERNEL = '''
import json, sys, time
import nbdist
from nbdist.cluster.engines import Cluster
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for

args = json.loads(sys.argv[1])
cluster = Cluster.connect(**args["connect"])
if args["die_starting"]:  # killed while nbdist.train still starts the run: its workers train
    from nbdist.modes.async_ps.backend import ClusterBackend
    start_workers = ClusterBackend.start_workers
    def start_and_be_killed(self, base):
        start_workers(self, base)
        time.sleep(2.0)  # (a start that takes long: many engines, a slow host)
        print("@@" + json.dumps({}), flush=True)
        time.sleep(600)  # killed here
    ClusterBackend.start_workers = start_and_be_killed
run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, batch_size=8, epochs=500,
                   timeout=args["timeout"], **args["options"])
wait_for(lambda: global_step(run) >= args["steps"], 120)
print("@@" + json.dumps({"run_id": run.run_id, "step": global_step(run)}), flush=True)
time.sleep(600)  # killed here
'''


def _kill_the_kernel(cluster, tmp_path, steps: int = 60, die_starting: bool = False,
                     **options) -> tuple[dict, float]:
    """Run the kernel (a child connected to `cluster`) until its run has trained `steps` (or,
    `die_starting`, until it has started the workers, inside `nbdist.train`), then SIGKILL it;
    (what it said, when it was killed)."""
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    args = {"connect": cluster.connect_args, "timeout": TIMEOUT_S, "steps": steps,
            "options": options, "die_starting": die_starting}
    kernel = subprocess.Popen([sys.executable, str(script), json.dumps(args)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = kernel.stdout.readline()
        assert line.startswith(RESULT), f"the kernel ended without starting (exit {kernel.poll()})"
        assert cluster.busy_engines(), "the run should be training when the kernel is killed"
    finally:
        kernel.kill()
        killed = time.monotonic()
        kernel.wait(30)
    return json.loads(line[len(RESULT):]), killed


def _idle_within_the_timeout(cluster, killed: float) -> float:
    wait_for(lambda: not cluster.busy_engines(), TIMEOUT_S, poll_s=0.1,
             what=lambda: f"idle engines within --timeout {TIMEOUT_S:.0f} s of the kernel's death "
                          f"(busy: {cluster.busy_engines()})")
    return time.monotonic() - killed


def _hubs(cluster) -> list:
    """The hubs still serving on the cluster's engines (ask idle engines only)."""
    return [hub for hubs in cluster.client[:].apply_sync(running_hubs) for hub in hubs]


def test_a_killed_kernel_leaves_idle_engines_and_a_last_checkpoint_that_resumes(cluster,
                                                                               tmp_path):
    folder = tmp_path / "ckpt"
    started, killed = _kill_the_kernel(cluster, tmp_path, servers=2, workers=1,
                                       checkpoint_dir=str(folder))
    idle_after = _idle_within_the_timeout(cluster, killed)
    wait_for(lambda: not _hubs(cluster), HUBS_EXIT_S, poll_s=0.2,
             what=lambda: f"every hub shard gone (serving: {_hubs(cluster)})")
    hubs_after = time.monotonic() - killed
    ckpt = load(folder)  # verified whole
    meta = ckpt.meta
    assert meta["run_id"] == started["run_id"]
    assert meta["created"] > time.time() - hubs_after - 1.0, "no checkpoint after the kill"
    assert meta["shards"][0]["version"] >= started["step"] and len(meta["shards"]) == 2
    print(f"engines idle {idle_after:.1f} s, hubs gone {hubs_after:.1f} s after the kernel's "
          f"death; last checkpoint at version "
          f"{meta['shards'][0]['version']} ({meta['epochs_done']:.2f} epochs)")
    # --resume goes on from it (its 500 epochs are not trained out here: a few steps, then stop)
    version = meta["shards"][0]["version"]
    with nbdist.resume(folder, SYNTHETIC_CELL, cluster=cluster, namespace={}) as run:
        wait_for(lambda: global_step(run) > version + 20 or run.ended(), 120)
        run.stop()
        run.wait()
    assert run.status == "stopped", run.error
    assert run.stats["epochs_done"] >= meta["epochs_done"]


def test_a_killed_kernel_ends_its_pipeline_run_on_a_connected_cluster(cluster, tmp_path):
    # killed at its first step: often before any `Alive` reached the stages (before, their lease
    # then waited out the hubs' 60 s first term, and the engines were idle 13 to 15 s later)
    _, killed = _kill_the_kernel(cluster, tmp_path, steps=1, mode="pipeline", stages=2)
    idle_after = _idle_within_the_timeout(cluster, killed)
    print(f"pipeline stages' engines idle {idle_after:.1f} s after the kernel's death")


def test_a_kernel_killed_while_it_starts_the_workers_leaves_idle_engines(cluster, tmp_path):
    # the kernel sends the hubs nothing while it starts the workers (seconds, on many engines):
    # before, a hub whose lease had not been renewed yet waited out its 60 s first term, and
    # the workers trained on that long after the kernel's death
    _, killed = _kill_the_kernel(cluster, tmp_path, die_starting=True)  # one hub shard
    idle_after = _idle_within_the_timeout(cluster, killed)
    wait_for(lambda: not _hubs(cluster), HUBS_EXIT_S, poll_s=0.2,
             what=lambda: f"every hub shard gone (serving: {_hubs(cluster)})")
    print(f"engines idle {idle_after:.1f} s after the death of a kernel that was starting them")
