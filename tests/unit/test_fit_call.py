"""A cell's own model.fit(...) call as the run's specification: binding, refusals, merging with
the magic's flags, Keras's validation_split and class_weight, per-epoch metric sums (pure)."""

import numpy as np
import pytest

from nbdist.core.epoch_metrics import EpochSums
from nbdist.engine.fit_call import FitCall
from nbdist.engine.fit_data import FitData, class_weights, split_last
from nbdist.errors import CellError, ConfigError
from nbdist.fit.plan import plan_fit, sync_batches


def test_positional_and_keyword_arguments_bind_as_keras_binds_them():
    call = FitCall.bind("m", ("X", "Y", 128, 15), {"validation_split": 0.1, "verbose": 2})
    assert (call.x, call.y, call.batch_size, call.epochs, call.validation_split, call.verbose) == (
        "X", "Y", 128, 15, 0.1, 2)
    assert call.given == {"x", "y", "batch_size", "epochs", "validation_split", "verbose"}
    assert call.shuffle is True and call.initial_epoch == 0 and call.batch == 128
    assert FitCall.bind("m", ("X", "Y"), {}).batch == 32  # Keras's default


def test_a_call_keras_would_reject_is_refused_naming_the_argument():
    with pytest.raises(CellError, match=r"has no argument epoch .*Keras's fit takes: x, y"):
        FitCall.bind("m", ("X",), {"epoch": 3})
    with pytest.raises(CellError, match="got y twice"):
        FitCall.bind("m", ("X", "Y"), {"y": "Y"})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epochs": 2, "initial_epoch": 2}, r"initial_epoch=2, epochs=2\) trains no epoch"),
    ({"validation_split": 1.5}, r"validation_split=\.\.\.\) must be a fraction in \[0, 1\)"),
    ({"shuffle": "batch"}, r"shuffle='batch'\) is not supported"),
    ({"class_weight": {0: 1.0}, "sample_weight": np.ones(3)},
     "both class_weight and sample_weight"),
    ({"class_weight": [1.0, 2.0]}, "must be a dict from class index to weight"),
    ({"steps_per_epoch": 0}, r"steps_per_epoch=\.\.\.\) must be a whole number >= 1"),
    ({"batch_size": -1}, r"batch_size=\.\.\.\) must be a whole number >= 1"),
    ({"validation_freq": 0.5}, "validation_freq"),
])
def test_arguments_nbdist_cannot_honour_are_refused_before_anything_trains(kwargs, message):
    with pytest.raises(CellError, match=message):
        FitCall.bind("m", ("X", "Y"), kwargs).check()


def test_validation_freq_selects_epochs_as_keras_does():
    every_two = FitCall.bind("m", (), {"validation_freq": 2})
    assert [every_two.should_validate(e) for e in range(4)] == [False, True, False, True]
    listed = FitCall.bind("m", (), {"validation_freq": [1, 3]})
    assert [listed.should_validate(e) for e in range(4)] == [True, False, True, False]


def test_flags_override_the_call_and_the_notes_say_which_value_won():
    call = FitCall.bind("m", ("X", "Y"), {"epochs": 15, "batch_size": 128})
    spec, options, notes = plan_fit(call, FitData(("x", "y"), ()), {"batch_size": 64}, "async")
    assert options == {"epochs": 15, "batch_size": 64} and spec.batch == 64 and not spec.split_batch
    assert notes == ["--batch-size 64 on the magic line overrides model.fit(batch_size=128)."]
    spec, options, notes = plan_fit(call, FitData(("x", "y"), ()), {}, "sync")
    assert options == {"epochs": 15, "batch_size": 128} and spec.split_batch and notes == []
    # --sim sync=1 simulates sync: its virtual ranks share the batch too; plain simulate does not
    assert plan_fit(call, FitData(("x", "y"), ()), {}, "simulate", sim_sync=True)[0].split_batch
    assert not plan_fit(call, FitData(("x", "y"), ()), {}, "simulate")[0].split_batch


def test_initial_epoch_counts_from_the_calls_epoch_and_steps_per_epoch_sets_the_epoch_size():
    call = FitCall.bind("m", ("X", "Y"), {"epochs": 5, "initial_epoch": 2, "steps_per_epoch": 10,
                                          "batch_size": 16})
    spec, options, _ = plan_fit(call, FitData(("x", "y"), ()), {}, "local")
    assert (spec.passes, options["epochs"], spec.epoch_size) == (3, 3, 160)
    with pytest.raises(ConfigError,
                       match=r"--epochs 2 trains no epoch after model.fit\(initial_epoch=2\)"):
        plan_fit(call, FitData(("x", "y"), ()), {"epochs": 2}, "local")


def test_sync_ranks_share_the_calls_batch_and_say_when_they_cannot_exactly():
    assert sync_batches(128, 2) == (64, None)
    each, warning = sync_batches(100, 3)
    assert each == 33 and "each step trains on 99 samples, not 100" in warning


def test_validation_split_is_the_last_fraction_before_shuffling_nested_included():
    x = {"a": np.arange(10), "b": np.arange(10) * 2}
    (xt, yt, wt), (xv, yv, wv) = split_last(0.2, x, np.arange(10), None)
    assert xt["a"].tolist() == list(range(8)) and xv["b"].tolist() == [16, 18]
    assert yv.tolist() == [8, 9] and wt is None and wv is None
    with pytest.raises(CellError, match="leaves no training or no validation sample out of 3"):
        split_last(0.9, np.arange(3))


def test_class_weights_become_sample_weights_as_keras_computes_them():
    assert class_weights(np.array([0, 1, 2, 1]), {1: 4.0, 2: 0.5}).tolist() == [1.0, 4.0, 0.5, 4.0]
    one_hot = np.eye(3, dtype=np.float32)[[2, 0, 1]]
    assert class_weights(one_hot, {2: 3.0}).tolist() == [3.0, 1.0, 1.0]
    assert class_weights(np.array([[1.0], [0.0]]), {1: 2.0}).tolist() == [2.0, 1.0]  # (n, 1) labels


def test_epoch_sums_add_each_pushs_increments_to_its_epoch():
    sums = EpochSums()
    sums.add({"0": [2.0, 4.0]})
    sums.add({"0": [1.0, 4.0], "1": [0.5, 1.0]})
    assert sums.to_wire() == {"0": [3.0, 8.0], "1": [0.5, 1.0]}
    with pytest.raises(ValueError, match="3 floats for epoch 0, which has 2"):
        sums.add({"0": [1.0, 1.0, 1.0]})


def test_an_epoch_ends_for_sync_once_every_rank_has_finished_it():
    sums = EpochSums()
    ranks = {0, 1}
    # the same rank twice
    assert not sums.rank_ended(0, 1, ranks) and not sums.rank_ended(0, 1, ranks)
    assert sums.rank_ended(0, 0, {0, 1})
