"""The coordinator's decisions, without sockets: chunks, start barrier, pause, evals, SSP."""

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
