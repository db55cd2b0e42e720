"""The exchange part of a `--mode sync --collective torch` step against a raw allreduce.

What it measures
    Two rank processes per Keras backend (TensorFlow, JAX, PyTorch), each with its share of the
    host's cores as a sync rank's engine has it (`configure_engine`) and the quickstart's
    784-256-256-10 MLP (269,322 parameters) compiled with `SGD(0.05, momentum=0.9)`, joined in
    one torch.distributed Gloo group made from nbdist's signed store on 127.0.0.1, as a sync
    run makes it (`nbdist.modes.sync.collective.TorchCollective`). Back to back, after a
    warm-up, `--steps` times each, median per call, interleaved in rounds:
      raw allreduce    the Gloo group's allreduce of a float32 buffer of the same size as
                       nbdist's (the flat gradient plus the control: 3 values and one batch
                       size per rank), through torch.from_numpy;
      raw + apply      that allreduce, then the Keras optimizer's `apply_gradients` of the
                       buffer split into the variables' shapes, written by hand;
      nbdist           the rank's step after its gradient (`compile_apply`): the batch weight,
                       the control into the same buffer, the allreduce, the optimizer;
      nbdist CODEC     the same with each of --codecs (powersgd:R: its allreduces of P and of
                       Q, its factors and error feedback, then the optimizer).
    "x raw" = nbdist / raw allreduce (what the step adds around the collective, the
    optimizer's update included); "x raw+apply" = nbdist / raw + apply (what nbdist's own
    code adds). Horovod's step against a raw Horovod allreduce: `benchmarks/sync_vs_async.py`.

    python benchmarks/sync_exchange.py                  # 3 backends, 200 steps each (~1 min)
    python benchmarks/sync_exchange.py --backends jax --steps 500
    python benchmarks/sync_exchange.py --backends tensorflow --codecs powersgd:4
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
import numpy as np
from _common import median, table

RANKS = 2


def _rank(rank: int, backend: str, key: bytes, env: dict, steps: int, codecs: list[str],
          out) -> None:
    os.environ["KERAS_BACKEND"] = backend  # before Keras loads in this process
    from nbdist.engine.keras_backend import configure_engine

    # each rank's share of the host's cores, as a sync rank is configured on its engine
    configure_engine(backend, max(1, (os.cpu_count() or 1) // RANKS), rank)
    import keras
    import torch
    from keras import ops

    from nbdist.core.compression import parse
    from nbdist.core.low_rank import LowRankReducer
    from nbdist.engine.blas_threads import one_blas_thread
    from nbdist.modes.sync.collective import TorchCollective
    from nbdist.modes.sync.rendezvous import SignedClient

    env = {**env, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(RANKS),
           "HOROVOD_GLOO_IFACE": "lo"}
    collective = TorchCollective(SignedClient(key, "bench", str(rank), env), env, 60.0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    trainable = model.trainable_variables
    model.optimizer.build(trainable)
    size = sum(int(np.prod(v.shape)) for v in trainable)
    control = np.zeros(3 + RANKS, np.float32)
    grad = np.random.default_rng(rank).normal(scale=1e-4, size=size).astype(np.float32)
    step = collective.compile_apply(model, size, parse("none"))
    shapes = [tuple(v.shape) for v in trainable]
    coded = {}
    for spec in codecs:
        codec = parse(spec).bind(shapes, 0, size)
        reducer = (LowRankReducer(codec.matrices, int(codec.amount), size, seed=0)
                   if codec.name == "powersgd" else None)
        coded[f"nbdist {codec}"] = collective.compile_apply(model, size, codec, reducer)
    buffer = np.zeros(size + control.size, np.float32)
    offsets = np.cumsum([0, *(int(np.prod(v.shape)) for v in trainable)]).tolist()

    def raw():
        collective.group.allreduce([torch.from_numpy(buffer)]).wait()

    def raw_apply():
        raw()
        model.optimizer.apply_gradients(zip(
            [ops.convert_to_tensor(buffer[a:b].reshape(v.shape), v.dtype)
             for a, b, v in zip(offsets[:-1], offsets[1:], trainable, strict=True)],
            trainable, strict=True))

    def nbdist_step():
        step(grad, 0.5, control)

    variants = {"raw allreduce": raw, "raw + apply": raw_apply, "nbdist": nbdist_step,
                **{name: (lambda s=s: s(grad, 0.5, control)) for name, s in coded.items()}}
    times: dict[str, list[float]] = {name: [] for name in variants}
    with one_blas_thread():  # as a powersgd rank runs (nbdist.engine.blas_threads)
        for call in variants.values():  # warm-up (JAX compiles, Gloo connects)
            for _ in range(10):
                call()
        for _ in range(max(1, steps // 20)):  # rounds of 20, interleaved
            for name, call in variants.items():
                for _ in range(20):
                    t0 = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - t0)
    out.put((rank, {name: median(values) for name, values in times.items()}))
    collective.close()


def measure(backend: str, steps: int, codecs: list[str]) -> dict:
    from nbdist.hub.protocol import new_key
    from nbdist.modes.sync.rendezvous import signed_store

    key = new_key()
    server = signed_store(("127.0.0.1", 0), key, "bench")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1])}
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, backend, key, env, steps, codecs, out))
             for r in range(RANKS)]
    try:
        for process in ranks:
            process.start()
        said = dict(out.get(timeout=600) for _ in ranks)
    finally:
        for process in ranks:
            process.join(30)
        server.shutdown()
        server.server_close()
    return said[0]  # rank 0's medians (the ranks wait for each other in every call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--codecs", default="",
                        help="--compression values to time besides none, e.g. powersgd:4,fp16")
    args = parser.parse_args()
    codecs = [c for c in args.codecs.split(",") if c]
    rows, coded = [], []
    for backend in args.backends:
        m = measure(backend, args.steps, codecs)
        rows.append([backend, f"{m['raw allreduce'] * 1e3:.2f}", f"{m['raw + apply'] * 1e3:.2f}",
                     f"{m['nbdist'] * 1e3:.2f}", f"{m['nbdist'] / m['raw allreduce']:.2f}",
                     f"{m['nbdist'] / m['raw + apply']:.2f}"])
        coded += [[backend, name, f"{t * 1e3:.2f}", f"{t / m['raw allreduce']:.2f}",
                   f"{t / m['nbdist']:.2f}"]
                  for name, t in m.items() if name.startswith("nbdist ")]
    print(table(["backend", "raw allreduce ms", "raw + apply ms", "nbdist ms", "x raw",
                 "x raw+apply"], rows))
    if coded:
        print()
        print(table(["backend", "step", "ms", "x raw", "x nbdist"], coded))
    print(f"\nload: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
