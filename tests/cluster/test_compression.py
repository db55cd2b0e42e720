"""--compression fp16 in real runs on engines: its effect on accuracy (the wire format itself
is tested in tests/unit/test_compression_format.py)."""

import numpy as np
import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL


def test_fp16_transfer_costs_little_accuracy_on_the_hub_weights(cluster):
    """TCP transport (as across hosts): the same seed with float32 and with float16 on the wire."""
    accuracies = {}
    for mode in ("none", "fp16"):
        ns = {}
        run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, epochs=3,
                           batch_size=16, transport="tcp", compression=mode, wait=True)
        assert run.status == "finished"
        accuracies[mode] = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]
    assert accuracies["none"] > 0.9
    assert abs(accuracies["fp16"] - accuracies["none"]) <= 0.03, accuracies


@pytest.mark.horovod
def test_sync_fp16_allreduce_keeps_ranks_identical_and_accuracy(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2, epochs=2,
                       batch_size=32, compression="fp16", wait=True)
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9
