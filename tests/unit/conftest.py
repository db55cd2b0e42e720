"""The unit tier holds: a unit test opens no socket (Python's or ZeroMQ's), starts no thread and
does not import TensorFlow or Keras. A test that does fails, naming what it did; it belongs in
tests/inproc (real sockets, threads and Keras inside the test process).

Sockets are seen by an audit hook (`socket.__new__`), ZeroMQ and threads by patching their
constructors for the test. The refusal is raised where the call is made and also recorded, so
a test that catches the error still fails. TensorFlow and Keras are seen by the `import` audit
event, raised only for a module that is not in `sys.modules`: where another tier (or the
collection of its files) loaded them already, they are taken out of `sys.modules` for the
test and put back after it, so any import of them in the test is refused all the same.
"""

from __future__ import annotations

import sys
import threading

import pytest
import zmq

HEAVY = ("tensorflow", "keras")  # a unit test runs on NumPy; these take seconds to import
_breaches: list[str] | None = None  # what the running unit test did that it must not (None: off)


class TierError(AssertionError):
    """A unit test used what only tests/inproc and the tiers above may use."""


def _refuse(what: str) -> None:
    _breaches.append(what)
    raise TierError(f"A unit test {what}; tests/unit holds pure tests (no sockets, threads or "
                    "TensorFlow). Move the test to tests/inproc, or test the pure part it uses.")


def _audit(event: str, args: tuple) -> None:
    if _breaches is None:
        return
    if event == "socket.__new__":
        _refuse("opened a socket")
    elif event == "import" and str(args[0]).split(".")[0] in HEAVY:
        _refuse(f"imported {args[0]}")


sys.addaudithook(_audit)  # an audit hook cannot be removed: `_breaches is None` turns it off

REFUSED = ((threading.Thread, "start", "started a thread"),
           (zmq.Context, "__init__", "made a ZeroMQ context (it starts I/O threads)"),
           (zmq.Socket, "__init__", "opened a ZeroMQ socket"))


@pytest.fixture(autouse=True)
def stays_in_its_tier(request, monkeypatch):
    """Fail the test if it opened a socket, started a thread or imported TensorFlow."""
    global _breaches
    for target, name, what in REFUSED:
        monkeypatch.setattr(target, name, lambda *args, _what=what, **kwargs: _refuse(_what))
    loaded = {name: sys.modules.pop(name) for name in HEAVY if name in sys.modules}
    _breaches = []
    try:
        yield
    finally:
        breaches, _breaches = _breaches, None
        sys.modules.update(loaded)
    call = getattr(request.node, "rep_call", None)  # (tests/conftest.py keeps it)
    if breaches and not (call is not None and call.failed):  # else its failure says it already
        pytest.fail(f"this unit test {', '.join(dict.fromkeys(breaches))} (see tests/unit/conftest.py)")
