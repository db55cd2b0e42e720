"""A Run in the shape of a `concurrent.futures.Future`, without a hub: what each method says
before and after the end. The same with real runs: tests/inproc/test_run_future_local.py."""

import ast
import pathlib
import threading

import pytest

from nbdist.errors import TrainingError
from tests.helpers import end, fed_run

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_running_run_is_not_done_and_result_and_exception_time_out():
    run = fed_run(2)
    assert not run.done() and run.running() and not run.cancelled()
    with pytest.raises(TimeoutError, match="still running after 0.01s"):
        run.result(timeout=0.01)
    with pytest.raises(TimeoutError, match="still running after 0.01s"):
        run.exception(timeout=0.01)


def test_a_finished_run_is_its_result_and_calls_a_late_callback_at_once_here():
    run = end(fed_run(2))
    assert run.done() and not run.running() and not run.cancelled()
    assert run.result() is run and run.result(timeout=0) is run and run.exception() is None
    called = []
    run.add_done_callback(lambda r: called.append((r, threading.current_thread())))
    assert called == [(run, threading.current_thread())]
    assert run.cancel() is False  # nothing left to cancel


def test_a_failed_run_raises_its_error_from_result_and_returns_it_from_exception():
    run = fed_run(1)
    run.state.error = TrainingError("The hub failed: gone")
    end(run, "failed")
    with pytest.raises(TrainingError, match="The hub failed: gone"):
        run.result()
    assert run.exception() is run.state.error and not run.cancelled()


def test_a_stopped_run_is_cancelled_and_still_has_a_result():
    run = end(fed_run(1), "stopped")
    assert run.cancelled() and run.result() is run and run.exception() is None


def test_a_callback_that_raises_is_logged_and_the_next_one_still_runs(caplog):
    run = end(fed_run(1))
    called = []
    run.add_done_callback(lambda r: 1 / 0)
    run.add_done_callback(called.append)
    assert called == [run]
    assert "done callback" in caplog.text and "ZeroDivisionError" in caplog.text


def test_no_code_reads_done_as_an_attribute_any_more():
    """`run.done` was a property; it is the method `run.done()` now, and a bound method is
    always true: a forgotten call would silently read as "ended"."""

    def reads(path: pathlib.Path) -> list[str]:
        tree = ast.parse(path.read_text())
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        return [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and n.attr == "done" and id(n) not in called
                and "run" in ast.unparse(n.value).lower()]

    found = [hit for folder in ("nbdist", "tests", "benchmarks", "scripts")
             for path in (ROOT / folder).rglob("*.py") for hit in reads(path)]
    assert found == []
