"""Cells as Keras tutorials write them (a subclassed model, a tf.data.Dataset held in memory
or streamed) trained in this kernel, in --mode local and simulate."""

import pytest

import nbdist
from nbdist.errors import DataError
from tests.helpers import DATASET_CELL, SUBCLASSED_CELL, quiet_keras_build, trained_every_sample


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "simulate"])
@pytest.mark.parametrize("cell,options", [
    (SUBCLASSED_CELL, {}), (DATASET_CELL, {"data": "train_ds"})], ids=["subclassed", "tf.data"])
def test_subclassed_model_and_tf_data_train_in_local_and_simulate(mode, cell, options):
    workers = {"workers": 2} if mode == "simulate" else {}
    with quiet_keras_build():
        run = nbdist.train(cell, namespace={}, mode=mode, epochs=2, wait=True, **workers, **options)
    trained_every_sample(run)


@pytest.mark.slow
def test_streamed_dataset_trains_locally_but_simulate_needs_it_in_memory():
    run = nbdist.train(DATASET_CELL, namespace={}, mode="local", epochs=2, data="train_ds",
                       in_memory_limit=0, wait=True)
    trained_every_sample(run)
    with pytest.raises(DataError,
                       match="--mode simulate trains in this kernel on data held in memory"):
        nbdist.train(DATASET_CELL, namespace={}, mode="simulate", workers=2, data="train_ds",
                     in_memory_limit=0)
