"""Hub soak: 32 simulated workers against one real hub for a bounded time, with random
abrupt worker deaths and rejoins. Checks that nothing is lost or applied twice.

What it does
    One `nbdist.hub.server.Hub` (asgd, plain SGD, metrics "minimal") serves in its own process.
    --workers processes (default 32) each drive a `nbdist.hub.client.WorkerTransport` like
    nbdist/modes/common/worker.py does: push a gradient for the chunk the hub handed out, pull,
    repeat; no
    TensorFlow. Each worker lives for a random time (exponential, mean --life seconds), then
    dies abruptly: it closes its sockets without saying bye, still holding a chunk. It comes
    back with the same worker id (a rejoin, `hello` again) after either a short pause (before
    the hub can notice) or a long one (the hub writes it off as lost after its silence
    deadline, hands its chunk to others, and takes it back when it says hello).

    Deaths happen between round trips, never with a push in flight: a push whose reply was
    never read could have been applied or not, and no observer could tell which.

What it checks
    - gradients are exact in float32: each push is k / 1024 with integer k in [-8, 8] per
      element (a deterministic random stream per worker), lr = 1/8. Every worker sums the k of
      the pushes the hub accepted (replied to, not "lost"). The hub's final parameters must
      EQUAL initial - lr * sum / 1024, bit for bit, and the hub's version (one per applied
      push) must equal the number of accepted pushes: lost = accepted - applied, duplicated =
      applied - accepted, both must be 0;
    - the hub process's RSS, sampled every second: first, last and max (flat means no leak per
      push, per death or per rejoin). With --metrics full the hub keeps one history row per
      push by design (the notebook's run.history), so its memory grows with the run there;
    - pushes/s: accepted pushes per second over the whole soak, all workers together.

    python benchmarks/hub_soak.py                    # 32 workers, 60 s
    python benchmarks/hub_soak.py --seconds 300 --workers 32 --life 8
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import time
import traceback
import uuid

import _common  # noqa: F401 - sys.path for a checkout; TF stays unloaded here anyway
import numpy as np
import psutil
from _common import table

from nbdist.core.coordinator import Plan
from nbdist.core.liveness import LOST_FLOOR_S
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.modes.common.worker import IDLE_POLL_S
from nbdist.wire.messages import Step

MP = mp.get_context("fork")  # the parent opens no zmq context until every child is forked
LR = 0.125  # a power of two: lr * k / 1024 is exact in float32
SCALE = 1024


def _hub_process(spec: HubSpec, conn) -> None:
    try:
        hub = Hub(spec)
        conn.send(("ok", hub.endpoints))
        conn.send(("done", hub.serve()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


def _worker_process(key, worker, shards, size, end_at, life_s, transport, conn) -> None:
    """One worker slot: live, die abruptly, come back, until end_at; report what was accepted."""
    rng = np.random.default_rng([worker, 7])
    total = np.zeros(size, np.int64)  # sum of k over accepted pushes
    counts = {"accepted": 0, "refused": 0, "deaths": 0, "rejoins": 0, "long_absences": 0}
    try:
        first = True
        while time.monotonic() < end_at:
            tr = WorkerTransport(key, worker, shards, 0, transport, timeout=60)
            refused = False
            try:
                reply = tr.hello()
                counts["rejoins"] += 0 if first else 1
                first = False
                dies_at = min(end_at, time.monotonic() + rng.exponential(life_s))
                while time.monotonic() < dies_at and not reply.done:
                    todo = reply.chunks
                    if not todo:
                        time.sleep(IDLE_POLL_S)
                        reply = tr.step(Step(worker))
                        continue
                    k = rng.integers(-8, 9, size, dtype=np.int64)
                    tr.grad[:] = k.astype(np.float32) / np.float32(SCALE)
                    reply = tr.step(Step(worker, push=True, pull=True, chunks=[todo[0].id],
                                         loss=0.0, compute_s=0.001))
                    if reply.lost:  # written off while alive: not applied, rejoin
                        counts["refused"] += 1
                        refused = True
                        break
                    total += k
                    counts["accepted"] += 1
                if time.monotonic() >= end_at or reply.done:
                    tr.bye()
                    break
            finally:
                tr.close()  # a death: sockets closed, no bye, a chunk still held
            if refused:
                continue
            counts["deaths"] += 1
            long = rng.random() < 0.3  # away long enough for the hub to write it off
            counts["long_absences"] += int(long)
            time.sleep(LOST_FLOOR_S + 2.0 if long else rng.uniform(0.05, 1.0))
        conn.send(("ok", counts, total))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


def soak(workers: int, seconds: float, size: int, life_s: float, transport: str,
         metrics: str) -> dict:
    key = new_key()
    plan = Plan(num_workers=workers, num_samples=10**12, epochs=1, batch_size=32, lr=LR,
                has_validation=False, algorithm="asgd", metrics=metrics)
    initial = np.random.default_rng(0).integers(-64, 64, size).astype(np.float32)
    spec = HubSpec(run_id=uuid.uuid4().hex[:12], key=key, shard=0, num_shards=1, plan=plan,
                   params=initial, non_trainable=np.zeros(0, np.float32), idle_timeout=120.0)
    hub_end, child = MP.Pipe()
    hub = MP.Process(target=_hub_process, args=(spec, child), daemon=True)
    hub.start()
    status, endpoints = hub_end.recv()
    if status != "ok":
        raise RuntimeError(endpoints)
    start = time.monotonic()
    end_at = start + seconds
    pipes, procs = [], []
    for w in range(workers):
        parent, child = MP.Pipe()
        p = MP.Process(target=_worker_process, daemon=True,
                       args=(key, w, [endpoints], size, end_at, life_s, transport, child))
        p.start()
        pipes.append(parent)
        procs.append(p)
    rss = []
    hub_ps = psutil.Process(hub.pid)
    while time.monotonic() < end_at:
        rss.append(hub_ps.memory_info().rss / 1e6)
        time.sleep(1.0)
    results = []
    for pipe in pipes:
        if not pipe.poll(120):
            raise RuntimeError("a worker did not report within 120 s of the end")
        msg = pipe.recv()
        if msg[0] != "ok":
            raise RuntimeError(msg[1])
        results.append(msg[1:])
    for p in procs:
        p.join(10)
    elapsed = time.monotonic() - start
    rss.append(hub_ps.memory_info().rss / 1e6)
    control = HubControl(key, [endpoints], timeout=30)
    try:
        snap = control.stats()
        params, _ = control.params()
        control.shutdown()
    finally:
        control.close()
    hub.join(10)
    totals = {k: sum(c[k] for c, _ in results) for k in results[0][0]}
    summed = sum(t for _, t in results)
    expected = initial - np.float32(LR) * (summed.astype(np.float32) / np.float32(SCALE))
    exact_sum = (initial.astype(np.float64) - LR * summed / SCALE)  # the same, computed exactly
    applied = int(snap["version"])
    return {**totals, "elapsed": elapsed, "applied": applied,
            "hub_steps": int(snap["global_step"]),
            "written_off": sum(1 for e in snap["events"] if e["event"] == "worker_lost"),
            "max_diff": float(np.max(np.abs(params.astype(np.float64) - exact_sum))),
            "bitwise": bool(np.array_equal(params, expected)), "rss": rss,
            "dropped": sum(snap["dropped"].values()), "error": snap["error"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="soak length (default 60)")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--size", type=int, default=100_000, help="float32 parameters")
    parser.add_argument("--life", type=float, default=10.0, help="mean seconds a worker lives")
    parser.add_argument("--transport", choices=["auto", "tcp"], default="auto")
    parser.add_argument("--metrics", choices=["minimal", "full"], default="minimal")
    args = parser.parse_args()
    # written-off workers are counted below
    logging.getLogger("nbdist.hub.server").setLevel(logging.ERROR)
    print(f"hub soak: {args.workers} workers, {args.seconds:g} s, {args.size:,} float32 "
          f"parameters, mean life {args.life:g} s, transport {args.transport}, "
          f"metrics {args.metrics}, silence deadline >= {LOST_FLOOR_S:g} s", flush=True)
    r = soak(args.workers, args.seconds, args.size, args.life, args.transport, args.metrics)
    lost, duplicated = max(0, r["accepted"] - r["applied"]), max(0, r["applied"] - r["accepted"])
    rss = r["rss"]
    rows = [
        ["pushes accepted (workers' count)", r["accepted"]],
        ["updates applied (hub version)", r["applied"]],
        ["lost updates", lost],
        ["duplicated updates", duplicated],
        ["final params == initial - lr * sum(accepted)", "yes, bit for bit" if r["bitwise"] else
         f"NO (max |diff| {r['max_diff']:.3g})"],
        ["pushes refused (sender written off)", r["refused"]],
        ["abrupt deaths (no bye)", r["deaths"]],
        ["rejoins (same id, hello again)", r["rejoins"]],
        ["written off by the hub (worker_lost)", r["written_off"]],
        ["messages dropped by the hub", r["dropped"]],
        ["pushes/s (accepted, all workers)", r["accepted"] / r["elapsed"]],
        ["hub RSS MB first / last / max", f"{rss[0]:.1f} / {rss[-1]:.1f} / {max(rss):.1f}"],
    ]
    print(table(["quantity", "value"], rows))
    ok = lost == 0 and duplicated == 0 and r["bitwise"] and not r["error"]
    print("PASS: nothing lost, nothing applied twice" if ok else f"FAIL (hub error: {r['error']})")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
