"""The coordinator's decisions, without sockets: chunks, start barrier, pause, evals, SSP."""

import pytest

from nbdist.ps.coordinator import Coordinator, Plan


def plan(**kw):
    base = dict(num_workers=2, num_samples=8, epochs=1, batch_size=4, lr=0.1, has_validation=True)
    return Plan(**{**base, **kw})


def test_no_chunks_until_every_worker_has_said_hello():
    c = Coordinator(plan())
    c.hello(0, "h", 0)
    assert c.work_for(0, pulled=True, version=0)["chunks"] == []
    c.hello(1, "h", 1)
    assert c.work_for(0, pulled=True, version=0)["chunks"] == [[0, 0, 0, 4]]


def test_paused_worker_keeps_its_chunk_but_is_not_shown_it():
    c = Coordinator(plan())
    c.hello(0, "h", 0), c.hello(1, "h", 1)
    c.work_for(0, True, 0)
    c.control({"paused": True}, now=1.0)
    assert c.work_for(0, True, 0)["chunks"] == []
    c.control({"paused": False}, now=2.0)
    assert c.work_for(0, True, 0)["chunks"] == [[0, 0, 0, 4]]


def test_epoch_end_queues_an_eval_that_goes_back_if_its_worker_leaves():
    c = Coordinator(plan())
    c.hello(0, "h", 0), c.hello(1, "h", 1)
    for w in (0, 1):
        (cid, *_), = c.work_for(w, True, 0)["chunks"]
        c.push(w, {"chunks": [cid], "compute_s": 0.01}, delay=0, now=1.0)
    job = c.work_for(0, pulled=True, version=2)
    assert job["eval"] == {"epoch": 0, "version": 2} and not job["done"]
    c.bye(0, now=2.0)  # left without reporting
    assert c.work_for(1, pulled=True, version=2)["eval"]["epoch"] == 0
    c.eval_result(1, {"eval": {"epoch": 0, "version": 2, "metrics": {"accuracy": 1.0}}}, now=3.0)
    assert c.work_for(1, pulled=True, version=2)["done"]


def test_ssp_holds_a_worker_too_far_ahead_until_the_slowest_catches_up():
    c = Coordinator(plan(num_samples=100, staleness=1, has_validation=False))
    c.hello(0, "h", 0), c.hello(1, "h", 1)
    for _ in range(2):
        (cid, *_), = c.work_for(0, True, 0)["chunks"]
        c.push(0, {"chunks": [cid]}, delay=0, now=1.0)
    assert c.work_for(0, True, 0) is None  # 2 clocks ahead of worker 1 with S = 1: hold
    (cid, *_), = c.work_for(1, True, 0)["chunks"]
    c.push(1, {"chunks": [cid]}, delay=0, now=1.0)
    assert c.work_for(0, True, 0) is not None


def test_a_live_staleness_change_decides_who_waits():
    """run.set_option("staleness", S) used to change only the rule's own copy of the clock,
    while the coordinator's clock (the one that holds replies) kept the old S."""
    c = Coordinator(plan(algorithm="ssp", staleness=0, num_samples=40))
    c.hello(0, "h", 0), c.hello(1, "h", 1)
    (cid, *_), = c.work_for(0, True, 0)["chunks"]
    c.work_for(1, True, 0)
    c.push(0, {"chunks": [cid], "compute_s": 0.01}, delay=0, now=1.0)
    assert c.work_for(0, True, 1) is None  # one push ahead of worker 1, S = 0: waits
    c.control({"option": ["staleness", 2]}, now=2.0)
    assert c.work_for(0, True, 1) is not None


def test_group_options_given_and_changed_live_shape_the_groups():
    """--algo-opt max_ratio and a live num_groups used to be checked, then ignored."""
    c = Coordinator(plan(algorithm="group", num_workers=3, num_samples=60, max_group_ratio=10.0))
    for w in range(3):
        c.hello(w, "h", w)
        c.stats.workers[w].samples_per_s = (100.0, 200.0, 900.0)[w]
    c.regroup(now=1.0)
    assert c.group_of == [[0, 1, 2]] * 3  # 9x apart, within max_ratio 10
    c.control({"option": ["max_ratio", 1.5]}, now=2.0)
    c.regroup(now=2.0)
    assert c.group_of == [[0], [1], [2]]
    c.control({"option": ["num_groups", 2]}, now=3.0)
    c.regroup(now=3.0)
    assert c.group_of == [[0, 1], [0, 1], [2]]


def test_max_ratio_given_with_algo_opt_reaches_the_plan():
    from types import SimpleNamespace

    from nbdist.api import _plan
    from nbdist.config import TrainConfig

    config = TrainConfig(algorithm="group", algo_options="max_ratio=3", groups=2)
    contents = SimpleNamespace(num_samples=100, validation=None)
    made, _, _ = _plan(config, contents, 0.1, num_workers=4)
    assert (made.max_group_ratio, made.groups) == (3.0, 2)


def test_options_bounded_by_the_workers_wait_until_their_number_is_known():
    from types import SimpleNamespace

    from nbdist.api import _plan
    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError

    config = TrainConfig(algorithm="group", groups=3)  # no --workers: every free engine
    contents = SimpleNamespace(num_samples=100, validation=None)
    assert _plan(config, contents, 0.1, num_workers=4)[0].groups == 3
    with pytest.raises(ConfigError, match=r"'num_groups' of group must be in \[0, 2\]. Received: 3"):
        _plan(config, contents, 0.1, num_workers=2)


def test_the_learning_rate_has_one_owner():
    """The hub's optimizer and the coordinator each used to keep (and change) a copy."""
    hub_owned = Coordinator(plan(lr=0.1))
    hub_owned.control({"lr": 0.5}, now=1.0)
    assert hub_owned.lr is None and hub_owned.work_for(0, True, 0)["lr"] is None
    assert hub_owned.stats.events[-1]["event"] == "set_lr"  # still recorded
    workers_owned = Coordinator(plan(lr=0.1, lr_owner="workers"))
    workers_owned.control({"lr": 0.5}, now=1.0)
    assert workers_owned.work_for(0, True, 0)["lr"] == 0.5
