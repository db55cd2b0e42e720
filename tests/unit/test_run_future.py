"""A Run is a `concurrent.futures.Future`; without a hub: what each method says before and
after the end, `wait`/`as_completed`, and its result (a Keras History). The same with real
runs: tests/inproc/test_run_future_local.py."""

import ast
import pathlib
import threading
from concurrent import futures
from concurrent.futures import Future

import pytest

from nbdist.errors import TrainingError
from nbdist.run.result import epoch_logs
from tests.helpers import end, fed_run

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_running_run_is_not_done_and_result_and_exception_time_out():
    run = fed_run(2)
    assert not run.done() and run.running() and not run.cancelled()
    with pytest.raises(TimeoutError, match="still running after 0.01s"):
        run.result(timeout=0.01)
    with pytest.raises(TimeoutError, match="still running after 0.01s"):
        run.exception(timeout=0.01)


def test_a_finished_run_is_a_done_future_whose_result_is_its_history():
    history = object()  # (a keras.callbacks.History: tests/inproc/test_run_future_local.py)
    run = end(fed_run(2), history=history)
    assert isinstance(run, Future)
    assert run.done() and run.ended() and not run.running() and not run.cancelled()
    assert run.result() is history and run.result(timeout=0) is history
    assert run.exception() is None
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


def test_a_stopped_run_is_not_cancelled_it_has_a_result():
    """A stopped run (`stop()` or `cancel()`) ends with a result, as a Future that ran; a
    cancelled Future would make `await asyncio.wrap_future(run)` raise CancelledError."""
    history = object()
    run = end(fed_run(1), "stopped", history=history)
    assert not run.cancelled() and run.status == "stopped"
    assert run.result() is history and run.exception() is None


def test_a_callback_that_raises_is_logged_and_the_next_one_still_runs(caplog):
    run = end(fed_run(1))
    called = []
    run.add_done_callback(lambda r: 1 / 0)
    run.add_done_callback(called.append)
    assert called == [run]
    assert "exception calling callback" in caplog.text and "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("call", [lambda r: r.set_result(None),
                                  lambda r: r.set_exception(ValueError()),
                                  lambda r: r.set_running_or_notify_cancel()])
def test_only_the_monitor_sets_a_runs_future_state(call):
    run = fed_run(1)
    with pytest.raises(TrainingError, match="set by its monitor thread"):
        call(run)
    assert not run.done()


def test_wait_and_as_completed_take_runs():
    ended, going = end(fed_run(1)), fed_run(1)
    done, pending = futures.wait([ended, going], timeout=0)
    assert done == {ended} and pending == {going}
    assert list(futures.as_completed([ended], timeout=0)) == [ended]


def test_a_fit_call_runs_result_is_the_history_its_call_returned():
    run = fed_run(1)
    run.state.fit_call_returned = threading.Event()  # (as begin_run sets it for a fit call)
    returned = object()  # the History the cell's model.fit(...) returned
    run.fit_call_returned(returned)
    assert end(run).result() is returned is run.keras_history


def test_the_history_built_from_the_rows_weights_losses_by_batch_size_and_adds_validation():
    """A row's epoch is the progress after its push: 1.0 ends the first epoch."""
    rows = [[0.1, 1, 0.25, 0, 1.0, 0, 10], [0.2, 2, 1.0, 1, 4.0, 0, 30],
            [0.3, 3, 1.5, 0, 2.0, 0, 8], [0.4, 4, 1.75, 1, None, 0, 8]]
    evals = [{"epoch": 0, "step": 2, "val_loss": 3.5, "version": 2},
             {"epoch": 1, "step": 4, "val_loss": 2.5, "val_accuracy": 0.75}]
    assert epoch_logs(rows, evals) == {0: {"loss": 3.25, "val_loss": 3.5},
                                       1: {"loss": 2.0, "val_loss": 2.5, "val_accuracy": 0.75}}


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
