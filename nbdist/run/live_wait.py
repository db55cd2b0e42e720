"""Wait for a run in a cell while its dashboard stays live: `wait_live`.

A cell that waits for training (`%%distribute --wait`, a cell's own `model.fit(...)`) holds
the kernel's main thread, and with it the kernel's asyncio loop: the loop that redraws the
dashboard and reads the shell channel stands still until the cell ends. `wait_live` does both
jobs itself, from the same thread, until the run ends:

- it redraws the dashboard at its cadence (`Dashboard.step`), so the widgets are still only
  touched by the main thread;
- it reads the shell messages meant for the main shell and dispatches the comm messages
  (widget state changes, button clicks) at once, the way ipykernel 7.4 itself dispatches them
  during an async cell (`Kernel.shell_main`: concurrent, the cell's parent header put back
  after each), so Pause, Stop and the sliders act on the run during the wait;
- it keeps every other request (execute, complete, inspect, kernel_info, ...) in arrival order
  and hands them back to the kernel's loop when the wait ends: they run after the cell, as
  they would have, never inside it;
- it calls `on_tick()` on each pass (~10 per second), on the main thread.

Where the shell messages are read, on ipykernel 7: the shell-channel thread forwards each
message for the main shell through an inproc PAIR socket, which the main loop reads
(`SubshellManager.get_shell_channel_to_subshell_pair(None).to_socket`); a kernel without the
shell-channel thread reads the shell ROUTER socket itself (`Kernel.shell_stream.socket`). The
wait reads the same socket on the same thread, so it never races the loop. Without such a
kernel (plain IPython, a script, ipykernel 6, an in-process kernel, a subshell's thread) the
wait is a plain one that still calls `on_tick`.

Ctrl-C (or an error raised by `on_tick`) stops the run and frees the engines before it
propagates, as `Run.wait` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import zmq

if TYPE_CHECKING:
    from nbdist.dashboard.widget import Dashboard
    from nbdist.run.handle import Run

log = logging.getLogger(__name__)

TICK_S = 0.1  # the longest one pass sleeps: how late the end of the run or Ctrl-C is seen
# with an `on_tick` (a fit call's driver: the workers wait at each epoch's end until it has run
# the callbacks) a pass every 0.02 s, so an epoch's end costs them little
TICK_WITH_WORK_S = 0.02
COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})


def wait_live(run: Run, dashboard: Dashboard | None = None, *,
              until: Callable[[], bool] | None = None,
              on_tick: Callable[[], None] | None = None) -> Run:
    """Block this (the kernel's main) thread until `run` ends, or `until()` is true, keeping
    `dashboard` and the notebook's widgets live meanwhile. Raises the run's error if it
    failed, like `run.wait()`; returns the run.

    `on_tick()` is called on every pass and once more after the run has ended (so it sees the
    last epochs). An exception from it, or Ctrl-C, stops the run, then propagates.

    Example:
        >>> dashboard = nbdist.dashboard.widget.show(run)             # doctest: +SKIP
        >>> wait_live(run, dashboard, on_tick=callbacks.dispatch)     # doctest: +SKIP
    """
    main = threading.current_thread() is threading.main_thread()
    inbox = ShellInbox.attach() if main else None
    if not main:
        dashboard = None  # widgets are the main thread's; its loop keeps refreshing them
    next_draw = time.monotonic()
    try:
        while not run.ended() and not (until is not None and until()):
            if on_tick is not None:
                on_tick()
            if dashboard is not None and time.monotonic() >= next_draw:
                dashboard.step()
                next_draw = time.monotonic() + dashboard.refresh_s
            tick = TICK_S if on_tick is None else TICK_WITH_WORK_S
            pause = (tick if dashboard is None
                     else min(tick, max(0.0, next_draw - time.monotonic())))
            if inbox is not None:
                inbox.serve(pause)
            else:
                run.state.ended.wait(pause)  # wakes as soon as the run ends
        if run.ended():
            if on_tick is not None:
                on_tick()
            if dashboard is not None:
                dashboard.step()
    except BaseException:  # Ctrl-C or on_tick's error: stop the workers and hub, free the engines
        run.close(timeout=30)
        raise
    finally:
        if inbox is not None:
            inbox.release()
    if run.ended() and run.error is not None:
        raise run.error
    return run


class ShellInbox:
    """The main shell's incoming messages, read by a cell that blocks the kernel's loop:
    comm messages are dispatched at once, the others kept for the loop."""

    def __init__(self, kernel, socket):
        self.kernel = kernel
        self.socket = socket
        self.kept: list[list] = []  # frames of the requests the loop gets back, in order
        self.live = True  # comm messages are dispatched at once (until one fails to be)
        self._concurrent = "concurrent" in inspect.signature(kernel.dispatch_shell).parameters

    @classmethod
    def attach(cls) -> ShellInbox | None:
        """The inbox of this process's ipykernel (>= 7), or None where there is none."""
        try:
            from IPython import get_ipython  # IPython: only in a shell
        except ImportError:
            return None
        kernel = getattr(get_ipython(), "kernel", None)
        if (kernel is None or getattr(kernel, "session", None) is None
                or not hasattr(kernel, "shell_main")):
            return None  # no kernel, or one before ipykernel 7 (no shell_main to hand back to)
        try:
            thread = getattr(kernel, "shell_channel_thread", None)
            if thread is not None:
                if threading.current_thread() is not thread.parent_thread:
                    return None
                socket = thread.manager.get_shell_channel_to_subshell_pair(None).to_socket
            else:
                socket = kernel.shell_stream.socket
        except Exception as exc:  # noqa: BLE001 - another kernel layout: wait without the inbox
            log.debug("no shell inbox in this kernel (%s): a plain wait", exc)
            return None
        return cls(kernel, socket) if isinstance(socket, zmq.Socket) else None

    def serve(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for messages, then take every one waiting."""
        if not self.socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            return
        while True:
            with _ctrl_c_deferred():  # a request read off the socket is kept before Ctrl-C acts
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                comm = self.live and self._msg_type(frames) in COMM_TYPES
                if not comm:
                    self.kept.append(frames)
            if comm:
                try:
                    self._dispatch(frames)
                except Exception as exc:  # noqa: BLE001 - a kernel unlike 7.4 inside: stop trying
                    self.live = False
                    log.warning("a widget message could not be handled during the wait (%r); it "
                                "is dropped, and the next ones wait for the end of the cell", exc)

    def release(self) -> None:
        """Hand the kept requests to the kernel's loop, in order: each waits there for the
        main shell's lock (held by this cell), as if the loop had read it itself. What is
        still on the socket (a Ctrl-C that ended the wait in its poll) is taken first: the
        loop's reader is woken only when a message reaches an empty socket (ZeroMQ's
        descriptor is edge-triggered, and the poll consumed the edge), so a message left
        there would keep the kernel from ever reading the shell again."""
        with _ctrl_c_deferred():
            while True:
                try:
                    self.kept.append(self.socket.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
            kept, self.kept = self.kept, []
            for frames in kept:
                self.kernel.io_loop.add_callback(self.kernel.shell_main, None, frames)

    def _msg_type(self, frames: list) -> str | None:
        """The message's type from its signed header (the signature is checked, the content
        left packed); None for what is not a message (ipykernel's own 'stop aborting')."""
        session = self.kernel.session
        try:
            _, rest = session.feed_identities(frames, copy=False)
            return session.deserialize(rest, content=False, copy=False)["header"]["msg_type"]
        except Exception:  # noqa: BLE001 - kept: the loop's own dispatch deals with it
            return None

    def _dispatch(self, frames: list) -> None:
        """The kernel's own dispatch of one comm message, with the cell's parent put back
        after it, so what the cell prints or draws next still goes under the cell."""
        kernel = self.kernel
        parent, ident = kernel.get_parent("shell"), kernel._parent_ident["shell"]  # noqa: SLF001
        options = {"concurrent": True} if self._concurrent else {}
        context = contextvars.copy_context()
        try:
            coro = kernel.dispatch_shell(frames, subshell_id=None, **options)
            try:
                waiting = context.run(coro.send, None)
            except StopIteration:
                return
            # It awaits something only the loop can deliver (no comm handler of ipykernel 7.4
            # does): the loop finishes it after the cell.
            kernel.io_loop.add_callback(_finish, coro, waiting, context)
        finally:
            kernel.set_parent(ident, parent, channel="shell")


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Ctrl-C during the block acts at its end, so a request read off the socket is always
    kept (a Ctrl-C between reading and keeping it would lose it: never answered). Main
    thread only, as `signal.signal` requires (the inbox is attached there only)."""
    caught: list[tuple] = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])
        elif caught and previous == signal.SIG_DFL:
            raise KeyboardInterrupt


async def _finish(coro, waiting, context: contextvars.Context) -> None:
    """Drive to its end, on the loop, a coroutine that suspended while stepped by hand."""
    while True:
        if waiting is None:
            await asyncio.sleep(0)
        else:
            await asyncio.wait({waiting})
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            return
