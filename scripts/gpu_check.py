"""Check a GPU node: train the quickstart (scripts/demo.py's cell) with `--mode async` and
`--mode sync` on a local cluster of this node, then print, per worker engine, which devices
TensorFlow had and where the model's weights and a fresh op were placed.

    python scripts/gpu_check.py                 # one worker per GPU (two on a node without one)
    python scripts/gpu_check.py --workers 4 --epochs 2 --modes async

Exit status 0 when every worker trained on a GPU of its own (or, on a node without a GPU, on
the CPU, saying so), 1 otherwise: two workers on one GPU while another was idle, a worker on the
CPU although the node has GPUs, or a run that failed. Needs `pip install "nbdist[gpu]"` (and
`make horovod` for sync; it says whether Horovod was built with NCCL).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import CELL  # the quickstart's cell, as `make demo` trains it


def engine_devices() -> dict:
    """On a worker engine after a run: its host and devices, and where its model's weights and
    a fresh op live (TensorFlow places both on the engine's one visible GPU, if any). Imports
    its own modules: it travels to the engines by value."""
    import os
    import socket

    import tensorflow as tf

    from nbdist.engine import gpu
    from nbdist.engine.run_cell import engine_namespace

    model = engine_namespace().get("model")
    weights = (model.trainable_variables[0].value.device
               if model is not None and model.trainable_variables else "")
    x = tf.ones((64, 64))
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "cuda_build": tf.test.is_built_with_cuda(),
            "gpus_listed": len(tf.config.list_physical_devices("GPU")),
            "visible": [d.name for d in tf.config.get_visible_devices("GPU")],
            "nvml_index": gpu._chosen,  # noqa: SLF001 - the device the monitor reads
            "gpu": gpu.GpuMonitor().info().get("gpu", ""),
            "weights_on": weights.split("device:")[-1],
            "op_on": tf.matmul(x, x).device.split("device:")[-1]}


def horovod_info() -> dict:
    """On an engine: how Horovod was built (nbdist's mark, NCCL or not)."""
    from nbdist.modes.sync.network import horovod_build

    try:
        import horovod.tensorflow as hvd

        return {"build": horovod_build(), "nccl": bool(hvd.nccl_built()),
                "gloo": bool(hvd.gloo_built())}
    except ImportError as exc:
        return {"error": str(exc)}


def verdict(rows: list[dict]) -> list[str]:
    """What is wrong with the devices the workers used (empty: all is well). Each worker on its
    own GPU while the host has enough; on a host without GPUs, the CPU is expected.

    Example:
        >>> ok = {"host": "n1", "gpus_listed": 2, "op_on": "GPU:0", "weights_on": "GPU:0"}
        >>> verdict([{**ok, "nvml_index": 0, "engine": 1}, {**ok, "nvml_index": 1, "engine": 2}])
        []
        >>> verdict([{**ok, "nvml_index": 0, "engine": 1},
        ...          {**ok, "nvml_index": 0, "engine": 2}])[0][:38]
        'engines 1, 2 on host n1 share GPU 0 wh'
    """
    problems, by_gpu = [], {}
    for r in rows:
        if r["gpus_listed"] and not (r["op_on"].startswith("GPU")
                                     and r["weights_on"].startswith("GPU")):
            problems.append(f"engine {r['engine']} on host {r['host']} trained on the CPU (ops on "
                            f"{r['op_on']}, weights on {r['weights_on']}) although TensorFlow "
                            f"lists {r['gpus_listed']} GPU(s)")
        if r["gpus_listed"]:
            by_gpu.setdefault((r["host"], r["nvml_index"]), []).append(r)
    for (host, index), same in sorted(by_gpu.items(), key=str):
        workers_here = sum(r["host"] == host for r in rows)
        if len(same) > 1 and workers_here <= same[0]["gpus_listed"]:
            problems.append(f"engines {', '.join(str(r['engine']) for r in same)} on host {host} "
                            f"share GPU {index} while the host has {same[0]['gpus_listed']} GPUs "
                            f"for {workers_here} workers")
    return problems


def show(mode: str, rows: list[dict]) -> None:
    print(f"\n{mode}: devices per worker engine")
    print(f"  {'engine':>6}  {'host':<14} {'CUDA build':<10} {'GPUs':>4}  {'visible':<24} "
          f"{'GPU (NVML)':<24} {'weights on':<11} {'ops on':<8}")
    for r in rows:
        name = (f"{r['nvml_index']}: {r['gpu']}" if r["gpu"] else
                "-" if r["nvml_index"] is None else str(r["nvml_index"]))
        print(f"  {r['engine']:>6}  {r['host']:<14} {r['cuda_build']!s:<10} {r['gpus_listed']:>4}  "
              f"{','.join(r['visible']) or '-':<24} {name:<24} "
              f"{r['weights_on'] or '-':<11} {r['op_on']:<8}")


def train(cluster, mode: str, workers: int, epochs: int) -> list[dict]:
    """Train the quickstart in `mode`; each worker engine's `engine_devices()`, and its GPU as
    the run's node table shows it."""
    import nbdist

    start = time.time()
    run = nbdist.train(CELL, cluster=cluster, namespace={}, mode=mode, workers=workers,
                       epochs=epochs, batch_size=64, wait=True)
    accuracy = run.history["val_accuracy"].dropna()
    print(f"{mode}: {run.status} in {time.time() - start:.1f}s, validation accuracy "
          f"{accuracy.iloc[-1] if len(accuracy) else float('nan'):.3f}")
    engines = [int(e) for e in run.nodes["engine"].dropna()]
    return [{**r, "engine": e}
            for e, r in zip(engines, cluster.client[engines].apply_sync(engine_devices),
                            strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=0,
                        help="workers per run (default: one per GPU, 2 without)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--modes", default="async,sync", help="comma-separated: async, sync")
    args = parser.parse_args(argv)
    import nbdist
    from nbdist.cluster.engines import Cluster

    gpus = _gpus_here()
    workers = args.workers or max(2, len(gpus))
    print(f"This node: {len(gpus)} GPU(s) {gpus or ''}; {workers} workers per run, "
          f"{args.epochs} epoch(s)")
    cluster = Cluster.start(workers + 1)  # async: one hub shard besides the workers
    problems = []
    try:
        print("Horovod on the engines:", cluster.client[0].apply_sync(horovod_info))
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            try:
                rows = train(cluster, mode, workers, args.epochs)
            except nbdist.errors.NbdistError as exc:
                problems.append(f"{mode}: the run failed: {type(exc).__name__}: {exc}")
                continue
            show(mode, rows)
            problems += [f"{mode}: {p}" for p in verdict(rows)]
    finally:
        cluster.stop()
    print("\n" + ("\n".join(f"PROBLEM {p}" for p in problems) if problems else
                  ("OK: every worker trained on a GPU of its own." if gpus else
                   "OK: no GPU on this node; every worker trained on the CPU.")))
    return 1 if problems else 0


def _gpus_here() -> list[str]:
    """The node's GPUs as nvidia-smi lists them (empty without a driver)."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return [line.split(" (UUID")[0] for line in out.stdout.splitlines() if line.startswith("GPU ")]


if __name__ == "__main__":
    sys.exit(main())
