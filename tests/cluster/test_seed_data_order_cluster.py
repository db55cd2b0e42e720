"""--seed sets the data order of the modes that train on engines (async, sync, pipeline): the
same seed gives the same order, another seed another one. One async worker, so that its pushes
land in the order it computes them."""

import pytest

import nbdist
from tests.helpers import SEEDED_SYNTHETIC_CELL, assert_seed_sets_order

MODES = {"async": dict(workers=1), "sync": dict(workers=2),
         "pipeline": dict(stages=2, micro_batches=2, partition="uniform")}


@pytest.mark.parametrize("mode", list(MODES))
def test_seed_sets_the_data_order(cluster, mode):
    if mode == "sync":
        pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    assert_seed_sets_order(lambda seed: nbdist.train(
        SEEDED_SYNTHETIC_CELL, cluster=cluster, namespace={}, mode=mode, epochs=1,
        batch_size=64, seed=seed, wait=True, **MODES[mode]))
