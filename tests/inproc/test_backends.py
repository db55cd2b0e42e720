"""The same cell on Keras's JAX and PyTorch backends: the worker's flat gradient equals
TensorFlow's, 50 hub steps with Adam equal Keras's own fit on that backend, what a backend
cannot run is refused with what to do instead, and a cell's own KERAS_BACKEND line chooses
the backend. Each backend runs in a child process (`tests/backend_child.py`): Keras picks its
backend once per process. (On a real cluster: tests/cluster/test_backends_cluster.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.backend_child import RESULT
from tests.backend_child import gradients as tensorflow_gradients

ROOT = Path(__file__).resolve().parents[2]
OTHERS = ("jax", "torch")
pytestmark = pytest.mark.slow


def child(case: str, *args: str, backend: str | None = None, timeout: float = 240) -> dict:
    """Run `tests.backend_child CASE ARGS` with KERAS_BACKEND=backend (None: unset)."""
    return start_child(case, *args, backend=backend, timeout=timeout)()


def start_child(case: str, *args: str, backend: str | None = None,
                timeout: float = 240) -> Callable[[], dict]:
    """Start `tests.backend_child CASE ARGS` with KERAS_BACKEND=backend (None: unset); returns
    what waits for its result (so that two children can run at once)."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    if backend is not None:
        env["KERAS_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    process = subprocess.Popen([sys.executable, "-m", "tests.backend_child", case, *args],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)

    def result() -> dict:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
        assert process.returncode == 0 and lines, stderr[-3000:]
        return json.loads(lines[-1][len(RESULT):])

    result.process = process
    return result


@pytest.fixture(scope="module")
def on_both(tmp_path_factory):
    """`on_both(case, backend, *args)`: the case's result on that backend. The first test of a
    case starts its JAX and its PyTorch child together, and the other backend's test collects
    its result: a child keeps about one core busy (imports, tracing, small steps), and the two
    together take about 60% of one after the other. An argument "{backend}" names the backend."""
    waiting: dict[tuple[str, str], Callable[[], dict]] = {}
    folder = tmp_path_factory.mktemp("children")

    def result(case: str, backend: str, *args: str, timeout: float = 240) -> dict:
        if (case, backend) not in waiting:
            for each in OTHERS:
                waiting[case, each] = start_child(
                    case, *(str(folder / a.format(backend=each)) if "{backend}" in a else a
                            for a in args), backend=each, timeout=timeout)
        return waiting.pop((case, backend))()

    yield result
    for wait in waiting.values():  # a backend's test deselected (-k): end its child
        wait.process.kill()
        wait.process.communicate()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """TensorFlow's numbers, computed in this (TensorFlow) process."""
    import keras

    assert keras.backend.backend() == "tensorflow"
    out = tmp_path_factory.mktemp("grads") / "tensorflow.npz"
    tensorflow_gradients(str(out))
    return dict(np.load(out))


@pytest.mark.parametrize("backend", OTHERS)
def test_the_flat_gradient_equals_tensorflows_for_sequential_functional_and_subclassed_models(
        backend, reference, on_both):
    said = on_both("gradients", backend, "{backend}.npz")
    out = said["out"]
    assert (said["backend"] == backend
            and said["models"] == ["functional", "sequential", "subclassed"])
    theirs = dict(np.load(out))
    assert set(theirs) == set(reference)
    for model in said["models"]:
        assert (theirs[f"{model}/flat"][0]
                == {"jax": "JaxFlatModel", "torch": "TorchFlatModel"}[backend])
        for what in ("grad", "held_grad", "loss", "nt"):  # held: gathered by index from held arrays
            np.testing.assert_allclose(theirs[f"{model}/{what}"], reference[f"{model}/{what}"],
                                       rtol=0, atol=1e-5, err_msg=f"{backend} {model} {what}")
        assert np.abs(reference[f"{model}/grad"]).max() > 1e-2  # the gradients are not all zero
        # metric increments: loss total and count, accuracy total and count
        np.testing.assert_allclose(theirs[f"{model}/metrics"], reference[f"{model}/metrics"],
                                   rtol=1e-5)
    assert reference["functional/nt"].size == 16  # BatchNorm's moving mean and variance move too


@pytest.mark.parametrize("backend", OTHERS)
def test_fifty_hub_steps_with_adam_equal_keras_fit_on_the_same_backend(backend, on_both):
    said = on_both("adam", backend, timeout=400)
    assert said["backend"] == backend
    assert sorted(said["models"]) == ["functional", "sequential", "subclassed"]
    for kind, found in said["models"].items():
        assert found["steps"] == 50, kind
        assert found["moved"] > 0.1, kind  # training changed the weights ...
        # ... exactly as Keras's fit did
        assert found["max_diff"] <= 1e-4, (kind, found["max_diff"])
        assert (f"Keras backend: {backend} (the kernel's; every worker runs the cell on it)"
                in found["events"])


@pytest.mark.parametrize("backend", OTHERS)
def test_every_rule_dbs_local_steps_and_overlap_train_on_the_backend_in_local_and_simulate(
        backend, on_both):
    """async's options on the hub and worker loop that async runs on engines (here in the
    kernel: --mode local, and simulate's 4 virtual workers); on engines: the cluster test."""
    from tests.backend_child import MODE_RUNS

    said = on_both("modes", backend, timeout=600)
    print(backend, said)  # the accuracies, for `pytest -rP`
    assert said["backend"] == backend and set(said["runs"]) == set(MODE_RUNS)
    assert said["fit"] > said["majority"] + 0.2  # the cell learns under Keras's fit
    for name, accuracy in said["runs"].items():
        assert accuracy >= said["fit"] - 0.15, (name, accuracy, said["fit"])
    # one worker, no staleness: fit's own steps
    assert abs(said["runs"]["local"] - said["fit"]) <= 0.01


def test_a_torch_dataloader_trains_as_keras_fit_trains_on_it():
    said = child("dataloader", backend="torch")
    assert said["backend"] == "torch" and said["steps"] == 3 * 50
    assert said["fit"] > 0.8 and abs(said["local"] - said["fit"]) <= 0.03, said


@pytest.mark.parametrize("backend", OTHERS)
def test_pipeline_stages_train_on_the_backend_as_one_machine_does(backend, on_both):
    """Stages as threads of a child process on the backend, real sockets: a skip connection
    across 3 stages (GPipe, 4 micro-batches), operators between layers (1F1B), a BatchNorm CNN
    at one micro-batch, integer tokens into an Embedding; 20 steps equal `train_on_batch` on
    the same mini-batches. (On TensorFlow, in this process: tests/inproc/test_pipeline_inproc.py;
    on a real cluster: tests/cluster/test_backends_cluster.py.)"""
    said = on_both("pipeline", backend, timeout=400)
    assert said["backend"] == backend
    for name in ("skip", "operators", "batchnorm", "tokens"):
        case = said[name]
        assert case["status"] == "finished" and case["steps"] == 20, (name, case)
        assert case["moved"] > 5e-3 and case["difference"] < 1e-5, (name, case)


def test_a_cells_own_keras_backend_line_chooses_the_runs_backend():
    """nbdist imports Keras only after the cell does, so the cell's first lines still choose."""
    said = child("cell_sets_backend", "torch", backend=None)
    assert said["backend"] == "torch"
    assert "Keras backend: torch (the kernel's; every worker runs the cell on it)" in said["events"]


def test_a_cell_that_sets_another_backend_after_keras_loaded_is_refused(monkeypatch):
    import nbdist
    from nbdist.errors import BackendError

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    cell = ('import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\n'
            'model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n'
            'model.compile("sgd", "mse")\nimport numpy as np\n'
            'x_train, y_train = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")\n')
    try:
        with pytest.raises(BackendError, match=r"KERAS_BACKEND is jax, but Keras was already "
                                               r"imported in this kernel with the tensorflow "
                                               r"backend .*Restart the kernel"):
            nbdist.train(cell, namespace={}, mode="local", data=("x_train", "y_train"))
    finally:
        os.environ.pop("KERAS_BACKEND", None)
