"""A real `--mode pipeline --stages 2` run on a real cluster, attacked while it trains, as the hub
is attacked in tests/inproc/test_hub_security.py:

- at every stage's TCP port: unsigned packets from ZeroMQ peers without the key (refused at
  the handshake, with no token or a guessed one), and from a peer past the gate unsigned,
  truncated, oversized and replayed packets (dropped by the limits, the MAC and the replay
  check), and an unsigned report at the kernel's port;
- at stage 1's port: 512 peers each holding most of a handshake command, and a peer that never
  ends a multipart message, while its engine's memory is read from outside.

Once the attacks are over the run is stopped; its model has the accuracy of the same steps
trained on one machine, and `run.pipeline` counts every refusal, per stage and reason; the
stage's engine grew by less than 256 MB."""

from __future__ import annotations

import os
import time

import psutil
import zmq

import nbdist
from nbdist.hub.gate import CUT, REFUSED
from nbdist.hub.protocol import Codec, send_frames
from nbdist.hub.wire import client_socket
from tests.helpers import SYNTHETIC_CELL, global_step, wait_for
from tests.hostile import Flood

CELL = "import keras\nkeras.utils.set_random_seed(3)\n" + SYNTHETIC_CELL  # the same initial weights here and there
EPOCHS, BATCH = 1000, 32  # stopped once the attacks are over
FLOOD_LIMIT_BYTES = 256 * 2**20


def _one_machine_accuracy(steps: int) -> float:
    """The cell trained here for `steps` of the pipeline's mini-batches, in its order:
    validation accuracy."""
    from nbdist.core.schedule import epoch_permutation

    ns: dict = {}
    exec(compile(CELL, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    model, x, y = ns["model"], ns["x_train"], ns["y_train"]
    starts = [(epoch, start) for epoch in range(EPOCHS) for start in range(0, len(x), BATCH)][:steps]
    for epoch, start in starts:
        index = epoch_permutation(len(x), 0, epoch)[start:start + BATCH]
        model.train_on_batch(x[index], y[index])
    return float(model.evaluate(ns["x_test"], ns["y_test"], verbose=0)[1])


def _attack(ctx, key: bytes, run_id: str, info: dict, replayed_sender: str, stage: int) -> list:
    """At one stage: ZeroMQ peers without the key (none, or a guessed token) sending unsigned
    packets, and a peer past the gate sending unsigned, truncated, oversized and replayed ones.
    Returns the sockets (closing them would drop what they have not sent yet)."""
    keyless, guessing = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
    guessing.setsockopt(zmq.PLAIN_USERNAME, f"{info['gate']}:0123".encode())
    guessing.setsockopt(zmq.PLAIN_PASSWORD, b"guess")
    past = client_socket(ctx, info, key, zmq.PUSH)
    for sock in (keyless, guessing, past):
        sock.connect(info["endpoint"])
    for sock in (keyless, guessing):
        for _ in range(4):  # as in issue 29: 4 unsigned packets
            sock.send(b"\0" * 32 + b'{"op":"F"}')
    past.send_multipart([b"\0" * 32 + b'{"op":"F","step":1,"mb":0}'])  # unsigned
    past.send_multipart([b"trunc"])  # truncated: shorter than a signature
    past.send_multipart([b"\0" * 32 + b"{}"] + [bytes(1024)] * 8)  # oversized: more frames than any message
    replay = Codec(key, replayed_sender.split("/")[0], run_id)
    replay.sender = replayed_sender  # the neighbour's own name, and a sequence number already used
    send_frames(past, replay.encode({"op": "F", "step": 1, "mb": 0, "src": replayed_sender.split("/")[0],
                                     "shapes": [], "dtypes": []}, to=f"stage-{stage}"))
    return [keyless, guessing, past]


def _refused_all(run) -> bool:
    reasons = ("bad signature", "truncated message", "oversized message", "replayed message", REFUSED)
    return all(d.get(r, 0) >= 1 for d in run.pipeline["dropped"] for r in reasons)


def test_a_pipeline_run_attacked_while_it_trains_finishes_at_the_same_accuracy_and_counts_it_all(cluster):
    pids = dict(zip(cluster.engine_ids, cluster.client[:].apply_sync(os.getpid), strict=True))  # engines busy later
    ns: dict = {}
    run = nbdist.train(CELL, cluster=cluster, namespace=ns, mode="pipeline", stages=2, micro_batches=4,
                       batch_size=BATCH, epochs=EPOCHS, partition="uniform")
    ctx = zmq.Context()
    try:
        wait_for(lambda: global_step(run) > 5, 240, what="the first steps")
        kernel, endpoints = run.state.control.link, run.state.backend.endpoints
        # the attacker holds the run's key and the stages' sender names, which nbdist never shows
        key, run_id = kernel.codec._key, run.run_id  # noqa: SLF001
        senders = {name.split("/")[0]: name for name in kernel.codec._last_seen}  # noqa: SLF001
        held = [sock for stage, info in enumerate(endpoints)
                for sock in _attack(ctx, key, run_id, info, senders[f"stage-{1 - stage}"], stage)]
        report = client_socket(ctx, kernel.report_endpoint, key, zmq.PUSH)
        report.connect(kernel.report_endpoint["endpoint"])
        report.send(b"\0" * 32 + b'{"op":"step"}')
        wait_for(lambda: _refused_all(run), 120, what=lambda: f"the refusals (so far {run.pipeline['dropped']})")
        stage1 = psutil.Process(pids[run.state.backend.engines[1]])
        base = peak = stage1.memory_info().rss
        with Flood("multipart", endpoints[1]["endpoint"], socket_type="PUSH", limit=1 << 30) as multipart, \
                Flood("pending", endpoints[1]["endpoint"], peers=512, frame_bytes=90_000):
            end = time.monotonic() + 8
            while time.monotonic() < end:
                peak = max(peak, stage1.memory_info().rss)
                time.sleep(0.05)
        assert run.status == "running" and held  # all of it happened while the run trained
        run.stop()
        run.wait(timeout=600)
    finally:
        ctx.destroy(linger=0)
    assert run.status == "stopped" and run.error is None
    steps = int(run.history["step"].max())
    got = float(ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1])
    want = _one_machine_accuracy(steps)
    assert abs(got - want) <= 0.02, (steps, got, want)  # the same training: the attacks changed nothing
    assert got > 0.8
    info = run.pipeline
    print(f"attacked pipeline: accuracy {got:.3f} (one machine {want:.3f}); dropped {info['dropped']}, "
          f"kernel {info['kernel_dropped']}; stage 1 engine RSS +{(peak - base) / 2**20:.1f} MB; "
          f"multipart peer {multipart.stats}")
    assert _refused_all(run)  # each attack, at each stage, counted under its reason
    assert info["dropped"][1].get(CUT, 0) >= 1  # the 512 peers
    assert info["kernel_dropped"].get("bad signature") == 1
    assert peak - base < FLOOD_LIMIT_BYTES, (peak - base) / 2**20
