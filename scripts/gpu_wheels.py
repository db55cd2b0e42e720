"""Gather what a bare GPU machine lacks to run `scripts/gpu_check.py`, into one folder that
travels with the checkout: the wheels of nbdist's pure-Python dependencies (Keras, ipyparallel
and its Jupyter dependencies, pyzmq, blake3, plotly, ipywidgets, ...) for that machine's Python,
and a slice of Fashion-MNIST.

    python scripts/gpu_wheels.py                       # -> .whl/ (ignored by git)
    python scripts/gpu_check.py --offline .whl ...     # there: installs them, with no network

The versions are the ones this checkout tests with (read from this environment's installed
packages), downloaded for the target Python and platform with `pip download --only-binary`.
Packages that GPU images ship with their CUDA builds of PyTorch and JAX (NumPy, pandas, h5py,
ml-dtypes, ...) are left out: a second copy ahead of them on the path could break what was
built against them. The folder must stay small (a device machine's working tree is capped), so
the training images are cut to `--train-samples`.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata as metadata
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOTS = ["keras", "ipyparallel", "pyzmq", "blake3", "plotly", "ipywidgets", "anywidget",
         "cloudpickle"]
# Shipped by GPU images beside CUDA builds of PyTorch and JAX (binary, or needed at one version
# by what they hold): never carried
ON_GPU_IMAGES = {"numpy", "pandas", "psutil", "h5py", "ml-dtypes", "absl-py", "rich",
                 "pygments", "markdown-it-py", "mdurl", "packaging", "typing-extensions",
                 "python-dateutil", "six", "tqdm", "narwhals", "cloudpickle", "mpi4py"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
LIMIT_MIB = 48  # leaves room for the checkout itself under a 64 MiB working tree
ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    """PyPI's normalised project name.

    Example:
        >>> canonical("Typing_Extensions"), canonical("jupyter.core")
        ('typing-extensions', 'jupyter-core')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str], python_version: str, skip: set[str]) -> dict[str, str]:
    """{project: installed version} for `roots` and everything they need on Linux CPython
    `python_version` (extras left out), as this environment has them, less `skip`."""
    from packaging.markers import Marker

    env = {"python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "platform_machine": "x86_64", "extra": ""}
    found, todo = {}, list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in found or name in skip:
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for requirement in dist.requires or []:
            spec, _, marker = requirement.partition(";")
            if marker and not Marker(marker).evaluate(env):
                continue
            todo.append(re.match(r"[A-Za-z0-9_.-]+", spec.strip()).group(0))
    return found


def download(pins: dict[str, str], folder: Path, python_version: str) -> None:
    """The wheels of `pins` for CPython `python_version` on x86-64 Linux, into `folder`."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", *platforms, "-d", str(folder),
                    *(f"{name}=={version}" for name, version in sorted(pins.items()))],
                   check=True)


def cut_idx(source: Path, target: Path, count: int) -> None:
    """Copy the first `count` records of a gzipped IDX file (images or labels)."""
    with gzip.open(source, "rb") as f:
        magic, total = struct.unpack(">II", f.read(8))
        dims = struct.unpack(f">{(magic & 0xFF) - 1}I", f.read(4 * ((magic & 0xFF) - 1)))
        record = 1
        for d in dims:
            record *= d
        keep = min(count, total)
        body = f.read(keep * record)
    with gzip.open(target, "wb", compresslevel=9) as f:
        f.write(struct.pack(">II", magic, keep) + struct.pack(f">{len(dims)}I", *dims) + body)


def copy_data(folder: Path, train_samples: int) -> Path:
    """Fashion-MNIST's test files and its first `train_samples` training images, for
    `NBDIST_DATA` there (nbdist.datasets reads these four IDX files)."""
    from nbdist.datasets import FASHION_MNIST_DIRS

    places = [Path(d).expanduser() for d in (os.environ.get("NBDIST_DATA"), *FASHION_MNIST_DIRS)
              if d]
    places += [p / "fashion-mnist" for p in places]
    source = next((p for p in places if (p / "train-images-idx3-ubyte.gz").is_file()), None)
    if source is None:
        raise SystemExit(f"Fashion-MNIST's gzipped IDX files are in none of {places}: "
                         "apt-get install dataset-fashion-mnist (make system), or set NBDIST_DATA")
    target = folder / "data" / "fashion-mnist"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copyfile(source / name, target / name)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        cut_idx(source / name, target / name, train_samples)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--to", default=str(ROOT / ".whl"), help="the folder (default: .whl)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--train-samples", type=int, default=30_000)
    args = parser.parse_args(argv)
    folder = Path(args.to)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()  # one version of each: pip refuses two
    pins = closure(ROOTS, args.python_version, ON_GPU_IMAGES)
    download(pins, folder, args.python_version)
    data = copy_data(folder, args.train_samples)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
    print(f"{len(pins)} wheels for CPython {args.python_version} and Fashion-MNIST "
          f"({args.train_samples:,} training images) in {folder}: {size:.1f} MiB")
    print(f"data: {data}")
    if size > LIMIT_MIB:
        print(f"too large for a device machine's working tree (over {LIMIT_MIB} MiB): "
              "lower --train-samples", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
