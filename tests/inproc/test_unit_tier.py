"""The unit tier's guard (tests/unit/conftest.py) fails a unit test that opens a socket, starts
a thread, makes a ZeroMQ context or imports TensorFlow, even one that swallows the refusal;
a pure test passes. Run as its own pytest session, on a copy of the guard."""

import shutil
import subprocess
import sys
from pathlib import Path

GUARD = Path(__file__).resolve().parents[1] / "unit" / "conftest.py"

TESTS = '''
import socket
import threading

import tensorflow as loaded  # at collection, as another tier's files load it: allowed


def test_pure():
    assert sum([1, 2]) == 3


def test_socket():
    socket.socket().close()


def test_thread_swallowed():
    try:
        threading.Thread(target=print).start()
    except Exception:
        pass  # the refusal is recorded all the same


def test_zeromq():
    import zmq

    zmq.Context()


def test_tensorflow():
    import tensorflow  # loaded already (the stub beside this file): refused all the same
'''


def test_the_unit_guard_fails_sockets_threads_zeromq_and_tensorflow(tmp_path):
    shutil.copy(GUARD, tmp_path / "conftest.py")
    (tmp_path / "test_tier.py").write_text(TESTS)
    (tmp_path / "tensorflow.py").write_text("")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "test_tier.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    outcomes = {line.split("::")[1].split()[0]: line.split()[0] for line in done.stdout.splitlines()
                if line.startswith(("PASSED", "FAILED", "ERROR"))}
    assert outcomes == {"test_pure": "PASSED", "test_socket": "FAILED",
                        "test_thread_swallowed": "ERROR", "test_zeromq": "FAILED",
                        "test_tensorflow": "FAILED"}, done.stdout
    assert "A unit test opened a socket" in done.stdout
    assert "this unit test started a thread" in done.stdout  # the swallowed one, at teardown
    assert "imported tensorflow" in done.stdout
