"""The hub's ASGD push (update + reply copy) with the compiled kernel and with NumPy, against
memcpy.

What it measures
    One ASGD push on a hub shard of N floats, as the hub runs it (`Updater.push(..., into=reply)`:
    `w -= lr * g` and the copy of the new `w` into the worker's reply buffer), on 1 and 2
    threads (`nbdist.hub.threads.BlockPool`), with:
      compiled   `nbdist._kernels.sgd_step_copy`: one pass, the reply written with streaming
                 stores from `kernels.STREAM_MIN` floats on;
      numpy      the NumPy fallback (`NBDIST_KERNELS=0`): the same numbers, cache-blocked.
    Then the same push with the hub applying Keras's momentum and Adam (`--optimizers`), whose
    formulas the kernel also runs in one pass each (NumPy: 6-12 passes per cache block), and
    the compiled push with `--predict-weights` (the last update kept, the reply `w + 1 x` it:
    four NumPy passes more), and that push with `--momentum-correction` too (a moving average
    of the delays and the optimizer's momentum set anew: scalars, no pass over the weights).
    Next to them, in the same run, copies of the same 4N bytes: glibc's `memcpy` (through
    ctypes), `np.copyto`, and the kernel's streaming copy (`copy_stream`, the floor for a pass
    that writes the bytes once).

How to read it
    Each time is the least of `--repeats` rounds of 5 calls, the variants interleaved within a
    round, so a busy moment hits all of them. `x memcpy` = push / glibc memcpy of the same
    bytes: issue 18's target is at most 2.0 at 10M floats. A pass that reads g and w and writes
    w and the reply moves 4 arrays against memcpy's 2, so about 2 is the floor without
    streaming stores' saving.

    python benchmarks/update_kernel.py                       # 1M, 10M and 20M floats
    python benchmarks/update_kernel.py --sizes 10000000 --repeats 9
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import time

import _common  # noqa: F401 - sys.path for a checkout
import numpy as np
from _common import table

from nbdist.algorithms import kernels
from nbdist.algorithms.optimizers import server_optimizer_spec
from nbdist.core.plan import Plan
from nbdist.core.updater import make_updater
from nbdist.hub.threads import BlockPool

_libc = ctypes.CDLL(None)
_libc.memcpy.restype = ctypes.c_void_p
_libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


@contextlib.contextmanager
def numpy_kernels():
    """The NumPy fallback, as `NBDIST_KERNELS=0` chooses it, for what runs inside."""
    saved = kernels.COMPILED
    kernels.COMPILED = None
    try:
        yield
    finally:
        kernels.COMPILED = saved


def asgd_updater(size: int, threads: int, pools: list[BlockPool], optimizer: str | None = None,
                 predict: bool = False, correct: bool = False):
    """The hub's updater for ASGD with plain SGD (the fused pass), or with the hub optimizer
    `optimizer` ("momentum", "adam": Keras's formulas, `--server-optimizer`); `correct`:
    with --momentum-correction."""
    plan = Plan(num_workers=2, num_samples=1000, epochs=1, batch_size=64, lr=0.01,
                has_validation=False, algorithm="asgd", predict_weights=predict,
                momentum_correction=correct)
    spec = server_optimizer_spec(optimizer, 0.01, [size]) if optimizer else None
    updater = make_updater(plan, {}, spec, size)
    if threads > 1:
        pools.append(BlockPool(threads))
        updater.use_blocks(pools[-1], threads)
    return updater


def measure(size: int, repeats: int, optimizers: list[str]) -> list[list[object]]:
    w, g, out = (np.ones(size, np.float32) for _ in range(3))
    g *= np.float32(1e-3)
    pools: list[BlockPool] = []
    variants = {
        "memcpy (glibc)": lambda: _libc.memcpy(out.ctypes.data, w.ctypes.data, w.nbytes),
        "np.copyto": lambda: np.copyto(out, w),
    }
    if kernels.COMPILED is not None:
        variants["streaming copy (kernel)"] = lambda: kernels.COMPILED.copy_stream(out, w)
    for threads in (1, 2):
        if kernels.COMPILED is not None:
            compiled = asgd_updater(size, threads, pools)
            variants[f"push, compiled, {threads} thread(s)"] = (
                lambda u=compiled: u.push(0, w, g, 0, into=out))
        with numpy_kernels():
            numpy_updater = asgd_updater(size, threads, pools)

        def numpy_push(u=numpy_updater):
            with numpy_kernels():
                u.push(0, w, g, 0, into=out)

        variants[f"push, numpy, {threads} thread(s)"] = numpy_push
    for optimizer in optimizers:  # the optimizers' formulas, one thread
        for kind in ("compiled", "numpy") if kernels.COMPILED is not None else ("numpy",):
            with contextlib.nullcontext() if kind == "compiled" else numpy_kernels():
                updater = asgd_updater(size, 1, pools, optimizer)

            def optimizer_push(u=updater, numpy=kind == "numpy"):
                with numpy_kernels() if numpy else contextlib.nullcontext():
                    u.push(0, w, g, 0, into=out)

            variants[f"push, {optimizer}, {kind}, 1 thread"] = optimizer_push
        if kernels.COMPILED is not None:
            predicting = asgd_updater(size, 1, pools, optimizer, predict=True)

            def predicting_push(u=predicting):
                u.push(0, w, g, 1)
                u.read_ahead(w, 1.0, out)

            variants[f"push, {optimizer}, compiled, --predict-weights"] = predicting_push
            correcting = asgd_updater(size, 1, pools, optimizer, predict=True, correct=True)

            def correcting_push(u=correcting):
                u.push(0, w, g, 1)
                u.read_ahead(w, 1.0, out)

            variants[f"push, {optimizer}, compiled, --predict-weights --momentum-correction"] = (
                correcting_push)
    best = dict.fromkeys(variants, float("inf"))
    try:
        for _ in range(repeats):
            for name, fn in variants.items():
                fn()  # warm: page faults, the pool's threads
                for _ in range(5):
                    t0 = time.perf_counter()
                    fn()
                    best[name] = min(best[name], time.perf_counter() - t0)
    finally:
        for pool in pools:
            pool.close()
    memcpy = best["memcpy (glibc)"]
    floor = best.get("streaming copy (kernel)", float("nan"))
    return [[f"{size:,}", name, 1e3 * t, t / memcpy, t / floor] for name, t in best.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 10_000_000, 20_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--optimizers", nargs="*", default=["momentum", "adam"],
                        help="hub optimizers to time too (Keras's formulas; none: only SGD)")
    args = parser.parse_args()
    print(f"update kernel: {kernels.IMPLEMENTATION}; sizes {args.sizes}, {args.repeats} rounds "
          f"of 5 calls; load {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    rows = []
    for size in args.sizes:
        rows += measure(size, args.repeats, args.optimizers)
        print(f"  {size:,} floats done", flush=True)
    print()
    print(table(["floats", "pass", "ms", "x memcpy", "x streaming copy"], rows))
    print(f"\nload: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
