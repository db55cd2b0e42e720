"""--sim calibrate=1 with a cluster: the cost model is measured on an engine, and says so."""

import numpy as np

import nbdist

CELL = """
import keras
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
"""


def test_calibration_runs_on_engine_zero_and_the_run_uses_it(cluster):
    rng = np.random.default_rng(0)
    ns = {"x_train": rng.random((256, 784), dtype=np.float32), "y_train": rng.integers(0, 10, 256)}
    run = nbdist.train(CELL, cluster=cluster, namespace=ns, mode="simulate", workers=2, epochs=1,
                       sim="calibrate=1", wait=True)
    events = run.events
    found = events[events.event == "sim_calibration"].iloc[0]
    engine = sorted(cluster.client.ids)[0]
    assert found["where"].startswith(f"engine {engine} (")
    assert [p[0] for p in found["points"]] == [8, 32, 128] and found["hub_round_trip_s"] > 0
    used = events[events.event == "sim_cost"].iloc[0]
    assert (used["per_step_s"] == found["per_step_s"]
            and used["per_sample_s"] == found["per_sample_s"])
    # the engine is ready for the next run: no hub left serving there
    from nbdist.hub.launch import running_hubs

    assert cluster.client[engine].apply_sync(running_hubs) == []
