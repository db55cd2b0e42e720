"""--mode simulate with links (`--sim bandwidth=...,latency=...`) and `--compression`: each
push and pull takes the virtual time its bytes take, the hub applies a push when it arrives
(after its work on the pushes before, with `per_push`), an evaluation takes its forward pass,
and a codec trains as a TCP worker's does. (The link arithmetic: tests/unit/test_links.py.)"""

import numpy as np
import pytest

import nbdist
from nbdist.core.links import Link, ring_allgather_s, ring_allreduce_s
from tests.helpers import SYNTHETIC_CELL

STEP = 0.001 + 32 * 2e-5  # the default cost of a batch of 32, in virtual seconds
FLOATS = 8 * 16 + 16 + 16 * 3 + 3  # the synthetic cell's MLP
FRAME = 4 * FLOATS  # 780 bytes of float32
MBIT = 8 * FRAME / 0.008 / 1e6  # the rate at which a frame takes 8 ms: 0.78 Mbit/s


def simulate(**options):
    ns = {}
    options = {"workers": 4, "epochs": 1, "batch_size": 32, "no_validation": True, **options}
    run = nbdist.train(SYNTHETIC_CELL, namespace=ns, mode="simulate", wait=True, **options)
    assert run.status == "finished", run.error
    weights = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    return run, weights


def test_one_workers_steps_each_wait_for_a_pull_and_a_push_over_its_links():
    run, weights = simulate(workers=1, sim=f"bandwidth={MBIT},latency=1")
    # a pull (8 ms, then 1 ms on each of two links), a step, a push (as long): per push
    cycle = 0.010 + STEP + 0.010
    np.testing.assert_allclose(run.history["time"].iloc[:5], cycle * np.arange(1, 6), rtol=1e-9)
    node = run.nodes.iloc[0]
    assert node["bytes_sent"] == node["steps"] * FRAME  # float32 pushes, counted as TCP's
    assert node["compression_ratio"] == 1.0
    # a push and a pull of a frame per cycle, over virtual seconds (not the kernel's clock)
    assert node["bytes_per_s"] == pytest.approx(2 * FRAME / cycle, rel=0.1)
    # the links move time, not the order: one worker trains as it does without them
    _, without = simulate(workers=1)
    np.testing.assert_array_equal(weights, without)


def test_four_workers_pushes_queue_at_a_slow_hub_link():
    run, _ = simulate(sim=f"bandwidth.hub={MBIT}")  # the workers' links: no limit
    arrivals = run.history["time"].to_numpy()
    # each push holds the hub's downlink 8 ms: one arrives at most every 8 ms
    assert np.diff(arrivals).min() >= 0.008 * (1 - 1e-9)
    assert arrivals[-1] >= 0.008 * len(arrivals)
    fast, _ = simulate()
    assert arrivals[-1] > 3 * fast.history["time"].iloc[-1]  # the link sets the pace


def test_pushes_queue_at_the_hub_for_its_work_on_each():
    """--sim per_push: the hub works on one push at a time, so a hub slower than the workers
    sets the pace: after the first step, one push is applied every per_push seconds."""
    hub = 0.004  # longer than a step (STEP: 1.64 ms)
    run, weights = simulate(sim=f"per_push={hub}")
    times = run.history["time"].to_numpy()
    np.testing.assert_allclose(times, STEP + hub * np.arange(1, len(times) + 1), rtol=1e-9)
    # the workers wait for the hub: their link time is none, so it is all the hub's queue
    assert (run.nodes["comm_s"] > 0).all()
    # the workers start together and take turns either way: the queue moves time, not the order
    _, without = simulate()
    np.testing.assert_array_equal(weights, without)


def test_an_evaluation_takes_a_forward_pass_and_reaches_the_history_after_it():
    """A worker evaluates before its next step, for a call's fixed cost per batch and a third of
    a trained sample's cost per validation sample, and its result is recorded then (as a real
    worker's next message brings it)."""
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, namespace=ns, mode="simulate", wait=True, workers=1,
                       epochs=2, batch_size=32, sim="per_step=0.001,per_sample=0.0003")
    assert run.status == "finished", run.error
    evaluation = 0.001 + 0.0003 * len(ns["x_test"]) / 3  # one batch: a call and the forward pass
    history = run.history.sort_values("time", kind="stable")
    first_eval = history["val_accuracy"].notna().to_numpy().argmax()
    before, at, after = history["time"].iloc[first_eval - 1:first_eval + 2]
    assert at == pytest.approx(before + evaluation, rel=1e-9)  # the epoch's last push, then it
    assert after == pytest.approx(at + 0.001 + 32 * 0.0003, rel=1e-9)  # then the next step


def test_a_fit_calls_validation_in_the_kernel_holds_the_workers_at_the_gate_for_its_pass():
    """The cell's own fit call validates in the kernel at each epoch's end while the workers
    wait at the gate: the clock moves on by that evaluation before the next epoch's steps."""
    ns = {}
    cell = SYNTHETIC_CELL + ("model.fit(x_train, y_train, batch_size=32, epochs=2, "
                             "validation_data=(x_test, y_test), verbose=0)\n")
    run = nbdist.train(cell, namespace=ns, mode="simulate", wait=True, workers=1,
                       sim="per_step=0.001,per_sample=0.0003")
    assert run.status == "finished", run.error
    rows = len(ns["x_test"])  # in the call's batches of 32, as Keras's fit validates
    evaluation = -(-rows // 32) * 0.001 + 0.0003 * rows / 3
    history = run.history.sort_values("time", kind="stable")
    first_eval = history["val_accuracy"].notna().to_numpy().argmax()
    before, at, after = history["time"].iloc[first_eval - 1:first_eval + 2]
    assert at == pytest.approx(before + evaluation, rel=1e-9)
    assert after == pytest.approx(at + 0.001 + 32 * 0.0003, rel=1e-9)


def test_simulated_sync_waits_for_a_ring_allreduce_per_step():
    run, _ = simulate(sim="sync=1,bandwidth=1,latency=0.5")
    ring = ring_allreduce_s(FRAME, [Link(1e6, 5e-4)] * 4)  # 6 rounds of 195 bytes and 1 ms
    assert ring == pytest.approx(6 * (8 * 195 / 1e6 + 1e-3))
    times = run.history["time"].to_numpy()
    np.testing.assert_allclose(times[:8], [ring + STEP] * 4 + [2 * (ring + STEP)] * 4, rtol=1e-9)
    assert run.nodes["bytes_sent"].sum() == 0  # the allreduce bypasses the hub: the sweep models it


def test_simulated_sync_gathers_a_codecs_frames_and_learns():
    """--sim sync=1 with topk: each step waits for a ring allgather of the 4 workers' frames
    (49 indices and values each), and the error feedback keeps the run learning."""
    run, weights = simulate(sim="sync=1,bandwidth=1,latency=0.5", compression="topk:0.25",
                            epochs=2, no_validation=False, seed=1)
    ring = ring_allgather_s(8 * 49, [Link(1e6, 5e-4)] * 4)  # 3 rounds of 392 bytes and 1 ms
    assert ring == pytest.approx(3 * (8 * 392 / 1e6 + 1e-3))
    times = run.history["time"].dropna().to_numpy()
    np.testing.assert_allclose(times[:4], [ring + STEP] * 4, rtol=1e-9)
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.8
    _, plain = simulate(sim="sync=1", epochs=2, no_validation=False, seed=1)
    assert not np.array_equal(weights, plain)  # the frames, not the gradients, were averaged


def test_a_codec_trains_in_the_simulator_as_its_frames_say():
    run, weights = simulate(workers=2, epochs=2, compression="topk:0.25", no_validation=False,
                            seed=1)
    kept = int(np.ceil(0.25 * FLOATS))
    traffic = run.traffic.set_index("worker")
    assert set(traffic["compression"]) == {"topk:0.25"}
    nodes = run.nodes.set_index("worker")
    # every push a topk frame of 49 indices and values; the first pull the float32 weights
    assert (traffic["bytes_sent"] == nodes["steps"] * 8 * kept).all()
    assert traffic["compression_ratio"].between(0.5, 0.53).all()  # and full pulls to evaluate
    _, plain = simulate(workers=2, epochs=2, no_validation=False, seed=1)
    assert not np.array_equal(weights, plain)  # the codec acted ...
    final = run.history["val_accuracy"].dropna().iloc[-1]
    assert final > 0.8, final  # ... and the error feedback kept what it left out
    again, same = simulate(workers=2, epochs=2, compression="topk:0.25", no_validation=False,
                           seed=1)
    np.testing.assert_array_equal(weights, same)  # its random streams are the seed's


def test_powersgd_factors_each_kernel_in_the_simulator_as_a_tcp_worker_does():
    run, weights = simulate(workers=2, epochs=2, compression="powersgd:1", no_validation=False,
                            seed=1)
    traffic = run.traffic.set_index("worker")
    nodes = run.nodes.set_index("worker")
    # every push: each kernel as rank-1 factors, (8 + 16) and (16 + 3) floats, and the biases
    assert (traffic["bytes_sent"] == nodes["steps"] * 4 * (24 + 16 + 19 + 3)).all()
    final = run.history["val_accuracy"].dropna().iloc[-1]
    assert final > 0.8, final  # the error feedback sends the rest of each kernel later
    _, same = simulate(workers=2, epochs=2, compression="powersgd:1", no_validation=False, seed=1)
    np.testing.assert_array_equal(weights, same)  # its first Qs are the seed's
