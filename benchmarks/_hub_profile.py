"""`hub_throughput.py --profile`: where one hub shard's CPU goes per push, phase by phase.

One worker pushes and pulls as fast as it can against one shard (its own process) for a
window of seconds; the shard counts its thread's CPU time per phase (`nbdist.hub.profile`,
on only here) and reports microseconds per push. "python" is every phase but the bytes
moved or hashed (the update with its fused copy-out, and the two MACs): the hub's own
Python and zmq calls, which the target wants under 100 us per push. "process CPU" is the
hub process's whole CPU time per push (the update pool and zmq's I/O thread included), and
"clock" the difference between the phases' sum and the thread's CPU over the window (the
cost of reading the clock, about 1 us per mark).
"""

from __future__ import annotations

import os

from _common import median, table

from nbdist.hub.profile import ARITHMETIC, PHASES


def profile_table(nbdist_cell, sizes: list[int], seconds: float, transports: list[str], repeats: int) -> None:
    """Measure and print the per-phase table (median over `repeats` per phase)."""
    print(f"hub CPU per push by phase (us), 1 shard, 1 worker, {seconds:g} s window, "
          f"{repeats} repeat(s); load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for size in sizes:
        for transport in transports:
            runs = [nbdist_cell(size, 1, 1, transport, seconds, profile=True) for _ in range(repeats)]
            prof = {p: median([r["profile"][p] for r in runs]) for p in PHASES}
            total = sum(prof.values())
            python = total - sum(prof[p] for p in ARITHMETIC)
            name = "shm" if transport == "auto" else transport
            rows.append([f"{size:,}", name, *(prof[p] for p in PHASES), total, python,
                         1e3 * median([r["hub_cpu_ms"] for r in runs]), median([r["rate"] for r in runs])])
            print(f"  {size:,} {name}: python {python:.0f} us/push, total {total:.0f}", flush=True)
    print(table(["params", "link", *PHASES, "sum", "python", "process CPU", "push/s"], rows))
    print(f"python = sum - ({' + '.join(ARITHMETIC)}); target: python < 100 us/push on shm at 269K. "
          f"load {os.getloadavg()[0]:.2f} (1 min)")
