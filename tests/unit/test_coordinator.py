"""The coordinator's decisions, without sockets: chunks, start barrier, pause, evals, SSP."""

import pytest

from nbdist.core.coordinator import Coordinator, Plan
from nbdist.wire.messages import Control, EvalJob, EvalResult, Hello, Report, Step


def chunk_lists(reply):
    """A reply's chunks in their wire form, [id, epoch, start, stop]."""
    return [c.to_list() for c in reply.chunks]


def plan(**kw):
    base = dict(num_workers=2, num_samples=8, epochs=1, batch_size=4, lr=0.1, has_validation=True)
    return Plan(**{**base, **kw})


def test_no_chunks_until_every_worker_has_said_hello():
    c = Coordinator(plan())
    c.hello(Hello(0, host="h", engine=0))
    assert chunk_lists(c.work_for(0, pulled=True, version=0)) == []
    c.hello(Hello(1, host="h", engine=1))
    assert chunk_lists(c.work_for(0, pulled=True, version=0)) == [[0, 0, 0, 4]]


def test_paused_worker_keeps_its_chunk_but_is_not_shown_it():
    c = Coordinator(plan())
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    c.work_for(0, True, 0)
    c.apply(Control(paused=True), now=1.0)
    assert chunk_lists(c.work_for(0, True, 0)) == []
    c.apply(Control(paused=False), now=2.0)
    assert chunk_lists(c.work_for(0, True, 0)) == [[0, 0, 0, 4]]


def test_pause_at_step_n_pauses_in_the_reply_to_the_nth_push_until_resumed():
    """--pause-at 3: the reply to the third push already holds the work back; one pause event
    at step 3; resume() goes on, and the step count passing 3 again later pauses nothing."""
    c = running(plan(num_samples=40, has_validation=False, pause_at=3))
    for _ in range(2):
        train_one(c, 0)
    assert not c.paused and c.work_for(0, True, 0).chunks != []
    c.push(Step(0, chunks=[c.assigned[0][0].id]), delay=0, now=2.0)  # the third push
    assert c.paused and c.work_for(0, True, 0).chunks == [] and c.snapshot(0)["paused"]
    (event,) = [e for e in c.stats.events if e["event"] == "pause"]
    assert (event["step"], event["reason"], event["time"]) == (3, "--pause-at", 2.0)
    c.apply(Control(paused=False), now=3.0)
    for _ in range(3):
        train_one(c, 1)
    assert not c.paused and c.steps_counted == 6


def test_pause_at_0_starts_paused_and_a_sync_rank_s_reports_count_as_steps():
    c = running(plan(pause_at=0))
    assert c.paused and c.work_for(0, True, 0).chunks == []
    assert [(e["event"], e["step"]) for e in c.stats.events] == [("pause", 0)]
    sync = running(plan(pause_at=2, lr_owner="workers", silence_is_loss=False))
    for rank in (0, 1):
        control = sync.report(Report(rank, batch=1, samples=4, epoch=0.5), now=1.0)
    assert control.paused and sync.stats.global_step == 2


def test_epoch_end_queues_an_eval_that_goes_back_if_its_worker_leaves():
    c = Coordinator(plan())
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    for w in (0, 1):
        (cid, *_), = chunk_lists(c.work_for(w, True, 0))
        c.push(Step(w, chunks=[cid], compute_s=0.01), delay=0, now=1.0)
    job = c.work_for(0, pulled=True, version=2)
    assert job.eval == EvalJob(epoch=0, version=2) and not job.done
    c.bye(0, now=2.0)  # left without reporting
    assert c.work_for(1, pulled=True, version=2).eval.epoch == 0
    c.eval_result(1, EvalResult(epoch=0, metrics={"accuracy": 1.0}, version=2), now=3.0)
    assert c.work_for(1, pulled=True, version=2).done


def test_an_eval_held_by_a_worker_that_starts_again_goes_back_to_the_queue():
    """A worker started again (its hub shard was taken over) says hello as a new process, which
    knows nothing of the evaluation its earlier process held: the job goes back to the queue
    and is handed out again, else the run would wait for its result forever."""
    c = Coordinator(plan())
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    for w in (0, 1):
        (cid, *_), = chunk_lists(c.work_for(w, True, 0))
        c.push(Step(w, chunks=[cid], compute_s=0.01), delay=0, now=1.0)
    assert c.work_for(0, pulled=True, version=2).eval == EvalJob(epoch=0, version=2)
    c.hello(Hello(0, host="h", engine=0))  # its new process
    assert not c.work_for(0, pulled=False, version=2).done
    assert c.work_for(0, pulled=True, version=2).eval == EvalJob(epoch=0, version=2)
    c.eval_result(0, EvalResult(epoch=0, metrics={"accuracy": 1.0}, version=2), now=3.0)
    assert c.work_for(0, pulled=True, version=2).done and c.work_for(1, True, 2).done


def test_ssp_holds_a_worker_too_far_ahead_until_the_slowest_catches_up():
    c = Coordinator(plan(num_samples=100, staleness=1, has_validation=False))
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    for _ in range(2):
        (cid, *_), = chunk_lists(c.work_for(0, True, 0))
        c.push(Step(0, chunks=[cid]), delay=0, now=1.0)
    assert c.work_for(0, True, 0) is None  # 2 clocks ahead of worker 1 with S = 1: hold
    (cid, *_), = chunk_lists(c.work_for(1, True, 0))
    c.push(Step(1, chunks=[cid]), delay=0, now=1.0)
    assert c.work_for(0, True, 0) is not None


# -- workers added mid-run (Run.add_workers, --elastic) ----------------------------------------


def running(p):
    c = Coordinator(p)
    for w in range(p.num_workers):
        c.hello(Hello(w, host="h", engine=w))
    return c


def train_one(c, worker, now=1.0, compute_s=0.01):
    (cid, *_), = chunk_lists(c.work_for(worker, True, 0))
    c.push(Step(worker, chunks=[cid], compute_s=compute_s), delay=0, now=now)
    return cid


def test_added_worker_gets_every_per_worker_entry_and_m_stays_the_configured_one():
    c = running(plan(num_samples=40, has_validation=False, slowdown=[1.0, 2.0]))
    c.add_worker(2, now=3.0, engine=7)
    assert c.plan.num_workers == 2 and c.num_workers == 3  # softsync's c, easgd's alpha keep M
    row = c.stats.workers[2]
    assert (row.worker, row.engine, row.state, row.batch_size) == (2, 7, "starting", 4)
    assert c.slowdown == [1.0, 2.0, 1.0] and c.groups.of[2] == [2] and list(c.assigned[2]) == []
    assert c.sizer.batches == [4, 4, 4] and c.sizer.total == 12  # the global batch grows by b0
    event = c.stats.events[-1]
    assert ((event["event"], event["worker"], event["engine"], event["time"])
            == ("worker_added", 2, 7, 3.0))
    snap = c.snapshot(0)
    assert [n["worker"] for n in snap["nodes"]] == [0, 1, 2] and snap["delays"]["2"] == {}
    assert not snap["finished"]


def test_added_worker_trains_once_it_said_hello_and_every_sample_is_trained_once():
    c = running(plan(num_samples=40, has_validation=False))
    train_one(c, 0), train_one(c, 1)  # chunks [0,4) and [4,8)
    c.add_worker(2, now=2.0)
    train_one(c, 0)  # the others do not wait for the newcomer
    c.hello(Hello(2, host="h", engine=5))
    assert chunk_lists(c.work_for(2, True, 0)) == [[3, 0, 12, 16]]  # after 0 took [8,12)
    done = {0: 0, 1: 0, 2: 0}
    w = 2
    while not c.schedule.finished:
        work = c.work_for(w, True, 0)
        for cid, _, start, stop in chunk_lists(work):
            c.push(Step(w, chunks=[cid]), delay=0, now=3.0)
            done[w] += stop - start
        w = (w + 1) % 3
    assert c.schedule.samples_per_epoch == [40]
    assert (sum(n.samples for n in c.stats.workers) == 40
            and c.stats.workers[2].samples == done[2] > 0)
    for worker in range(3):
        assert c.work_for(worker, True, 0).done
        c.bye(worker, now=9.0)
    assert c.finished


def test_run_waits_for_an_added_worker_that_has_not_said_hello_yet():
    c = running(plan(num_samples=8, has_validation=False))
    c.add_worker(2, now=1.0)
    train_one(c, 0), train_one(c, 1)
    c.bye(0, now=2.0), c.bye(1, now=2.0)
    assert not c.finished  # it was promised work: it is told "done" on hello, then leaves
    c.hello(Hello(2, host="h", engine=2))
    reply = c.work_for(2, True, 0)
    assert reply.chunks == [] and reply.done
    c.bye(2, now=3.0)
    assert c.finished


def test_dbs_sums_stay_the_global_batch_after_an_add_and_the_newcomer_is_measured_first():
    c = running(plan(num_samples=10_000, has_validation=False, dbs=True, batch_size=10,
                     batch_min=1))
    c.sizer.rebalance_every = 1
    for _ in range(4):  # worker 1 twice as slow: after warm-up DBS moves batch to worker 0
        train_one(c, 0, compute_s=0.01), train_one(c, 1, compute_s=0.02)
    before = c.sizer.batches
    assert sum(before) == 20 and before[0] > before[1]
    c.add_worker(2, now=5.0)
    assert c.sizer.batches == [*before, 10] and sum(c.sizer.batches) == c.sizer.total == 30
    c.hello(Hello(2, host="h", engine=2))
    train_one(c, 0), train_one(c, 1)
    assert c.sizer.batches[:2] == before  # no rebalance until the newcomer is measured
    for _ in range(4):
        train_one(c, 2, compute_s=0.01 * c.sizer.batch_for(2) / 10)
        train_one(c, 0, compute_s=0.01 * c.sizer.batch_for(0) / 10)
    last = [e for e in c.stats.events if e["event"] == "rebalance"][-1]["batches"]
    assert len(last) == 3 and sum(last) == 30 == sum(c.sizer.batches)  # rebalanced with it, still B


def test_ssp_does_not_hold_the_others_back_for_a_newcomer_and_counts_it_from_the_slowest():
    c = running(plan(num_samples=1000, has_validation=False, staleness=1))
    c.add_worker(2, now=1.0)
    for _ in range(3):  # worker 2 is still starting: 0 and 1 run on, one clock apart at most
        train_one(c, 0), train_one(c, 1)
    assert c.work_for(0, True, 0) is not None and c.clock.clocks == (3, 3, 0)
    c.hello(Hello(2, host="h", engine=2))
    assert c.clock.clocks == (3, 3, 3) and c.work_for(2, True, 0) is not None
    train_one(c, 0), train_one(c, 0)
    assert c.work_for(0, True, 0) is None  # two ahead of the others, the newcomer included


def test_an_added_worker_is_alone_in_its_group_until_the_next_regroup():
    c = running(plan(algorithm="group", groups=1, num_samples=400, has_validation=False))
    assert c.reply_for(0, True, 0).group == [0, 1]
    c.add_worker(2, now=1.0)
    c.hello(Hello(2, host="h", engine=2))
    assert c.reply_for(2, True, 0).group == [2] and c.reply_for(0, True, 0).group == [0, 1]
    for w in range(3):
        train_one(c, w)
    c.regroup(now=2.0)
    assert sorted({tuple(g) for g in c.groups.of}) == [(0, 1, 2)]  # equal speeds: one group


def test_adding_out_of_order_or_to_a_run_that_ends_is_refused():
    c = running(plan(num_samples=8, has_validation=False))
    with pytest.raises(ValueError, match=r"next id, 2 \(Received: 3\)"):
        c.add_worker(3, now=1.0)
    c.apply(Control(stop=True), now=1.0)
    with pytest.raises(ValueError, match="the run is ending"):
        c.add_worker(2, now=2.0)
    assert c.num_workers == 2
def test_a_live_staleness_change_decides_who_waits():
    """run.set_option("staleness", S) used to change only the rule's own copy of the clock,
    while the coordinator's clock (the one that holds replies) kept the old S."""
    c = Coordinator(plan(algorithm="ssp", staleness=0, num_samples=40))
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    (cid, *_), = chunk_lists(c.work_for(0, True, 0))
    c.work_for(1, True, 0)
    c.push(Step(0, chunks=[cid], compute_s=0.01), delay=0, now=1.0)
    assert c.work_for(0, True, 1) is None  # one push ahead of worker 1, S = 0: waits
    c.apply(Control(option=("staleness", 2)), now=2.0)
    assert c.work_for(0, True, 1) is not None


def test_group_options_given_and_changed_live_shape_the_groups():
    """--algo-opt max_ratio and a live num_groups used to be checked, then ignored."""
    c = Coordinator(plan(algorithm="group", num_workers=3, num_samples=60, max_group_ratio=10.0))
    for w in range(3):
        c.hello(Hello(w, host="h", engine=w))
        c.stats.workers[w].samples_per_s = (100.0, 200.0, 900.0)[w]
    c.regroup(now=1.0)
    assert c.groups.of == [[0, 1, 2]] * 3  # 9x apart, within max_ratio 10
    c.apply(Control(option=("max_ratio", 1.5)), now=2.0)
    c.regroup(now=2.0)
    assert c.groups.of == [[0], [1], [2]]
    c.apply(Control(option=("num_groups", 2)), now=3.0)
    c.regroup(now=3.0)
    assert c.groups.of == [[0, 1], [0, 1], [2]]


def test_max_ratio_given_with_algo_opt_reaches_the_plan():
    from types import SimpleNamespace

    from nbdist.config import TrainConfig
    from nbdist.job import coordinator_plan

    config = TrainConfig(algorithm="group", algo_options="max_ratio=3", groups=2)
    contents = SimpleNamespace(num_samples=100, validation=None)
    made, _, _ = coordinator_plan(config, contents, 0.1, num_workers=4)
    assert (made.max_group_ratio, made.groups) == (3.0, 2)


def test_options_bounded_by_the_workers_wait_until_their_number_is_known():
    from types import SimpleNamespace

    from nbdist.config import TrainConfig
    from nbdist.errors import ConfigError
    from nbdist.job import coordinator_plan

    config = TrainConfig(algorithm="group", groups=3)  # no --workers: every free engine
    contents = SimpleNamespace(num_samples=100, validation=None)
    assert coordinator_plan(config, contents, 0.1, num_workers=4)[0].groups == 3
    with pytest.raises(ConfigError,
                       match=r"'num_groups' of group must be in \[0, 2\]. Received: 3"):
        coordinator_plan(config, contents, 0.1, num_workers=2)


def test_the_learning_rate_has_one_owner():
    """The hub's optimizer and the coordinator each used to keep (and change) a copy."""
    hub_owned = Coordinator(plan(lr=0.1))
    hub_owned.apply(Control(lr=0.5), now=1.0)
    assert hub_owned.lr is None and hub_owned.work_for(0, True, 0).lr is None
    assert hub_owned.stats.events[-1]["event"] == "set_lr"  # still recorded
    workers_owned = Coordinator(plan(lr=0.1, lr_owner="workers"))
    workers_owned.apply(Control(lr=0.5), now=1.0)
    assert workers_owned.work_for(0, True, 0).lr == 0.5
