"""Synchronous (Horovod allreduce) against asynchronous (parameter hub) training, 2 workers.

What it measures
    The 784-256-256-10 MLP (SGD 0.05, batch 64 per worker) on Fashion-MNIST, trained for the
    same number of epochs (`--epochs`, default 2) on a local cluster of 3 engines
    (`nbdist.Cluster.start(3)`) with 2 workers, three ways:
      sync       `mode="sync"`: Horovod allreduce of one flat gradient buffer per step (the
                 rendezvous and the metrics hub run in this process; ranks on 2 engines);
      asgd       `mode="async", algorithm="asgd"`: hub on the third engine, w -= lr g;
      ddc-asgd   `mode="async", algorithm="ddc-asgd"`: adaptive delay compensation plus
                 delay-weighted momentum on the hub.
    Modes are interleaved within each repeat (order flipped every repeat); medians over
    `--repeats`.

    samples/s  steady-state training throughput: samples pushed (or reported, sync) between
               10% and 95% of the run's push times in run.history (hub clock), over that time;
               it includes the validation pause at the end of each epoch but one.
    val acc    the last val_* row of run.history (validation on the test split at the end of
               the last epoch, on the hub's weights / rank 0's weights).
    compute, comm / step   run.nodes compute_s / steps and comm_s / steps (mean over both
               workers, whole run) and the median per-step comm from run.timeline. In sync
               mode comm is everything after the gradient: build the control vector, the
               allreduce (including waiting for the other rank), the optimizer update, the
               control read-back. In async mode it is the push/pull round trip to the hub.

    Allreduce baseline, measured in the same process run on the same 2 engines the sync ranks
    use: a raw `hvd.allreduce` (op Sum) of the same number of float32 values as nbdist's
    per-step allreduce (flat gradient + 3 control values + one batch size per rank), N times
    back to back after a warm-up, median per call; once eager and once inside a tf.function
    fed a NumPy array (as nbdist's step is), and once as a copy of nbdist's step function
    (concat with the control values, allreduce, split, the Keras SGD apply_gradients on the
    same MLP's variables: "raw allreduce + apply"). Then as a training loop: a gradient of a
    batch of 64 on each rank, then that step function, each timed ("raw allreduce + apply,
    training"): there the allreduce waits for the slower rank's gradient, as in real training.
    Its Horovod set-up is nbdist's own (nbdist/modes/sync/backend.py
    SyncBackend.start_workers): Horovod's RendezvousHTTPServer bound to 127.0.0.1 in this
    process, host assignments from get_host_assignments, the same HOROVOD_* variables on each
    engine (Gloo, interface lo). Not horovodrun, whose rendezvous listens on all interfaces.

How to read it
    "x raw" = nbdist sync comm per step (mean; then median) / raw tf.function allreduce per
    call: what nbdist's step adds around the collective (the optimizer update, the
    concat/split, waiting for the slower rank). Async should beat sync in samples/s when the
    allreduce dominates; validation accuracy after the same epochs tells what the staleness
    cost.

    python benchmarks/sync_vs_async.py            # 2 epochs per run, 2 repeats (~3 min)
    python benchmarks/sync_vs_async.py --quick    # 1 epoch, 1 repeat (~1 min)
    python benchmarks/sync_vs_async.py --epochs 3 --repeats 3 --allreduces 500
"""

from __future__ import annotations

import argparse
import threading
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, table
from _training import CELL, history_window, last_val, pushes

WORKERS = 2
BATCH = 64
MODES = [("sync", {"mode": "sync"}),
         ("asgd", {"mode": "async", "algorithm": "asgd"}),
         ("ddc-asgd", {"mode": "async", "algorithm": "ddc-asgd"})]
RAW = "raw allreduce"


def measure_run(cluster, options: dict, epochs: int) -> dict:
    import nbdist

    t_call = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=WORKERS, epochs=epochs,
                       batch_size=BATCH, timeout=120, **options)
    with run:  # an error or Ctrl-C stops the run on the way out
        run.wait(900)
    wall = time.monotonic() - t_call
    hist = pushes(run)
    win, t0, t1 = history_window(hist, 0.10, end_frac=0.95)
    nodes = run.nodes
    steps = nodes["steps"].sum()
    tl = run.timeline
    val = last_val(run)
    return {
        "rate": float(win["batch_size"].sum()) / (t1 - t0),
        "val_acc": float(val.get("val_accuracy", float("nan"))),
        "val_loss": float(val.get("val_loss", float("nan"))),
        "compute": float(nodes["compute_s"].sum() / steps),
        "comm": float(nodes["comm_s"].sum() / steps),
        "comm_median": float(tl["comm_s"].iloc[1:].median()) if len(tl) else float("nan"),
        "steps": int(steps), "wall": wall,
    }


def raw_allreduce(env: dict, n_floats: int, reps: int, threads: int, local_rank: int,
                  batch: int) -> dict:
    """On an engine: one Horovod rank timing `reps` allreduces of n_floats float32, three ways:
    eager, in a tf.function, and in a copy of nbdist's step function (concat, allreduce, split,
    the optimizer's apply_gradients on the same MLP's variables), all back to back."""
    import os
    import time

    os.environ.update(env)
    from nbdist.engine.keras_backend import configure_tensorflow

    configure_tensorflow(threads, local_rank)  # a no-op if TensorFlow already runs here
    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    hvd.init()
    try:
        data = np.ones(n_floats, dtype=np.float32)

        @tf.function
        def in_graph(x):
            return hvd.allreduce(x, op=hvd.Sum, name="bench_raw_graph")

        def eager(x):
            return hvd.allreduce(tf.constant(x), op=hvd.Sum, name="bench_raw_eager")

        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        optimizer = keras.optimizers.SGD(1e-9)  # the weights barely move: nothing to diverge
        trainable = model.trainable_variables
        optimizer.build(trainable)
        sizes = [int(np.prod(v.shape)) for v in trainable]
        size = sum(sizes)
        grad, control = data[:size].copy(), data[size:].copy()

        @tf.function(reduce_retracing=True)
        # nbdist/modes/sync/rank.py _SyncLoop's allreduce_apply
        def step_shaped(weighted_grad, control):
            reduced = hvd.allreduce(tf.concat([weighted_grad, control], 0), op=hvd.Sum,
                                    name="bench_step_shaped")
            grads = tf.split(reduced[:size], sizes)
            optimizer.apply_gradients(zip([tf.reshape(g, v.shape)
                                           for g, v in zip(grads, trainable, strict=True)],
                                          trainable, strict=True))
            return reduced[size:]

        rng = np.random.default_rng(hvd.rank())
        x = rng.random((batch, 784), dtype=np.float32)
        y = rng.integers(0, 10, batch)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def gradient(x, y):  # one flat buffer, as nbdist's rank hands to its allreduce
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return tf.concat([tf.reshape(g, [-1]) for g in tape.gradient(loss, trainable)], 0)

        calls = (("eager", lambda: eager(data)), ("graph", lambda: in_graph(data)),
                 ("step", lambda: step_shaped(grad, control)))
        out = {}
        for _ in range(20):  # training steps: gradient, then the step function, timed apart
            step_shaped(gradient(x, y), control).numpy()
        split = []
        for _ in range(reps):
            t0 = time.perf_counter()
            g = gradient(x, y)
            t1 = time.perf_counter()
            step_shaped(g, control).numpy()
            split.append((t1 - t0, time.perf_counter() - t1))
        out["train_grad"], out["train_comm"] = (float(v) for v in np.median(split, axis=0))
        for name, fn in calls:
            for _ in range(20):
                fn().numpy()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn().numpy()
                times.append(time.perf_counter() - t0)
            out[name] = float(np.median(times))
        return out
    finally:
        hvd.shutdown()


def measure_raw(cluster, n_floats: int, reps: int) -> dict:
    """nbdist's Horovod set-up (SyncBackend.start_workers), running raw_allreduce instead."""
    import os

    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    from nbdist.cluster.engines import assign_roles
    from nbdist.modes.sync.backend import GLOO_TIMEOUT_S

    hosts = cluster.engine_hosts()
    engines = list(assign_roles(hosts, 0, WORKERS).workers)  # the engines sync mode uses
    by_host: dict[str, list[int]] = {}
    for e in engines:
        by_host.setdefault(hosts[e], []).append(e)
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{len(es)}"
                                                     for h, es in by_host.items())),
                                len(engines))
    server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
    server.init(plan)
    threading.Thread(target=server.serve_forever, daemon=True, name="bench-rendezvous").start()
    try:
        port = server.server_address[1]
        next_on_host = {h: iter(es) for h, es in by_host.items()}
        pending = []
        for slot in plan:
            engine = next(next_on_host[slot.hostname])
            env = {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank),
                   "HOROVOD_SIZE": str(slot.size), "HOROVOD_LOCAL_RANK": str(slot.local_rank),
                   "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                   "HOROVOD_CROSS_RANK": str(slot.cross_rank),
                   "HOROVOD_CROSS_SIZE": str(slot.cross_size), "HOROVOD_CONTROLLER": "gloo",
                   "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                   "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S), "HOROVOD_GLOO_IFACE": "lo",
                   "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60"}
            threads = max(1, (os.cpu_count() or 1) // slot.local_size)
            pending.append(cluster.client[engine].apply_async(raw_allreduce, env, n_floats, reps,
                                                              threads, slot.local_rank, BATCH))
        results = [ar.get(300) for ar in pending]
    finally:
        server.shutdown()
        server.server_close()
    return {k: median([r[k] for r in results])
            for k in ("eager", "graph", "step", "train_grad", "train_comm")}


def flat_size() -> int:
    from nbdist.engine.flat_layout import read_flat

    ns: dict = {}
    exec(compile(CELL, "<cell>", "exec"), ns)  # noqa: S102 - our own code
    return int(read_flat(ns["model"])[0].size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch, 1 repeat")
    parser.add_argument("--epochs", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--allreduces", type=int, default=300,
                        help="timed raw allreduces per repeat")
    args = parser.parse_args()
    epochs = args.epochs or (1 if args.quick else 2)
    repeats = args.repeats or (1 if args.quick else 2)

    from nbdist.modes.sync.rank import CONTROL_FIELDS

    n_floats = flat_size() + CONTROL_FIELDS + WORKERS  # what nbdist's step allreduces
    print(f"sync_vs_async: 784-256-256-10 MLP on Fashion-MNIST, {WORKERS} workers, batch {BATCH} "
          f"each, {epochs} epoch(s) per run, {repeats} repeat(s); allreduce of {n_floats:,} "
          f"float32 ({n_floats * 4 / 1e6:.2f} MB)", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name, _ in MODES}
    raws: list[dict] = []
    cluster = None
    t_start = time.monotonic()
    try:
        import nbdist

        cluster = nbdist.Cluster.start(WORKERS + 1)
        for rep in range(repeats):
            steps = [*MODES, (RAW, None)]
            for name, options in (steps if rep % 2 == 0 else steps[::-1]):
                if options is None:
                    r = measure_raw(cluster, n_floats, args.allreduces)
                    raws.append(r)
                    print(f"  [{rep + 1}/{repeats}] {RAW:<13} eager {r['eager'] * 1e3:.2f} ms, "
                          f"tf.function {r['graph'] * 1e3:.2f} ms, with apply "
                          f"{r['step'] * 1e3:.2f} ms per call; training: gradient "
                          f"{r['train_grad'] * 1e3:.2f} ms, then allreduce + apply "
                          f"{r['train_comm'] * 1e3:.2f} ms", flush=True)
                    continue
                r = measure_run(cluster, options, epochs)
                runs[name].append(r)
                print(f"  [{rep + 1}/{repeats}] {name:<13} {r['rate']:>7,.0f} samples/s  val acc "
                      f"{r['val_acc']:.4f}  comm/step {r['comm'] * 1e3:.2f} ms  ({r['wall']:.0f}s)",
                      flush=True)
    finally:
        if cluster is not None:
            cluster.stop()

    raw_graph, raw_eager = median([r["graph"] for r in raws]), median([r["eager"] for r in raws])
    raw_step = median([r["step"] for r in raws])
    raw_train_comm = median([r["train_comm"] for r in raws])
    rows = []
    base = median([r["rate"] for r in runs["sync"]])
    for name, _ in MODES:
        rs = runs[name]

        def med(key, rs=rs):
            return median([r[key] for r in rs])

        sync = name == "sync"
        rows.append([name, med("rate"), med("rate") / base, f"{med('val_acc'):.4f}",
                     f"{med('val_loss'):.4f}", med("compute") * 1e3, med("comm") * 1e3,
                     med("comm_median") * 1e3, med("comm") / raw_graph if sync else "",
                     med("comm_median") / raw_graph if sync else "", med("wall")])
    rows.append([RAW + " (tf.function)", "", "", "", "", "", raw_graph * 1e3, raw_graph * 1e3,
                 1.0, 1.0, ""])
    rows.append([RAW + " (eager)", "", "", "", "", "", raw_eager * 1e3, raw_eager * 1e3,
                 raw_eager / raw_graph, raw_eager / raw_graph, ""])
    rows.append([RAW + " + apply", "", "", "", "", "", raw_step * 1e3, raw_step * 1e3,
                 raw_step / raw_graph, raw_step / raw_graph, ""])
    raw_train_grad = median([r["train_grad"] for r in raws])
    rows.append([RAW + " + apply, training", "", "", "", "", raw_train_grad * 1e3,
                 raw_train_comm * 1e3, raw_train_comm * 1e3, raw_train_comm / raw_graph,
                 raw_train_comm / raw_graph, ""])
    print()
    print(f"Medians of {repeats} repeat(s), {epochs} epoch(s) per run; times per step in ms; "
          f"allreduce of {n_floats * 4 / 1e6:.2f} MB on the sync ranks' 2 engines "
          f"({args.allreduces} calls per repeat).")
    print(table(["mode", "samples/s", "x sync", "val acc", "val loss", "compute/step",
                 "comm/step", "comm median", "x raw", "x raw (median)", "wall s"], rows))
    print("  comm/step = run.nodes comm_s / steps (mean, whole run, including the other rank's\n"
          "  validation pause); comm median = median per-step comm from run.timeline; x raw = "
          "sync\n"
          "  comm/step (mean, then median) over the raw tf.function allreduce per call. \"+ "
          "apply\" =\n"
          "  nbdist's step function alone (concat, allreduce, split, SGD apply), ranks in "
          "lockstep;\n"
          "  \"training\" = the same after a gradient of a batch of 64 on each rank, as a "
          "training\n"
          "  loop runs it, so its comm includes waiting for the slower rank's "
          "gradient, as sync's does.")
    sync_median = median([r["comm_median"] for r in runs["sync"]])
    print("\nnbdist's sync step over a raw allreduce + apply of the same bytes: "
          f"{sync_median / raw_step:.2f}x by the median step ({sync_median * 1e3:.2f} ms against "
          f"{raw_step * 1e3:.2f} ms; target <= 1.1), "
          f"{median([r['comm'] for r in runs['sync']]) / raw_step:.2f}x by the mean (which "
          "includes the other rank's validation pause)")
    print("... and over a raw training loop's allreduce + apply after a gradient, which waits for "
          f"the slower rank as nbdist's does: {sync_median / raw_train_comm:.2f}x by the median "
          f"step ({raw_train_comm * 1e3:.2f} ms)")
    print(f"\ntotal benchmark time {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
