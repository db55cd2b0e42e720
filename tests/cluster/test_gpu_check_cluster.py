"""scripts/gpu_check.py as a lab runs it, here on a node without a GPU: it trains the quickstart
on a local cluster and prints each worker engine's devices (CPU here)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is built by `make horovod`")
def test_gpu_check_trains_sync_and_names_each_engines_devices():
    out = subprocess.run([sys.executable, str(SCRIPT), "--backends", "tensorflow", "--modes",
                          "sync", "--epochs", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("This node: 0 GPU(s)") and "'gloo': True" in out.stdout
    assert any(line.startswith("sync: finished") for line in lines)
    assert any(line.startswith("fit: ") and line.endswith("on CPU:0") for line in lines)
    assert any(line.startswith("sync: ") and "x fit's samples/s" in line for line in lines)
    table = lines[lines.index("tensorflow sync: devices per worker engine") + 2:][:2]
    assert [line.split()[0] for line in table] == ["0", "1"]  # one line per worker engine
    assert all(line.split()[-2:] == ["CPU:0", "CPU:0"] for line in table)  # weights and ops
    assert lines[-1] == "OK: no GPU on this node; every worker trained on the CPU."
