"""nbdist async against TensorFlow's own ParameterServerStrategy, side by side in one run.

What it measures
    The 784-256-256-10 MLP (relu, softmax, SGD 0.05, sparse categorical crossentropy) on
    Fashion-MNIST, batch 64 per worker step, 2 workers and 1 parameter server, all on this
    machine over loopback, each side for the same wall-clock budget (`--warm` + `--seconds` from
    its first completed step):
      nbdist        `nbdist.train(cell, cluster=Cluster.start(3), workers=2, servers=1)`:
                    one hub shard engine, two worker engines (algorithm asgd);
      TF PSS keras  `tf.distribute.experimental.ParameterServerStrategy` with a
                    `ClusterCoordinator` and a custom training loop (TensorFlow's documented
                    way; Keras 3's `model.fit` has no ClusterCoordinator integration): the Keras 3
                    model and optimizer created under `strategy.scope()`, one step function
                    dispatched by `coordinator.schedule`, a per-worker `tf.data` pipeline;
      TF PSS raw    the same loop on plain `tf.Variable`s and a hand-written forward pass and
                    SGD update: TensorFlow without Keras (and the fallback if the
                    Keras model cannot run under the strategy: the script then prints why).
    The TF cluster follows TensorFlow's in-process-cluster pattern (one `tf.distribute.Server`
    per task, `SimpleClusterResolver`), but each server is its own process, like nbdist's
    engines; the coordinator is a child of this script that exits before nbdist starts, so the
    two sides never compete for cores. The nbdist engines stay idle while TF runs.

    Thread budget (2 cores): what nbdist's ClusterBackend gives each of two workers on one
    host, `cpu_count // 2` intra-op threads and `min(T, 2)` inter-op threads; every TF server
    and the coordinator get the same, and the tf.data pipeline one private thread.

    samples/s   steady state: steps completed between `--warm` and the end of the budget, times
                the batch, over that time (nbdist: the hub's sample counters at the Run's polls;
                TF: the results of scheduled steps as they are fetched, in order).
    test acc    accuracy on the 10,000 test images of the weights reached at the end of the
                budget, computed by the same NumPy forward pass for both sides.
    ratio       nbdist samples/s over TF's (median over repeats). Goal: >= 1.5.

    python benchmarks/peers.py                  # 20 s budget + 5 s warm-up, 2 repeats, keras and
                                                # raw
    python benchmarks/peers.py --quick          # 10 s, 1 repeat, keras only
    python benchmarks/peers.py --seconds 30 --repeats 3 --peers keras
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
import numpy as np
from _common import median, spread, table

WORKERS = 2
LR = 0.05
RESULT = "@@result "
STALL_S = 300  # the TF side gives up (and says where it hung) after this long


def threads_per_worker() -> int:
    """nbdist's ClusterBackend: cpu_count // workers on the host."""
    return max(1, (os.cpu_count() or 1) // WORKERS)


def accuracy(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of the MLP's [W1, b1, W2, b2, W3, b3], in NumPy (same for both sides)."""
    h = x
    for i in range(0, len(weights) - 2, 2):
        h = np.maximum(h @ weights[i] + weights[i + 1], 0.0)
    logits = h @ weights[-2] + weights[-1]
    return float((logits.argmax(axis=1) == y).mean())


def test_split() -> tuple[np.ndarray, np.ndarray]:
    from nbdist.datasets import load_fashion_mnist

    _, (x, y) = load_fashion_mnist()
    return x.reshape(-1, 784).astype("float32") / 255.0, y.astype(np.int64)


# -- TensorFlow side: servers and coordinator (child processes) ------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tf_config(threads: int):
    """Servers: the workers' intra-op budget; inter-op threads as TensorFlow's own in-process
    cluster sets them on small machines (num_workers + 1): with fewer, a worker blocked on
    its iterator or a remote variable read can leave no thread for the op it waits for (with
    1 inter-op thread this script's first step never finished). These threads mostly wait."""
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                    inter_op_parallelism_threads=max(min(threads, 2), WORKERS + 1))


def server_main(spec: str, job: str, index: int, threads: int) -> None:
    """Child: one tf.distribute.Server (a worker or the parameter server), until killed."""
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(spec)), job_name=job,
                                  task_index=index, protocol="grpc", config=tf_config(threads))
    server.join()


def write_train_files(folder: Path) -> tuple[str, str]:
    """Fashion-MNIST's training split as raw uint8 files the TF workers read themselves (a
    dataset_fn holding the arrays as constants would ship 188 MB of graph to every worker)."""
    from nbdist.datasets import load_fashion_mnist

    (x, y), _ = load_fashion_mnist()
    xp, yp = folder / "x_train.u8", folder / "y_train.u8"
    xp.write_bytes(np.ascontiguousarray(x, dtype=np.uint8).tobytes())
    yp.write_bytes(np.ascontiguousarray(y, dtype=np.uint8).tobytes())
    return str(xp), str(yp)


def coordinator_main(args: argparse.Namespace) -> None:
    """Child: start the TF cluster, train for the budget, print one RESULT line, exit hard
    (the coordinator's teardown would otherwise log errors about the servers it outlives)."""
    import faulthandler

    # a stalled TF cluster must not hang the script
    faulthandler.dump_traceback_later(STALL_S, exit=True)
    threads = args.threads
    spec = {"worker": [f"localhost:{free_port()}" for _ in range(WORKERS)],
            "ps": [f"localhost:{free_port()}"]}
    servers = [subprocess.Popen([sys.executable, __file__, "--server", json.dumps(spec), job,
                                 str(i), "--threads", str(threads)])
               for job in ("ps", "worker") for i in range(len(spec[job]))]
    result: dict = {}
    try:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(min(threads, 2), WORKERS + 1))
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        result["model"] = args.peer
        if args.peer == "keras":
            try:
                step_fn, read_weights = keras_step(strategy)
            except Exception as exc:  # noqa: BLE001 - reported, then the raw fallback runs
                result["keras_error"] = f"{type(exc).__name__}: {exc}"
                result["model"] = "raw (fallback)"
                step_fn, read_weights = raw_step(strategy)
        else:
            step_fn, read_weights = raw_step(strategy)
        result.update(train_for(tf, strategy, coordinator, step_fn, args))
        x_test, y_test = test_split()
        result["test_acc"] = accuracy(read_weights(), x_test, y_test)
        result["threads"] = {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                             "inter": tf.config.threading.get_inter_op_parallelism_threads()}
    except Exception as exc:  # noqa: BLE001 - the parent prints it
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for p in servers:
            p.kill()
            p.wait()
        print(RESULT + json.dumps(result), flush=True)
        os._exit(0)


def keras_step(strategy):
    """The Keras 3 model and optimizer under the strategy, one gradient step per call."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step, lambda: [np.asarray(v.numpy()) for v in model.weights]


def raw_step(strategy):
    """The same MLP on plain tf.Variables (Glorot-uniform weights, zero biases), plain SGD."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    sizes = [(784, 256), (256, 256), (256, 10)]
    with strategy.scope():
        variables = []
        for fan_in, fan_out in sizes:
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            variables.append(tf.Variable(rng.uniform(-limit, limit,
                                                     (fan_in, fan_out)).astype("float32")))
            variables.append(tf.Variable(np.zeros(fan_out, "float32")))

    def step(x, y):
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(variables) - 2, 2):
                h = tf.nn.relu(h @ variables[i] + variables[i + 1])
            logits = h @ variables[-2] + variables[-1]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
            v.assign_sub(LR * g)
        return loss

    return step, lambda: [np.asarray(v.numpy()) for v in variables]


def train_for(tf, strategy, coordinator, step, args) -> dict:
    """Schedule steps for warm + seconds after the first one completes; steady-state rate."""
    x_path, y_path = args.data

    def dataset_fn():
        x = tf.reshape(tf.io.decode_raw(tf.io.read_file(x_path), tf.uint8), [-1, 784])
        y = tf.io.decode_raw(tf.io.read_file(y_path), tf.uint8)
        ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60000).repeat()
              .batch(args.batch, drop_remainder=True)
              .map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, tf.cast(b, tf.int64)))
              .prefetch(1))
        options = tf.data.Options()
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
        return ds.with_options(options)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(it):
        x, y = next(it)
        return strategy.run(step, args=(x, y))

    t_call = time.monotonic()
    pending: collections.deque = collections.deque()
    done = 0
    stamps: list[tuple[float, int]] = []
    first = None
    last_loss = float("nan")
    while True:
        pending.append(coordinator.schedule(train_step, args=(iterator,)))
        while len(pending) > 4 * WORKERS or (first is None and pending):  # bounded queue
            last_loss = float(pending.popleft().fetch())
            done += 1
            now = time.monotonic()
            stamps.append((now, done))
            if first is None:
                first = now
        if first is not None and time.monotonic() - first >= args.warm + args.seconds:
            break
    coordinator.join()
    t_end = time.monotonic()
    done += len(pending)
    stamps.append((t_end, done))
    t0 = first + args.warm
    start = next(s for s in stamps if s[0] >= t0)
    rate = (done - start[1]) * args.batch / (t_end - start[0])
    return {"rate": rate, "steps": done, "startup": first - t_call, "loss": last_loss}


class Peer:
    """Runs the TF coordinator child for one measurement."""

    def __init__(self, data: tuple[str, str], threads: int):
        self.data, self.threads = data, threads

    def measure(self, peer: str, seconds: float, warm: float, batch: int) -> dict:
        cmd = [sys.executable, __file__, "--coordinator", "--peer", peer, "--seconds", str(seconds),
               "--warm", str(warm), "--batch", str(batch), "--threads", str(self.threads),
               "--data", *self.data]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        raise RuntimeError(f"the TF coordinator child printed no result (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")


# -- nbdist side -----------------------------------------------------------------------------


def measure_nbdist(cluster, seconds: float, warm: float, batch: int) -> dict:
    # _training.CELL: the same MLP and data. No validation during the budget (the TF loop has
    # none); both sides are evaluated on x_test afterwards, the same way (accuracy() below).
    from _training import CELL, FOREVER_EPOCHS, run_for

    import nbdist

    ns: dict = {}
    t_call = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace=ns, workers=WORKERS, servers=1,
                       epochs=FOREVER_EPOCHS, batch_size=batch, no_validation=True, timeout=120)
    timing = run_for(run, seconds, warm)
    t0, t1 = timing["window"]
    weights = [np.asarray(w) for w in ns["model"].get_weights()]
    return {"rate": timing["sampler"].rate(t0, t1), "steps": int(run.nodes["steps"].sum()),
            "startup": timing["first_push"] - t_call,
            "test_acc": accuracy(weights, ns["x_test"], ns["y_test"].astype(np.int64)),
            "loss": float(run.history["loss"].dropna().iloc[-20:].mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 s budget, 1 repeat, keras only")
    parser.add_argument("--seconds", type=float, default=None,
                        help="counted budget (default 20; 10 with --quick)")
    parser.add_argument("--warm", type=float, default=5.0,
                        help="seconds after the first step not counted")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--batch", type=int, default=64, help="per worker step")
    parser.add_argument("--peers", default=None, help="keras,raw (default; keras with --quick)")
    # internal: the child processes
    parser.add_argument("--server", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peer", default="keras", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=threads_per_worker(), help=argparse.SUPPRESS)
    parser.add_argument("--data", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.server:
        server_main(*args.server[:2], int(args.server[2]), args.threads)
        return
    if args.coordinator:
        coordinator_main(args)
        return

    seconds = args.seconds or (10.0 if args.quick else 20.0)
    repeats = args.repeats or (1 if args.quick else 2)
    peers = (args.peers or ("keras" if args.quick else "keras,raw")).split(",")
    threads = threads_per_worker()
    print(f"peers: 784-256-256-10 MLP on Fashion-MNIST, {WORKERS} workers + 1 parameter server, "
          f"batch {args.batch} per worker step, {args.warm:g} s warm-up + {seconds:g} s counted, "
          f"{repeats} repeat(s), {threads} intra-op thread(s) per worker", flush=True)
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {__import__('keras').__version__}", flush=True)
    sides = ["nbdist", *peers]
    results: dict[str, list[dict]] = {s: [] for s in sides}
    cluster = None
    with tempfile.TemporaryDirectory(prefix="nbdist-peers-") as folder:
        peer = Peer(write_train_files(Path(folder)), threads)
        try:
            import nbdist

            cluster = nbdist.Cluster.start(WORKERS + 1)
            for rep in range(repeats):
                for side in (sides if rep % 2 == 0 else sides[::-1]):
                    if side == "nbdist":
                        r = measure_nbdist(cluster, seconds, args.warm, args.batch)
                    else:
                        r = peer.measure(side, seconds, args.warm, args.batch)
                        if "error" in r:
                            raise RuntimeError(f"TF ParameterServerStrategy ({side}) "
                                               f"failed: {r['error']}")
                        if "keras_error" in r:
                            print("  TF's ParameterServerStrategy could not run the Keras 3 model: "
                                  f"{r['keras_error']}\n"
                                  "  -> measured the raw tf.Variable model instead",
                                  flush=True)
                    results[side].append(r)
                    print(f"  [{rep + 1}/{repeats}] {side:<7} {r['rate']:>8,.0f} samples/s  "
                          f"test acc {r['test_acc']:.3f}  steps {r['steps']:,}  "
                          f"(start-up {r['startup']:.1f}s)", flush=True)
        finally:
            if cluster is not None:
                cluster.stop()

    names = {"nbdist": "nbdist async (asgd, 1 hub shard)",
             "keras": "TF PSS + ClusterCoordinator, Keras 3 model",
             "raw": "TF PSS + ClusterCoordinator, raw tf.Variables"}
    base = median([r["rate"] for r in results["nbdist"]])
    rows = []
    for side in sides:
        rs = results[side]
        name = names[side] + (" (fallback: raw)" if any("keras_error" in r for r in rs) else "")
        rate = median([r["rate"] for r in rs])
        rows.append([name, rate, spread([r["rate"] for r in rs]),
                     median([r["test_acc"] for r in rs]), "-" if side == "nbdist" else base / rate])
    print()
    print(table(["side", "samples/s", "range", "test acc", "nbdist x"], rows))
    print(f"\nat equal wall-clock time: {args.warm:g} s warm-up + {seconds:g} s from each side's "
          "first step; goal nbdist >= 1.5x each TF row")
    for side in peers:
        ratio = base / median([r["rate"] for r in results[side]])
        print(f"  vs {side}: {ratio:.2f}x -> {'HOLDS' if ratio >= 1.5 else 'DOES NOT HOLD'}")


if __name__ == "__main__":
    main()
