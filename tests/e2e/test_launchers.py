"""Engines from real schedulers, through ipyparallel's own launchers: a single-node Slurm
(slurm-wlm + munge, configured in a temporary folder, see tests/schedulers.py) and Open MPI.
Both then train: async and sync under Slurm, sync through Gloo with engines that are MPI ranks."""

from __future__ import annotations

import os

import numpy as np
import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL, outlives
from tests.schedulers import SlurmCluster, mpi_env, mpi_unavailable, slurm_unavailable

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # each test starts engines
SLURM = slurm_unavailable()
MPI = mpi_unavailable()


def _needs_horovod():
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")


def _identical_ranks(run, ns):
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    kernel = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    np.testing.assert_array_equal(kernel, results[0]["params"])


@pytest.mark.horovod
@pytest.mark.skipif(SLURM is not None, reason=f"Slurm: {SLURM}")
def test_slurm_launcher_starts_engines_as_one_job_that_trains_async_and_sync(tmp_path, monkeypatch):
    _needs_horovod()
    from nbdist.cluster.engines import Cluster

    notebook = tmp_path / "notebook"
    notebook.mkdir()
    monkeypatch.chdir(notebook)  # ipyparallel writes its batch script to the cwd unless told
    with SlurmCluster(tmp_path / "slurm") as slurm:
        monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
        cluster = Cluster.start(3, launcher="slurm", timeout=180)
        try:
            jobs = cluster.client[:].apply_sync(os.getenv, "SLURM_JOB_ID")
            assert len(set(jobs)) == 1 and jobs[0] is not None  # all three are tasks of one sbatch job
            ns = {}
            run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, epochs=2,
                               batch_size=16, wait=True, timeout=60)
            assert run.status == "finished" and run.stats["epoch_samples"] == [900, 900]
            ns = {}
            run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2,
                               epochs=2, batch_size=32, wait=True, timeout=60)
            assert run.status == "finished"
            _identical_ranks(run, ns)
            assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85
        finally:
            cluster.stop()
        assert list(notebook.iterdir()) == [], "the launcher left files in the notebook's folder"
        left = _gone(slurm.leftovers, timeout=30)
        assert not left, f"processes outlived the job and its cluster: {left}"


def _gone(find, timeout: float) -> dict[int, str]:
    """Wait for processes to exit; those still there, with their command lines."""
    import time

    deadline = time.monotonic() + timeout
    while (pids := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
    return out


@pytest.mark.horovod
@pytest.mark.skipif(MPI is not None, reason=f"MPI: {MPI}")
def test_mpi_launcher_engines_are_mpi_ranks_and_train_sync_through_gloo(ip, monkeypatch, capsys):
    _needs_horovod()
    for name, value in mpi_env().items():
        monkeypatch.setenv(name, value)
    ip.run_line_magic("nbdist", "start 2 --launcher mpi")
    magics = ip.magics_manager.registry["NbdistMagics"]
    cluster = magics.cluster
    try:
        pids = cluster.client[:].apply_sync(os.getpid)
        ranks = cluster.client[:].apply_sync(os.getenv, "OMPI_COMM_WORLD_RANK")
        assert sorted(ranks) == ["0", "1"]  # started by mpiexec: MPI ranks, refused in sync mode before
        ip.run_cell_magic("distribute", "--mode sync --workers 2 --epochs 2 --batch-size 32 --wait -o mpi_run",
                          SYNTHETIC_CELL)
        run = ip.user_ns["mpi_run"]
        assert run.status == "finished"
        _identical_ranks(run, ip.user_ns)
    finally:
        ip.run_line_magic("nbdist", "stop")
    for pid in pids:
        assert not outlives(pid, wait_s=10.0), f"MPI engine {pid} outlived %nbdist stop"
