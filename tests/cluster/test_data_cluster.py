"""Cells as Keras tutorials write them, trained in every mode: a subclassed model, a frozen base
model inside the model, a tf.data.Dataset held in memory or streamed by shards."""

import warnings

import numpy as np
import pytest

import nbdist
from nbdist.errors import DataError
from tests.conftest import SYNTHETIC_CELL

DATA = SYNTHETIC_CELL.split("model = ")[0]  # imports and the synthetic arrays (900 train, 300 test)
COMPILE = '''model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
SUBCLASSED_CELL = DATA + '''
class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(3, activation="softmax")
    def call(self, x):
        return self.out(self.hidden(x))
model = Net()
model.build((None, 8))
''' + COMPILE
BASE_CELL = DATA + '''
keras.utils.set_random_seed(5)
base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu")])
base.trainable = False
model = keras.Sequential([base, keras.layers.Dense(3, activation="softmax")])
''' + COMPILE
DATASET_CELL = SYNTHETIC_CELL + '''
import tensorflow as tf
train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)
'''


def _quiet():
    """Keras warns that build() on a subclassed model without build() creates nothing."""
    return warnings.catch_warnings(action="ignore", category=UserWarning)


def _learned(run, epochs=2, threshold=0.85):
    assert run.status == "finished" and run.error is None
    assert run.nodes["samples"].sum() == epochs * 900  # global epochs: every sample once per epoch
    assert run.history["val_accuracy"].dropna().iloc[-1] > threshold


@pytest.mark.cluster
def test_subclassed_model_trains_in_async_after_every_worker_builds_it(cluster):
    with _quiet():
        run = nbdist.train(SUBCLASSED_CELL, cluster=cluster, namespace={}, workers=2, epochs=2, wait=True)
    _learned(run)


@pytest.mark.cluster
def test_cell_with_a_frozen_base_trains_the_outer_model_in_async_and_keeps_the_base(cluster):
    ns, before = {}, {}
    run = nbdist.train(BASE_CELL, cluster=cluster, namespace=ns, workers=2, epochs=2, wait=True)
    assert run.model is ns["model"] and run.model.layers[0] is ns["base"]
    assert "Training `model` (it contains `base`)" in run.events["text"].iloc[0]  # said, not silent
    _learned(run, threshold=0.6)  # only the last layer learns, on random frozen features
    exec(BASE_CELL, before)  # the seeded cell again: the base's weights before training
    for trained, initial in zip(ns["base"].weights, before["base"].weights, strict=True):
        np.testing.assert_array_equal(trained.numpy(), initial.numpy())  # frozen: unchanged


@pytest.mark.cluster
@pytest.mark.parametrize("limit", ["2GiB", "0"], ids=["in-memory", "streamed"])
def test_tf_data_trains_in_async_in_memory_or_streamed_by_shards(cluster, limit):
    run = nbdist.train(DATASET_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                       data="train_ds", in_memory_limit=limit, wait=True)
    _learned(run)
    passes = [task.get(10)["shard_passes"] for task in run._backend._tasks.values()]  # noqa: SLF001
    if limit == "0":  # 1800 samples from two shards of 450: at least 4 passes begun between them
        assert all(p >= 1 for p in passes) and sum(passes) >= 4
        assert any("goes through its own shard" in w for w in run.warnings)
    else:
        assert passes == [None, None] and run.warnings == []


@pytest.mark.cluster
@pytest.mark.horovod
@pytest.mark.parametrize("cell,options", [
    (SUBCLASSED_CELL, {}), (DATASET_CELL, {"data": "train_ds"}),
    (DATASET_CELL, {"data": "train_ds", "in_memory_limit": 0})], ids=["subclassed", "tf.data", "streamed"])
def test_subclassed_model_and_tf_data_train_in_sync(cluster, cell, options):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    with _quiet():
        run = nbdist.train(cell, cluster=cluster, namespace={}, mode="sync", workers=2, epochs=2,
                           wait=True, **options)
    assert run.status == "finished" and run.error is None
    results = run._backend.results  # noqa: SLF001
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert results[0]["steps"] == 2 * 15  # ceil(900 / 64) per epoch, streamed or not
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "simulate"])
@pytest.mark.parametrize("cell,options", [
    (SUBCLASSED_CELL, {}), (DATASET_CELL, {"data": "train_ds"})], ids=["subclassed", "tf.data"])
def test_subclassed_model_and_tf_data_train_in_local_and_simulate(mode, cell, options):
    workers = {"workers": 2} if mode == "simulate" else {}
    with _quiet():
        run = nbdist.train(cell, namespace={}, mode=mode, epochs=2, wait=True, **workers, **options)
    _learned(run)


@pytest.mark.slow
def test_streamed_dataset_trains_locally_but_simulate_needs_it_in_memory():
    run = nbdist.train(DATASET_CELL, namespace={}, mode="local", epochs=2, data="train_ds",
                       in_memory_limit=0, wait=True)
    _learned(run)
    with pytest.raises(DataError, match="--mode simulate trains in this kernel on data held in memory"):
        nbdist.train(DATASET_CELL, namespace={}, mode="simulate", workers=2, data="train_ds", in_memory_limit=0)
