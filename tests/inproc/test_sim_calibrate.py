"""--sim calibrate=1: the cost model from a timed gradient step and a real hub's round trip."""

import numpy as np

import nbdist
from nbdist.modes.simulate.calibrate import describe, hub_round_trip

CELL = """
import keras
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
"""


def _data(n=256):
    rng = np.random.default_rng(0)
    return {"x_train": rng.random((n, 784), dtype=np.float32), "y_train": rng.integers(0, 10, n)}


def test_calibrated_run_uses_and_shows_the_measured_cost_model():
    run = nbdist.train(CELL, namespace=_data(), mode="simulate", workers=2, epochs=1,
                       sim="calibrate=1", wait=True)
    events = run.events
    found = events[events.event == "sim_calibration"].iloc[0]
    used = events[events.event == "sim_cost"].iloc[0]
    assert found["where"] == "kernel"
    assert [p[0] for p in found["points"]] == [8, 32, 128]
    assert found["hub_round_trip_s"] > 0 and found["per_step_s"] >= found["hub_round_trip_s"]
    assert (used["per_step_s"] == found["per_step_s"]
            and used["per_sample_s"] == found["per_sample_s"])
    notes = [t for t in events.get("text", []) if isinstance(t, str) and "--sim calibrate" in t]
    assert notes and f"per_step={float(found['per_step_s'])!r}" in notes[0]
    # the virtual clock follows the fitted model: 256 samples / 2 workers at batch 32, no jitter
    steps_per_worker = 256 / 32 / 2
    end = run.history["time"].max()
    assert np.isclose(end, steps_per_worker * (found["per_step_s"] + 32 * found["per_sample_s"]),
                      rtol=1e-6)


def test_hub_round_trip_grows_with_the_parameter_count():
    small, large = hub_round_trip(1_000, trips=10), hub_round_trip(4_000_000, trips=10)
    assert 0 < small < large  # 16 MB each way against 4 kB: far beyond timing noise


def test_describe_gives_the_numbers_to_repeat_the_run_exactly():
    from nbdist.core.simclock import CostModel
    from nbdist.modes.simulate.calibrate import Calibration

    text = describe(Calibration(CostModel(0.0012, 3.4e-05), 0.0009, 3.4e-05, 0.0003, [],
                                "engine 0 (h)"))
    assert "engine 0 (h)" in text and "--sim per_step=0.0012,per_sample=3.4e-05" in text
