"""`--algorithm async-local-sgd`: the hub's delayed Nesterov (Liu et al. 2024) against a NumPy
oracle written from the paper's update, on numbers worked out by hand and on random push
orders; the recipe's defaults and what it refuses."""

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.config import TrainConfig
from nbdist.errors import ConfigError
from tests.rule_cases import f32, random_pushes


def delayed_nesterov(w, deltas, n, lr=0.7, beta=0.9):
    """The paper's DN, in float64, one delta after another: δ += Δ and w -= lr Δ / n each
    push; every n-th push also m = β m + δ / n, w -= lr β m, δ = 0."""
    w, m, pending = np.asarray(w, np.float64), np.zeros(len(w)), np.zeros(len(w))
    for t, delta in enumerate(deltas):
        pending += delta
        w = w - lr * np.asarray(delta, np.float64) / n
        if (t + 1) % n == 0:
            m = beta * m + pending / n
            w = w - lr * beta * m
            pending[:] = 0.0
    return w


def test_two_workers_by_hand():
    """n = 2, η = 0.5, β = 0.5 (exact in float32). Push 1, Δ = [1, 2]: w = [1, 1] - 0.25 [1, 2]
    = [0.75, 0.5]. Push 2, Δ = [1, -2]: w -= 0.25 Δ -> [0.5, 1]; the momentum takes the mean
    of both, m = [1, 0], and w -= 0.25 m -> [0.25, 1]."""
    rule = make_rule("async-local-sgd", 2, 2, {"outer_lr": 0.5, "momentum": 0.5})
    w = f32(1, 1)
    assert rule.on_push(0, w, f32(1, 2), lr=1.0, delay=0)
    assert w.tolist() == [0.75, 0.5]
    assert rule.on_push(1, w, f32(1, -2), lr=1.0, delay=0)
    assert w.tolist() == [0.25, 1.0]
    assert rule.pushes == 2


@pytest.mark.parametrize("n", [1, 3, 4])
def test_random_pushes_match_the_papers_update(n):
    for seed in range(3):
        pushes = random_pushes(seed, pushes=13, size=6, workers=4)
        rule = make_rule("async-local-sgd", 6, 4, {"buffer": n})
        w = np.linspace(-1, 1, 6, dtype=np.float32)
        start = w.copy()
        for worker, delta, _ in pushes:  # the hub's rate: 1 unless run.set_lr changes it
            rule.on_push(worker, w, delta, lr=1.0, delay=0)
        expected = delayed_nesterov(start, [d for _, d, _ in pushes], n)
        np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_n_deltas_equal_diloco_outer_nesterov_on_their_mean():
    """Over one round of n pushes, DN moves w as DiLoCo's outer step does on their mean:
    w - lr (ḡ + β m) with m = β m + ḡ (m starting at 0)."""
    deltas = [f32(0.5, -1.0, 0.25), f32(0.1, 0.3, -0.2), f32(-0.4, 0.2, 0.6)]
    rule = make_rule("async-local-sgd", 3, 3)
    w = f32(1.0, 2.0, 3.0)
    for i, d in enumerate(deltas):
        rule.on_push(i, w, d, lr=1.0, delay=0)
    mean = np.mean(deltas, axis=0, dtype=np.float64)
    np.testing.assert_allclose(w, [1.0, 2.0, 3.0] - 0.7 * (mean + 0.9 * mean), rtol=1e-6)


def test_the_recipe_takes_h_and_plain_sgd_and_refuses_another_outer_optimizer():
    config = TrainConfig(algorithm="async-local-sgd")
    assert config.local_steps == 500 and config.server_optimizer is None
    assert TrainConfig(algorithm="async-local-sgd", local_steps=20).local_steps == 20
    with pytest.raises(ConfigError, match="--algorithm async-local-sgd is its own outer "
                                          "optimizer, a delayed Nesterov momentum"):
        TrainConfig(algorithm="async-local-sgd", server_optimizer="nesterov")
    with pytest.raises(ConfigError, match="--algorithm async-local-sgd trains rounds of local "
                                          "steps, which --mode sync does not run"):
        TrainConfig(algorithm="async-local-sgd", mode="sync", workers=2)
    rule = make_rule("async-local-sgd", 4, 3)
    assert rule.options == {"buffer": 3, "momentum": 0.9, "outer_lr": 0.7}


def test_the_hub_applies_each_delta_as_it_lands_and_rounds_share_the_epoch():
    """A shard core as the hub runs it (the recipe's SGD at rate 1 around the rule): H = 500
    and 10 chunks an epoch give each of two workers 5, and each push moves w at once, as the
    oracle says, with no barrier (a reply to every push)."""
    from nbdist.algorithms.optimizers import server_optimizer_spec
    from nbdist.core.plan import Plan
    from nbdist.core.shard import ShardCore
    from nbdist.wire.messages import Hello, Step

    plan = Plan(num_workers=2, num_samples=40, epochs=2, batch_size=4, lr=None,
                has_validation=False, algorithm="async-local-sgd", chunks_ahead=500,
                local_steps=500, lr_owner="workers")
    w0 = np.array([1.0, -2.0, 0.5], np.float32)
    c = ShardCore(plan, w0.copy(), np.zeros(0, np.float32), now=lambda: 0.0,
                  optimizer=server_optimizer_spec("sgd", None, [3]))
    for worker in (0, 1):
        c.hello(Hello(worker, host="h", engine=worker))
    replies = {w: c.reply(w, pull=True) for w in (0, 1)}
    assert [len(r.chunks) for r in replies.values()] == [5, 5]
    deltas = [(0, f32(0.5, 0.25, -1.0)), (0, f32(0.2, -0.4, 0.8)), (1, f32(0.1, 0.3, 0.0))]
    for i, (worker, delta) in enumerate(deltas):
        chunks = [ch.id for ch in replies[worker].chunks]
        c.push(Step(worker, chunks=chunks, batch=20), delta)
        replies[worker] = c.reply(worker, pull=True, token=f"p{i}")
        assert replies[worker] is not None and c.version == i + 1
        expected = delayed_nesterov(w0, [d for _, d in deltas[: i + 1]], n=2)
        np.testing.assert_allclose(c.params, expected, rtol=1e-6)
