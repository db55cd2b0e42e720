"""Where a hub shard's CPU goes, phase by phase, when asked (`HubSpec.profile`).

The serve loop calls `mark(phase)` after each phase of a message; `PhaseClock` adds the
thread's CPU time since the previous mark to that phase. Off (the default), `mark` is a
function that does nothing, so the loop pays one empty call per phase and no clock read.
`benchmarks/hub_throughput.py --profile` turns it on and prints the table per push. Each mark
reads the thread's CPU clock (a system call, ~0.7 us here); the summary says how much of the
phases' sum that is (`clock`).

Phases of a push, in order (`PHASES`):
    recv     the frames off the socket with the bounded-receive checks (`wire.recv_bounded`);
             the receive also waits (there is no poll), so its wake-up is counted here
    mac_in   the request's keyed BLAKE3 MAC over header and buffers
    parse    header JSON, envelope, op-field and segment checks, `Step` decode, the link
    update   the rule and optimizer on the shard's slice (with the fused copy-out of the reply)
    reply    the coordinator's assignment and the reply header (`ShardCore.reply`, `Reply`)
    encode   the reply header's JSON and envelope (and, over TCP, the reply's copy-out)
    mac_out  the reply's MAC
    send     the frames onto the socket
    settle   the pushes' accounting after the reply (statistics, timeline, delays), every
             `server.SETTLE_EVERY` pushes
    loop     the rest of the loop: held replies, group timeouts, lost-worker checks
"""

from __future__ import annotations

import time

from nbdist.hub.protocol import no_mark

PHASES = ("recv", "mac_in", "parse", "update", "reply", "encode", "mac_out", "send", "settle",
          "loop")
ARITHMETIC = ("update", "mac_in", "mac_out")  # bytes moved or hashed; the rest is Python and zmq


class PhaseClock:
    """Thread CPU nanoseconds per phase; `mark(phase)` charges the time since the last mark."""

    def __init__(self):
        self.ns = dict.fromkeys(PHASES, 0)
        self.pushes = self.marks = 0
        self.mark_ns = _clock_cost_ns()
        self._last = time.thread_time_ns()

    def mark(self, phase: str) -> None:
        now = time.thread_time_ns()
        self.ns[phase] += now - self._last
        self._last = now
        self.marks += 1

    def summary(self) -> dict:
        """Microseconds per push for each phase, the pushes counted, and `clock`: what reading
        the clock itself added per push (marks per push x one read), spread over the phases."""
        per = max(1, self.pushes)
        return {"pushes": self.pushes, **{p: self.ns[p] / 1e3 / per for p in PHASES},
                "clock": self.marks * self.mark_ns / 1e3 / per}


def _clock_cost_ns(reads: int = 200, rounds: int = 10) -> float:
    """One read of the thread's CPU clock, in ns (a system call: ~0.7 us here); the least of
    a few rounds, so a preemption while measuring does not count."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(reads):
            time.thread_time_ns()
        best = min(best, (time.perf_counter_ns() - t0) / reads)
    return best


def marker(on: bool) -> tuple[PhaseClock | None, object]:
    """(clock, mark): a real clock when `on`, else (None, a mark that does nothing)."""
    if not on:
        return None, no_mark
    clock = PhaseClock()
    return clock, clock.mark
