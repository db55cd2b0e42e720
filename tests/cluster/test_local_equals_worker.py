"""--mode local is one async worker in the kernel: after one epoch of a Dropout MLP and of a
BatchNorm + Dropout CNN, `--mode local` and `--mode async --workers 1` end with the same
weights (BatchNorm's moving statistics included) to 1e-5.

Neither cell seeds Keras: the test seeds the kernel, as a notebook would before the cell, and
both runs start from the kernel's weights and its dropout seeds (`WorkerSpec.rng_state`; before
it an engine drew its own masks, 0.05 apart after one epoch of the MLP). The local run goes in
a child process with the async worker's TensorFlow thread count (tests/local_child.py): two
thread counts round a convolution differently, and on the CNN that grew to 1e-2 in 63 steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nbdist
from tests.helpers import LOCAL_WORKER_CELLS, tensorflow_threads

ROOT = Path(__file__).resolve().parents[2]
SEED = 1  # where the two thread counts' rounding had grown to 1e-2 on the CNN


@pytest.fixture(scope="module")
def one_worker(cluster):
    """Each cell trained by one async worker: {name: weights}, and the worker's threads."""
    import keras

    weights, threads = {}, set()
    for name, cell in LOCAL_WORKER_CELLS.items():
        keras.utils.set_random_seed(SEED)
        ns: dict = {}
        run = nbdist.train(cell, cluster=cluster, namespace=ns, mode="async", workers=1,
                           epochs=1, batch_size=32, wait=True)
        assert run.status == "finished", run.error
        weights[name] = [np.asarray(v.numpy()) for v in ns["model"].weights]
        engine = run.state.backend.roles.workers[0]
        threads.add(tuple(cluster.client[engine].apply_sync(tensorflow_threads)))
    assert len(threads) == 1, f"the two runs' workers had other threads: {threads}"
    return weights, threads.pop()


@pytest.fixture(scope="module")
def local_runs(one_worker, tmp_path_factory):
    """Each cell trained by --mode local in a child process with the worker's threads."""
    _, (intra, inter) = one_worker
    out = tmp_path_factory.mktemp("local") / "weights.npz"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")]))
    done = subprocess.run([sys.executable, "-m", "tests.local_child", str(intra), str(inter),
                           str(SEED), str(out), *LOCAL_WORKER_CELLS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as saved:
        return {name: [saved[f"{name}/{i}"] for i in range(len(one_worker[0][name]))]
                for name in LOCAL_WORKER_CELLS}


def initial_weights(cell: str) -> list:
    """The weights the kernel's model starts from (Keras seeded as the runs seed it)."""
    import keras

    keras.utils.set_random_seed(SEED)
    ns: dict = {}
    exec(compile(cell, "<cell>", "exec"), ns)  # noqa: S102 - the test's own cell
    return [np.asarray(v.numpy()) for v in ns["model"].weights]


@pytest.mark.parametrize("name", list(LOCAL_WORKER_CELLS))
def test_local_mode_ends_with_one_async_workers_weights(one_worker, local_runs, name):
    worker, local = one_worker[0][name], local_runs[name]
    start = initial_weights(LOCAL_WORKER_CELLS[name])
    assert len(worker) == len(local) == len(start)
    trained = max(float(np.abs(a - b).max()) for a, b in zip(worker, start, strict=True))
    assert trained > 1e-2, f"{name}: one epoch moved no weight by more than {trained:.3g}"
    for i, (a, b) in enumerate(zip(worker, local, strict=True)):  # moving statistics included
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5,
                                   err_msg=f"{name}: weight {i}, local against one worker")
