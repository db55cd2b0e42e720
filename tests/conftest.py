"""Shared fixtures: a real local ipyparallel cluster, a real IPython shell, small cells.

Tests live in tiers, one folder each, and every test gets its folder's marker:
- `unit/`: pure functions on NumPy arrays, exact values, no TensorFlow, no sockets;
- `inproc/`: real Keras models, hubs and sockets inside the test process;
- `cluster/`: a real ipyparallel cluster (engines as separate processes);
- `e2e/`: notebooks, a browser, the Horovod build, Slurm and MPI launchers.
`make test-fast` runs `unit` and `inproc`.

The cluster fixture starts engines as separate processes (no mocks) once per session and
stops them at the end, checking that no engine process is left behind.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A small learnable problem: trains in seconds, reaches high accuracy.
SYNTHETIC_CELL = '''
import keras
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=1200, shape=(8,), classes=3, seed=1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''

TIERS = ("unit", "inproc", "cluster", "e2e")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier, so `-m` selects a tier wherever it is run from."""
    root = config.rootpath / "tests"
    for item in items:
        tier = item.path.relative_to(root).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


NUM_ENGINES = 3  # one hub shard + two workers, or two shards + one worker


@pytest.fixture(scope="session")
def cluster():
    """A real local cluster of NUM_ENGINES engine processes, stopped at the end."""
    from nbdist.cluster.engines import Cluster

    handle = Cluster.start(NUM_ENGINES)
    pids = handle.client[:].apply_sync(os.getpid)
    yield handle
    handle.stop()
    left = [p for p in pids if _alive(p)]
    assert not left, f"engine processes left running after stop: {left}"


def _alive(pid: int, wait_s: float = 5.0) -> bool:
    """Whether `pid` still runs after up to `wait_s` seconds (engines take a moment to exit)."""
    import time

    for _ in range(int(wait_s / 0.1)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def ip():
    """A real IPython shell with nbdist's magics loaded."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdist")
    yield shell
    magics = shell.magics_manager.registry["NbdistMagics"]
    magics.cluster = None  # the session fixture owns the shared cluster
    magics.run = None
