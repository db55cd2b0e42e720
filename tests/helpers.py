"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 120.0, poll_s: float = 0.05) -> None:
    """Poll `condition` until it is true; fail the test after `timeout` seconds. A bound on a
    wait for an event, not a timing assertion: generous, so a loaded machine only waits longer."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition not reached within {timeout:g}s"
        time.sleep(poll_s)
