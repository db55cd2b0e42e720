"""One pass from cell to job (nbdist/job.py): what the kernel decides, decided once."""

import numpy as np
import pytest

import nbdist
from nbdist.config import TrainConfig
from tests.helpers import SYNTHETIC_CELL, prepared


def test_the_job_holds_what_the_kernel_decided_and_the_plan_once_the_workers_are_known():
    config = TrainConfig(mode="local", epochs=2, batch_size=50, lr=0.05)
    job = prepared(SYNTHETIC_CELL, config)
    assert job.model_name == "model" and job.contents.num_samples == 900
    assert job.layout == {"trainable": [[8, 16], [16], [16, 3], [3]], "non_trainable": []}
    assert job.params.shape == (8 * 16 + 16 + 16 * 3 + 3,) and job.params.dtype == np.float32
    assert job.optimizer["class_name"] == "SGD" and job.optimizer["learning_rate"] == 0.05
    assert (job.lr_owner == "hub"
            and job.warnings == ["--lr 0.05 replaces the cell's learning rate 0.1."])
    assert job.plan is None  # not before the mode's backend has counted its workers
    sized = job.for_workers(3)
    assert (sized.num_workers, sized.plan.num_workers, sized.plan.num_samples) == (3, 3, 900)
    assert sized.plan.slowdown == [1.0, 1.0, 1.0] and sized.layout is job.layout


def test_sync_keeps_the_cells_optimizer_on_the_ranks():
    job = prepared(SYNTHETIC_CELL, TrainConfig(mode="sync", workers=2))
    assert (job.optimizer is None and job.lr_owner == "workers"
            and job.workers_rate == pytest.approx(0.1))


def test_the_kernel_reads_the_models_layout_once(monkeypatch):
    """It used to be read again for each use (three times in api._start, again in simulate)."""
    import nbdist.engine.flat_layout as flat_layout
    from nbdist import job
    from nbdist.modes.common import worker

    calls = []
    real = flat_layout.layout

    def counted(model):
        calls.append(model)
        return real(model)

    for module in (flat_layout, job, worker):  # each module that imports it
        monkeypatch.setattr(module, "layout", counted)
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="simulate", workers=2, epochs=1,
                       wait=True)
    assert run.status == "finished" and len(calls) == 1
