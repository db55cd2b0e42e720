"""A disk that fills during a checkpoint, for real: the checkpoint folder is a 1 MiB tmpfs, mounted
in a mount namespace of its own (root only), for a child process that trains a --mode local
run there. Two checkpoints are saved; then the disk is filled so that the third one's array
file still fits but its meta does not. The save fails with ENOSPC and leaves nothing of itself
behind; both earlier checkpoints load whole, the newest resumes, and the run's own final
checkpoint, which finds the disk full too, warns instead of failing the run.
(`tests/inproc/test_checkpoint.py` injects the ENOSPC at each step of a save instead.)"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = '''
import errno, json, os, subprocess, sys
import nbdist
from nbdist.checkpoint.store import load
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for, wait_paused

folder = sys.argv[1]
out = {}
run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=3, batch_size=8,
                   pause_at=40, checkpoint_dir=folder, checkpoint_every=3600)
wait_paused(run)
first = load(run.checkpoint())
run.resume()
wait_for(lambda: global_step(run) >= 80, 60)
run.pause()
wait_for(lambda: run.status == "paused", 60)
second = load(run.checkpoint())
out["saved"] = [first.meta["shards"][0]["version"], second.meta["shards"][0]["version"]]
# fill the disk: room for one more array file (the same size as the last), not for its meta
arrays = os.path.getsize(os.path.join(folder, second.meta["arrays_file"]))
stat = os.statvfs(folder)
pages = stat.f_bavail * stat.f_frsize // 4096 - -(-arrays // 4096)
subprocess.run(["dd", "if=/dev/zero", f"of={folder}/../fill", "bs=4096", f"count={pages}"],
               check=True, capture_output=True)
before = sorted(os.listdir(folder))
try:
    run.checkpoint()
    out["third"] = "saved"
except OSError as exc:
    out["third"] = errno.errorcode.get(exc.errno, str(exc.errno))
out["unchanged"] = sorted(os.listdir(folder)) == before
out["loaded"] = [load(os.path.join(folder, name)).meta["shards"][0]["version"]
                 for name in ("meta.json", "meta.1.json")]
run.stop()
run.wait()
out["status"], out["warnings"] = run.status, run.warnings
resumed = nbdist.resume(folder, SYNTHETIC_CELL, namespace={}, wait=True)
out["resumed"] = [resumed.status, global_step(resumed)]
print("@@" + json.dumps(out), flush=True)
'''


@pytest.mark.slow
def test_a_disk_full_during_a_checkpoint_leaves_the_previous_ones_and_the_newest_resumes(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs in a mount namespace of "
                    "its own (tests/inproc/test_checkpoint.py injects the full disk instead)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = (f"mount -t tmpfs -o size=1m tmpfs {disk} && mkdir {disk}/ckpt && "
               f"exec {sys.executable} {script} {disk}/ckpt")
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("@@"))[2:])
    first, second = out["saved"]
    assert first < second, out
    assert out["third"] == "ENOSPC" and out["unchanged"], out  # nothing of it left behind
    assert out["loaded"] == [second, first], out  # both earlier checkpoints, whole
    assert out["status"] == "stopped", out
    assert any("checkpoint not saved" in w for w in out["warnings"]), out
    assert out["resumed"][0] == "finished" and out["resumed"][1] > second, out
