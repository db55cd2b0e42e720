"""--seed sets the data order of --mode local and --mode simulate: the same seed gives the same
order, another seed another one (docs/guide.md, "Local mode: one worker in this kernel")."""

import nbdist
from tests.helpers import SEEDED_SYNTHETIC_CELL, assert_seed_sets_order


def test_seed_sets_the_data_order_of_local_mode():
    assert_seed_sets_order(lambda seed: nbdist.train(
        SEEDED_SYNTHETIC_CELL, namespace={}, mode="local", epochs=1, batch_size=64, seed=seed,
        wait=True))


def test_seed_sets_the_data_order_of_simulate_mode():
    """(simulate's --seed also seeds the cell; this cell seeds Keras again itself, so only the
    data order is left to differ)"""
    assert_seed_sets_order(lambda seed: nbdist.train(
        SEEDED_SYNTHETIC_CELL, namespace={}, mode="simulate", workers=2, epochs=1, batch_size=64,
        seed=seed, wait=True))
