"""`hub_throughput.py --profile`: where one hub shard's CPU goes per push, phase by phase.

One worker pushes and pulls as fast as it can against one shard (its own process) for a
window of seconds; the shard counts its thread's CPU time per phase (`nbdist.hub.profile`,
on only here) and reports microseconds per push. "clock" is what the profiler's own clock
reads added (marks per push x one read, ~0.7 us each). "python" is the phases' sum less
the bytes moved or hashed (the update with its fused copy-out, and the two MACs) and less
"clock": the hub's own Python and zmq calls, which the target wants under 100 us per push
(the update's own Python, a few ufunc calls, stays in "update"). "process CPU" is the hub
process's whole CPU time per push, warm-up and profiler included (the update pool and
zmq's I/O thread too: over TCP that is where the kernel's socket copies show).
"""

from __future__ import annotations

import os

from _common import median, table

from nbdist.hub.profile import ARITHMETIC, PHASES


def profile_table(nbdist_cell, sizes: list[int], seconds: float, transports: list[str],
                  repeats: int) -> None:
    """Measure and print the per-phase table (median over `repeats` per phase)."""
    print(f"hub CPU per push by phase (us), 1 shard, 1 worker, {seconds:g} s window, "
          f"{repeats} repeat(s); load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for size in sizes:
        for transport in transports:
            runs = [nbdist_cell(size, 1, 1, transport, seconds, profile=True)
                    for _ in range(repeats)]
            prof = {p: median([r["profile"][p] for r in runs]) for p in (*PHASES, "clock")}
            total = sum(prof[p] for p in PHASES)
            python = total - sum(prof[p] for p in ARITHMETIC) - prof["clock"]
            name = "shm" if transport == "auto" else transport
            rows.append([f"{size:,}", name, *(prof[p] for p in PHASES), total, prof["clock"],
                         python, 1e3 * median([r["hub_cpu_ms"] for r in runs]),
                         median([r["rate"] for r in runs])])
            print(f"  {size:,} {name}: python {python:.0f} us/push, total {total:.0f}", flush=True)
    print(table(["params", "link", *PHASES, "sum", "clock", "python", "process CPU", "push/s"],
                rows))
    print(f"python = sum - ({' + '.join(ARITHMETIC)}) - clock (the profiler's own clock reads); "
          f"target: python < 100 us/push on shm at 269K. load {os.getloadavg()[0]:.2f} (1 min)")
