"""Shared fixtures: a real local ipyparallel cluster, a real IPython shell (helpers and the
cells the tests share are in tests/helpers.py).

Tests live in tiers, one folder each, and every test gets its folder's marker:
- `unit/`: pure functions on NumPy arrays, exact values, no TensorFlow, no sockets, no threads
  (tests/unit/conftest.py fails a unit test that uses them);
- `inproc/`: real Keras models, hubs and sockets inside the test process;
- `cluster/`: a real ipyparallel cluster (engines as separate processes);
- `e2e/`: notebooks, a browser, the Horovod build, Slurm and MPI launchers.
`make test-fast` runs `unit` and `inproc`.

The cluster fixture starts engines as separate processes (no mocks) once per session and
stops them at the end, checking that no engine process is left behind. Between two tests that
use it, `shared_cluster_left_idle` checks that the first left no run going and no engine busy.
"""

from __future__ import annotations

import os
import time

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test (`item.rep_call`), for fixtures that check what
    a test left behind and need not fail a test twice."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


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


IDLE_WAIT_S = 30.0  # a run that just ended frees its engines within this (its tasks return)


@pytest.fixture(autouse=True)
def shared_cluster_left_idle(request):
    """After each test that used the session cluster: fail that test (at its teardown) if it
    left a run going, an engine busy or a hub serving, then end the leftovers, so one test's
    leftovers cannot break the next."""
    if "cluster" not in request.fixturenames:
        yield
        return
    from nbdist.hub.launch import running_hubs

    cluster = request.getfixturevalue("cluster")
    yield
    runs = cluster.runs
    for run in runs:
        run.close(timeout=60)
    deadline = time.monotonic() + IDLE_WAIT_S
    while (busy := cluster.busy_engines()) and time.monotonic() < deadline:
        time.sleep(0.1)
    hubs = {} if busy else {e: h for e, h in zip(cluster.engine_ids, cluster.client[:].apply_sync(
        running_hubs), strict=True) if h}
    if busy:  # stuck in a task: interrupt it (the nanny relays SIGINT), for the next test's sake
        cluster.client.send_signal("SIGINT", targets=list(busy), block=False)
    call = getattr(request.node, "rep_call", None)
    assert not (runs or busy or hubs) or (call is not None and call.failed), (
        f"the test left the shared cluster busy: runs still going {[r.run_id for r in runs]}, "
        f"engines with tasks {busy}, hubs still serving {hubs}. End every run it starts (`with "
        "run:`, run.stop(), run.wait()) before it returns.")


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
