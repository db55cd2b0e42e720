"""--mode pipeline on a real ipyparallel cluster: each stage on its own engine, activations and
gradients over signed ZeroMQ between engines.

- exactness: no dropout, same data order -> the weights of single-machine training at the
  same mini-batch to 1e-5 after 20 steps, for GPipe and 1F1B, S = 2 and 3;
- the user surface: %%distribute --mode pipeline with its flags, validation per epoch,
  run.profile, run.partition, run.pipeline and the report;
- a stage's engine killed mid-run, with a free engine in the cluster: the stages start again
  from the latest epoch end's weights and the run finishes as undisturbed; with none free, the
  run fails within 60 s naming the stage, the engine and what was missing, and the other
  engines take the next run.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import nbdist
from nbdist.errors import ConfigError, TrainingError
from tests.helpers import PIPELINE_OPERATORS_CELL, PIPELINE_SKIP_CELL, wait_for

# A functional model whose skip connection (d1 into the Add) crosses a cut at S = 3.
CELL = "B = 16\n" + PIPELINE_SKIP_CELL  # 320 samples


def _single_machine(cell: str, batch: int) -> list:
    from nbdist.core.schedule import epoch_permutation

    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    perm = epoch_permutation(len(x), 0, 0)
    for start in range(0, len(x), batch):
        model.train_on_batch(x[perm[start:start + batch]], y[perm[start:start + batch]])
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize(("stages", "schedule"),
                         [(2, "gpipe"), (2, "1f1b"), (3, "gpipe"), (3, "1f1b")])
def test_pipeline_weights_equal_single_machine_training_after_20_steps(cluster, stages, schedule):
    want = _single_machine(CELL, 16)  # 320 samples / 16 = 20 steps
    ns: dict = {}
    run = nbdist.train(CELL, cluster=cluster, namespace=ns, mode="pipeline", stages=stages,
                       micro_batches=4, batch_size=16, schedule=schedule, partition="uniform")
    run.wait(timeout=240)
    assert run.status == "finished"
    got = [w.numpy() for w in ns["model"].weights]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(got, _initial(CELL), strict=True))
    assert moved > 1e-2  # it trained
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert run.history["step"].max() == 20
    engines = run.state.backend.engines
    assert len(set(engines)) == stages  # one engine per stage
    # every engine is on this host: activations and gradients went through shared memory
    assert all(m["shm"] > 0 and m["tcp"] == 0 for m in run.pipeline["messages"])


def test_a_residual_cnn_written_with_operators_trains_on_stages_as_on_one_machine(cluster):
    """`c1 + c2 * 0.5` and `h * 2.0 + 1.0`: operations without weights, placed in stages like
    layers. The kernel wrote the stages' weights back into its model by each step's
    operation, and failed on them: "'Multiply' object has no attribute 'weights'"."""
    cell = "B = 16\n" + PIPELINE_OPERATORS_CELL
    want = _single_machine(cell, 16)
    ns: dict = {}
    run = nbdist.train(cell, cluster=cluster, namespace=ns, mode="pipeline", stages=2,
                       micro_batches=2, batch_size=16, partition="uniform")
    run.wait(timeout=240)
    assert run.status == "finished", run.error
    for a, b in zip([w.numpy() for w in ns["model"].weights], want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _initial(cell: str) -> list:
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102
    return [w.numpy() for w in ns["model"].weights]


def test_the_magic_trains_with_validation_and_shows_profile_partition_and_timeline(ip, cluster,
                                                                                   tmp_path):
    from tests.helpers import SYNTHETIC_CELL

    magics = ip.magics_manager.registry["NbdistMagics"]
    magics.cluster = cluster
    ip.run_cell_magic("distribute", "--mode pipeline --stages 2 --micro-batches 4 --batch-size 32 "
                      "--partition greedy --schedule 1f1b --epochs 3 --no-dashboard --wait",
                      SYNTHETIC_CELL)
    run = ip.user_ns["_nbdist_run"]
    assert run.status == "finished" and run.error is None
    history = run.history
    assert (len(history["val_accuracy"].dropna()) == 3
            and history["val_accuracy"].dropna().iloc[-1] > 0.8)
    assert len(history["accuracy"].dropna()) == 3  # training accuracy per epoch
    acc = ip.user_ns["model"].evaluate(ip.user_ns["x_test"], ip.user_ns["y_test"], verbose=0)[1]
    assert acc == pytest.approx(history["val_accuracy"].dropna().iloc[-1], abs=1e-6)
    assert list(run.profile["layer"]) == [layer.name for layer in ip.user_ns["model"].layers]
    assert (run.profile["forward_s"] > 0).all() and (run.profile["backward_s"] > 0).all()
    part = run.partition
    assert list(part["stage"]) == [0, 1] and part["measured_s"].notna().all()
    assert part["params"].sum() == ip.user_ns["model"].count_params()
    summary = run.pipeline
    assert summary["ideal_bubble"] == pytest.approx(1 / 5) and 0 < summary["bubble"] < 1
    report = run.report(str(tmp_path / "r.html"))
    assert "pipeline timeline" in report.read_text()


def test_clear_errors_before_any_engine_is_used(cluster):
    with pytest.raises(ConfigError,
                       match=r"--stages 5 needs 5 engines, one per stage, but the cluster has 3"):
        nbdist.train(CELL, cluster=cluster, namespace={}, mode="pipeline", stages=5,
                     micro_batches=2, batch_size=16)
    with pytest.raises(ConfigError, match="does not split into --micro-batches 5"):
        nbdist.train(CELL, cluster=cluster, namespace={}, mode="pipeline", micro_batches=5,
                     batch_size=16)
    shared = CELL.replace('s = keras.layers.Add(name="add")([d1, d2])',
                          'tied = keras.layers.Dense(16, name="tied")\n'
                          's = tied(keras.layers.Add(name="add")([d1, tied(d2)]))')
    with pytest.raises(ConfigError, match=r"The layer 'tied' is called in stage 0 and in stage 1"):
        nbdist.train(shared, cluster=cluster, namespace={}, mode="pipeline", stages=2,
                     micro_batches=2, batch_size=16, partition="uniform")


@pytest.fixture(scope="module")
def own_cluster():
    """Three engines of our own, one of which the test kills."""
    from nbdist.cluster.engines import Cluster

    handle = Cluster.start(3)
    handle.pids = dict(zip(handle.engine_ids, handle.client[:].apply_sync(os.getpid), strict=True))
    yield handle
    handle.stop()


def test_a_killed_stage_engine_fails_the_run_and_the_others_take_the_next_run(own_cluster):
    long_cell = "B = 200\n" + PIPELINE_SKIP_CELL  # 4000 samples
    run = nbdist.train(long_cell, cluster=own_cluster, namespace={}, mode="pipeline", stages=3,
                       micro_batches=2, batch_size=8, epochs=50, partition="uniform")
    wait_for(lambda: run.state.snapshot.get("global_step", 0) > 10)
    victim = run.state.backend.engines[1]
    os.kill(own_cluster.pids[victim], signal.SIGKILL)
    with pytest.raises(TrainingError, match=rf"Pipeline stage 1 \(on engine {victim}\) died.* "
                                            r"It could not start again: 1 lost stage\(s\) need a "
                                            r"free engine each and the cluster has 0 that "
                                            r"answer"):
        run.wait(timeout=120)
    assert run.status == "failed"
    survivors = [e for e in own_cluster.engine_ids if e != victim]
    assert own_cluster.client[survivors].apply_sync(os.getpid)  # they answer at once
    ns: dict = {}
    again = nbdist.train(CELL, cluster=own_cluster.subset(survivors), namespace=ns,
                         mode="pipeline", stages=2, micro_batches=2, batch_size=16)
    again.wait(timeout=240)
    assert again.status == "finished" and again.history["step"].max() == 20


# SYNTHETIC_CELL on 6,000 samples (an epoch of 1-2 s on stages), with its fit call; the
# kernel's callback kills stage 1's engine (VICTIM) 0.3 s into the third epoch
RESTART_CELL = """
import keras
from nbdist.datasets import make_synthetic
keras.utils.set_random_seed(3)
(x_train, y_train), (x_test, y_test) = make_synthetic(n=6000, shape=(8,), classes=3, seed=1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
class Kill(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and KILL:
            import os, signal, threading
            threading.Timer(0.3, os.kill, (VICTIM, signal.SIGKILL)).start()
history = model.fit(x_train, y_train, epochs=5, batch_size=32, callbacks=[Kill()])
"""


def test_a_killed_stage_engine_is_replaced_by_a_free_one_and_the_run_finishes_as_undisturbed(
        cluster):
    """Stage 1's engine killed during the third epoch of a fit call, a free engine in the
    cluster: every stage starts again from the weights of the second epoch's end, stage 1 on
    the free engine, and the fit call finishes its five epochs; with plain SGD (no optimizer
    slots to lose) and the same data order, as the undisturbed run does."""
    import contextlib
    import io

    from nbdist.cluster.engines import Cluster

    options = dict(mode="pipeline", stages=2, micro_batches=2, partition="uniform")
    undisturbed = {"KILL": False, "VICTIM": 0}
    with contextlib.redirect_stdout(io.StringIO()):
        nbdist.train(RESTART_CELL, namespace=undisturbed, cluster=cluster, **options)
    own = Cluster.start(3)  # killed into: never the shared session cluster
    try:
        stage1 = list(own.engine_ids)[1]  # the stages take the first engines, in order
        victim = own.client[stage1].apply_sync(os.getpid)
        ns = {"KILL": True, "VICTIM": victim}
        with contextlib.redirect_stdout(io.StringIO()):
            run = nbdist.train(RESTART_CELL, namespace=ns, cluster=own, **options)
        assert run.status == "finished", run.error
        assert not os.path.exists(f"/proc/{victim}/status") or not _running(victim)
        row = run.events[run.events["event"] == "stages_restarted"].iloc[0]
        spare = [e for e in own.engine_ids if e not in (list(own.engine_ids)[0], stage1)]
        assert (row["lost_stages"], row["engines"], row["new_engines"], row["epoch"]) == (
            [1], [stage1], spare, 2)
        assert any("every stage started again from the weights at the end of epoch 2" in w
                   for w in run.warnings), run.warnings
        assert len(ns["history"].history["loss"]) == 5
        x, y = ns["x_test"], ns["y_test"]
        acc = ns["model"].evaluate(x, y, verbose=0)[1]
        acc_straight = undisturbed["model"].evaluate(x, y, verbose=0)[1]
        gap = max(float(np.abs(a.numpy() - b.numpy()).max())
                  for a, b in zip(ns["model"].weights, undisturbed["model"].weights, strict=True))
        assert abs(acc - acc_straight) <= 0.01 and gap < 1e-3, (acc, acc_straight, gap)
        print(f"stage 1 restarted on engine {spare[0]} after {row['recovery_s']:.1f} s; accuracy "
              f"{acc:.4f} (undisturbed {acc_straight:.4f}), largest weight gap {gap:.2e}")
    finally:
        own.stop()


def _running(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        return "zombie" not in status.read()


def model_parallel_cell() -> str:
    """The training cell of notebooks/05-model-parallel.ipynb, without its magic line (the
    notebook's own cell, not a copy; it reads SAMPLES from the namespace)."""
    import json
    from pathlib import Path

    notebook = Path(__file__).parents[2] / "notebooks" / "05-model-parallel.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells
                 if "".join(c["source"]).startswith("%%distribute --mode pipeline")]
    return source.split("\n", 1)[1]


def test_a_stage_does_not_wait_to_ack_a_neighbour_that_has_finished(cluster):
    """The micro-batch sweep of notebooks/05-model-parallel.ipynb, 8 micro-batches: the last
    stage sends its last gradient through shared memory and ends; the first stage's ack of that
    slot finds no one to take it. It is dropped (only the sender could reuse the slot): before,
    the first stage waited for room past --timeout, in three runs of four here."""
    for _ in range(3):
        run = nbdist.train(model_parallel_cell(), cluster=cluster,
                           namespace={"SAMPLES": 2000, "EPOCHS": 1}, mode="pipeline", stages=2,
                           micro_batches=8, epochs=1, batch_size=64, no_validation=True,
                           timeout=60, wait=True)
        assert run.status == "finished", run.error
