"""Typed hub messages: each is one dataclass, its header is the fields that differ from their
defaults, and a received header decodes to the message that was sent."""

import json
import math
import re
from pathlib import Path

import pytest

from nbdist.wire.messages import (
    HUB_REQUESTS,
    Chunk,
    Control,
    EvalJob,
    EvalResult,
    Hello,
    Reply,
    Report,
    ReportReply,
    ShardState,
    Step,
    SyncState,
)
from nbdist.wire.schema import ENVELOPE_FIELDS, Wire

NBDIST = Path(__file__).resolve().parents[2] / "nbdist"
EXAMPLES = [
    Hello(2, engine=5, host="node1", link="shm", shm="nbdist-seg", offset=16, total=64, gpu="T4"),
    Step(1, push=True, pull=True, chunks=[7], loss=0.25, compute_s=0.01, comm_s=0.002, wait_s=0.5,
         batch=8, group=[0, 1], norm=3.5, seg="nbdist-seg", lag=1, fragment=2,
         metrics={"0": [1.0, 2.0]},
         eval=EvalResult(0, {"accuracy": 0.5}, version=9), traffic=[1, 2, 3, 4], gpu_util=50,
         gpu_mem=7),
    Report(1, samples=32, loss=0.5, batch=32, epoch=0.5, epoch_end=0, metrics={"0": [1.0]},
           state=SyncState(seq=1, epoch=0, offset=32, steps=4, final=False, lr=0.1, iterations=4,
                           optimizer="SGD", slots=[[3, 2], [2]])),
    Control(lr=0.5, by="ReduceLROnPlateau", paused=False, slowdown=(1, 2.0),
            option=("staleness", 2.0), epoch_done=3, eval=EvalResult(3, {"loss": 0.1})),
    Reply(3, chunks=[Chunk(4, 0, 8, 12)], lr=0.1, group=[0, 1], eval=EvalJob(0, 3), params="shm",
          seg="s"),
    ReportReply(lr=0.1, paused=True, batches=[32, 16], send_state=2, open_epoch=1),
    ShardState(shard=0, version=4, names=["params"], rule="asgd", schedule={"epoch": 0},
               state_seq=2),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_crosses_the_wire_unchanged(message):
    header = json.loads(json.dumps(message.encode()))  # what the codec sends and parses
    assert header["op"] == message.OP
    assert type(message).decode(header) == message


def test_the_header_holds_only_what_differs_from_the_defaults():
    assert Step(0).encode() == {"op": "step", "worker": 0}
    assert Reply(3).encode() == {"op": "reply", "version": 3}  # what shards 1..S-1 answer
    assert Reply.written_off(5).encode() == {"op": "reply", "version": 5, "stop": True,
                                             "done": True, "lost": True}
    assert Control(paused=False).encode() == {"op": "control", "paused": False}  # a resume
    assert Reply(3, chunks=[Chunk(0, 1, 8, 12)]).encode()["chunks"] == [[0, 1, 8, 12]]
    assert math.isnan(Step.decode({"op": "step", "worker": 0}).loss)


def test_other_shards_get_what_they_apply_a_push_with():
    step = EXAMPLES[1]
    other = step.for_other_shard()
    assert {k for k, v in other.encode().items()} == {"op", "worker", *Step.SHARED}
    assert (other.norm, other.lag, other.group, other.batch) == (3.5, 1, [0, 1], 8)
    assert other.chunks == [] and other.metrics is None and other.eval is None
    assert Control(paused=True, epoch_done=1).for_other_shards() is None
    assert Control(lr=0.5, paused=True).for_other_shards() == Control(lr=0.5)


def test_every_request_names_its_reply():
    for kind in HUB_REQUESTS.values():
        assert issubclass(kind.REPLY, Wire) and kind.REPLY.OP and kind.schema.op == kind.OP


def test_no_module_reads_a_hub_header_by_key():
    """Headers are read through their messages; by key only the envelope, the codec's part."""
    read = re.compile(r'\.header(?:\[|\.get\()"(\w+)"')
    for path in sorted(NBDIST.rglob("*.py")):
        for key in read.findall(path.read_text()):
            assert key in ENVELOPE_FIELDS, f"{path.relative_to(NBDIST)} reads header key {key!r}"
