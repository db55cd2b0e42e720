"""What streaming a push in chunks would gain over TCP: a projection for issue 18's TCP targets.

What it measures
    A worker and a hub process on this machine over ZeroMQ TCP (DEALER to ROUTER, loopback),
    `--params` float32 each way, three ways, interleaved in one process run:
      raw        the bytes echoed back, nothing checked (hub_throughput.py's baseline);
      one        as nbdist's push today: the worker MACs the gradient (keyed BLAKE3) and sends
                 it as one message; the hub checks the MAC, applies w -= lr g in place, MACs w
                 and replies; the worker checks the reply's MAC;
      chunks K   the same work cut into K messages of params/K floats, each MAC'd on its own:
                 the worker queues every chunk (ZeroMQ sends without waiting), then takes the
                 K replies, so the worker's MAC of chunk k+1, the transfer, and the hub's check,
                 update and reply of chunk k can overlap on the two cores.
    Round trips per second, medians of `--repeats`, ratio to raw in the same run. No nbdist
    code runs here: it is a model of a protocol nbdist does not have, to tell whether building
    it would reach "TCP at least 0.70 of raw pyzmq".

    python benchmarks/tcp_chunks.py                     # 269,322 and 1,000,000 params (~1 min)
    python benchmarks/tcp_chunks.py --params 1000000 --chunks 4 16 --repeats 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import _common  # noqa: F401 - sys.path before nbdist loads
from _common import median, table

KEY = bytes(range(32))
TAG = 32


def _hub(port_queue, params: int) -> None:
    """The hub process: echo, or check + update + reply, per message (mode in its first byte)."""
    import numpy as np
    import zmq
    from blake3 import blake3

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    port_queue.put(port)
    weights = np.zeros(params, np.float32)
    while True:
        ident, mode, tag, offset, payload = sock.recv_multipart(copy=False)
        kind = bytes(mode.buffer)
        if kind == b"q":
            break
        if kind == b"r":  # raw echo
            sock.send_multipart([ident, mode, tag, offset, payload], copy=False)
            continue
        if blake3(payload.buffer, key=KEY).digest() != bytes(tag.buffer):
            raise RuntimeError("bad MAC")
        start = int.from_bytes(offset.buffer, "little")
        grad = np.frombuffer(payload.buffer, np.float32)
        part = weights[start:start + grad.size]
        part -= np.float32(0.01) * grad
        reply = part.tobytes()  # the reply's own buffer, as the hub copies out today
        sock.send_multipart([ident, mode, blake3(reply, key=KEY).digest(), offset, reply],
                            copy=False)
    sock.close(0)
    ctx.term()


def round_trips(sock, grad, chunks: int, mode: bytes, seconds: float) -> float:
    """Round trips per second of `grad` cut into `chunks` messages (`mode` b"r" raw, b"m" MAC'd)."""
    import numpy as np
    from blake3 import blake3

    bounds = np.linspace(0, grad.size, chunks + 1).astype(int)
    parts = [(int(lo), grad[lo:hi].view(np.uint8))
             for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    done, end = 0, time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < end:
        for lo, part in parts:
            tag = blake3(part, key=KEY).digest() if mode == b"m" else bytes(TAG)
            sock.send_multipart([mode, tag, lo.to_bytes(8, "little"), part], copy=False)
        for _ in parts:
            _, tag, _, payload = sock.recv_multipart(copy=False)
            if mode == b"m" and blake3(payload.buffer, key=KEY).digest() != bytes(tag.buffer):
                raise RuntimeError("bad reply MAC")
        done += 1
    return done / (time.perf_counter() - t0)


def measure(params: int, chunk_counts: list[int], repeats: int, seconds: float) -> dict:
    import numpy as np
    import zmq

    spawn = mp.get_context("spawn")  # a fresh interpreter, as nbdist's hub process is
    ports = spawn.Queue()
    hub = spawn.Process(target=_hub, args=(ports, params), daemon=True)
    hub.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{ports.get(timeout=60)}")
    grad = np.random.default_rng(0).random(params, dtype=np.float32)
    sides = [("raw", b"r", 1), ("one", b"m", 1)] + [(f"chunks {k}", b"m", k) for k in chunk_counts]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    try:
        for _name, mode, k in sides:  # warm-up
            round_trips(sock, grad, k, mode, 0.2)
        for rep in range(repeats):
            for name, mode, k in (sides if rep % 2 == 0 else sides[::-1]):
                rates[name].append(round_trips(sock, grad, k, mode, seconds))
        sock.send_multipart([b"q", b"", b"", b""])
    finally:
        sock.close(0)
        ctx.term()
        hub.join(10)
        if hub.is_alive():
            hub.kill()
    return {name: median(values) for name, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, nargs="+", default=[269_322, 1_000_000])
    parser.add_argument("--chunks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per side and repeat")
    args = parser.parse_args()
    rows = []
    for params in args.params:
        result = measure(params, args.chunks, args.repeats, args.seconds)
        raw = result["raw"]
        for name, rate in result.items():
            rows.append([f"{params:,}", name, rate, 1e3 / rate, rate / raw])
    print(f"TCP loopback, worker and hub processes, medians of {args.repeats} x "
          f"{args.seconds:.1f} s")
    print(table(["params", "side", "round trips/s", "ms each", "x raw"], rows))
    print("  one = nbdist's protocol today (one message, 4 keyed-BLAKE3 passes per round trip);\n"
          "  chunks K = the same MACs and update cut into K messages, pipelined; "
          "target x raw >= 0.70")


if __name__ == "__main__":
    main()
