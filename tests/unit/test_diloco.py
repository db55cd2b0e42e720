"""`--algorithm diloco`: the recipe's defaults, the hub's round (every worker's delta, their
mean, the outer Nesterov step) against a NumPy oracle written from the paper's formula, and
rounds that share an epoch fairly (pure: the shard core on an injected clock)."""

import numpy as np
import pytest

from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.config import TrainConfig
from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore
from nbdist.errors import ConfigError
from nbdist.wire.messages import Hello, Step


def test_diloco_takes_the_papers_h_and_outer_nesterov_unless_the_run_sets_them():
    config = TrainConfig(algorithm="diloco")
    assert config.local_steps == 500 and config.server_optimizer == "nesterov"
    given = TrainConfig(algorithm="diloco", local_steps=20, server_optimizer="adam")
    assert given.local_steps == 20 and given.server_optimizer == "adam"
    spec = server_optimizer_spec("nesterov", None, [3])
    assert spec["config"] == {"momentum": 0.9, "nesterov": True} and spec["learning_rate"] == 0.7


def test_diloco_is_refused_where_no_local_steps_run():
    with pytest.raises(ConfigError, match="--algorithm diloco trains rounds of local steps, "
                                          "which --mode sync does not run"):
        TrainConfig(algorithm="diloco", mode="sync", workers=2)
    assert TrainConfig(algorithm="diloco", mode="simulate", workers=2).local_steps == 500
    with pytest.raises(ConfigError, match="'num_groups' of diloco must be in \\[1, 1\\]"):
        TrainConfig(algorithm="diloco", algo_options={"num_groups": 2})


def outer_nesterov(w, momentum_buffer, deltas, lr=0.7, mu=0.9):
    """DiLoCo's outer step, as the paper's PyTorch SGD(nesterov=True) takes it:
    g = mean(deltas); b = mu b + g; w = w - lr (g + mu b)."""
    g = np.mean(deltas, axis=0)
    momentum_buffer = mu * momentum_buffer + g
    return w - lr * (g + mu * momentum_buffer), momentum_buffer


def test_a_round_waits_for_every_delta_and_steps_the_outer_nesterov_on_their_mean():
    plan = Plan(num_workers=2, num_samples=64, epochs=1, batch_size=4, lr=None,
                has_validation=False, algorithm="diloco", groups=1, chunks_ahead=4,
                local_steps=4, lr_owner="workers")
    w0 = np.array([1.0, -2.0, 0.5], np.float32)
    c = ShardCore(plan, w0.copy(), np.zeros(0, np.float32), now=lambda: 0.0,
                  optimizer=server_optimizer_spec("nesterov", None, [3]))
    for worker in (0, 1):
        c.hello(Hello(worker, host="h", engine=worker))
    replies = {w: c.reply(w, pull=True) for w in (0, 1)}
    assert [len(r.chunks) for r in replies.values()] == [4, 4]  # H = 4 each, of 16 chunks
    expected, buffer = w0.astype(np.float64), np.zeros(3)
    rounds = [([0.5, 0.25, -1.0], [0.1, 0.3, 0.0]), ([0.2, -0.4, 0.8], [-0.6, 0.0, 0.2])]
    for r, (d0, d1) in enumerate(rounds):
        chunks = {w: [ch.id for ch in replies[w].chunks] for w in (0, 1)}
        c.push(Step(0, chunks=chunks[0], batch=16, group=[0, 1]), np.array(d0, np.float32))
        assert c.reply(0, pull=True, token=f"r0-{r}") is None  # held for the other's delta
        assert c.version == r
        c.push(Step(1, chunks=chunks[1], batch=16, group=[0, 1]), np.array(d1, np.float32))
        expected, buffer = outer_nesterov(expected, buffer, [d0, d1])
        np.testing.assert_allclose(c.params, expected, rtol=1e-6)
        assert c.version == r + 1
        released = {w: reply for w, _, _, reply in c.release()}
        replies = {0: released[0], 1: c.reply(1, pull=True)}


def test_a_round_of_local_steps_takes_at_most_the_workers_share_of_an_epoch():
    """H = 500 and 10 chunks an epoch: each of the two workers takes 5, not the first all 10."""
    plan = Plan(num_workers=2, num_samples=40, epochs=1, batch_size=4, lr=None,
                has_validation=False, algorithm="diloco", groups=1, chunks_ahead=500,
                local_steps=500, lr_owner="workers")
    c = ShardCore(plan, np.zeros(2, np.float32), np.zeros(0, np.float32), now=lambda: 0.0,
                  optimizer=server_optimizer_spec("nesterov", None, [2]))
    for worker in (0, 1):
        c.hello(Hello(worker, host="h", engine=worker))
    assert [len(c.reply(w, pull=True).chunks) for w in (0, 1)] == [5, 5]
