"""`wait_live` where there is no kernel (a script, plain IPython, this test process): a plain
wait on a real `--mode local` run that still calls `on_tick`, stops the run on Ctrl-C or on
`on_tick`'s error, and raises the run's own error. With a kernel: tests/e2e/test_live_wait.py."""

import asyncio
import contextvars

import pytest

import nbdist
from nbdist.errors import TrainingError
from nbdist.run.live_wait import ShellInbox, _finish, wait_live
from tests.helpers import SYNTHETIC_CELL, global_step


def run_pausing_at(step: int):
    """A run that pauses itself at `step` (of 113): it cannot end before the test stops it,
    whatever the machine's speed."""
    return nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", batch_size=8, pause_at=step)


def test_there_is_no_shell_inbox_outside_a_kernel():
    assert ShellInbox.attach() is None


def test_on_tick_runs_on_every_pass_and_once_after_the_end():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", batch_size=32, pause_at=0)
    seen = []

    def on_tick():
        seen.append(run.done())
        if len(seen) == 1:  # the run waits, paused, for the first tick
            run.resume()

    assert wait_live(run, on_tick=on_tick) is run
    assert run.status == "finished"
    assert seen[0] is False and seen[-1] is True  # called while it trained, and after


def test_until_returns_with_the_run_still_training():
    run = run_pausing_at(20)
    with run:
        wait_live(run, until=lambda: global_step(run) >= 20)
        assert not run.done() and global_step(run) >= 20
    assert run.status == "stopped"


@pytest.mark.parametrize("error", [KeyboardInterrupt, ZeroDivisionError])
def test_ctrl_c_or_an_error_in_on_tick_stops_the_run_and_propagates(error):
    run = run_pausing_at(10)

    def on_tick():
        if global_step(run) >= 10:
            raise error

    with pytest.raises(error):
        wait_live(run, on_tick=on_tick)
    assert run.done() and run.status == "stopped"


def test_the_runs_own_error_is_raised_like_run_wait():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=3, lr=1e30)
    with pytest.raises(TrainingError, match=r"became (nan|inf) at step \d+"):
        wait_live(run)
    assert run.status == "failed"


def test_a_handler_that_suspends_while_stepped_by_hand_is_finished_on_the_loop():
    """A comm dispatch that awaits (none does in ipykernel 7.4) is handed to the kernel's loop
    with what it awaits, in its own context, and runs to its end there."""
    where = contextvars.ContextVar("where", default="cell")
    done = []

    async def handler(ready):
        where.set("handler")
        done.append(await ready)
        await asyncio.sleep(0)
        done.append(where.get())

    async def loop():
        ready = asyncio.get_running_loop().create_future()
        coro, context = handler(ready), contextvars.copy_context()
        waiting = context.run(coro.send, None)  # as ShellInbox._dispatch steps it
        assert waiting is ready and done == []
        ready.set_result("clicked")
        await _finish(coro, waiting, context)
        assert where.get() == "cell"  # the handler's context stayed its own

    asyncio.run(loop())
    assert done == ["clicked", "handler"]
