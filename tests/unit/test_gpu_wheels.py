"""scripts/gpu_wheels.py: what a GPU machine without network gets (the wheel list, the data
slice); the download itself needs PyPI and runs by hand (the script's docstring)."""

import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np

spec = importlib.util.spec_from_file_location(
    "gpu_wheels", Path(__file__).resolve().parents[2] / "scripts" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_wheels)


def write_idx(path, array):
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def test_cut_idx_keeps_the_first_records_and_a_header_that_says_so(tmp_path):
    images = np.arange(5 * 3 * 2, dtype=np.uint8).reshape(5, 3, 2)
    write_idx(tmp_path / "all.gz", images)
    gpu_wheels.cut_idx(tmp_path / "all.gz", tmp_path / "cut.gz", 2)
    with gzip.open(tmp_path / "cut.gz") as f:
        data = f.read()
    assert struct.unpack(">IIII", data[:16]) == (0x0803, 2, 3, 2)
    assert data[16:] == images[:2].tobytes()
    gpu_wheels.cut_idx(tmp_path / "all.gz", tmp_path / "more.gz", 99)  # fewer than asked: all
    with gzip.open(tmp_path / "more.gz") as f:
        assert struct.unpack(">II", f.read(8))[1] == 5


def test_closure_follows_requirements_and_leaves_out_what_gpu_images_ship():
    pins = gpu_wheels.closure(["ipyparallel"], "3.12", gpu_wheels.ON_GPU_IMAGES)
    assert {"ipyparallel", "pyzmq", "traitlets", "jupyter-client", "tornado"} <= set(pins)
    assert not set(pins) & gpu_wheels.ON_GPU_IMAGES  # numpy, psutil, ...: never a second copy
    assert all(isinstance(v, str) and v[0].isdigit() for v in pins.values())
