"""A learning-rate schedule in the cell's Keras optimizer: --lr is refused over it, set_lr
replaces it once (real Keras optimizers, no engines)."""

import pytest

from nbdist.errors import ConfigError


def test_lr_with_a_schedule_is_refused_naming_both():
    import keras

    from nbdist.engine.learning_rate import check_lr

    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9))
    with pytest.raises(ConfigError,
                       match=r"--lr 0.01 replaces a constant .*Adam.*ExponentialDecay. "
                             r"Drop --lr, or change the schedule in the cell"):
        check_lr(0.01, optimizer)
    check_lr(None, optimizer)  # no --lr: the schedule runs
    check_lr(0.01, keras.optimizers.Adam(1e-3))  # a constant rate: --lr replaces it


def test_set_constant_lr_replaces_a_schedule_once_and_assigns_a_constant():
    import keras

    from nbdist.engine.learning_rate import schedule_name, set_constant_lr

    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(1e-3, 100))
    assert set_constant_lr(optimizer, 5e-4) == "CosineDecay"
    assert schedule_name(optimizer) is None
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(5e-4)
    assert set_constant_lr(optimizer, 2e-4) is None
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(2e-4)
