"""A full /dev/shm (another user on the server filled it) cannot SIGBUS a run: every shared-memory
segment's pages are allocated when it is made (`posix_fallocate`, `nbdist.hub.shm.create`), so
no room is an error there, the worker or hub shard goes over TCP instead, and `run.warnings`
says so. Before, a segment was sparse, and the first write into it on a full /dev/shm killed
the process with SIGBUS."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL

ROOT = Path(__file__).resolve().parents[2]

CHILD = '''
import json
import nbdist
from tests.helpers import SYNTHETIC_CELL

run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=1, batch_size=32, wait=True)
print("@@" + json.dumps({"status": run.status, "warnings": run.warnings,
                         "links": list(run.nodes["link"])}), flush=True)
'''


def _no_room(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_segments_that_cannot_be_allocated_send_the_run_over_tcp_and_it_says_so(monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", servers=2, epochs=1,
                       batch_size=32, wait=True)
    assert run.status == "finished", run.error
    assert list(run.nodes["link"]) == ["tcp"]
    said = [w for w in run.warnings if "shared memory unavailable" in w]
    assert [w.split(":")[0] for w in said] == ["hub shard 0", "hub shard 1", "worker 0"], said
    assert all("No space left on device" in w and "/dev/shm" in w for w in said)


@pytest.mark.slow
def test_a_full_dev_shm_is_no_sigbus_but_tcp_and_a_warning(tmp_path):
    """A real full /dev/shm: a 256 KiB tmpfs mounted over it in a mount namespace of its own
    (root only), filled up, for a child process that trains a --mode local run there."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs over /dev/shm in a mount "
                    "namespace of its own (the segment-allocation test above covers the fall-back)")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    fill = ("mount -t tmpfs -o size=256k tmpfs /dev/shm && "
            "(dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; true) && "
            f"exec {sys.executable} {script}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", fill], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (f"the child exited with {done.returncode} (-7: SIGBUS)\n"
                                  f"{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("@@"))
    result = json.loads(line[2:])
    assert result["status"] == "finished" and result["links"] == ["tcp"], result
    said = [w for w in result["warnings"] if "shared memory unavailable" in w]
    assert [w.split(":")[0] for w in said] == ["hub shard 0", "worker 0"], result["warnings"]


def test_a_pipeline_stage_whose_slots_cannot_be_allocated_sends_by_tcp(monkeypatch):
    from nbdist.hub.protocol import new_key
    from nbdist.modes.pipeline.kernel_link import KernelLink
    from nbdist.modes.pipeline.link import StageLink
    from nbdist.modes.pipeline.messages import Forward

    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    key = new_key()
    kernel = KernelLink(key, "r", "127.0.0.1", 2)
    a, b = (StageLink(key, "r", s, "127.0.0.1", 10, (3, 1 << 20), slots=2) for s in (0, 1))
    a.connect({"stage-1": b.info}, kernel.report_endpoint, kernel.control_endpoint)
    b.connect({"stage-0": a.info}, kernel.report_endpoint, kernel.control_endpoint)
    try:
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for i in range(2):
            a.send("stage-1", Forward(1, i), [x + i])
        assert a.messages == {"shm": 0, "tcp": 2} and a.outboxes == {}
        for i in range(2):
            _, header, (got,) = b.wait(("F", 1, i))
            assert header.shm is None
            np.testing.assert_array_equal(got, x + i)
    finally:
        a.close()
        b.close()
        kernel.close()
