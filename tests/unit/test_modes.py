"""Modes as packages: the MODES table (the Backend protocol: test_layering.py), one error for a
non-finite step, one float64->float32 conversion, and no private names imported across nbdist's
modules."""

import ast
import pathlib

import numpy as np
import pytest

from nbdist.config import Mode
from nbdist.errors import NoClusterError, TrainingError

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nbdist"


def test_every_mode_has_one_table_entry_with_a_start():
    from nbdist.fit.launch import start_function
    from nbdist.modes import MODES

    assert set(MODES) == {m.value for m in Mode}
    for mode in MODES:
        start = start_function(mode)
        assert start.__name__ == "start" and start.__module__ == MODES[mode].module


# a value away from its default for each option some mode does not take
GIVEN = dict(algorithm="hogwild", workers=2, servers=2, transport="tcp", compression="fp16",
             timeout=60.0, algo_options="lambda0=1", staleness_lr=True, predict_weights=False,
             momentum_correction=False, precise_bn=False, average_tail=0.2,
             staleness=2, n=2, groups=2, local_steps=2, server_optimizer="adam", overlap=True,
             pin="auto", spin="off", dbs=True, batch_min=8, batch_max=64, slowdown="1,2",
             metrics="minimal", pause_at=3, elastic=True, checkpoint_dir="ckpt",
             checkpoint_every=30.0, sim="per_step=0.01", sync_batchnorm=True, collective="torch",
             stages=3, micro_batches=2, partition="greedy", schedule="1f1b")


def test_every_option_is_taken_by_every_mode_or_named_in_the_specs_that_take_it():
    import dataclasses

    from nbdist.config import TrainConfig
    from nbdist.modes import EVERY_MODE, MODES

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    named = set().union(*(spec.takes for spec in MODES.values()))
    assert fields == EVERY_MODE | named and not EVERY_MODE & named
    assert set(GIVEN) == named  # the refusal test below covers each of them


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_each_option_a_mode_does_not_take_is_refused_naming_the_mode_the_flag_and_the_fix(mode):
    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError
    from nbdist.modes import MODES, modes_taking

    base = {"workers": 2} if mode == "simulate" else {}
    for option, value in GIVEN.items():
        if option in MODES[mode].takes:
            continue
        flag = "--algo-opt" if option == "algo_options" else "--" + option.replace("_", "-")
        if option in ("predict_weights", "momentum_correction", "precise_bn"):  # False: --no-
            flag = "--no-" + option.replace("_", "-")
        works = ", ".join(modes_taking(option))
        with pytest.raises(ConfigError) as refused:
            TrainConfig(mode=mode, **{**base, option: value})
        assert str(refused.value).startswith(f"{flag} does not apply to --mode {mode}, which ")
        assert f"{flag} works with --mode {works}. Drop the flag, or pick one of those modes." in \
            str(refused.value)


def test_checkpoints_are_refused_in_simulate_mode_instead_of_failing_into_the_warnings():
    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--checkpoint-dir does not apply to --mode simulate, "
                       r".*\(Received: --checkpoint-dir ckpt\)\. --checkpoint-dir works with "
                       r"--mode async, local, sync\. Drop the flag, or pick one of those modes\.$"):
        TrainConfig(mode="simulate", workers=2, checkpoint_dir="ckpt")


def test_staleness_lr_is_refused_in_sync_mode_which_has_no_delays_to_divide_by():
    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--staleness-lr does not apply to --mode sync, which "
                       r"averages gradients with an allreduce.*works with --mode async, "
                       r"local, simulate\."):
        TrainConfig(mode="sync", staleness_lr=True)
    assert TrainConfig(mode="async", staleness_lr=True).staleness_lr


def test_the_flags_help_and_resume_read_their_modes_from_the_specs():
    from nbdist.flags import MAGIC_FLAGS, config_flags
    from nbdist.modes import MODES, modes_taking

    for flag in config_flags():
        assert flag.modes == modes_taking(flag.name), flag.name
    resume = next(flag for flag in MAGIC_FLAGS if flag.name == "resume")
    assert resume.modes == tuple(m for m, spec in MODES.items() if spec.checkpoints)
    assert resume.modes == ("async", "local", "sync")


def test_every_mode_trains_on_every_backend_and_a_spec_declaring_fewer_is_refused(monkeypatch):
    from dataclasses import replace

    from nbdist.engine.keras_backend import check_mode
    from nbdist.errors import BackendError
    from nbdist.modes import MODES

    for mode in MODES:
        for backend in ("tensorflow", "jax", "torch"):
            check_mode(mode, backend)
    narrow = replace(MODES["pipeline"], backends=("tensorflow",),
                     backends_why="cuts the model into TensorFlow stages")
    monkeypatch.setitem(MODES, "pipeline", narrow)
    with pytest.raises(BackendError, match=r"^--mode pipeline cuts the model into TensorFlow "
                       r"stages, so it trains only on Keras's TensorFlow backend \(Received: "
                       r"this kernel's Keras backend is jax\)\. Train bulk-synchronously"):
        check_mode("pipeline", "jax")


def test_who_owns_the_learning_rate_comes_from_the_mode_then_the_rule_and_local_steps():
    from nbdist.config import TrainConfig

    owners = {mode: TrainConfig(mode=mode, workers=None if mode in ("pipeline",) else 1).lr_owner
              for mode in ("async", "local", "sync", "simulate", "pipeline")}
    assert owners == {"async": "hub", "local": "hub", "sync": "workers", "simulate": "hub",
                      "pipeline": "workers"}
    assert TrainConfig(local_steps=2).lr_owner == "workers"
    assert TrainConfig(algorithm="easgd").lr_owner == "workers"


def test_a_mode_without_checkpoints_refuses_run_checkpoint_from_its_spec():
    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError
    from nbdist.run.handle import Run

    run = Run(TrainConfig(mode="simulate", workers=2), model=None, model_name="model")
    with pytest.raises(ConfigError, match=r"^run.checkpoint\('ckpt'\) does not apply to --mode "
                       r"simulate, .*It works with --mode async, local, sync"):
        run.checkpoint("ckpt")


def test_a_mode_that_needs_a_cluster_is_refused_before_the_cell_runs():
    import nbdist

    cell = "raise RuntimeError('the cell ran')"
    for mode in ("async", "sync"):
        with pytest.raises(NoClusterError, match="No cluster to train on"):
            nbdist.train(cell, mode=mode)
    # --mode local needs none, so its cell runs (with Keras): tests/inproc/test_local_mode.py


def test_backends_that_cannot_grow_refuse_new_workers_saying_why():
    from nbdist.errors import ConfigError
    from nbdist.modes.local.backend import LocalBackend

    with pytest.raises(ConfigError,
                       match=r"--mode local.*Received: run.add_workers\(\[3\]\).*--mode async"):
        LocalBackend({}).add_workers([3], announce=None)
    assert LocalBackend({}).joined_engines() == []


def test_a_non_finite_step_has_one_message_naming_where_and_how_to_fix():
    from nbdist.engine.evaluate import check_finite

    check_finite(0.5, 2.0, step=1, where="worker 0", epoch=0)  # finite: nothing
    with pytest.raises(TrainingError) as caught:
        check_finite(float("nan"), 2.0, step=7, where="rank 1 (engine 4)", epoch=2)
    assert str(caught.value) == ("The loss became nan at step 7 on rank 1 (engine 4) (epoch 2). "
                                 "Lower the learning rate (--lr), check the data for NaN/inf, or "
                                 "normalise the inputs.")
    with pytest.raises(TrainingError,
                       match=r"^The gradient norm became inf at step 3 on worker 2 \(epoch 0\)"):
        check_finite(1.0, float("inf"), step=3, where="worker 2", epoch=0)


def test_float64_inputs_become_float32_once_and_other_dtypes_stay():
    from nbdist.engine.data import as_float32

    x = np.array([[0.1, 2.5]], dtype=np.float64)
    assert as_float32(x).dtype == np.float32 and as_float32(x).tolist() == [[np.float32(0.1), 2.5]]
    for kept in (np.array([1, 2], dtype=np.int64), np.array([1.0], dtype=np.float16)):
        assert as_float32(kept) is kept


def test_no_private_name_is_imported_across_nbdist_modules():
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("nbdist")):
                found += [f"{path.relative_to(ROOT.parent)}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert found == []


def test_the_mode_packages_and_the_job_do_not_import_upwards():
    """One pass from cell to job: nothing below `nbdist.api` calls back up into it, and the job
    (made before any mode is chosen) imports no mode."""

    def imported(path):
        return {n.module for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom)}

    upward = {str(p.relative_to(ROOT.parent)) for p in (ROOT / "modes").rglob("*.py")
              if imported(p) & {"nbdist.api", "nbdist"}}
    assert upward == set()
    assert not any(m and m.startswith(("nbdist.modes", "nbdist.api"))
                   for m in imported(ROOT / "job.py"))


def test_a_sync_rank_is_never_written_off_for_silence_but_an_async_worker_is():
    """Sync ranks are silent together while rank 0 evaluates (the others wait in the
    allreduce); the hub wrote both off after 30 s of that and the run failed with
    WorkersLostError. No other rank can take over a sync rank's data anyway; a rank that really
    hangs or dies fails the collective (Horovod) or its engine (ipyparallel)."""
    from types import SimpleNamespace

    from nbdist.config import TrainConfig
    from nbdist.core.coordinator import Coordinator
    from nbdist.core.liveness import LOST_FIRST_S
    from nbdist.job import coordinator_plan

    contents = SimpleNamespace(num_samples=100, validation=None)
    for mode, lost in (("sync", []), ("async", [0, 1])):
        plan, _, _ = coordinator_plan(TrainConfig(mode=mode, workers=2), contents, 0.1,
                                      num_workers=2)
        coordinator = Coordinator(plan)
        for worker in (0, 1):
            coordinator.heard(worker, 0.0)
        assert coordinator.overdue(LOST_FIRST_S + 1.0) == lost, mode
