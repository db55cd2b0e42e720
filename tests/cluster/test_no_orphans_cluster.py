"""A kernel killed at any moment of `%nbdist start` leaves no controller or engine behind:
the watchdog starts before the first cluster process and ends every process that carries the
cluster's id (ipyparallel's IPP_CLUSTER_ID)."""

import subprocess
import sys
import time

import pytest

from nbdist.cluster.watchdog import tagged

KERNEL = '''
import sys
from nbdist.cluster.engines import Cluster
print("importing", flush=True)
Cluster.start(2, cluster_id=sys.argv[1])
print("started", flush=True)
import time
time.sleep(600)
'''


def _kernel(tmp_path, cluster_id):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    return subprocess.Popen([sys.executable, str(script), cluster_id], stdout=subprocess.PIPE, text=True)


def _wait_until_none_left(cluster_id, limit_s=60.0):
    """The processes of `cluster_id` still running after the watchdog had `limit_s` to act."""
    end = time.monotonic() + limit_s
    left = tagged(cluster_id)
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = tagged(cluster_id)
    return [(p.pid, " ".join(p.cmdline())[:80]) for p in left if p.is_running()]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("moment", ["import", "controller", "engines", "started"])
def test_a_kernel_killed_during_start_leaves_no_process_behind(tmp_path, moment):
    cluster_id = f"nbdist-orphan-{moment}-{time.time_ns() % 10**6}"
    kernel = _kernel(tmp_path, cluster_id)
    try:
        assert kernel.stdout.readline().strip() == "importing"
        if moment == "controller":  # the controller exists, the engines may not yet
            while not any("ipyparallel.controller" in " ".join(p.cmdline()) for p in tagged(cluster_id)):
                time.sleep(0.05)
        elif moment == "engines":  # an engine process exists (it may not be registered)
            while not any("ipyparallel.engine" in " ".join(p.cmdline()) for p in tagged(cluster_id)):
                time.sleep(0.05)
        elif moment == "started":
            assert kernel.stdout.readline().strip() == "started"
            assert len(tagged(cluster_id)) >= 3  # controller and two engines (and nannies)
    finally:
        kernel.kill()
        kernel.wait(10)
    assert _wait_until_none_left(cluster_id) == []
