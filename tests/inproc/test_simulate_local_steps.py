"""--mode simulate with --local-steps and DiLoCo: each virtual worker steps with its own NumPy
copy of the cell's optimizer and pushes the change, as a real worker does with Keras's."""

import numpy as np

import nbdist
from tests.helpers import SYNTHETIC_CELL

ADAM_CELL = SYNTHETIC_CELL.replace("keras.optimizers.SGD(0.1)", "keras.optimizers.Adam(0.01)")


def simulate(cell=ADAM_CELL, **options):
    ns = {}
    options = {"workers": 1, "epochs": 2, "batch_size": 32, "seed": 2, **options}
    run = nbdist.train(cell, namespace=ns, mode="simulate", wait=True, **options)
    assert run.status == "finished", run.error
    weights = np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables])
    return run, weights


def test_one_worker_with_local_steps_trains_as_one_without_them():
    """One worker: a round of 5 Adam steps on its copy, then the hub adds the change at rate 1
    (--server-optimizer sgd, the default): the same weights as the hub's own Adam step per
    gradient, up to float32 rounding of the subtraction."""
    _, plain = simulate()
    run, rounds = simulate(local_steps=5)
    np.testing.assert_allclose(rounds, plain, rtol=0, atol=2e-5)
    assert np.abs(plain).max() > 0.1
    assert run.nodes["samples"].sum() == 2 * 900  # every sample once per epoch
    assert run.nodes["steps"].sum() == len(run.history.dropna(subset=["loss"]))
    assert run.nodes["steps"].iloc[0] == 2 * 6  # 29 batches an epoch: 6 rounds (the last of 4)


def test_diloco_trains_four_virtual_workers_in_rounds_at_one_outer_step_each():
    run, _ = simulate(workers=4, algorithm="diloco", local_steps=4, epochs=3)
    assert run.nodes["samples"].sum() == 3 * 900
    pushes = run.history.dropna(subset=["loss"])
    # 85 batches: five rounds of 4 x 4 local steps, whose 4 pushes the group barrier applies
    # together (at one virtual time), then what is left of the data
    rounds = pushes.groupby("time")["worker"].nunique()
    assert rounds.iloc[:5].tolist() == [4] * 5 and rounds.iloc[5:].sum() == 2
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.8
    said = " ".join(run.warnings)
    assert "nesterov" in said.lower() or "diloco" in said.lower(), run.warnings


def test_async_local_sgd_applies_each_round_as_it_lands_and_trains_as_well():
    """Four virtual workers, one of them twice as slow: no barrier (the fast ones train more
    rounds instead of waiting for it, so more samples), every sample once per epoch, and the
    delayed Nesterov reaches diloco's mark."""
    run, _ = simulate(workers=4, algorithm="async-local-sgd", local_steps=4, epochs=3,
                      slowdown=[1, 1, 1, 2])
    samples = run.nodes.set_index("worker")["samples"]
    assert samples.sum() == 3 * 900
    assert samples[3] < 0.75 * samples[0], samples
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.8
    assert any("delayed Nesterov" in w for w in run.warnings), run.warnings
