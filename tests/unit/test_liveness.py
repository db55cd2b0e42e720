"""Liveness that a pause cannot fool: silence counts only the time the watcher's own loop ran
(`RunningClock`), so a stopped or starved hub (or kernel) blames no one for the gap, while a
worker that is really gone is still found at its deadline. Clock readings are fed by hand."""

from nbdist.core.coordinator import Coordinator, Plan
from nbdist.core.liveness import (
    GAP_S,
    LEASE_GAP_S,
    LOST_FIRST_S,
    LOST_STEPS,
    Lease,
    Liveness,
    RunningClock,
    lease_term,
)
from nbdist.wire.messages import Hello, Step


def test_the_running_clock_counts_intervals_in_full_up_to_its_gap_and_no_time_going_back():
    clock = RunningClock(max_step_s=2.0)
    readings = [50.0, 50.5, 52.5, 52.75, 92.75, 93.0, 90.0, 90.5, 93.5]
    assert [clock.read(t) for t in readings] == [0.0, 0.5, 2.5, 2.75, 4.75, 5.0, 5.0, 5.0, 5.5]
    assert clock.discounted == 38.0  # the 40 s interval counted 2 s
    # a reading that went back (an NTP step of a non-monotonic source) counts nothing, and the
    # time up to the last reading is not counted twice
    assert clock.elapsed == 5.5


def test_a_suspend_of_the_hub_writes_off_no_worker_but_real_silence_still_does():
    """Hub loop readings every 0.5 s; both workers push each turn (0.5 s steps: a deadline of
    LOST_STEPS x 0.5 = 10 s), worker 1 stops at 10 s. At 12 s the hub is stopped for 40 s (a
    laptop's lid): on raw readings both would be 40 s silent, past their deadline; on the
    running clock worker 0 is GAP_S silent, and worker 1 is found once the hub has watched it
    for 10 s."""
    clock, live = RunningClock(), Liveness()
    for turn in range(25):  # 0 .. 12 s
        t = clock.read(100.0 + 0.5 * turn)
        live.heard(0, t), live.pushed(0, t, slowdown=1.0)
        if t <= 10.0:
            live.heard(1, t), live.pushed(1, t, slowdown=1.0)
    deadline = live.deadline(1, 1.0, False)
    assert t == 12.0 and deadline == LOST_STEPS * 0.5 == live.deadline(0, 1.0, False)
    now = clock.read(152.0)  # the hub ran again 40 s later
    assert now == 12.0 + GAP_S and clock.discounted == 40.0 - GAP_S
    assert live.silent(0, now) == GAP_S and live.silent(1, now) == 2.0 + GAP_S < deadline
    # worker 0 speaks each turn; worker 1 is really gone: lost after 10 s of watching, not before
    for turn in range(1, 13):
        now = clock.read(152.0 + 0.5 * turn)
        live.heard(0, now)
    assert now == 20.0 and live.silent(1, now) == deadline  # not yet past it
    now = clock.read(152.0 + 0.5 * 13)
    assert live.silent(1, now) == 10.5 > deadline and live.silent(0, now) == 0.5


def test_the_coordinator_on_a_running_clock_loses_only_the_worker_that_went_quiet():
    """Worker 0 pushes every 0.5 s; worker 1 said hello and never pushed (its first deadline,
    LOST_FIRST_S). A 998 s stop of the hub loses nobody; worker 1 is lost once the hub has run
    LOST_FIRST_S since it spoke, not a turn sooner."""
    p = Plan(num_workers=2, num_samples=4000, epochs=1, batch_size=4, lr=0.1,
             has_validation=False)
    c = Coordinator(p)
    clock = RunningClock()
    c.hello(Hello(0, host="h", engine=0)), c.hello(Hello(1, host="h", engine=1))
    c.heard(0, clock.read(0.0)), c.heard(1, clock.read(0.0))

    def turn(reading: float) -> float:
        t = clock.read(reading)
        (chunk,) = c.work_for(0, True, 0).chunks
        c.heard(0, t)
        c.push(Step(0, chunks=[chunk.id]), delay=0, now=t)
        return t

    for k in range(1, 5):
        turn(0.5 * k)
    assert c.overdue(clock.read(1000.0)) == []  # on the raw readings: [0, 1]
    assert clock.read(1000.0) == 2.0 + GAP_S
    quiet_until = LOST_FIRST_S - (2.0 + GAP_S)  # running time left before worker 1 is overdue
    ks = int(quiet_until / 0.5)
    for k in range(1, ks + 1):
        t = turn(1000.0 + 0.5 * k)
    assert t == LOST_FIRST_S and c.overdue(t) == []
    t = turn(1000.0 + 0.5 * (ks + 1))
    assert c.overdue(t) == [1]


def test_the_kernels_lease_lapses_after_its_term_of_silence_and_is_renewed_by_each_message():
    lease = Lease(term_s=4.0, now=0.0, first_s=30.0)
    assert not lease.lapsed(29.0) and lease.lapsed(30.5)  # before the kernel's first message
    lease.renew(31.0)
    assert not lease.lapsed(35.0) and lease.lapsed(35.25)  # then the term alone
    lease.renew(35.1)
    lease.renew(34.0)  # a reading that went back does not shorten the term
    assert lease.silent(39.0) == 39.0 - 35.1 and not lease.lapsed(39.0)


def test_a_suspend_of_kernel_and_hub_together_lapses_no_lease_but_a_dead_kernel_does():
    """The hub's loop reads its clock every 0.5 s, the kernel polls every 0.25 s. Both are
    stopped for 40 s (a laptop's lid): on the lease's running clock the kernel was silent
    LEASE_GAP_S. Then the kernel dies: the lease lapses after its term of the hub's running time."""
    term = lease_term(8.0)
    clock = RunningClock(max_step_s=LEASE_GAP_S)
    lease = Lease(term, clock.read(100.0))
    for turn in range(1, 21):
        lease.renew(clock.read(100.0 + 0.5 * turn))
    now = clock.read(150.0)  # 40 s later: the hub ran again, the kernel's poll comes at once
    assert not lease.lapsed(now) and lease.silent(now) == LEASE_GAP_S
    lease.renew(clock.read(150.1))
    lapsed = next(t for t in (150.1 + 0.5 * k for k in range(1, 40))
                  if lease.lapsed(clock.read(t)))
    assert lapsed == 150.1 + 0.5 * 13 and term == 6.0  # the first check past 6 s of silence


def test_the_lease_term_leaves_the_workers_room_to_leave_within_the_timeout():
    assert [lease_term(t) for t in (120.0, 8.0, 4.0, 1.0)] == [118.0, 6.0, 2.0, 0.5]
