"""Cells as Keras tutorials write them, trained in every mode: a subclassed model, a frozen base
model inside the model, a tf.data.Dataset held in memory or streamed by shards (in --mode local
and simulate: tests/inproc/test_data_modes.py)."""

import numpy as np
import pytest

import nbdist
from tests.helpers import (
    DATASET_CELL,
    SUBCLASSED_CELL,
    SYNTHETIC_CELL,
    quiet_keras_build,
    trained_every_sample,
)

BASE_CELL = SYNTHETIC_CELL.split("model = ")[0] + '''
keras.utils.set_random_seed(5)
base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu")])
base.trainable = False
model = keras.Sequential([base, keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''


def test_subclassed_model_trains_in_async_after_every_worker_builds_it(cluster):
    with quiet_keras_build():
        run = nbdist.train(SUBCLASSED_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                           wait=True)
    trained_every_sample(run)


def test_cell_with_a_frozen_base_trains_the_outer_model_in_async_and_keeps_the_base(cluster):
    ns, before = {}, {}
    run = nbdist.train(BASE_CELL, cluster=cluster, namespace=ns, workers=2, epochs=2, wait=True)
    assert run.model is ns["model"] and run.model.layers[0] is ns["base"]
    assert "Training `model` (it contains `base`)" in run.events["text"].iloc[0]  # said, not silent
    # only the last layer learns, on random frozen features
    trained_every_sample(run, threshold=0.6)
    exec(BASE_CELL, before)  # noqa: S102 - the seeded cell again: the base's weights before training
    for trained, initial in zip(ns["base"].weights, before["base"].weights, strict=True):
        np.testing.assert_array_equal(trained.numpy(), initial.numpy())  # frozen: unchanged


@pytest.mark.parametrize("limit", ["2GiB", "0"], ids=["in-memory", "streamed"])
def test_tf_data_trains_in_async_in_memory_or_streamed_by_shards(cluster, limit):
    run = nbdist.train(DATASET_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                       data="train_ds", in_memory_limit=limit, wait=True)
    trained_every_sample(run)
    passes = [result["shard_passes"] for result in run.worker_results.values()]
    if limit == "0":  # 1800 samples from two shards of 450: at least 4 passes begun between them
        assert all(p >= 1 for p in passes) and sum(passes) >= 4
        assert any("goes through its own shard" in w for w in run.warnings)
    else:
        assert passes == [None, None]
        assert [w for w in run.warnings if not w.startswith("--average-tail ")] == []


@pytest.mark.horovod
@pytest.mark.parametrize("cell,options", [
    (SUBCLASSED_CELL, {}), (DATASET_CELL, {"data": "train_ds"}),
    (DATASET_CELL, {"data": "train_ds", "in_memory_limit": 0})],
    ids=["subclassed", "tf.data", "streamed"])
def test_subclassed_model_and_tf_data_train_in_sync(cluster, cell, options):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    with quiet_keras_build():
        run = nbdist.train(cell, cluster=cluster, namespace={}, mode="sync", workers=2, epochs=2,
                           wait=True, **options)
    assert run.status == "finished" and run.error is None
    results = run.worker_results
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert results[0]["steps"] == 2 * 15  # ceil(900 / 64) per epoch, streamed or not
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.85
