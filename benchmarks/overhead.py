"""nbdist's overhead against plain `model.fit`, one worker, each with nbdist's thread budget.

What it measures
    The 784-256-256-10 MLP (relu, softmax, SGD 0.05, sparse categorical crossentropy) on
    Fashion-MNIST, trained two ways at batch 64 and 256:
      model.fit      in a child process of this script (TensorFlow loaded once, idle while
                     nbdist runs, so the two sides never compete for cores);
      nbdist async   `nbdist.train(cell, cluster=Cluster.start(2), workers=1)`: one hub engine
                     plus one worker engine on this machine, with transport "auto" (shared
                     memory; only signed headers travel, over a same-host Unix socket,
                     nbdist.hub.localline), "ipc" (`--transport all`: shared memory with the
                     headers over ZeroMQ's ipc, NBDIST_LOCAL_LINE=0 on the engines) and "tcp"
                     (raw frames);
      nbdist overlap with --overlap, the same runs with `overlap=True` (the worker pushes step
                     t and receives its reply while it computes step t+1), per transport, in
                     the same repeats, interleaved with the plain runs.
    Spin: nbdist's default `spin="auto"` lets the hub (which has a core of its own here) and the
    worker poll instead of sleeping between messages; `--spin both` adds spin="off" rows.
    Thread budgets: the fit child uses every core (T = cpu_count intra-op threads, min(T, 2)
    inter-op, set through `nbdist.engine.keras_backend.configure_tensorflow`), as model.fit alone on
    the machine would; nbdist's ClusterBackend gives its worker the cores the hub shard on its
    host leaves (`nbdist.cluster.affinity.worker_threads`: 1 of 2 cores here), since the hub
    works while the worker computes. `--worker-threads 2 1` measures the worker at both.

    Only steady state counts. For fit: one warm-up fit (tracing), then a timed fit whose batch
    end times are recorded; the rate is taken over the middle of that fit (batches 10%..95%).
    For nbdist: the same middle window of the run, located with `run.nodes` snapshots (steps,
    samples, compute_s, comm_s) and `run.history` (time of each push), so start-up (engine
    TensorFlow import, running the cell, tf.function tracing) is excluded. Each measurement is
    repeated (--repeats, interleaved fit/nbdist so slow phases of a noisy machine hit both) and
    the median is reported; "range" shows min-max over repeats.

How to read it
    ratio = nbdist samples/s / model.fit samples/s at the same batch size (1.00 = no overhead).
    Targets: >= 0.95 at batch 256, >= 0.85 at batch 64; overlap rows >= 0.95 at any batch. The
    per-step breakdown below the table splits nbdist's wall time per step into the worker's
    compute (batch gather + its one compiled call, which assigns the pulled weights and computes
    the gradients, as the worker reports it), comm (gradient sent to reply received: the
    push/pull round trip including the hub's update and copy-out) and other (the rest of the
    worker loop: gradient copy into the transport buffer, header, bookkeeping). The isolated
    costs of FlatModel.gradients and .assign_and_gradients, measured in the fit child with the
    same threads, show what of compute is TensorFlow. On overlap rows comm is in flight while
    the next step computes, so compute + comm may exceed wall and other is n/a; `comm exposed`
    (comm - compute there, all of comm on plain rows) is the wait the worker did not hide.

    python benchmarks/overhead.py                 # both transports, batch 64 and 256, 3 repeats
    python benchmarks/overhead.py --backend jax   # Keras's JAX backend on both sides (or torch,
                                                  # tensorflow: the default, or KERAS_BACKEND's)
    python benchmarks/overhead.py --backend torch --model convnet   # the keras.io convnet
    python benchmarks/overhead.py --quick         # 1 repeat, shorter runs
    python benchmarks/overhead.py --overlap       # plus overlap=True rows per transport
    python benchmarks/overhead.py --transport tcp --batch 256
    python benchmarks/overhead.py --transport all # auto, ipc and tcp, interleaved
    python benchmarks/overhead.py --spin both     # spin="auto" (the default) vs "off", interleaved
    python benchmarks/overhead.py --transport tcp --overlap --courier both
                                                  # the overlapped TCP exchange on its own thread
                                                  # (the default) vs the worker's (NBDIST_COURIER=0)
    python benchmarks/overhead.py --option algorithm=hogwild   # any nbdist.train option
    python benchmarks/overhead.py --hub both      # hub shard as its own process vs a thread
    python benchmarks/overhead.py --pin both      # pin="off" vs pin="auto" (hub and worker on
                                                  # cores of their own), interleaved
    python benchmarks/overhead.py --stateless both  # the worker's stateless gradient call vs
                                                  # assign-then-gradient (NBDIST_STATELESS=0)
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import time

import _common  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL and sys.path before nbdist loads
from _common import median, spread, table
from _overhead_fit import MODEL_CODE, MODELS, WINDOW, FitChild

CELL = MODEL_CODE  # what nbdist trains: the same code, no x_test (no validation pauses)
TARGETS = {64: 0.85, 256: 0.95}
OVERLAP_TARGET = 0.95  # overlap=True hides communication behind compute, at any batch size


def thread_budget(workers_on_host: int = 1) -> int:
    """The fit child's threads: every core (what nbdist gave a lone worker before it left the
    hub shard's core free; nbdist.cluster.affinity.worker_threads)."""
    return max(1, (os.cpu_count() or 1) // workers_on_host)


# -- nbdist side ----------------------------------------------------------------------------


def measure_nbdist(cluster, batch: int, epochs: int, transport: str, options: dict) -> dict:
    import nbdist

    n = 60000
    total = epochs * math.ceil(n / batch)
    t_call = time.monotonic()
    run = nbdist.train(CELL, cluster=cluster, namespace={}, workers=1, servers=1, epochs=epochs,
                       batch_size=batch, transport=transport, no_validation=True, timeout=120,
                       **options)
    first_push = None
    a = b = None  # node rows at the start and end of the steady-state window
    with run:  # an error or Ctrl-C stops the run on the way out
        while not run.done():
            nodes = run.nodes
            if len(nodes):
                row = nodes.iloc[0].to_dict()
                steps = int(row["steps"])
                if first_push is None and steps >= 1:
                    first_push = time.monotonic() - t_call
                if a is None and steps >= WINDOW[0] * total:
                    a = row
                elif a is not None and steps <= WINDOW[1] * total:
                    b = row
            time.sleep(0.05)
        run.wait()
    end_to_end = time.monotonic() - t_call
    hist = run.history
    nodes = run.nodes.iloc[0].to_dict()
    if a is None or b is None or b["steps"] <= a["steps"]:
        raise RuntimeError(f"run too short to find a steady-state window ({total} steps); "
                           "raise --steps")
    hist = hist.dropna(subset=["step", "time"])
    t_of = dict(zip(hist["step"].astype(int), hist["time"], strict=True))
    if int(a["steps"]) not in t_of or int(b["steps"]) not in t_of:
        raise RuntimeError("run.history has no row per push (metrics off?); the steady-state "
                           "window needs the push times")
    steps = int(b["steps"] - a["steps"])
    wall = t_of[int(b["steps"])] - t_of[int(a["steps"])]
    return {
        "rate": (b["samples"] - a["samples"]) / wall,
        "wall_step": wall / steps,
        "compute_step": (b["compute_s"] - a["compute_s"]) / steps,
        "comm_step": (b["comm_s"] - a["comm_s"]) / steps,
        "window_steps": steps,
        "total_steps": int(nodes["steps"]),
        "first_push_s": first_push,
        "end_to_end_s": end_to_end,
        "delay_max": int(nodes["delay_max"]),
    }


def _set_hub_mode(mode: str, stateless: str = "on", transport: str = "auto",
                  courier: bool = True) -> None:
    """On an engine: serve the next hubs as their own process or from a thread (nbdist.hub.launch);
    the next workers' gradient call stateless or assigning (nbdist.engine.flatmodel); same-host
    headers over the local line or ZeroMQ ipc (nbdist.hub.localline); an overlapped TCP
    exchange on a thread of its own or the worker's (nbdist.modes.common.courier)."""
    import os

    os.environ["NBDIST_COURIER"] = "1" if courier else "0"
    os.environ["NBDIST_HUB_PROCESS"] = "1" if mode == "process" else "0"
    os.environ["NBDIST_STATELESS"] = "0" if stateless == "off" else "1"
    os.environ["NBDIST_LOCAL_LINE"] = "0" if transport == "ipc" else "1"


def _start_tensorflow(threads: int) -> None:
    """On an engine: start TensorFlow with `threads` now; later runs keep them."""
    from nbdist.engine.keras_backend import configure_tensorflow

    configure_tensorflow(threads, 0)
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # TensorFlow's thread pools exist from here on


def worker_threads(cluster) -> tuple[int, int]:
    """Ask the worker engine how many threads its backend actually uses there."""

    def probe(here: str):
        import sys  # the probe runs on the engine, whose path lacks benchmarks/

        sys.path.insert(0, here)
        from _overhead_fit import backend_threads

        found = backend_threads()
        return found["intra"], found["inter"]

    here = os.path.dirname(os.path.abspath(__file__))
    return tuple(cluster.client[cluster.engine_ids[-1]].apply_sync(probe, here))


# -- main -----------------------------------------------------------------------------------


def _parse_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise SystemExit(f"--option expects KEY=VALUE (Received: {text!r})")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, shorter runs")
    parser.add_argument("--backend", choices=["tensorflow", "jax", "torch"],
                        default=os.environ.get("KERAS_BACKEND", "tensorflow"),
                        help="Keras's backend on both sides (fit and nbdist): KERAS_BACKEND for "
                             "this process, the fit child and the engines")
    parser.add_argument("--model", choices=["mlp", "convnet"], default="mlp",
                        help="mlp: the quickstart's 784-256-256-10 MLP; convnet: the keras.io "
                             "convnet")
    parser.add_argument("--transport", choices=["auto", "ipc", "tcp", "both", "all"],
                        default="both",
                        help="both: auto and tcp; all: auto, ipc (shared memory, headers over "
                             "ZeroMQ ipc instead of the local line) and tcp")
    parser.add_argument("--spin", choices=["auto", "off", "both"], default="auto",
                        help="nbdist.train(..., spin=...): auto (nbdist's default: the hub, which "
                             "has a core here, and the worker poll instead of sleeping), off, or "
                             "both, interleaved (rows marked spin-off)")
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="about this many steps per run (default 1000, 500 with --quick)")
    parser.add_argument("--courier", choices=["on", "off", "both"], default="on",
                        help="TCP with --overlap: the exchange on a thread of its own (nbdist's "
                             "default) or on the worker's own (NBDIST_COURIER=0); both: "
                             "interleaved")
    parser.add_argument("--overlap", action="store_true",
                        help="also measure every transport with nbdist.train(..., overlap=True), "
                             "interleaved with the other rows (target >= 0.95 at any batch)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra nbdist.train option, e.g. --option algorithm=hogwild "
                             "(values are Python literals or strings; repeatable)")
    parser.add_argument("--hub", choices=["process", "thread", "both"], default="process",
                        help="serve the hub shard as its own process (nbdist's default) or from a "
                             "thread of its engine (NBDIST_HUB_PROCESS=0), or both, interleaved")
    parser.add_argument("--pin", choices=["off", "auto", "both"], default=None,
                        help="nbdist.train(..., pin=...): 'both' measures off and auto "
                             "interleaved, each on a cluster of its own (TensorFlow's thread count "
                             "is fixed when an engine first uses it); default: nbdist's default")
    parser.add_argument("--fit-threads", type=int, default=None, metavar="N",
                        help="model.fit's intra-op threads (default: every core); PyTorch's "
                             "OpenMP threads on a loaded machine want 1")
    parser.add_argument("--worker-threads", type=int, nargs="+", default=None, metavar="N",
                        help="start the engines' TensorFlow with N intra-op threads (min(N, 2) "
                             "inter-op) before any run, so the worker keeps N whatever nbdist's "
                             "budget says; several values: one cluster each, rows interleaved")
    parser.add_argument("--stateless", choices=["on", "off", "both"], default="on",
                        help="the worker's gradient call: stateless (nbdist's default, where the "
                             "model allows it), assigning the variables first (NBDIST_STATELESS=0 "
                             "on the engines), or both, interleaved")
    args = parser.parse_args()

    # before Keras is imported here, in the fit child, on the engines
    os.environ["KERAS_BACKEND"] = args.backend
    global CELL
    CELL = MODELS[args.model]
    options = dict(_parse_option(o) for o in args.option)
    if args.overlap and "overlap" in options:
        raise SystemExit("--overlap adds overlap=True rows next to the plain ones; drop "
                         "--option overlap=... (or drop --overlap to make every row overlapped)")
    repeats = args.repeats or (1 if args.quick else 3)
    target_steps = args.steps or (500 if args.quick else 1000)
    transports = {"both": ["auto", "tcp"],
                  "all": ["auto", "ipc", "tcp"]}.get(args.transport, [args.transport])
    # --spin both: each transport twice, nbdist's default (auto) and " spin-off"
    transports = [t + ("" if s == "auto" else " spin-off") for t in transports
                  for s in {"both": ["auto", "off"]}.get(args.spin, [args.spin])]
    # --courier both: each TCP transport also with the overlapped exchange on the worker's thread
    couriers = {"both": ["", " courier-off"], "off": [" courier-off"]}.get(args.courier, [""])
    transports = [t + c for t in transports for c in (couriers if t.startswith("tcp") else [""])]
    # (transport, overlap) pairs, in the order they run within a repeat
    hubs = ["process", "thread"] if args.hub == "both" else [args.hub]
    pins = ["off", "auto"] if args.pin == "both" else [args.pin]
    states = ["on", "off"] if args.stateless == "both" else [args.stateless]
    wts = args.worker_threads or [None]
    sides = [(t, ov, h, (p, wt), st) for t in transports
             for ov in ([False, True] if args.overlap else [False])
             for h in hubs for p in pins for wt in wts for st in states]
    threads = args.fit_threads or thread_budget()
    epochs = {b: max(1, round(target_steps * b / 60000)) for b in args.batch}
    what = {"mlp": "784-256-256-10 MLP", "convnet": "keras.io convnet"}[args.model]
    print(f"overhead: {what} on Fashion-MNIST, Keras backend {args.backend}, 1 worker, "
          f"batches {args.batch}, "
          f"transports {transports}{' each plain and overlap=True' if args.overlap else ''}, "
          f"{repeats} repeat(s), epochs per run {epochs}"
          + (f", options {options}" if options else ""), flush=True)

    fits: dict[int, list[dict]] = {b: [] for b in args.batch}
    runs: dict[tuple, list[dict]] = {(b, *side): [] for b in args.batch for side in sides}
    child = None
    clusters: dict = {}
    t_start = time.monotonic()
    try:
        child = FitChild(threads)
        import nbdist

        for p in pins:
            for wt in wts:
                clusters[(p, wt)] = nbdist.Cluster.start(2)
                if wt is not None:
                    clusters[(p, wt)].client[:].apply_sync(_start_tensorflow, wt)
        for rep in range(repeats):
            for b in args.batch:
                f = child.fit(b, epochs[b], args.model)
                fits[b].append(f)
                print(f"  [{rep + 1}/{repeats}] batch {b:>3} model.fit             "
                      f"{f['rate']:>9,.0f} samples/s", flush=True)
                for t, ov, h, (p, wt), st in sides:
                    cluster = clusters[(p, wt)]
                    line, *flags = t.split(" ")
                    cluster.client[:].apply_sync(_set_hub_mode, h, st, line,
                                                 "courier-off" not in flags)
                    # plain rows: overlap=False (not the default)
                    side_options = {"overlap": ov, **options, **({"pin": p} if p else {}),
                                    "spin": "off" if "spin-off" in flags else "auto"}
                    r = measure_nbdist(cluster, b, epochs[b], "auto" if line == "ipc" else line,
                                       side_options)
                    runs[(b, t, ov, h, (p, wt), st)].append(r)
                    print(f"  [{rep + 1}/{repeats}] batch {b:>3} nbdist {t:<4}"
                          f"{' overlap' if ov else '':<8} hub {h:<7}"
                          f"{f' pin {p:<4}' if p else ''}{f' threads {wt}' if wt else ''}"
                          f"{' assigning' if st == 'off' else ''}  "
                          f"{r['rate']:>9,.0f} samples/s  (first push after "
                          f"{r['first_push_s']:.1f}s)", flush=True)
        engine_threads = {k: worker_threads(c) for k, c in clusters.items()}
    finally:
        if child is not None:
            child.close()
        for c in clusters.values():
            c.stop()

    def side_name(t: str, ov: bool, h: str, pw: tuple, st: str) -> str:
        p, wt = pw
        return (f"nbdist {t}" + {"auto": " (shm)", "ipc": " (shm)"}.get(t.split(" ")[0], "")
                + (" overlap" if ov else "")
                + (f" hub {h}" if len(hubs) > 1 else "") + (f" pin {p}" if p else "")
                + (f" threads {wt}" if wt else "")
                + (" assigning" if st == "off" else ""))

    all_overlap = bool(options.get("overlap"))
    rows = []
    for b in args.batch:
        base = median([f["rate"] for f in fits[b]])
        rows.append([b, "model.fit", base, spread([f["rate"] for f in fits[b]]), 1.0, ""])
        for t, ov, h, p, st in sides:
            rates = [r["rate"] for r in runs[(b, t, ov, h, p, st)]]
            ratio = median(rates) / base
            target = OVERLAP_TARGET if ov or all_overlap else TARGETS.get(b)
            verdict = ("" if target is None
                       else f"{'ok' if ratio >= target else 'MISS'} (>= {target})")
            rows.append([b, side_name(t, ov, h, p, st), median(rates), spread(rates), ratio,
                         verdict])
    print()
    engine_reports = ", ".join(f"{i}/{j}" + (f" with pin {p}" if p else "")
                               for (p, _), (i, j) in engine_threads.items())
    print(f"Keras backend {args.backend} on both sides. "
          f"Thread budget: model.fit intra-op {threads}, inter-op {min(threads, 2)} "
          f"(fit child reports {child.info['intra']}/{child.info['inter']}, worker engine reports "
          f"{engine_reports}); {os.cpu_count()} CPUs. Steady state = "
          f"steps {WINDOW[0]:.0%}..{WINDOW[1]:.0%} of each run; medians of {repeats} repeat(s).")
    print(table(["batch", "side", "samples/s", "range", "ratio to fit", "target"], rows))

    print("\nPer-step time of nbdist (ms, medians over repeats, steady-state window):")
    brows, overlapped = [], False
    for b in args.batch:
        fit_step = b / median([f["rate"] for f in fits[b]]) * 1e3
        grad = median([f["grad_s"] for f in fits[b]]) * 1e3
        assign_grad = median([f["assign_grad_s"] for f in fits[b]]) * 1e3
        held_sl = median([f["held_stateless_s"] for f in fits[b]]) * 1e3
        held_as = median([f["held_assign_s"] for f in fits[b]]) * 1e3
        for t, ov, h, p, st in sides:
            rs = runs[(b, t, ov, h, p, st)]
            wall, comp, comm = (median([r[k] for r in rs]) * 1e3
                                for k in ("wall_step", "compute_step", "comm_step"))
            other, exposed = wall - comp - comm, comm
            # With overlap, comm is the time a push/pull was in flight while the next step
            # computed: compute + comm is not a serial split of wall, so there is no "other";
            # what the worker waited for beyond that compute is comm - compute.
            if ov or all_overlap or other < -0.05 * wall:
                other, overlapped = float("nan"), True
                exposed = max(0.0, comm - comp)
            brows.append([b, t + (" overlap" if ov else "") + (f" {h}" if len(hubs) > 1 else "")
                          + (f" pin {p[0]}" if p[0] else "") + (f" threads {p[1]}" if p[1] else "")
                          + (" assigning" if st == "off" else ""), wall, comp, comm, exposed, other,
                          fit_step, grad, assign_grad, held_sl, held_as,
                          median([r["first_push_s"] for r in rs])])
    print(table(["batch", "transport", "wall", "compute", "comm", "comm exposed", "other",
                 "fit step", "iso grad", "iso a+g", "iso held sl", "iso held a+g", "start-up s"],
                brows))
    print("  wall = steady-state time per push; compute = the worker's batch gather + its one\n"
          "  compiled call (assign the pulled weights, then gradients); comm = gradient sent to\n"
          "  reply received (push/pull round trip, the hub's update and copy-out, shared memory "
          "or\n"
          "  TCP frames); other = wall - compute - comm (gradient copy into the transport buffer,\n"
          "  header, loop); fit step = model.fit's time per step; iso grad / iso a+g =\n"
          "  FlatModel.gradients / .assign_and_gradients alone, same threads (compute - iso a+g\n"
          "  = batch gather + host copies); iso held sl / iso held a+g = the worker's own call\n"
          "  (assign_and_gradients_at: the batch gathered in the graph from held arrays),\n"
          "  stateless and assigning the variables first, alone, median of 6 rounds (ABBA);\n"
          "  start-up = nbdist.train() call until the first push;\n"
          "  comm exposed = the part of comm the worker waited for: all of it without overlap.")
    if overlapped:
        print("  other = n/a on overlap rows: the push/pull of step t is in flight while step t+1\n"
              "  computes, so comm there is send-to-receive time (mostly hidden behind compute), "
              "not\n"
              "  extra time, and compute + comm can exceed wall; comm exposed = comm - compute "
              "there\n"
              "  (the wait for step t's reply after step t+1 was computed, plus the loop around "
              "it).")
    print(f"\ntotal benchmark time {time.monotonic() - t_start:.0f}s; "
          f"load {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
