"""Large updates split into blocks on threads (`nbdist.hub.threads.BlockPool`) give exactly
the single-threaded numbers; a block that fails raises in the caller."""

import numpy as np
import pytest

from nbdist.algorithms import optimizers
from nbdist.algorithms.blocks import MIN_SPLIT, run_serial
from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.core.coordinator import Plan
from nbdist.core.updater import make_updater
from nbdist.hub.threads import BlockPool

SIZE = MIN_SPLIT + 12345  # large enough to split, with a ragged last block


def _spec(name: str, **config) -> dict:
    spec = server_optimizer_spec("sgd", 0.05, [SIZE // 3, SIZE - SIZE // 3])
    spec.update(class_name=name, config=config)
    return spec


SPECS = {
    "plain sgd": server_optimizer_spec("sgd", 0.05, [SIZE]),
    "momentum nesterov": _spec("SGD", momentum=0.9, nesterov=True),
    "adam": _spec("Adam"),
    "adam amsgrad clipvalue": _spec("Adam", amsgrad=True, clipvalue=0.5),
    "adamw": _spec("AdamW", weight_decay=0.01),
    "rmsprop centered momentum": _spec("RMSprop", centered=True, momentum=0.5),
    "adagrad clipnorm": _spec("Adagrad", clipnorm=1.0),
    "adamax": _spec("Adamax"),
    "nadam": _spec("Nadam", global_clipnorm=1.0),
}


@pytest.mark.parametrize("algorithm", ["asgd", "hogwild"])
@pytest.mark.parametrize("name", list(SPECS))
def test_a_split_update_on_threads_equals_the_single_pass_bit_for_bit(name, algorithm, monkeypatch):
    """Threads x cache blocks (with the reply copied out of each block while in cache), and
    cache blocks alone, against one pass of each formula over the whole shard."""
    plan = Plan(num_workers=2, num_samples=1000, epochs=1, batch_size=10, lr=0.05,
                has_validation=False, algorithm=algorithm)
    cached = make_updater(plan, {}, SPECS[name], SIZE)  # cache blocks, one thread
    monkeypatch.setattr(optimizers, "CACHE_BLOCKED_MIN", SIZE + 1)
    one, split = (make_updater(plan, {}, SPECS[name], SIZE) for _ in range(2))
    if one.optimizer is not None:
        assert not one.optimizer.cache_blocked  # the reference really is one pass
    pool, calls = BlockPool(3), []

    def recording(fn, ranges):
        calls.append(len(ranges))
        pool(fn, ranges)

    split.use_blocks(recording, 3)
    rng = np.random.default_rng(7)
    w0 = rng.normal(size=SIZE).astype(np.float32)
    wa, wb, wc = w0.copy(), w0.copy(), w0.copy()
    outa, outb, outc = (np.empty(SIZE, np.float32) for _ in range(3))
    try:
        for step in range(3):
            g = rng.normal(size=SIZE).astype(np.float32)
            assert one.push(step % 2, wa, g, delay=step, into=outa) == \
                split.push(step % 2, wb, g, delay=step, into=outb) == \
                cached.push(step % 2, wc, g, delay=step, into=outc)
            np.testing.assert_array_equal(wa, wb)
            np.testing.assert_array_equal(wa, wc)
            np.testing.assert_array_equal(outa, outb)
            np.testing.assert_array_equal(outa, outc)
            np.testing.assert_array_equal(outa, wa)
    finally:
        pool.close()
    assert not np.array_equal(wa, w0)
    assert calls and max(calls) == 3  # the blocks really ran as 3 (Nadam copies out in blocks)
    if split.optimizer is not None and name != "nadam":
        for key, slot in one.optimizer.export_state().items():
            np.testing.assert_array_equal(slot, split.optimizer.export_state()[key])
            np.testing.assert_array_equal(slot, cached.optimizer.export_state()[key])


def test_a_failing_block_raises_in_the_caller():
    pool = BlockPool(2)

    def fail(lo, hi):
        if lo:
            raise ValueError("block")

    with pytest.raises(ValueError, match="block"):
        pool(fail, [(0, 1), (1, 2)])
    pool.close()
    run_serial(lambda lo, hi: None, [(0, 1)])
