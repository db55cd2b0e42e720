"""Check a GPU node: train the quickstart (scripts/demo.py's cell) on a local cluster of this
node, on each Keras backend installed, and print, per worker engine, which devices the backend
had and where the model's weights and a fresh op were placed; then the run's samples/s and
accuracy against plain `model.fit` on the same device.

    python scripts/gpu_check.py                    # every backend installed, its modes
    python scripts/gpu_check.py --backends torch --modes async,local --workers 4 --epochs 2
    python scripts/gpu_check.py --offline .whl     # a machine without network (below)

Modes by default: TensorFlow async and sync (Horovod); JAX and PyTorch async and local (in
this process). One worker per GPU (two on a node without one).

Exit status 0 when every worker trained on a GPU of its own (or, on a node without a GPU, on
the CPU, saying so), 1 otherwise: two workers on one GPU while another was idle, a worker on the
CPU although the node has GPUs, or a run that failed. Needs `pip install "nbdist[gpu]"` for
TensorFlow (and `make horovod` for sync; it says whether Horovod was built with NCCL), or
"jax[cuda12]" or PyTorch's CUDA build for those backends.

A GPU machine with PyTorch and JAX but no network, no Keras and no Jupyter packages: here,
`python scripts/gpu_wheels.py` gathers their wheels (for its Python) and a slice of
Fashion-MNIST into `.whl/`; copy the checkout with that folder there and run
`python3 scripts/gpu_check.py --offline .whl`, which installs them into a temporary folder
with pip, offline, and runs the check with nbdist from the checkout.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import CELL  # the quickstart's cell, as `make demo` trains it

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}  # backend: its module
DEFAULT_MODES = {"tensorflow": "async,sync", "jax": "async,local", "torch": "async,local"}


def where(tensor) -> str:
    """'GPU:i' or 'CPU:0': where a tensor or variable value of any Keras backend lives."""
    if tensor is None:
        return ""
    if callable(getattr(tensor, "devices", None)):  # a JAX array
        device = next(iter(tensor.devices()))
        return f"{'CPU' if device.platform == 'cpu' else 'GPU'}:{device.id}"
    device = tensor.device
    if isinstance(device, str):  # TensorFlow: '/job:localhost/replica:0/task:0/device:GPU:0'
        return device.split("device:")[-1]
    return f"{'CPU' if device.type == 'cpu' else 'GPU'}:{device.index or 0}"  # a torch.device


def devices_here(model) -> dict:
    """This process's backend, the GPUs it lists, and where `model`'s weights and a fresh op
    live. Imports its own modules: it travels to the engines by value."""
    import os
    import socket

    import keras

    from nbdist.engine import gpu

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        cuda, count = tf.test.is_built_with_cuda(), len(tf.config.list_physical_devices("GPU"))
        visible = ",".join(d.name for d in tf.config.get_visible_devices("GPU"))
    elif backend == "torch":
        import torch

        cuda, count = torch.version.cuda is not None, torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    else:
        import jax

        try:
            count = len(jax.devices("gpu"))
        except RuntimeError:  # a CPU build of jaxlib, or no driver
            count = 0
        cuda, visible = count > 0, os.environ.get("CUDA_VISIBLE_DEVICES", "")
    weights = (model.trainable_variables[0].value
               if model is not None and model.trainable_variables else None)
    ones = keras.ops.ones((64, 64))
    return {"host": socket.gethostname(), "pid": os.getpid(), "backend": backend,
            "cuda_build": cuda, "gpus_listed": count, "visible": visible.split(",") if visible
            else [], "nvml_index": gpu._chosen,  # noqa: SLF001 - the device the monitor reads
            "gpu": gpu.GpuMonitor().info().get("gpu", ""), "weights_on": where(weights),
            "op_on": where(keras.ops.matmul(ones, ones))}


def engine_devices() -> dict:
    """On a worker engine after a run: `devices_here` (pushed there first: ipyparallel sends a
    function's code, not the functions it calls) for the model the run left there."""
    from nbdist.engine.run_cell import engine_namespace

    return devices_here(engine_namespace().get("model"))


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
                            f"{r['op_on']}, weights on {r['weights_on']}) although "
                            f"{r.get('backend', 'tensorflow')} lists {r['gpus_listed']} GPU(s)")
        if r["gpus_listed"]:
            by_gpu.setdefault((r["host"], r["nvml_index"]), []).append(r)
    for (host, index), same in sorted(by_gpu.items(), key=str):
        workers_here = sum(r["host"] == host for r in rows)
        if len(same) > 1 and workers_here <= same[0]["gpus_listed"]:
            problems.append(f"engines {', '.join(str(r['engine']) for r in same)} on host {host} "
                            f"share GPU {index} while the host has {same[0]['gpus_listed']} GPUs "
                            f"for {workers_here} workers")
    return problems


def show(label: str, rows: list[dict]) -> None:
    print(f"\n{label}: devices per worker engine")
    print(f"  {'engine':>6}  {'host':<14} {'CUDA build':<10} {'GPUs':>4}  {'visible':<24} "
          f"{'GPU (NVML)':<24} {'weights on':<11} {'ops on':<8}")
    for r in rows:
        name = (f"{r['nvml_index']}: {r['gpu']}" if r["gpu"] else
                "-" if r["nvml_index"] is None else str(r["nvml_index"]))
        print(f"  {r['engine']:>6}  {r['host']:<14} {r['cuda_build']!s:<10} {r['gpus_listed']:>4}  "
              f"{','.join(r['visible']) or '-':<24} {name:<24} "
              f"{r['weights_on'] or '-':<11} {r['op_on']:<8}")


def fit_baseline(epochs: int) -> dict:
    """Plain `model.fit` of the quickstart in this process, on its default device: samples/s
    from the end of its first step (its compilation left out, as a run's figure starts at its
    first push) and test accuracy."""
    import keras

    namespace: dict = {}
    exec(CELL, namespace)  # noqa: S102 - the script's own cell
    model, (x, y) = namespace["model"], (namespace["x_train"], namespace["y_train"])
    first_step_done: list[float] = []
    mark = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: first_step_done or first_step_done.append(
            time.perf_counter()))
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0, callbacks=[mark])
    seconds = time.perf_counter() - first_step_done[0]
    accuracy = model.evaluate(namespace["x_test"], namespace["y_test"], verbose=0)[1]
    return {"samples_per_s": (epochs * len(x) - 64) / seconds, "accuracy": float(accuracy),
            "devices": {**devices_here(model), "engine": "kernel"}}


def train(cluster, mode: str, workers: int, epochs: int) -> tuple[list[dict], dict]:
    """Train the quickstart in `mode`: each worker engine's `engine_devices()` (local: this
    process's), and the run's samples/s (first push to last) and validation accuracy."""
    import nbdist

    namespace: dict = {}
    run = nbdist.train(CELL, cluster=cluster, namespace=namespace, mode=mode,
                       workers=1 if mode == "local" else workers,
                       epochs=epochs, batch_size=64, wait=True)
    accuracy = run.history["val_accuracy"].dropna()
    seconds = run.history["time"].max()
    figures = {"accuracy": float(accuracy.iloc[-1]) if len(accuracy) else float("nan"),
               "samples_per_s": float(run.nodes["samples"].sum() / seconds) if seconds else 0.0}
    print(f"{mode}: {run.status}, {figures['samples_per_s']:,.0f} samples/s, validation "
          f"accuracy {figures['accuracy']:.3f}")
    if mode == "local":
        return [{**devices_here(namespace.get("model")), "engine": "kernel"}], figures
    engines = [int(e) for e in run.nodes["engine"].dropna()]
    view = cluster.client[engines]
    view.push({"devices_here": devices_here, "where": where}, block=True)  # what it calls there
    return ([{**r, "engine": e}
             for e, r in zip(engines, view.apply_sync(engine_devices), strict=True)], figures)


def check_backend(backend: str, modes: list[str], workers: int, epochs: int) -> list[str]:
    """Every mode of one backend on one local cluster; the problems found."""
    import nbdist
    from nbdist.cluster.engines import Cluster

    print(f"\n=== Keras on {backend}: {', '.join(modes)} ===")
    baseline = fit_baseline(epochs)
    print(f"fit: {baseline['samples_per_s']:,.0f} samples/s, test accuracy "
          f"{baseline['accuracy']:.3f}, on {baseline['devices']['op_on']}")
    cluster = Cluster.start(workers + 1)  # async: one hub shard besides the workers
    problems = []
    try:
        if "sync" in modes and backend == "tensorflow":
            print("Horovod on the engines:", cluster.client[0].apply_sync(horovod_info))
        for mode in modes:
            try:
                rows, figures = train(cluster, mode, workers, epochs)
            except nbdist.errors.NbdistError as exc:
                problems.append(f"{backend} {mode}: the run failed: {type(exc).__name__}: {exc}")
                continue
            print(f"{mode}: {figures['samples_per_s'] / baseline['samples_per_s']:.2f}x fit's "
                  f"samples/s, accuracy {figures['accuracy'] - baseline['accuracy']:+.3f} "
                  "against fit's")
            show(f"{backend} {mode}", rows)
            problems += [f"{backend} {mode}: {p}" for p in verdict(rows)]
    finally:
        cluster.stop()
    return problems


def install_offline(folder: Path, argv: list[str]) -> int:
    """Install the wheels `scripts/gpu_wheels.py` gathered into a temporary folder, with no
    network, then run this check again with them and nbdist from this checkout on the path
    (and the folder's Fashion-MNIST as NBDIST_DATA)."""
    wheels = sorted(str(w) for w in folder.glob("*.whl"))
    if not wheels:
        print(f"no wheels in {folder}: run `python scripts/gpu_wheels.py` where pip reaches "
              "PyPI, and copy the folder here", file=sys.stderr)
        return 2
    site = Path(tempfile.gettempdir()) / "nbdist-gpu-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                    *wheels], check=True)
    paths = [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
           "NBDIST_DATA": str(folder / "data")}
    print(f"installed {len(wheels)} wheels into {site} (offline); nbdist from {ROOT}", flush=True)
    return subprocess.run([sys.executable, __file__, *argv], env=env, check=False).returncode


def installed_backends() -> list[str]:
    import importlib.util

    return [b for b, module in BACKENDS.items() if importlib.util.find_spec(module)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="",
                        help="comma-separated: tensorflow, jax, torch (default: those installed)")
    parser.add_argument("--modes", default="",
                        help="comma-separated: async, local, sync (default: per backend)")
    parser.add_argument("--workers", type=int, default=0,
                        help="workers per run (default: one per GPU, 2 without)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--offline", metavar="FOLDER",
                        help="first install the wheels scripts/gpu_wheels.py put in FOLDER")
    args = parser.parse_args(argv)
    rest = list(sys.argv[1:] if argv is None else argv)
    if args.offline:
        i = rest.index("--offline")
        return install_offline(Path(args.offline).resolve(), rest[:i] + rest[i + 2:])
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] or installed_backends()
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends {','.join(unknown)}: expected some of {', '.join(BACKENDS)}")
    if len(backends) > 1:  # Keras takes its backend once per process: one process each
        codes = [subprocess.run([sys.executable, __file__, *rest, "--backends", b],
                                check=False).returncode for b in backends]
        return max(codes)
    (backend,) = backends
    os.environ["KERAS_BACKEND"] = backend  # before anything imports Keras
    # fit here and the engines share this node's GPUs: JAX takes what it needs, not 75% each
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    gpus = _gpus_here()
    workers = args.workers or max(2, len(gpus))
    modes = [m.strip() for m in (args.modes or DEFAULT_MODES[backend]).split(",") if m.strip()]
    print(f"This node: {len(gpus)} GPU(s) {gpus or ''}; {workers} workers per run, "
          f"{args.epochs} epoch(s)", flush=True)
    problems = check_backend(backend, modes, workers, args.epochs)
    print("\n" + ("\n".join(f"PROBLEM {p}" for p in problems) if problems else
                  ("OK: every worker trained on a GPU of its own." if gpus else
                   "OK: no GPU on this node; every worker trained on the CPU.")))
    return 1 if problems else 0


def _gpus_here() -> list[str]:
    """The node's GPUs as nvidia-smi lists them (empty without a driver)."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return [line.split(" (UUID")[0] for line in out.stdout.splitlines() if line.startswith("GPU ")]


if __name__ == "__main__":
    sys.exit(main())
