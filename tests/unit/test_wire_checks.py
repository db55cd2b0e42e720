"""The checks on what arrives, before anything reads it: each field's type as its message's
dataclass declares it (`nbdist.wire.schema`), worker ids (`check_link`), and the bounded
receive that counts frames and bytes (`recv_bounded`)."""

import dataclasses
import math

import pytest

from nbdist.errors import ProtocolError
from nbdist.hub.wire import check_link, recv_bounded
from nbdist.wire.messages import HUB_REQUESTS, Control, Hello, Reply, Report, Step

STEP = {"op": "step", "worker": 1, "push": True, "chunks": [3, 4], "loss": float("nan"), "batch": 8}


def test_field_checks_by_hand():
    assert math.isnan(Step.decode(STEP).loss)  # a NaN loss is reported, not a framing error
    assert HUB_REQUESTS["stats"].decode({"op": "stats", "since": 0}).since == 0
    with pytest.raises(ProtocolError,
                       match=r"^malformed header: wrong type or value of push, chunks \(Step\)$"):
        Step.decode({**STEP, "push": 1, "chunks": [3, "4"]})
    with pytest.raises(ProtocolError, match=r"wrong type or value of worker \(Step\)"):
        Step.decode({**STEP, "worker": True})
    with pytest.raises(ProtocolError, match=r"lacks worker \(Step\)"):
        Step.decode({"op": "step"})
    with pytest.raises(ProtocolError, match=r"unknown field\(s\) bogus"):
        Step.decode({**STEP, "bogus": 1})
    with pytest.raises(ProtocolError) as caught:
        Step.decode({**STEP, "lag": "1"})
    assert caught.value.reason == "malformed header" and "lag" in caught.value.detail


def test_a_worker_id_must_name_a_worker_of_the_run():
    check_link({}, Hello(1), "worker-1/ab", num_workers=2)
    for worker in (2, -1):
        with pytest.raises(ProtocolError,
                           match=rf"wrong type or value of worker={worker} \(0\.\.1\)"):
            check_link({}, Step(worker), "worker-9/ab", num_workers=2)


@pytest.mark.parametrize("metrics", [{"0": [1.5, 2]}, {"12": []}])
def test_metrics_are_digit_keyed_lists_of_numbers(metrics):
    assert Step.decode({**STEP, "metrics": metrics}).metrics == metrics
    assert Report.decode({"op": "report", "worker": 0, "metrics": metrics,
                          "epoch_end": 1}).epoch_end == 1


@pytest.mark.parametrize("metrics", [{"x": [1.0]}, {"0": ["a"]}, {"0": [True]}, {"0": 1.0}, [[1.0]],
                                     {"-1": [1.0]}])
def test_other_metrics_are_refused(metrics):
    with pytest.raises(ProtocolError, match=r"wrong type or value of metrics"):
        Step.decode({**STEP, "metrics": metrics})


@pytest.mark.parametrize(("kind", "header", "field"), [
    (Step, {"worker": 0, "group": [0, None]}, "group"),
    (Step, {"worker": 0, "eval": {"epoch": 0, "version": 1}}, "eval"),  # a result has metrics
    (Step, {"worker": 0, "eval": {"epoch": 0, "metrics": {"acc": "high"}}}, "eval"),
    (Reply, {"version": 1, "chunks": [[0, 0, 4]]}, "chunks"),  # [id, epoch, start, stop]
    (Reply, {"version": 1, "eval": {"epoch": 0, "version": 1.5}}, "eval"),
    (Control, {"slowdown": [1, 2.0, 3]}, "slowdown"),  # (worker, factor)
    (Control, {"option": [1, 2.0]}, "option"),  # (name, value)
    (Control, {"epoch_done": 1.0}, "epoch_done"),
    (Control, {"eval": {"epoch": 0, "metrics": {}, "extra": 1}}, "eval"),
    (Report, {"worker": 0, "state": {"seq": 1}}, "state"),
])
def test_nested_fields_are_checked_inside(kind, header, field):
    with pytest.raises(ProtocolError, match=rf"wrong type or value of {field} "):
        kind.decode({"op": kind.OP, **header})


JSON_VALUES = ("text", 7, 1.5, True, None, [1], {"a": 1})  # one of each JSON type


@pytest.mark.parametrize("kind", list(HUB_REQUESTS.values()))
def test_every_field_of_every_request_is_checked_against_its_annotation(kind):
    """The checks come from the dataclasses: in every field of every request, a value of each
    JSON type either fits its annotation (and is decoded as sent) or is refused, naming the
    field; and every field refuses some."""
    base = {"op": kind.OP, **{"worker": 0, "shards": []}}
    base = {k: v for k, v in base.items()
            if k == "op" or k in {f.name for f in dataclasses.fields(kind)}}
    kind.decode(base)
    for f in dataclasses.fields(kind):
        refused = 0
        for value in JSON_VALUES:
            try:
                decoded = kind.decode({**base, f.name: value})
            except ProtocolError as exc:
                assert exc.reason == "malformed header" and f"of {f.name} (" in exc.detail, exc
                refused += 1
            else:
                assert getattr(decoded, f.name) == value, (f.name, value)
        assert refused >= 4, f"{kind.__name__}.{f.name} accepts {7 - refused} JSON types"


class FakeFrame:
    def __init__(self, size, more):
        self.size, self.more = size, more

    def __len__(self):
        return self.size


class FakeSocket:
    def __init__(self, sizes):
        self.frames = [FakeFrame(s, i < len(sizes) - 1) for i, s in enumerate(sizes)]
        self.read = 0

    def recv(self, copy=False):
        self.read += 1
        return self.frames[self.read - 1]


def test_bounded_receive_counts_frames_and_bytes_and_drains_the_rest():
    assert len(recv_bounded(FakeSocket([5, 32, 100, 400]), max_frames=4, max_bytes=537)) == 4
    too_many = FakeSocket([5] * 20)  # 20 frames of 5 bytes: under the size limit, over the count
    with pytest.raises(ProtocolError, match=r"oversized message: more than 4 frames or 1000 bytes "
                                            r"\(16 more frame\(s\) dropped unread\)"):
        recv_bounded(too_many, max_frames=4, max_bytes=1000)
    assert too_many.read == 20  # the whole message left the socket
    too_big = FakeSocket([5, 32, 600, 1])
    with pytest.raises(ProtocolError, match=r"\(2 more frame\(s\) dropped unread\)"):
        recv_bounded(too_big, max_frames=8, max_bytes=600)
    assert too_big.read == 4
