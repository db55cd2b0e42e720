"""`--algorithm streaming-diloco` (Douillard et al. 2025): the fragments, the hub's Nesterov on
one fragment per group step against numbers worked out by hand and a float64 oracle, the merge,
the barrier that keeps fragments apart, and the recipe's defaults and refusals."""

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.algorithms.streaming import fragment_span, merge_fragment, round_steps
from nbdist.config import TrainConfig
from nbdist.core.barrier import GroupBarrier
from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore
from nbdist.errors import ConfigError
from nbdist.wire.messages import Hello, Step
from tests.rule_cases import f32


@pytest.mark.parametrize("size,parts", [(10, 4), (3, 4), (0, 2), (269_322, 7), (5, 1)])
def test_fragments_cut_a_slice_into_contiguous_runs_in_order(size, parts):
    spans = [fragment_span(size, parts, i) for i in range(parts)]
    assert spans[0][0] == 0 and spans[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1
    with pytest.raises(ValueError):
        fragment_span(size, parts, parts)


def test_a_round_is_h_over_p_steps_rounded_up():
    assert [round_steps(h, 4) for h in (100, 101, 4, 3, 1)] == [25, 26, 1, 1, 1]


# Three group steps, 2 fragments of a 5-float slice, beta = eta = 0.5 (exact in float32):
# step 1, fragment 0 (floats 0..2), mean g = [1, 2, 4]: u = g, w -= 0.5 (g + 0.5 u) = [.75, 1.5, 3]
# step 2, fragment 1 (floats 3..4), g = [2, -1]: u = g, w -= 0.5 (1.5 g) -> w[3:] = [-1.5, 0.75]
# step 3, fragment 0, g = [2, 0, -4]: u = 0.5 [1, 2, 4] + g = [2.5, 1, -2],
#   w -= 0.5 (g + 0.5 u) = [1.625, 0.25, -2.5] -> w[:3] = [-2.375, -1.75, -0.5]
# What a push holds outside its fragment is never read (the 9s).
ROUNDS = [(0, f32(2, 4, 6, 9, 9), f32(0, 0, 2, 9, 9)),
          (1, f32(9, 9, 9, 4, 0), f32(9, 9, 9, 0, -2)),
          (0, f32(2, 0, -4, 9, 9), f32(2, 0, -4, 9, 9))]
BY_HAND = [-2.375, -1.75, -0.5, -1.5, 0.75]
OPTIONS = {"fragments": 2, "outer_lr": 0.5, "momentum": 0.5}


def test_the_rule_steps_nesterov_on_one_fragment_by_hand():
    rule = make_rule("streaming-diloco", 5, 2, OPTIONS)
    w = np.zeros(5, np.float32)
    for fragment, a, b in ROUNDS:
        assert rule.next_fragment == fragment
        rule.select(fragment)
        assert rule.on_push(0, w, (a + b) / np.float32(2), lr=1.0, delay=0)
    assert w.tolist() == BY_HAND
    assert rule.next_fragment == 1
    with pytest.raises(ValueError, match="2 fragments"):
        rule.select(2)


def test_a_late_push_of_an_earlier_fragment_leaves_the_cursor():
    """A group step timed out without a worker: its push of that fragment comes alone, after
    the cursor moved on; it is applied to its own fragment, and everyone's next push is the
    cursor's, so the workers push the same fragment again."""
    rule = make_rule("streaming-diloco", 4, 2, {"fragments": 4})
    w = np.zeros(4, np.float32)
    for fragment in (0, 1, 0, 2):  # the second 0 is late
        rule.select(fragment)
        rule.on_push(0, w, f32(1, 1, 1, 1), lr=1.0, delay=0)
    assert rule.next_fragment == 3
    assert (w != 0).tolist() == [True, True, True, False]


def streaming_oracle(w, rounds, parts, lr=0.7, beta=0.9):
    """The paper's outer step in float64: per fragment p, u_p = beta u_p + g_p and
    w_p -= lr (g_p + beta u_p), one fragment per round, the rest of w untouched."""
    w, u = np.asarray(w, np.float64).copy(), np.zeros(len(w))
    for fragment, g in rounds:
        lo, hi = fragment_span(len(w), parts, fragment)
        u[lo:hi] = beta * u[lo:hi] + g[lo:hi]
        w[lo:hi] -= lr * (g[lo:hi] + beta * u[lo:hi])
    return w


def test_random_rounds_match_the_oracle():
    rng = np.random.default_rng(0)
    rule = make_rule("streaming-diloco", 11, 3, {"fragments": 3})
    w = rng.normal(size=11).astype(np.float32)
    start, rounds = w.copy(), []
    for r in range(10):
        fragment, g = r % 3, rng.normal(size=11).astype(np.float32)
        rule.select(fragment)
        rule.on_push(0, w, g, lr=1.0, delay=0)
        rounds.append((fragment, g))
    np.testing.assert_allclose(w, streaming_oracle(start, rounds, 3), rtol=1e-5, atol=1e-6)


def test_the_hub_applies_each_groups_mean_to_the_fragment_its_pushes_name():
    """A shard as the hub runs it: two workers' pushes meet at the barrier, tagged by their
    fragment; the weights after the three rounds are the numbers worked out by hand."""
    plan = Plan(num_workers=2, num_samples=64, epochs=1, batch_size=4, lr=1.0,
                has_validation=False, algorithm="streaming-diloco", groups=1, chunks_ahead=4,
                local_steps=4)
    core = ShardCore(plan, np.zeros(5, np.float32), np.zeros(0, np.float32), now=lambda: 0.0,
                     rule_options=OPTIONS)
    for worker in (0, 1):
        core.hello(Hello(worker))
        assert core.reply(worker, pull=True).fragment == 0
    for fragment, a, b in ROUNDS:
        for worker, delta in ((0, a), (1, b)):
            core.push(Step(worker, push=True, pull=True, batch=4, group=[0, 1],
                           fragment=fragment), delta)
        assert core.reply(0, pull=True).fragment == (fragment + 1) % 2
    assert core.params.tolist() == BY_HAND
    assert core.export()["rule_state"]["next_fragment"] == 1  # what a checkpoint keeps


def test_pushes_of_different_fragments_never_share_a_step():
    barrier = GroupBarrier(size=2)
    assert barrier.add((0, 1), 0, f32(1, 1), batch=1, read_version=0, header={}, tag=0) == []
    # worker 1 is a fragment ahead: worker 0's step goes alone, worker 1's waits for its own
    ready = barrier.add((0, 1), 1, f32(3, 3), batch=1, read_version=0, header={}, tag=1)
    assert [(s.tag, s.mean.tolist(), sorted(s.headers)) for s in ready] == [(0, [1.0, 1.0], [0])]
    flushed = barrier.add((0, 1), 0, f32(5, 5), batch=1, read_version=0, header={}, tag=1)
    assert [(s.tag, s.mean.tolist()) for s in flushed] == [(1, [4.0, 4.0])]


def test_merge_mixes_the_global_fragment_into_the_workers_own():
    local = f32(1, 2, 3)
    merge_fragment(local, f32(3, 2, 1), 0.25)
    assert local.tolist() == [2.5, 2.0, 1.5]
    merge_fragment(local, f32(0, 0, 0), 0.0)
    assert local.tolist() == [0.0, 0.0, 0.0]


def test_the_recipes_defaults_and_refusals():
    config = TrainConfig(algorithm="streaming-diloco")
    assert config.local_steps == 100 and config.server_optimizer is None
    assert TrainConfig(algorithm="streaming-diloco", compression="int8").compression == "int8"
    with pytest.raises(ConfigError, match="cannot encode alone .* Use --compression fp16 or int8"):
        TrainConfig(algorithm="streaming-diloco", compression="topk:0.01")
    with pytest.raises(ConfigError, match="streaming-diloco is not simulated"):
        TrainConfig(algorithm="streaming-diloco", mode="simulate")
    with pytest.raises(ConfigError, match="a Nesterov momentum on one fragment at a time"):
        TrainConfig(algorithm="streaming-diloco", server_optimizer="adam")
    with pytest.raises(ConfigError, match="Option 'mix' of streaming-diloco must be in"):
        TrainConfig(algorithm="streaming-diloco", algo_options={"mix": 1.5})
    with pytest.raises(ConfigError, match="runs on one hub shard"):
        TrainConfig(algorithm="streaming-diloco", servers=2)
