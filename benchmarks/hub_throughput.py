"""Hub throughput: simulated NumPy workers against nbdist hub shards, next to raw pyzmq.

What it measures
    N worker processes (N = 1, 2, 4, 8, 16) each push a gradient and pull the parameters of a
    1M-parameter float32 model (4 MB each way) as fast as they can, against 1 and 2 hub shards,
    each `nbdist.hub.server.Hub` serving in its own process. Workers are
    `nbdist.hub.client.WorkerTransport` driven exactly like nbdist/modes/common/worker.py's
    training loop
    (a push `Step` with the chunk of the last reply, pull in the same round trip; checkouts
    before the typed wire take a header dict: {"chunks": [id], ...}, or {"chunk": id, ...}
    for hubs that hand out one chunk),
    with no TensorFlow and no compute between steps. The
    hub does its real work per push: verify the signed header, apply SGD, count the chunk,
    copy out the parameters. Transports: "tcp" (raw frames over loopback TCP) and "auto"
    (same host: shared memory for the buffers, signed headers over the local line,
    nbdist.hub.localline; NBDIST_LOCAL_LINE=0: over ZeroMQ ipc).

    The baseline, measured in the same run with the same process counts: a raw pyzmq
    ROUTER/DEALER echo over TCP loopback. One server process per shard receives the client's
    slice (4 MB / shards) and replies with a slice of the same size, zero-copy (copy=False),
    doing nothing else; each client sends its slices to every server and waits for all replies.

    Each cell: start the processes, let every worker register and warm up, then count round
    trips completed inside a common window of --seconds (all workers busy throughout). Every
    cell is measured --repeats times, raw/tcp/auto back to back within each repeat, so a busy
    moment of a shared machine hits all three; the table shows medians.

How to read it
    push/s  = round trips (one push + one pull) per second, summed over all workers;
    hub CPU ms/push = the busiest shard process's CPU time while serving / pushes it applied
              (warm-up included): the hub's own cost per push, Python, MAC and update;
    GB/s    = push/s x 8 MB (4 MB gradient in + 4 MB parameters out) / 1e9. For "auto" the
              bytes go through shared memory, so GB/s there is the equivalent rate;
    x raw   = nbdist push/s divided by raw pyzmq echo round trips/s for the same cell;
    MAC ms/step = the MAC work of one TCP round trip (nbdist's keyed BLAKE3 over header and
              buffers, signed and verified each way: 4 passes over 4 MB), timed alone in this
              process (least of 20), next to HMAC-SHA256's; MAC % step = its share of the tcp step;
    curve   (--encrypt) = tcp with CurveZMQ on the hub sockets, as `%nbdist start --encrypt`;
              curve +ms/step = its step minus the plain tcp step of the same cell.
    Targets: tcp >= 0.70 x raw; auto (shared memory) > 1.00 x raw. On a 2-core machine every
    process shares the same two cores, so beyond 2 workers more workers only add contention.

    python benchmarks/hub_throughput.py            # shards 1,2 x workers 1..16, 3 repeats
    python benchmarks/hub_throughput.py --quick    # 1 repeat, 1 s cells, workers 1, 4, 16
    python benchmarks/hub_throughput.py --workers 1 2 --shards 1 --size 270000
    python benchmarks/hub_throughput.py --workers 1 2 --transport tcp --encrypt   # + CurveZMQ
    python benchmarks/hub_throughput.py --sweep    # 1..32 workers, 1/2/4 shards, 1M and 10M, shm
    python benchmarks/hub_throughput.py --profile  # the hub's CPU per phase of a push
                                                   # (_hub_profile.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import traceback
import uuid

import _common  # noqa: F401 - sys.path for a checkout; TF stays unloaded here anyway
import numpy as np
from _cells import Procs, raw_cell, recv_answer, run_window, shared_window, timed_loop
from _common import median, table

from nbdist.core.sharding import shard_bounds
from nbdist.hub.client import WorkerTransport
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.modes.common.launch import hub_specs
from nbdist.modes.common.worker import IDLE_POLL_S

try:  # the typed wire; older checkouts take header dicts and keep HubControl in client.py
    from nbdist.hub.control import HubControl
    from nbdist.wire.messages import Step
except ImportError:
    import nbdist.hub.client as _before_typed_wire

    HubControl, Step = _before_typed_wire.HubControl, None

# -- processes ------------------------------------------------------------------------------


def _hub_process(spec: HubSpec, conn) -> None:
    try:
        hub = Hub(spec)
        conn.send(("ok", hub.endpoints))
        cpu0 = time.process_time()
        summary = hub.serve()
        conn.send(("done", {**summary, "cpu_s": time.process_time() - cpu0}))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


def _nbdist_worker(key, worker, shards, transport, win, conn) -> None:
    tr = None
    try:
        tr = WorkerTransport(key, worker, shards, 0, transport, timeout=60)
        tr.grad[:] = 0.0  # the hub's SGD does the same work for any values
        started: set[int] = set()

        def step(reply):  # the push+pull round trip of nbdist/modes/common/worker.py's loop
            todo = _todo(reply, started)
            if not todo:  # no work yet (e.g. until every worker said hello): wait cheaply,
                while not todo:  # then pull, as the worker loop does
                    time.sleep(IDLE_POLL_S)
                    reply = _exchange(tr, worker, reply, pull=False)
                    todo = _todo(reply, started)
                reply = _exchange(tr, worker, reply, pull=True)
            started.add(todo[0])
            return _exchange(tr, worker, reply, pull=True, chunk=todo[0])

        reply = tr.hello()
        t0 = time.monotonic()
        for _ in range(3):
            reply = step(reply)
        win.warm[worker] = (time.monotonic() - t0) / 3
        win.barrier.wait(120)
        count = timed_loop(step, reply, win.start_at.value, win.seconds.value)
        conn.send(("ok", count))
        tr.bye()
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        if tr is not None:
            tr.close()


def _exchange(tr, worker: int, reply, pull: bool, chunk: int | None = None):
    """One round trip: a push completing `chunk` (None: no push) and/or a pull, as this
    checkout's WorkerTransport takes it (`reply`: the last one, for the older header forms)."""
    if Step is not None:
        chunks = [] if chunk is None else [chunk]
        return tr.step(Step(worker, push=chunk is not None, pull=pull, chunks=chunks))
    if chunk is None:
        return tr.step({}, push=False, pull=pull)
    header = {"loss": 0.0, "compute_s": 0.0, "comm_s": 0.0}
    if "chunks" in reply:  # several chunks per reply, "chunks" in pushes
        header.update(chunks=[chunk], wait_s=0.0)
    else:
        header["chunk"] = chunk
    return tr.step(header, push=True, pull=True)


def _todo(reply, started: set[int]) -> list[int]:
    """Ids of the chunks the hub handed this worker that it has not trained on yet."""
    if Step is not None:
        ids = [c.id for c in reply.chunks]
    elif "chunks" in reply:
        ids = [c[0] for c in reply["chunks"] or []]
    else:
        ids = [reply["chunk"][0]] if reply.get("chunk") is not None else []
    return [i for i in ids if i not in started]


def _hub_base(key: bytes, params: np.ndarray, shards: int, workers: int) -> HubSpec:
    """Shard 0's spec for an endless run (never out of chunks), for this nbdist's HubSpec."""
    common = {"run_id": uuid.uuid4().hex[:12], "key": key, "shard": 0, "num_shards": shards,
              "params": params, "non_trainable": np.zeros(0, np.float32),
              "bind_host": "127.0.0.1", "idle_timeout": 60.0}
    run = {"num_workers": workers, "num_samples": 10**15, "epochs": 1, "batch_size": 64,
           "lr": 1e-3, "has_validation": False, "algorithm": "asgd"}
    if "plan" in {f.name for f in dataclasses.fields(HubSpec)}:  # newer hubs: a coordinator Plan
        from nbdist.core.coordinator import Plan

        return HubSpec(**common, plan=Plan(**run))
    return HubSpec(**common, **run)


# -- one cell -------------------------------------------------------------------------------


def nbdist_cell(size: int, shards: int, workers: int, transport: str, seconds: float,
                profile: bool = False) -> dict:
    """`transport` "tcp", "auto", or "curve" (tcp with --encrypt: CurveZMQ on the hub sockets).
    `profile`: also return shard 0's CPU per phase of a push (nbdist.hub.profile)."""
    key = new_key()
    params = np.zeros(size, dtype=np.float32)
    base = _hub_base(key, params, shards, workers)
    if profile:
        base = dataclasses.replace(base, profile=True)
    if transport == "curve":
        base, transport = dataclasses.replace(base, encrypt=True), "tcp"
    hubs, crew, endpoints = Procs(), Procs(), []
    try:
        hub_conns = [hubs.start(_hub_process, s) for s in hub_specs(base, params, shards)]
        endpoints = [recv_answer(c, f"hub shard {i}") for i, c in enumerate(hub_conns)]
        win = shared_window(workers, seconds)
        conns = [crew.start(_nbdist_worker, key, w, endpoints, transport, win)
                 for w in range(workers)]
        count, seconds = run_window(conns, win)
        crew.stop(timeout=30)  # workers say bye and leave before the hubs shut down
        _shutdown(key, endpoints)
        endpoints = []
        summaries = [recv_answer(c, f"hub shard {i}", 15) for i, c in enumerate(hub_conns)]
        for s in summaries:
            if s["error"] or s["dropped"]:
                raise RuntimeError(f"hub shard {s['shard']}: error {s['error']!r}, "
                                   f"dropped {s['dropped']}")
        pushes = sum(s["version"] for s in summaries) / shards  # every push reaches every shard
        return {"rate": count / seconds, "profile": summaries[0].get("profile"),
                "hub_cpu_ms": 1e3 * max(s["cpu_s"] for s in summaries) / max(1.0, pushes)}
    finally:
        crew.stop()
        if endpoints:  # failed or interrupted: let the hubs close (unlink segments, sockets)
            _shutdown(key, endpoints, timeout=2.0)
        hubs.stop()


def _shutdown(key: bytes, endpoints: list[dict], timeout: float = 10.0) -> None:
    control = HubControl(key, endpoints, timeout=timeout)
    try:
        control.shutdown()
    finally:
        control.close()  # the parent holds no zmq context when it forks the next cell


def mac_ms_per_step(size: int, shards: int, kind: str, repeats: int = 20) -> float:
    """Milliseconds of MAC work in one TCP round trip: the worker signs its push and verifies
    the pull, the hub verifies the push and signs the pull (4 passes over each shard's slice),
    with nbdist's keyed BLAKE3 ("blake3") or HMAC-SHA256 ("hmac"), in this process."""
    import hashlib
    import hmac

    from nbdist.hub.protocol import mac

    key, header = new_key(), b'{"op":"step","worker":0,"push":true,"pull":true}' * 4
    slices = [np.ones(hi - lo, np.float32) for lo, hi in shard_bounds(size, shards)]

    def one(buf):
        if kind == "hmac":
            h = hmac.new(key, header, hashlib.sha256)
            h.update(memoryview(buf).cast("B"))
            return h.digest()
        return mac(key, header, [buf])

    best = float("inf")  # the least of the repeats: the MAC's own cost, not a busy moment's
    for _ in range(repeats):
        t0 = time.perf_counter()
        for buf in slices:
            for _pass in range(4):
                one(buf)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


# -- main -----------------------------------------------------------------------------------


def memcpy_rate(size: int, repeats: int = 7) -> float:
    """Round trips/s if one round trip cost only a single-threaded memcpy of its bytes (the
    4*size gradient in and the 4*size parameters out), in this process (least of repeats)."""
    a, b = np.ones(2 * size, np.float32), np.empty(2 * size, np.float32)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 1.0 / best


def saturation(rates: dict[int, float]) -> str:
    """The smallest worker count whose push/s is within 10% of the best of the sweep."""
    best = max(rates.values())
    return str(min(n for n, r in rates.items() if r >= 0.9 * best))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 repeat of 1 s cells, workers 1, 4, 16")
    parser.add_argument("--sweep", action="store_true",
                        help="workers 1..32, shards 1, 2, 4, sizes 1M and 10M, shm and raw, 0.5 s "
                             "cells, 1 repeat (~10 min)")
    parser.add_argument("--seconds", type=float, default=None, help="window per cell (default 1.5)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="default 3 (1 with --quick/--sweep)")
    parser.add_argument("--workers", type=int, nargs="+", default=None)
    parser.add_argument("--shards", type=int, nargs="+", default=None, help="default 1 2")
    parser.add_argument("--transport", choices=["tcp", "auto", "both"], default=None,
                        help="default both (auto with --sweep)")
    parser.add_argument("--size", type=int, nargs="+", default=None,
                        help="float32 parameters, one or more (default 1000000)")
    parser.add_argument("--encrypt", action="store_true",
                        help="also measure tcp with CurveZMQ on the hub sockets "
                             "(what --encrypt does)")
    parser.add_argument("--profile", action="store_true",
                        help="the hub's CPU per phase of a push, 1 worker, 269K and 1M, shm and "
                             "tcp")
    args = parser.parse_args()
    if args.profile:
        from _hub_profile import profile_table

        profile_table(nbdist_cell, args.size or [269_322, 1_000_000], args.seconds or 3.0,
                      ["auto", "tcp"] if args.transport in (None, "both") else [args.transport],
                      args.repeats or 1)
        return
    seconds = args.seconds or (1.0 if args.quick else 0.5 if args.sweep else 1.5)
    repeats = args.repeats or (1 if args.quick or args.sweep else 3)
    workers = args.workers or ([1, 2, 4, 8, 16, 32] if args.sweep else
                               [1, 4, 16] if args.quick else [1, 2, 4, 8, 16])
    shard_counts = args.shards or ([1, 2, 4] if args.sweep else [1, 2])
    sizes = args.size or ([1_000_000, 10_000_000] if args.sweep else [1_000_000])
    transport = args.transport or ("auto" if args.sweep else "both")
    transports = ["tcp", "auto"] if transport == "both" else [transport]
    sides = ["raw", *transports, *(["curve"] if args.encrypt else [])]
    print(f"hub throughput: sizes {sizes} float32 parameters, shards {shard_counts}, workers "
          f"{workers}, {seconds:g} s per cell, {repeats} interleaved repeat(s), loopback only",
          flush=True)
    t0 = time.monotonic()
    for size in sizes:
        report(size, shard_counts, workers, transports, sides, seconds, repeats, args.encrypt)
    print(f"total time {time.monotonic() - t0:.0f}s; load {os.getloadavg()[0]:.2f} (1 min)")


def report(size, shard_counts, workers, transports, sides, seconds, repeats, encrypt) -> None:
    """Measure and print one model size's table."""
    gb_per_rt = 2 * 4 * size / 1e9
    cells = [(s, n) for s in shard_counts for n in workers]
    rates: dict[tuple[int, int, str], list[float]] = {(s, n, t): [] for s, n in cells
                                                      for t in sides}
    cpu: dict[tuple[int, int, str], list[float]] = {k: [] for k in rates}
    for rep in range(repeats):
        for shards, n in cells:  # raw and nbdist back to back: a noisy moment hits all sides
            for side in sides:
                if side == "raw":
                    rate = raw_cell(size, shards, n, seconds)["rate"]
                else:
                    cell = nbdist_cell(size, shards, n, side, seconds)
                    rate = cell["rate"]
                    cpu[(shards, n, side)].append(cell["hub_cpu_ms"])
                rates[(shards, n, side)].append(rate)
            print(f"  [{rep + 1}/{repeats}] size {size:,} shards {shards} workers {n:>2}: "
                  + ", ".join(f"{t} {rates[(shards, n, t)][-1]:,.0f}" for t in sides) + " push/s",
                  flush=True)
    memcpy = memcpy_rate(size)
    headers = ["shards", "workers", "raw push/s", "raw GB/s", "memcpy push/s"]
    for t in transports:
        name = "auto(shm)" if t == "auto" else t
        headers += [f"{name} push/s", f"{name} GB/s", f"{name} x raw", f"{name} hub CPU ms/push"]
    if "tcp" in transports:  # the cost of authenticating every byte, against the tcp step
        headers += ["tcp step ms", "MAC ms/step", "MAC % step", "HMAC-SHA256 ms/step"]
    if encrypt:
        headers += ["curve push/s", "curve step ms", "curve +ms/step"]
    macs = {s: (mac_ms_per_step(size, s, "blake3"), mac_ms_per_step(size, s, "hmac"))
            for s in shard_counts}
    rows = []
    for shards, n in cells:
        raw = median(rates[(shards, n, "raw")])
        row: list[object] = [shards, n, raw, raw * gb_per_rt, memcpy]
        for t in transports:
            rate = median(rates[(shards, n, t)])
            row += [rate, rate * gb_per_rt, rate / raw, median(cpu[(shards, n, t)])]
        if "tcp" in transports:  # a worker's step: n workers share the rate
            step_ms = 1e3 * n / median(rates[(shards, n, "tcp")])
            row += [step_ms, macs[shards][0], 100 * macs[shards][0] / step_ms, macs[shards][1]]
        if encrypt:
            curve = median(rates[(shards, n, "curve")])
            row += [curve, 1e3 * n / curve,
                    1e3 * n / curve - 1e3 * n / median(rates[(shards, n, "tcp")])]
        rows.append(row)
    print()
    print(f"{size:,} parameters ({4 * size / 1e6:.0f} MB each way): medians of {repeats} "
          "repeat(s); push/s = push+pull round trips per second, all workers; memcpy push/s = 1 / "
          "(one thread's memcpy of a round trip's 8*size bytes); step ms = one worker's round "
          "trip; MAC ms/step = keyed BLAKE3 over header and buffers, 4 passes per round trip, "
          "alone")
    print(table(headers, rows))
    if len(workers) > 1:
        sat = [[s, t, saturation({n: median(rates[(s, n, t)]) for n in workers}),
                max(median(rates[(s, n, t)]) for n in workers)] for s in shard_counts
               for t in sides]
        print("saturation: the fewest workers within 10% of the best push/s, per shard count")
        print(table(["shards", "side", "saturates at workers", "best push/s"], sat))
    parts = []
    if "tcp" in transports:
        ok = sum(r[headers.index("tcp x raw")] >= 0.70 for r in rows)
        parts.append(f"tcp >= 0.70 x raw in {ok}/{len(rows)} cells")
    if "auto" in transports:
        ok = sum(r[headers.index("auto(shm) x raw")] > 1.0 for r in rows)
        parts.append(f"auto > 1.00 x raw in {ok}/{len(rows)} cells")
    print(f"targets: {'; '.join(parts)}.\n")


if __name__ == "__main__":
    main()
