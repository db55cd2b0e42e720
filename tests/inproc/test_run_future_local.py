"""Real runs in this process (--mode local and simulate): the Run as a `concurrent.futures.Future`
(`wait`, `as_completed`, `asyncio.wrap_future`, its Keras History, cancel, a failure), and the
backends' `current_weights` while a run trains. The same on a cluster: test_async_cluster.py
and test_sync_cluster.py; a Run without a hub: tests/unit/test_run_future.py."""

import asyncio
import threading
from concurrent import futures

import keras
import numpy as np
import pytest

import nbdist
from nbdist.engine.flat_layout import read_flat
from nbdist.errors import TrainingError
from tests.helpers import SYNTHETIC_CELL, wait_for, wait_paused

SEEDED_CELL = SYNTHETIC_CELL.replace("import keras\n",
                                     "import keras\nkeras.utils.set_random_seed(7)\n")


def test_cancel_stops_the_run_and_a_done_callback_runs_once_from_the_monitor_thread():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", pause_at=0)  # ends if stopped
    seen = []
    run.add_done_callback(
        lambda r: seen.append((threading.current_thread().name, r.done(), r.status)))
    assert run.running() and not run.done() and not run.cancelled()
    assert run.cancel() is True
    history = run.result(timeout=60)  # a stopped run has a result: what it trained
    assert isinstance(history, keras.callbacks.History) and run.exception() is None
    assert run.status == "stopped" and not run.cancelled()  # (a Future that ran, not cancelled)
    assert not run.running() and run.cancel() is False
    wait_for(lambda: seen, 30, what="the done callback")  # it runs just after the end is set
    late = []
    run.add_done_callback(lambda r: late.append(threading.current_thread().name))
    assert seen == [(f"nbdist-run-{run.run_id}", True, "stopped")]  # once, after the end
    assert late == [threading.current_thread().name]  # ended already: at once, here


def test_wait_and_as_completed_take_a_run_and_its_result_is_a_history_of_its_epochs():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=2)
    done, pending = futures.wait([run], timeout=120)
    assert done == {run} and not pending and run.status == "finished"
    assert list(futures.as_completed([run], timeout=0)) == [run]
    history = run.result()
    assert isinstance(history, keras.callbacks.History) and history.epoch == [0, 1]
    assert len(history.history["loss"]) == 2 and history.model is run.model
    assert run.keras_history is None  # (no fit call: the History is built from the epochs)
    assert history.history["loss"][1] < history.history["loss"][0]
    assert history.history["val_accuracy"] == list(
        run.history.dropna(subset=["val_accuracy"]).groupby("epoch")["val_accuracy"].last())


def test_a_run_awaited_with_asyncio_wrap_future_gives_its_history():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=1)

    async def main():
        return await asyncio.wait_for(asyncio.wrap_future(run), timeout=120)

    history = asyncio.run(main())
    assert history is run.result() and history.epoch == [0]


def test_a_failed_run_gives_its_error_to_result_and_exception():
    run = nbdist.train(SYNTHETIC_CELL, namespace={}, mode="local", epochs=3, lr=1e30)
    error = run.exception(timeout=120)
    assert isinstance(error, TrainingError) and error is run.error
    assert "The notebook's model holds the weights of" in str(error)  # what it kept
    with pytest.raises(TrainingError, match=r"became (nan|inf) at step"):
        run.result()
    assert run.done() and not run.running() and not run.cancelled()

    async def main():
        return await asyncio.wrap_future(run)

    with pytest.raises(TrainingError, match=r"became (nan|inf) at step"):
        asyncio.run(main())


def paused_weights(run) -> tuple:
    """Once `run` (pause_at=20) has paused itself and every worker holds (its step in flight has
    landed: nothing changes the weights from then on), read the current weights twice."""
    wait_paused(run)
    state = run.state
    first = state.backend.current_weights(state.control)
    return first, state.backend.current_weights(state.control)


@pytest.mark.parametrize("mode", ["local", "simulate"])
def test_current_weights_are_the_trained_ones_while_it_trains_and_the_final_ones_when_stopped(mode):
    start = {}
    exec(compile(SEEDED_CELL, "<cell>", "exec"), start)  # noqa: S102 - the weights it starts from
    initial = read_flat(start["model"])[0]
    ns = {}
    workers = 2 if mode == "simulate" else None
    run = nbdist.train(SEEDED_CELL, namespace=ns, mode=mode, workers=workers, batch_size=8,
                       pause_at=20)
    (params, non_trainable), (again, _) = paused_weights(run)
    assert params.shape == initial.shape and params.dtype == np.float32 and non_trainable.size == 0
    assert not np.array_equal(params, initial)  # trained
    np.testing.assert_array_equal(params, again)  # paused: the same weights
    run.stop()
    run.wait(timeout=60)
    np.testing.assert_array_equal(read_flat(ns["model"])[0], params)  # nothing trained since
