"""Shared fixtures: a real local ipyparallel cluster, a real IPython shell (helpers and the
cells the tests share are in tests/helpers.py).

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

from tests.helpers import outlives

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TIERS = ("unit", "inproc", "cluster", "e2e")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier, so `-m` selects a tier wherever it is run from."""
    root = config.rootpath / "tests"
    for item in items:
        if not item.path.is_relative_to(root):
            continue  # a test file given by hand from outside tests/ has no tier
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
    left = [p for p in pids if outlives(p)]
    assert not left, f"engine processes left running after stop: {left}"


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
