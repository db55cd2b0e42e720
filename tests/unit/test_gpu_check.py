"""scripts/gpu_check.py's verdict on the devices a run's workers used (pure; the script itself
runs in tests/cluster/test_gpu_check_cluster.py, on CPU: nothing here has a GPU)."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def row(engine, host="n1", gpus=2, index=0, on="GPU:0"):
    return {"engine": engine, "host": host, "gpus_listed": gpus, "nvml_index": index, "op_on": on,
            "weights_on": on}


def test_each_worker_on_its_own_gpu_passes():
    assert gpu_check.verdict([row(1, index=0), row(2, index=1)]) == []
    assert gpu_check.verdict([row(1, host="n1"), row(2, host="n2")]) == []  # GPU 0 of two hosts


def test_two_workers_on_one_gpu_while_another_is_idle_is_a_problem():
    (problem,) = gpu_check.verdict([row(1, index=0), row(2, index=0)])
    assert problem.startswith("engines 1, 2 on host n1 share GPU 0 while the host has 2 GPUs "
                              "for 2 workers")


def test_more_workers_than_gpus_may_share():
    assert gpu_check.verdict([row(1, gpus=1), row(2, gpus=1)]) == []


@pytest.mark.parametrize("on", ["CPU:0", ""])
def test_a_worker_on_the_cpu_of_a_gpu_node_is_a_problem(on):
    (problem,) = gpu_check.verdict([row(1, gpus=1, on=on)])
    assert "engine 1 on host n1 trained on the CPU" in problem


def test_a_node_without_gpus_trains_on_the_cpu_without_complaint():
    assert gpu_check.verdict([row(1, gpus=0, index=None, on="CPU:0"),
                              row(2, gpus=0, index=None, on="CPU:0")]) == []
