"""Typed hub messages: the header a reply or step encodes to is the wire format as it was."""

import math

from nbdist.core.schedule import Chunk
from nbdist.hub.messages import Reply, Step

WORK = {"version": 7, "lr": None, "paused": False, "stop": False, "slowdown": 2.0, "group": [0, 1],
        "chunks": [[3, 1, 12, 16]], "eval": {"epoch": 0, "version": 7}, "done": False}


def test_a_shard_0_reply_encodes_to_the_same_header_and_its_chunks_are_typed():
    reply = Reply.decode(WORK)
    assert reply.chunks == [Chunk(3, 1, 12, 16)] and reply.chunks[0].size == 4
    assert reply.encode() == {"op": "reply", **WORK}
    reply.params, reply.seg = "shm", "seg-1"
    assert reply.encode() == {"op": "reply", **WORK, "params": "shm", "seg": "seg-1"}
    waiting = Reply.decode({**{k: v for k, v in WORK.items() if k != "eval"}, "eval_pending": True})
    assert waiting.encode()["eval_pending"] is True and "eval" not in waiting.encode()


def test_other_shards_send_the_version_only_and_a_written_off_worker_is_told_to_leave():
    assert Reply.decode({"version": 3}).encode() == {"op": "reply", "version": 3}
    assert Reply.written_off(5).encode() == {"op": "reply", "version": 5, "lost": True, "stop": True,
                                             "done": True}


def test_a_step_names_its_fields_and_keeps_the_statistics_it_carries():
    header = {"op": "step", "run": "r", "from": "w/1", "to": "hub-0", "seq": 4, "nbytes": [8],
              "worker": 1, "push": True, "pull": True, "chunks": [3], "loss": 0.5, "compute_s": 0.01,
              "batch": 4, "group": [0, 1], "traffic": [10, 20, 0, 0]}
    step = Step.decode(header)
    assert (step.worker, step.push, step.pull, step.batch, step.group, step.norm) == (1, True, True, 4, [0, 1], None)
    assert step.stats == {"traffic": [10, 20, 0, 0]}
    assert step.counted() == {"traffic": [10, 20, 0, 0], "chunks": [3], "loss": 0.5, "compute_s": 0.01,
                              "comm_s": 0.0, "wait_s": 0.0}
    assert Step.decode(step.encode()) == step
    assert math.isnan(Step(0).loss) and "loss" not in Step(0).encode()


def test_the_hubs_direct_reply_header_is_what_decode_then_encode_gives():
    """`Reply.wire` skips building Chunks on the hub's per-push path; it must not change a byte."""
    pending = {**{k: v for k, v in WORK.items() if k != "eval"}, "eval_pending": True}
    for work in (WORK, pending, {"version": 4}, {**WORK, "chunks": [], "stop": True, "done": True}):
        for params, seg in ((None, None), ("shm", "seg-1"), ("live", "seg-2")):
            expected = Reply.decode(work)
            expected.params, expected.seg = params, seg
            assert Reply.wire(work, params, seg) == expected.encode()
