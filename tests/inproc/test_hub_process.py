"""A hub shard in its own process: it serves the same protocol, and it always leaves."""

import os
import tempfile
import uuid

import numpy as np
import pytest

from nbdist.core.coordinator import Plan
from nbdist.hub import launch
from nbdist.hub.control import HubControl
from nbdist.hub.protocol import new_key
from nbdist.hub.server import HubSpec


def _spec(key: bytes, **changes) -> HubSpec:
    plan = Plan(num_workers=1, num_samples=100, epochs=1, batch_size=10, lr=0.1,
                has_validation=False, algorithm="asgd")
    base = {"run_id": uuid.uuid4().hex[:12], "key": key, "shard": 0, "num_shards": 1, "plan": plan,
            "params": np.arange(5, dtype=np.float32), "non_trainable": np.zeros(0, np.float32),
            "idle_timeout": 60.0}
    return HubSpec(**{**base, **changes})


def test_a_process_hub_answers_the_kernel_and_reports_its_summary_when_shut_down(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_PROCESS", "1")
    key = new_key()
    spec = _spec(key)
    endpoints = launch.start_hub(spec)
    proc = launch.hub_process(spec.run_id, 0)
    assert proc is not None and proc.pid != os.getpid()  # a process of its own
    with open(f"/proc/{proc.pid}/environ", "rb") as env:  # NumPy's BLAS on one thread
        assert b"OPENBLAS_NUM_THREADS=1" in env.read().split(b"\0")
    assert launch.running_hubs() == [(spec.run_id, 0)]
    control = HubControl(key, [endpoints], timeout=20)
    try:
        params, _ = control.params()
        np.testing.assert_array_equal(params, np.arange(5, dtype=np.float32))
        control.shutdown()
    finally:
        control.close()
    summary = launch.join_hub(spec.run_id, 0, timeout=20)
    assert summary["shard"] == 0 and summary["error"] is None and summary["dropped"] == {}
    assert launch.running_hubs() == [] and proc.returncode == 0


def test_a_process_hub_that_nobody_stops_is_closed_by_join(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_PROCESS", "1")
    spec = _spec(new_key())
    launch.start_hub(spec)
    proc = launch.hub_process(spec.run_id, 0)
    summary = launch.join_hub(spec.run_id, 0, timeout=0.5)  # still serving: asked to close
    assert summary["shard"] == 0 and summary["error"] is None
    assert proc.returncode == 0


def test_a_hub_that_cannot_start_says_so_and_leaves_no_process(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_PROCESS", "1")
    bad = _spec(new_key(), bind_host="203.0.113.1")  # an address this machine does not have
    with pytest.raises(RuntimeError, match="hub shard 0 could not start: ZMQError: Cannot assign"):
        launch.start_hub(bad)
    assert launch.running_hubs() == []
    assert _socket_files(bad) == []  # its local line had been opened before the bind failed


def test_a_hub_that_cannot_bind_gives_back_its_socket_files_and_memory():
    import glob

    import zmq

    from nbdist.hub.server import Hub

    bad = _spec(new_key(), bind_host="203.0.113.1")
    segments = set(glob.glob("/dev/shm/*"))
    with pytest.raises(zmq.ZMQError, match="Cannot assign"):
        Hub(bad)  # as a thread hub starts it (NBDIST_HUB_PROCESS=0)
    assert _socket_files(bad) == [] and set(glob.glob("/dev/shm/*")) <= segments


def _socket_files(spec) -> list[str]:
    import glob
    import tempfile

    return glob.glob(f"{tempfile.gettempdir()}/nbdist-{spec.run_id}-*")


def test_the_thread_hub_remains_available(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_PROCESS", "0")
    spec = _spec(new_key())
    launch.start_hub(spec)
    assert (launch.running_hubs() == [(spec.run_id, 0)]
            and launch.hub_process(spec.run_id, 0) is None)
    assert launch.join_hub(spec.run_id, 0, timeout=0.2)["error"] is None


def test_a_spec_crosses_to_the_hub_process_without_pickle_and_unchanged():
    import io

    from nbdist.hub.process import decode_spec, encode_spec

    restore = {"version": 7, "opt": {"momentum": np.arange(5, dtype=np.float32), "iterations": 3},
               "rule": {"clock": (1, 2)}, 1: np.float32(0.5)}
    spec = _spec(b"\x00\xffkey", restore=restore, optimizer={"class_name": "SGD", "segments": [5]},
                 shapes=[(4, 8), (8,)])
    back = decode_spec(io.BytesIO(encode_spec(spec)))
    assert back.key == spec.key and back.plan == spec.plan and back.run_id == spec.run_id
    np.testing.assert_array_equal(back.params, spec.params)
    assert back.params.dtype == np.float32 and back.non_trainable.shape == (0,)
    np.testing.assert_array_equal(back.restore["opt"]["momentum"], restore["opt"]["momentum"])
    assert back.restore["rule"] == {"clock": (1, 2)} and back.restore[1] == 0.5
    assert back.optimizer == spec.optimizer and back.shapes == [(4, 8), (8,)]
    with pytest.raises(TypeError, match="cannot carry a object"):
        encode_spec({"x": object()})


def test_a_killed_hub_process_leaves_no_socket_files_once_joined(monkeypatch):
    import os

    monkeypatch.setenv("NBDIST_HUB_PROCESS", "1")
    spec = _spec(new_key())
    endpoints = launch.start_hub(spec)
    files = ([endpoints["ipc"].removeprefix("ipc://")]
             + ([endpoints["local"]] if "local" in endpoints else []))
    assert all(os.path.exists(f) for f in files)
    proc = launch.hub_process(spec.run_id, 0)
    proc.kill()  # SIGKILL: the hub unlinks nothing itself
    proc.wait()
    assert all(os.path.exists(f) for f in files)
    summary = launch.join_hub(spec.run_id, 0, timeout=0.5)
    assert "without a summary" in summary["error"]
    assert not any(os.path.exists(f) for f in files)
    assert not os.path.exists(os.path.dirname(files[0]))  # nor their folder


def _socket_paths(endpoints: dict) -> list[str]:
    local = [endpoints["local"]] if "local" in endpoints else []
    return [endpoints["ipc"].removeprefix("ipc://"), *local]


def test_the_hub_socket_files_are_owner_only_at_a_path_nobody_can_guess():
    """Its ipc socket and same-host line sit in a new 0700 folder with a random name: no other
    user can connect to them, and the run id and shard (which the dashboard shows) do not give
    the path away."""
    import os
    import stat

    from nbdist.hub.server import Hub

    spec = _spec(new_key())
    hubs = [Hub(spec), Hub(spec)]  # the same run and shard twice: two different places
    try:
        paths = [_socket_paths(h.endpoints) for h in hubs]
        assert paths[0][0] != paths[1][0]
        for path in (p for group in paths for p in group):
            folder = os.stat(os.path.dirname(path))
            assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid(), path
            assert os.path.dirname(path) != os.path.realpath(tempfile.gettempdir())
        assert all(os.path.dirname(p) == os.path.dirname(g[0]) for g in paths for p in g)
    finally:
        for h in hubs:
            h.close()
    for path in (p for group in paths for p in group):
        assert not os.path.exists(os.path.dirname(path))  # the folder goes with the hub


def test_a_squatted_or_stale_socket_path_does_not_stop_a_hub():
    """Whatever sits in the temporary folder under the names a hub of this run used to take
    (a folder someone made there, a stale socket file) does not stop it from binding."""
    import os

    from nbdist.hub.server import Hub

    spec = _spec(new_key())
    squatted = [os.path.join(tempfile.gettempdir(), f"nbdist-{spec.run_id}-0.{ext}")
                for ext in ("ipc", "line")]
    for path in squatted:
        os.mkdir(path)  # what another user could leave there
    try:
        hub = Hub(spec)
        assert hub.endpoints["ipc"] and hub.endpoints["tcp"]
        hub.close()
    finally:
        for path in squatted:
            os.rmdir(path)
