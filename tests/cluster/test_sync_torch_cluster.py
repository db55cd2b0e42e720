"""`--mode sync --collective torch` on Keras's TensorFlow backend, on a real local cluster:
torch.distributed's Gloo group in place of Horovod (what a machine where Horovod cannot be
built trains with), with --compression fp16, powersgd and randomk, --dbs, and a checkpoint that
resumes exactly.
(JAX and PyTorch, where torch is the only collective: tests/cluster/test_backends_cluster.py.)"""

import importlib.util

import numpy as np
import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL, wait_paused

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="PyTorch is not installed: pip install 'nbdist[torch]'")]

OPTIONS = dict(mode="sync", workers=2, collective="torch")
# momentum: the Keras optimizer keeps one slot per weight, which the checkpoint must carry
MOMENTUM_CELL = SYNTHETIC_CELL.replace("SGD(0.1)", "SGD(0.05, momentum=0.9)").replace(
    "model = keras", "keras.utils.set_random_seed(3)\nmodel = keras")


def weights(ns):
    return np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])


def test_torch_ranks_with_fp16_and_dbs_end_identical_and_equal_to_the_kernel_model(cluster):
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, epochs=2, batch_size=32,
                       compression="fp16", dbs=True, wait=True, **OPTIONS)
    assert run.status == "finished", run.error
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    np.testing.assert_array_equal(weights(ns), results[0]["params"])
    assert results[0]["steps"] == results[1]["steps"] == 2 * 15  # ceil(900 / 64) per epoch
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9
    assert any(str(t).startswith("--collective torch: torch.distributed's allreduce")
               for t in run.events["text"].dropna())


@pytest.mark.parametrize("codec", ["powersgd:1", "randomk:0.2"])
def test_torch_ranks_with_a_codecs_own_exchange_end_identical(cluster, codec):
    """powersgd: Gloo's allreduces of P and of Q; randomk: Gloo's allgather of each rank's frame
    (its own random stream, its error feedback)."""
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, epochs=2, batch_size=32,
                       compression=codec, wait=True, **OPTIONS)
    assert run.status == "finished", run.error
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    np.testing.assert_array_equal(weights(ns), results[0]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9


def test_a_torch_sync_checkpoint_resumes_to_the_weights_of_an_uninterrupted_run(cluster,
                                                                                 tmp_path):
    """Two ranks sum in the same order on every step, and a resume starts at a whole global
    batch with the momentum restored: the run continues bit for bit, as with Horovod."""
    options = dict(OPTIONS, batch_size=8, seed=4)
    straight = {}
    nbdist.train(MOMENTUM_CELL, cluster=cluster, namespace=straight, epochs=2, wait=True,
                 **options)
    run = nbdist.train(MOMENTUM_CELL, cluster=cluster, namespace={}, epochs=2,
                       checkpoint_dir=str(tmp_path), pause_at=40, **options)
    wait_paused(run).stop()
    run.wait(timeout=60)
    assert run.status == "stopped"
    resumed = {}
    again = nbdist.resume(tmp_path, MOMENTUM_CELL, cluster=cluster, namespace=resumed, wait=True)
    assert again.status == "finished" and again.config.collective == "torch"
    np.testing.assert_array_equal(weights(resumed), weights(straight))
