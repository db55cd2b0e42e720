"""Modes as packages: the MODES table (the Backend protocol: test_layering.py), one error for a
non-finite step, one float64->float32 conversion, and no private names imported across nbdist's
modules."""

import ast
import pathlib

import numpy as np
import pytest

from nbdist.config import Mode
from nbdist.errors import NoClusterError, TrainingError

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nbdist"


def test_every_mode_has_one_table_entry_with_a_start():
    from nbdist.modes import MODES, start_function

    assert set(MODES) == {m.value for m in Mode}
    for mode in MODES:
        start = start_function(mode)
        assert start.__name__ == "start" and start.__module__ == MODES[mode].module


def test_a_mode_that_needs_a_cluster_is_refused_before_the_cell_runs():
    import nbdist

    cell = "raise RuntimeError('the cell ran')"
    for mode in ("async", "sync"):
        with pytest.raises(NoClusterError, match="No cluster to train on"):
            nbdist.train(cell, mode=mode)
    # --mode local needs none, so its cell runs (with Keras): tests/inproc/test_local_mode.py


def test_backends_that_cannot_grow_refuse_new_workers_saying_why():
    from nbdist.errors import ConfigError
    from nbdist.modes.local.backend import LocalBackend

    with pytest.raises(ConfigError, match=r"--mode local.*Received: run.add_workers\(\[3\]\).*--mode async"):
        LocalBackend({}).add_workers([3], announce=None)
    assert LocalBackend({}).joined_engines() == []


def test_a_non_finite_step_has_one_message_naming_where_and_how_to_fix():
    from nbdist.engine.evaluate import check_finite

    check_finite(0.5, 2.0, step=1, where="worker 0", epoch=0)  # finite: nothing
    with pytest.raises(TrainingError) as caught:
        check_finite(float("nan"), 2.0, step=7, where="rank 1 (engine 4)", epoch=2)
    assert str(caught.value) == ("The loss became nan at step 7 on rank 1 (engine 4) (epoch 2). Lower the "
                                 "learning rate (--lr), check the data for NaN/inf, or normalise the inputs.")
    with pytest.raises(TrainingError, match=r"^The gradient norm became inf at step 3 on worker 2 \(epoch 0\)"):
        check_finite(1.0, float("inf"), step=3, where="worker 2", epoch=0)


def test_float64_inputs_become_float32_once_and_other_dtypes_stay():
    from nbdist.engine.data import as_float32

    x = np.array([[0.1, 2.5]], dtype=np.float64)
    assert as_float32(x).dtype == np.float32 and as_float32(x).tolist() == [[np.float32(0.1), 2.5]]
    for kept in (np.array([1, 2], dtype=np.int64), np.array([1.0], dtype=np.float16)):
        assert as_float32(kept) is kept


def test_no_private_name_is_imported_across_nbdist_modules():
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nbdist"):
                found += [f"{path.relative_to(ROOT.parent)}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert found == []


def test_the_mode_packages_and_the_job_do_not_import_upwards():
    """One pass from cell to job: nothing below `nbdist.api` calls back up into it, and the job
    (made before any mode is chosen) imports no mode."""

    def imported(path):
        return {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}

    upward = {str(p.relative_to(ROOT.parent)) for p in (ROOT / "modes").rglob("*.py")
              if imported(p) & {"nbdist.api", "nbdist"}}
    assert upward == set()
    assert not any(m and m.startswith(("nbdist.modes", "nbdist.api")) for m in imported(ROOT / "job.py"))


def test_a_sync_rank_is_never_written_off_for_silence_but_an_async_worker_is():
    """Sync ranks are silent together while rank 0 evaluates (the others wait in the
    allreduce); the hub wrote both off after 30 s of that and the run failed with
    WorkersLostError. No other rank can take over a sync rank's data anyway; a rank that really
    hangs or dies fails the collective (Horovod) or its engine (ipyparallel)."""
    from types import SimpleNamespace

    from nbdist.config import TrainConfig
    from nbdist.core.coordinator import LOST_FIRST_S, Coordinator
    from nbdist.job import coordinator_plan

    contents = SimpleNamespace(num_samples=100, validation=None)
    for mode, lost in (("sync", []), ("async", [0, 1])):
        plan, _, _ = coordinator_plan(TrainConfig(mode=mode, workers=2), contents, 0.1, num_workers=2)
        coordinator = Coordinator(plan)
        for worker in (0, 1):
            coordinator.heard(worker, 0.0)
        assert coordinator.overdue(LOST_FIRST_S + 1.0) == lost, mode
