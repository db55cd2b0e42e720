"""What `make horovod` would build on a node (scripts/build_horovod.sh --plan): NCCL for GPU
tensors where the node has an NVIDIA GPU, the CUDA compiler and NCCL's header, Gloo only on a
CPU node, and a clear refusal for a GPU node without the toolkit. The GPU, nvcc and NCCL are
stand-ins here (nothing in CI has a GPU); the build itself is tests/e2e/test_horovod_build.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_horovod.sh"


def plan(tmp_path: Path, gpu: bool, nvcc: bool, nccl: bool, **env) -> subprocess.CompletedProcess:
    bin_dir, cuda, nccl_home = tmp_path / "bin", tmp_path / "cuda", tmp_path / "nccl"
    for d in (bin_dir, cuda / "bin", nccl_home / "include"):
        d.mkdir(parents=True, exist_ok=True)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1)'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    if nvcc:
        (cuda / "bin" / "nvcc").write_text("#!/bin/sh\nexit 0\n")
        (cuda / "bin" / "nvcc").chmod(0o755)
    if nccl:
        (nccl_home / "include" / "nccl.h").write_text("/* stand-in */\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HOROVOD_", "NBDIST_HOROVOD", "CUDA_"))}
    clean.update(PATH=f"{bin_dir}:/usr/bin:/bin", CUDA_HOME=str(cuda),
                 HOROVOD_NCCL_HOME=str(nccl_home), **env)
    return subprocess.run(["bash", str(SCRIPT), "--plan", sys.executable], capture_output=True,
                          text=True, timeout=120, env=clean)


def test_a_cpu_node_builds_gloo_only(tmp_path):
    out = plan(tmp_path, gpu=False, nvcc=True, nccl=True)  # a toolkit without a GPU changes nothing
    assert out.returncode == 0, out.stderr
    assert "-gloo-tf" in out.stdout and out.stdout.startswith("hvd0.28.1-nbdistp1-")


def test_a_gpu_node_with_nvcc_and_nccl_builds_nccl(tmp_path):
    out = plan(tmp_path, gpu=True, nvcc=True, nccl=True)
    assert out.returncode == 0, out.stderr
    assert "-nccl-tf" in out.stdout


@pytest.mark.parametrize(("nvcc", "says"), [(False, "no CUDA toolkit"), (True, "no nccl.h")])
def test_a_gpu_node_without_the_toolkit_or_nccl_is_told_what_to_install(tmp_path, nvcc, says):
    if any(Path(d, "nccl.h").exists() for d in ("/usr/include", "/usr/local/include")):
        pytest.skip("this machine has NCCL's header installed system-wide")
    out = plan(tmp_path, gpu=True, nvcc=nvcc, nccl=False)
    assert out.returncode == 1 and out.stdout == ""
    assert says in out.stderr and "NBDIST_HOROVOD_OPS=gloo make horovod" in out.stderr


def test_the_choice_can_be_forced_and_a_wrong_value_is_refused(tmp_path):
    assert "-gloo-tf" in plan(tmp_path, gpu=True, nvcc=False, nccl=False,
                              NBDIST_HOROVOD_OPS="gloo").stdout
    out = plan(tmp_path, gpu=False, nvcc=False, nccl=False, NBDIST_HOROVOD_OPS="cuda")
    assert out.returncode == 1 and "Received: 'cuda'" in out.stderr
