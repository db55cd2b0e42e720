"""Update-rule throughput: the hub's time per push for every rule, against `w -= lr * g`.

What it measures
    For each rule in `nbdist.algorithms.RULES` (asgd, hogwild, dc-asgd, dc-asgd-a, ddc-asgd,
    softsync, ssp, group, easgd), built with `make_rule(name, size, num_workers=4)` and default
    options, on float32 parameter vectors of 1M and 10M floats (4 MB and 40 MB), in this process,
    single-threaded NumPy, no sockets, timed in CPU time of this thread (`time.thread_time`, so
    time the process spends descheduled on a busy machine does not count):
      push   the time of `rule.on_push(worker, w, g, lr, delay)`;
      pull   the time of `rule.on_pull(worker, w, version)`, which the hub calls once per pull
             (a no-op for most rules; DC rules copy `w` into a shared backup there). The hub's
             own copy of `w` into the worker's pull buffer is not in it (see the asgd rows below).
    Pushes follow the hub's pattern with 4 workers round-robin: worker m pushes a gradient read
    3 versions ago (delay 3 in steady state), then pulls the new version (`on_pull`), then the
    next worker pushes. One sample is one such round of 4 pushes, timed call by call; the push
    and pull columns are per call (round total / 4), so for `softsync --n 1`, which applies
    one of every 4 pushes, it is the average over the buffered and the applying pushes.

    Two more rows time the hub's hot path for asgd (a push that also asks for the weights):
      asgd push_and_read      `rule.push_and_read(worker, w, g, lr, delay, out)`: the update and
                              the copy into the worker's pull buffer `out` in one blocked pass;
      asgd on_push + copyto   `rule.on_push(...)` then `np.copyto(out, w)`, what the fused call
                              replaces (every rule without its own push_and_read does this).

    The floor is a plain `w -= lr * g` (its own `w`, same `g`) in the cheapest in-place NumPy
    form. Two forms are timed, interleaved, in a calibration at the start of each size:
      2-pass   `np.multiply(g, lr, out=scratch); np.subtract(w, scratch, out=w)`;
      blocked  the same two calls on 64Ki-float slices (256 KiB, so the slice of scratch is
               still in cache for the subtract: memory is read and written about once).
    The one with the lower median is "the floor" of that size (marked `*`), and it is run twice
    right before every single push of every rule and the second run is timed: a busy moment of
    a shared machine hits floor and rule alike, each ratio compares neighbouring measurements,
    and the floor is not slowed by the rule's cache traffic (a rule with a large working set
    evicts the floor's arrays; the untimed first run brings them back), so it is the strict one.

How to read it
    push ms / pull ms = median time per call. `x floor` = median over rounds of (the round's push
    time / the time of the floors run just before each of its pushes): 1.00 means the rule costs
    what one SGD pass costs. `floor ms` shows that paired floor. `+pull` = (push + pull) /
    floor, what the hub pays per push-and-pull round trip for the rule beyond the copy into the
    reply. `state MB` = the rule's `state_nbytes`. Targets (issue, push only): asgd <= 1.2 x
    floor, dc-asgd-a and ddc-asgd <= 4 x floor.
    At 1M the vectors fit in this machine's cache levels; 10M is mostly main-memory bandwidth.

    python benchmarks/rules_throughput.py            # 1M and 10M, ~1 min (< 3 min)
    python benchmarks/rules_throughput.py --quick    # a third of the rounds, ~20 s (< 40 s)
    python benchmarks/rules_throughput.py --sizes 269322 --rules asgd dc-asgd-a
"""

from __future__ import annotations

import argparse
import gc
import time

import _common  # noqa: F401 - sys.path for a checkout
import numpy as np
from _common import median, table

from nbdist.algorithms import RULES, make_rule

WORKERS = 4
DELAY = 3  # steady-state delay of round-robin workers: 3 other pushes since each pull
LR = 0.01
BLOCK = 1 << 16  # floats per slice of the blocked floor (256 KiB)
TARGETS = {"asgd": 1.2, "dc-asgd-a": 4.0, "ddc-asgd": 4.0}
DEFAULT_SIZES = [1_000_000, 10_000_000]
# CPU time of this thread: on a shared machine, time spent descheduled is not the rule's cost
# (memory-bandwidth and cache contention from other processes still count, for both sides).
CLOCK = time.thread_time
ROUNDS = {1_000_000: 40, 10_000_000: 10}  # timed rounds per entry (quick: 1/3), others scaled


# -- the floor ------------------------------------------------------------------------------


def floor_two_pass(w: np.ndarray, g: np.ndarray, lr: np.float32, scratch: np.ndarray) -> None:
    np.multiply(g, lr, out=scratch)
    np.subtract(w, scratch, out=w)


def floor_blocked(w: np.ndarray, g: np.ndarray, lr: np.float32, scratch: np.ndarray) -> None:
    for lo in range(0, w.size, BLOCK):
        hi = min(lo + BLOCK, w.size)
        s, wb = scratch[lo:hi], w[lo:hi]
        np.multiply(g[lo:hi], lr, out=s)
        np.subtract(wb, s, out=wb)


FLOORS = {"2-pass": floor_two_pass, "blocked": floor_blocked}


# -- one entry: a rule (or the asgd hot path) driven by 4 round-robin workers ---------------


class Entry:
    """A rule with its own `w`, driven like the hub drives it; `kind` picks what a push is."""

    def __init__(self, label: str, rule_name: str, size: int, w0: np.ndarray,
                 options: dict | None = None, kind: str = "push"):
        self.label, self.kind = label, kind
        self.rule = make_rule(rule_name, size, num_workers=WORKERS, options=options)
        self.w = w0.copy()
        self.out = [np.empty_like(w0) for _ in range(WORKERS)] if kind != "push" else None
        self.version = 0
        self.read = [0] * WORKERS
        for m in range(WORKERS):  # every worker starts from the same first pull
            self.rule.on_pull(m, self.w, 0)

    def round(self, g: np.ndarray, floor) -> tuple[float, float, float]:
        """4 pushes, worker 0..3, each followed by its pull, each preceded by two `floor()`s
        (the first untimed: it brings the floor's arrays back into cache after the rule's
        own traffic, so the timed one is the floor at its best); total push, pull and floor
        seconds of the round."""
        push = pull = base = 0.0
        clock = CLOCK
        rule, w = self.rule, self.w
        for m in range(WORKERS):
            delay = self.version - self.read[m]
            floor()
            f0 = clock()
            floor()
            if self.kind == "push":
                t0 = clock()
                changed = rule.on_push(m, w, g, LR, delay)
                t1 = clock()
            elif self.kind == "fused":
                t0 = clock()
                changed = rule.push_and_read(m, w, g, LR, delay, self.out[m])
                t1 = clock()
            else:  # "copy": the unfused hot path
                t0 = clock()
                changed = rule.on_push(m, w, g, LR, delay)
                np.copyto(self.out[m], w)
                t1 = clock()
            self.version += int(changed)
            t2 = clock()
            rule.on_pull(m, w, self.version)
            t3 = clock()
            self.read[m] = self.version
            base += t0 - f0
            push += t1 - t0
            pull += t3 - t2
        return push, pull, base


def entries_for(names: list[str]) -> list[tuple]:
    """(label, rule name, options, kind) in table order."""
    out = []
    for name in names:
        out.append((name, name, None, "push"))
        if name == "softsync":
            out.append(("softsync n=1", name, {"n": 1}, "push"))
        if name == "asgd":
            out.append(("asgd push_and_read", name, None, "fused"))
            out.append(("asgd on_push + copyto", name, None, "copy"))
    return out


def measure_size(size: int, names: list[str], rounds: int) -> tuple[dict, dict, str]:
    """Calibrate the floor forms, then time every entry in rounds paired with the best one."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(size, dtype=np.float32)
    g = rng.standard_normal(size, dtype=np.float32)
    g *= np.float32(1e-3)
    fw, scratch = w0.copy(), np.empty_like(w0)
    lr32 = np.float32(LR)
    calibration: dict[str, list[float]] = {k: [] for k in FLOORS}
    gc.disable()
    try:
        for r in range(2 * rounds + 1):  # both forms interleaved, the first pair untimed
            for key, f in (list(FLOORS.items())[::-1] if r % 2 else FLOORS.items()):
                t0 = CLOCK()
                f(fw, g, lr32, scratch)
                if r:
                    calibration[key].append(CLOCK() - t0)
    finally:
        gc.enable()
    best = min(calibration, key=lambda k: median(calibration[k]))
    floor_fn = FLOORS[best]

    def floor() -> None:
        floor_fn(fw, g, lr32, scratch)

    results = {}
    for label, name, options, kind in entries_for(names):
        entry = Entry(label, name, size, w0, options, kind)
        entry.round(g, floor)  # warm-up: page faults of the rule's state, backups, delays at 3
        push, pull, base = [], [], []
        gc.disable()
        try:
            for _ in range(rounds):
                p, q, f = entry.round(g, floor)
                push.append(p / WORKERS)
                pull.append(q / WORKERS)
                base.append(f / WORKERS)
        finally:
            gc.enable()
        results[label] = {"push": push, "pull": pull, "floor": base, "kind": kind,
                          "state": entry.rule.state_nbytes}
        del entry
        print(f"  {size:>10,}  {label:<22} push {median(push) * 1e3:8.2f} ms   "
              f"floor {median(base) * 1e3:7.2f} ms", flush=True)
    return results, calibration, best


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a third of the rounds (< 40 s)")
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES,
                        help="float32 parameters per vector (default 1M and 10M)")
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds of 4 pushes per rule (default 40 at 1M, 10 at 10M, "
                             "a third with --quick)")
    args = parser.parse_args()

    def rounds_for(size: int) -> int:
        if args.rounds:
            return args.rounds
        base = ROUNDS.get(size) or max(5, min(200, round(4e7 / size)))
        return max(3, base // 3) if args.quick else base

    print(f"rules_throughput: {len(args.rules)} rules, {WORKERS} workers round-robin "
          f"(push delay {DELAY}, then pull), sizes {args.sizes}, rounds "
          f"{[rounds_for(s) for s in args.sizes]}; NumPy {np.__version__}", flush=True)
    t_start = time.monotonic()
    rows, verdicts, floor_notes = [], [], []
    for size in args.sizes:
        res, calibration, best = measure_size(size, args.rules, rounds_for(size))
        floor_ms = median([t for r in res.values() for t in r["floor"]]) * 1e3
        floor_notes.append(f"{size:,}: {best}, {floor_ms:.2f} ms = "
                           f"{12 * size / (floor_ms * 1e-3) / 1e9:.1f} GB/s at 12 B/float")
        cal_best = median(calibration[best])
        for key in FLOORS:
            ms = median(calibration[key]) * 1e3
            rows.append([size, f"floor {key}" + (" *" if key == best else ""), ms, ms,
                         ms / (cal_best * 1e3), float("nan"), float("nan"), float("nan"), "", ""])
        for label, r in res.items():
            push, pull = median(r["push"]), median(r["pull"])
            # per round: the rule's time over the floor timed just before each of its calls
            ratio = median([p / f for p, f in zip(r["push"], r["floor"], strict=True)])
            both = median([(p + q) / f for p, q, f in zip(r["push"], r["pull"], r["floor"],
                                                           strict=True)])
            target = TARGETS.get(label)
            verdict = ""
            if target is not None:
                verdict = "ok" if ratio <= target else "MISS"
                verdicts.append(f"{label} @ {size:,}: {ratio:.2f}x {verdict}")
            has_pull = r["kind"] == "push"
            rows.append([size, label, push * 1e3, median(r["floor"]) * 1e3, ratio,
                         pull * 1e3 if has_pull else float("nan"),
                         both if has_pull else float("nan"),
                         r["state"] / 1e6, f"<= {target}x" if target else "", verdict])
    print()
    print(table(["size", "rule", "push ms", "floor ms", "x floor", "pull ms", "+pull x floor",
                 "state MB",
                 "target", "verdict"], rows))
    print("  floor (*) = the cheaper `w -= lr*g` form in a calibration of both (floor rows: that\n"
          "  calibration, x = over the cheaper one); paired with every push: "
          f"{'; '.join(floor_notes)}.\n"
          "  floor ms = median of the floors paired with that row's pushes (each the second of "
          "two\n"
          "  back-to-back floors, so the rule's cache traffic does not slow it).\n"
          "  push/pull ms = median per call (a round of 4 pushes / 4); x floor = median over "
          "rounds\n"
          "  of (the round's pushes / the floors timed just before each of them); +pull = (push +\n"
          "  pull) / floor; pull = rule.on_pull (n/a for the two hot-path rows, whose copy is in\n"
          "  push ms). softsync = default n = M = 4 (applies every push); softsync n=1 buffers 3\n"
          "  pushes and applies the 4th. group = its hub update only (the "
          "barrier's mean is outside).")
    print(f"  targets: {'; '.join(verdicts) or 'none measured'}. "
          f"total time {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    main()
