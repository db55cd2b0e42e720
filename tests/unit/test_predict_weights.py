"""--predict-weights: a worker reads w + d·Δ (Δ the hub's last update, d its recent delay), with
hand-computed numbers; one worker (no delay) reads exactly what it read without it; which rules
and modes take it, and the clear refusal elsewhere."""

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.config import TrainConfig
from nbdist.core.plan import Plan
from nbdist.core.shard import ShardCore, expected_delay
from nbdist.core.updater import Updater
from nbdist.errors import ConfigError
from nbdist.wire.messages import Hello, Step


def core(num_workers=2, predict=True, optimizer=None):
    plan = Plan(num_workers=num_workers, num_samples=64, epochs=1, batch_size=4, lr=0.5,
                has_validation=False, predict_weights=predict)
    return ShardCore(plan, np.zeros(2, np.float32), np.zeros(0, np.float32), now=lambda: 0.0,
                     optimizer=optimizer)


def start(c, workers):
    for w in workers:
        c.hello(Hello(w, host="h", engine=w))
    for w in workers:
        c.reply(w, pull=True)


def read(c, worker, plain=False):
    out = np.full(2, np.nan, np.float32)
    c.read_into(worker, out, plain=plain)
    return out.tolist()


def test_a_stale_worker_reads_the_weights_one_more_update_ahead():
    c = core()
    start(c, (0, 1))
    assert read(c, 0) == [0.0, 0.0]  # no update, no delay yet: the weights themselves
    c.push(Step(0, chunks=[0], batch=4), np.array([1, 2], np.float32))  # read v0, delay 0
    assert c.params.tolist() == [-0.5, -1.0]
    assert read(c, 0) == [-0.5, -1.0]  # its delay so far is 0: nothing to predict
    c.reply(0, pull=True)
    c.push(Step(1, chunks=[1], batch=4), np.array([2, 0], np.float32))  # read v0, delay 1
    assert c.params.tolist() == [-1.5, -1.0]  # the last update: [-1, 0]
    assert read(c, 1) == [-2.5, -1.0]  # w + 1 x [-1, 0]
    assert read(c, 1, plain=True) == [-1.5, -1.0]  # an evaluation reads w itself


def test_without_prediction_every_read_is_the_weights():
    c = core(predict=False)
    start(c, (0, 1))
    c.push(Step(0, chunks=[0], batch=4), np.array([1, 2], np.float32))
    c.push(Step(1, chunks=[1], batch=4), np.array([2, 0], np.float32))
    assert read(c, 1) == c.params.tolist() == [-1.5, -1.0]
    assert c.updater.last_step is None


def test_one_worker_reads_exactly_what_it_read_without_prediction():
    adam = server_optimizer_spec("adam", 0.01, [2])
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(12, 2)).astype(np.float32)
    reads = {}
    for predict in (True, False):
        c = core(num_workers=1, predict=predict, optimizer=adam)
        start(c, (0,))
        seen = []
        for i, g in enumerate(grads):
            c.push(Step(0, chunks=[i], batch=4), g)
            c.reply(0, pull=True)
            seen.append(read(c, 0))
        reads[predict] = seen
    assert reads[True] == reads[False]  # no delay: bit for bit the same


def test_the_last_step_is_the_whole_update_under_adam():
    adam = server_optimizer_spec("adam", 0.01, [3])
    up = Updater(make_rule("asgd", 3, 2), adam, predict=True)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    for g in ([0.3, -1.0, 2.0], [0.1, 0.4, -0.2]):
        before = w.copy()
        up.push(0, w, np.array(g, np.float32), delay=1)
        np.testing.assert_array_equal(up.last_step, w - before)
    out = np.empty(3, np.float32)
    up.read_ahead(w, 2.0, out)
    np.testing.assert_allclose(out, w + 2 * up.last_step, rtol=0, atol=1e-7)
    assert up.state_nbytes == Updater(make_rule("asgd", 3, 2), adam).state_nbytes + 2 * 3 * 4


def test_the_expected_delay_is_the_median_of_the_last_three_capped():
    assert expected_delay([], 4) == 0.0
    assert expected_delay([3], 4) == 3.0
    assert expected_delay([1, 2], 4) == 1.5
    assert expected_delay([1, 50, 1], 4) == 1.0  # one long wait does not move it
    assert expected_delay([40, 50, 60], 4) == 7.0  # at most 2M - 1


def test_a_worker_that_rejoins_starts_from_a_plain_read():
    c = core()
    start(c, (0, 1))
    c.push(Step(1, chunks=[1], batch=4), np.array([2, 0], np.float32))
    c.push(Step(0, chunks=[0], batch=4), np.array([1, 2], np.float32))
    assert c.delays[0] == [1]
    c.hello(Hello(0, host="h", engine=0))
    assert 0 not in c.delays and read(c, 0) == c.params.tolist()


@pytest.mark.parametrize(("options", "predicted"), [
    ({}, True),
    ({"algorithm": "ssp"}, True),
    ({"algorithm": "dc-asgd-a"}, False),
    ({"algorithm": "softsync"}, False),
    ({"local_steps": 4}, False),
    ({"mode": "sync"}, False),
    ({"mode": "simulate", "workers": 2}, True),
    ({"predict_weights": False}, False),
])
def test_prediction_is_on_where_it_works_unless_turned_off(options, predicted):
    assert TrainConfig(**options).weights_predicted is predicted


@pytest.mark.parametrize("options", [{"algorithm": "dc-asgd"}, {"algorithm": "hogwild"},
                                     {"local_steps": 2}])
def test_asking_for_prediction_where_it_cannot_work_is_refused(options):
    with pytest.raises(ConfigError, match="--predict-weights works with --algorithm asgd or ssp"):
        TrainConfig(predict_weights=True, **options)


def test_prediction_is_refused_in_a_mode_without_an_update_rule_either_way():
    for switch in ("--predict-weights", "--no-predict-weights"):
        with pytest.raises(ConfigError, match=f"{switch} does not apply to --mode sync.*works "
                                              "with --mode async, local, simulate"):
            TrainConfig(mode="sync", predict_weights=switch == "--predict-weights")
