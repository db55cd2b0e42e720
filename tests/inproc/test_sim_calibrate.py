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
    # the round trip is split: the hub's work per push, and the worker's side in per_step
    assert 0 < found["per_push_s"] <= found["hub_round_trip_s"]
    assert found["per_step_s"] + found["per_push_s"] >= 0.9 * found["hub_round_trip_s"]
    assert (used["per_step_s"] == found["per_step_s"]
            and used["per_sample_s"] == found["per_sample_s"]
            and used["per_push_s"] == found["per_push_s"])
    notes = [t for t in events.get("text", []) if isinstance(t, str) and "--sim calibrate" in t]
    assert notes and (f"per_step={float(found['per_step_s'])!r}" in notes[0]
                      and f"per_push={float(found['per_push_s'])!r}" in notes[0])
    # the virtual clock follows the fitted model: 256 samples / 2 workers at batch 32, no jitter;
    # the two workers' pushes queue at the hub (per_push each, one at a time) only at the first
    # step, when both push at once: after it they are per_push apart
    steps_per_worker = 256 / 32 / 2
    step = found["per_step_s"] + 32 * found["per_sample_s"] + found["per_push_s"]
    end = run.history["time"].max()
    assert np.isclose(end, steps_per_worker * step + found["per_push_s"], rtol=1e-6)


def test_hub_round_trip_grows_with_the_parameter_count():
    small, large = hub_round_trip(1_000, trips=10), hub_round_trip(4_000_000, trips=10)
    assert 0 < small < large  # 16 MB each way against 4 kB: far beyond timing noise


def test_describe_gives_the_numbers_to_repeat_the_run_exactly():
    from nbdist.core.simclock import CostModel
    from nbdist.modes.simulate.calibrate import Calibration

    text = describe(Calibration(CostModel(0.0012, 3.4e-05), 0.0009, 3.4e-05, 0.0004, 0.0001,
                                [], "engine 0 (h)"))
    assert "engine 0 (h)" in text
    assert "--sim per_step=0.0012,per_sample=3.4e-05,per_push=0.0001" in text
