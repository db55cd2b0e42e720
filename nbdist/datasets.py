"""Offline dataset loaders: real data for demos and a synthetic problem for tests.

Responsible for:
- ``load_fashion_mnist``: Fashion-MNIST from the standard IDX files (gzip or plain), found in
  an explicit folder, ``$NBDIST_DATA``, Debian's ``dataset-fashion-mnist`` package or the Keras
  cache.
- ``load_cifar10``: CIFAR-10 from its *binary* release (never the pickle release).
- ``load_digits``: scikit-learn's bundled 8x8 digits, split 1500 train / 297 test.
- ``make_synthetic``: a seeded Gaussian-blob classification problem that small models learn fast.

Every loader returns ``(x_train, y_train), (x_test, y_test)``, reads only local files and
never unpickles. Nothing is cached between calls. The module imports only the standard
library and NumPy; scikit-learn is imported inside ``load_digits``.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from nbdist.env import switch
from nbdist.errors import ConfigError, DatasetFormatError, DatasetNotFoundError, DependencyError

__all__ = [
    "FASHION_MNIST_DIRS",
    "Splits",
    "load_cifar10",
    "load_digits",
    "load_fashion_mnist",
    "make_synthetic",
]

Splits = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``(x_train, y_train), (x_test, y_test)``, the shape ``keras.datasets.*.load_data()`` returns."""

FASHION_MNIST_DIRS: tuple[str, ...] = (
    "/usr/share/datasets/fashion-mnist",  # Debian: apt-get install dataset-fashion-mnist
    "~/.keras/datasets/fashion-mnist",  # where keras.datasets.fashion_mnist caches its download
)
"""Folders searched after ``path=`` and ``$NBDIST_DATA``; ``~`` is expanded at call time."""

_FASHION_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_FASHION_MNIST_HELP = (
    "Install Debian's package with `sudo apt-get install dataset-fashion-mnist`, or download the "
    "four IDX files (https://github.com/zalandoresearch/fashion-mnist) and set NBDIST_DATA=/path "
    "or pass path=..."
)

# IDX type codes (third byte of the magic number) -> (NumPy dtype, name).
_IDX_DTYPES = {
    0x08: (np.dtype("u1"), "unsigned byte"),
    0x09: (np.dtype("i1"), "signed byte"),
    0x0B: (np.dtype(">i2"), "short"),
    0x0C: (np.dtype(">i4"), "int"),
    0x0D: (np.dtype(">f4"), "float"),
    0x0E: (np.dtype(">f8"), "double"),
}

_CIFAR10_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR10_TEST = "test_batch.bin"
_CIFAR10_RECORD = 1 + 3 * 32 * 32
_CIFAR10_HELP = (
    "Download the binary version (https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz), "
    "extract it and pass path= the extracted `cifar-10-batches-bin` folder or its parent."
)


def load_fashion_mnist(path: str | os.PathLike[str] | None = None) -> Splits:
    """Load Fashion-MNIST from local IDX files, so notebooks and engines never need the network.

    Looks, in order, in ``path`` (only there, if given), ``$NBDIST_DATA``, then each folder of
    ``FASHION_MNIST_DIRS``; ``path`` and ``$NBDIST_DATA`` may also hold the files in a
    ``fashion-mnist`` subfolder. Returns uint8 images ``(N, 28, 28)`` and uint8 labels ``(N,)``
    in 0..9; the arrays are writable.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_fashion_mnist()
        >>> x_train.shape, x_test.shape
        ((60000, 28, 28), (10000, 28, 28))
    """
    user_root = path if path is not None else switch("NBDIST_DATA")
    folders: list[Path] = []
    if user_root is not None:
        root = Path(user_root).expanduser()
        folders += [root, root / "fashion-mnist"]
    if path is None:
        folders += [Path(d).expanduser() for d in FASHION_MNIST_DIRS]

    looked: list[str] = []
    for folder in folders:
        files, missing = _find_idx_files(folder)
        if files is not None:
            return _read_fashion_mnist(files)
        looked.append(f"{folder} ({missing})")
    origin = "the folder passed as path=" if path is not None else "any of the usual places"
    raise DatasetNotFoundError(
        f"Fashion-MNIST not found in {origin}. Looked in: {'; '.join(looked)}. "
        f"Expected the four IDX files "
        f"{', '.join(f + '[.gz]' for f in _FASHION_MNIST_FILES.values())} in one folder. "
        f"{_FASHION_MNIST_HELP}"
    )


def _find_idx_files(folder: Path) -> tuple[dict[str, Path] | None, str]:
    """Map each split to its file in ``folder`` (plain preferred over .gz), or say what is
    missing."""
    if not folder.is_dir():
        return None, "no such folder"
    files: dict[str, Path] = {}
    missing: list[str] = []
    for key, name in _FASHION_MNIST_FILES.items():
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                files[key] = candidate
                break
        else:
            missing.append(f"{name}[.gz]")
    if missing:
        return None, f"missing {', '.join(missing)}"
    return files, ""


def _read_fashion_mnist(files: dict[str, Path]) -> Splits:
    arrays = {key: _read_idx(file) for key, file in files.items()}
    for split in ("train", "test"):
        x_file, y_file = files[f"x_{split}"], files[f"y_{split}"]
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
            raise DatasetFormatError(
                f"{x_file} is not a Fashion-MNIST image file (Received: dtype {x.dtype}, shape "
                f"{x.shape}); expected unsigned bytes of shape (N, 28, 28). Check that the file "
                f"is the right one, or re-download it."
            )
        if y.dtype != np.uint8 or y.ndim != 1:
            raise DatasetFormatError(
                f"{y_file} is not a Fashion-MNIST label file (Received: dtype {y.dtype}, shape "
                f"{y.shape}); expected unsigned bytes of shape (N,). Check that the file is the "
                f"right one, or re-download it."
            )
        if len(x) != len(y):
            raise DatasetFormatError(
                f"{x_file} holds {len(x)} images but {y_file} holds {len(y)} labels; expected "
                f"equal counts. The files come from different sets or one is damaged: "
                f"re-download both."
            )
        if len(y) and int(y.max()) > 9:
            raise DatasetFormatError(
                f"{y_file} holds label {int(y.max())}; expected labels 0..9. The file is "
                f"damaged or from another dataset: re-download it."
            )
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def _read_idx(file: Path) -> np.ndarray:
    """Read one IDX file (gzip or plain, told apart by content) into a writable array."""
    data = file.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetFormatError(
                f"{file} is a damaged gzip file ({exc}); expected a complete gzip-compressed "
                f"IDX file. Re-download it."
            ) from exc
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in _IDX_DTYPES or data[3] == 0:
        raise DatasetFormatError(
            f"{file} is not an IDX file (Received: magic bytes {data[:4].hex() or 'none'}); "
            f"expected 0000 followed by a type code and a dimension count, e.g. 00000803 for "
            f"images. Check that it is the right file, or re-download it."
        )
    dtype, dtype_name = _IDX_DTYPES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetFormatError(
            f"{file} is truncated: {len(data)} bytes, but its header alone announces "
            f"{ndim} dimensions ({header} bytes). Re-download it."
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "longer than its header says"
        raise DatasetFormatError(
            f"{file} is {problem}: {len(data)} bytes, expected {expected} for {dtype_name} "
            f"data of shape {shape}. Re-download it."
        )
    # frombuffer parses without Python loops; the copy makes the result writable and native-endian.
    return (
        np.frombuffer(data, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def load_cifar10(path: str | os.PathLike[str]) -> Splits:
    """Load CIFAR-10 from its binary release, never the pickle one, since unpickling runs code.

    ``path`` is the ``cifar-10-batches-bin`` folder or its parent. Returns uint8 images
    ``(N, 32, 32, 3)`` (channel-last, as Keras expects) and uint8 labels ``(N,)`` in 0..9.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_cifar10("~/data/cifar-10-batches-bin")
        >>> x_train.shape, x_test.shape
        ((50000, 32, 32, 3), (10000, 32, 32, 3))
    """
    root = Path(path).expanduser()
    names = (*_CIFAR10_TRAIN, _CIFAR10_TEST)
    folder = root
    if not (root / names[0]).is_file() and (root / "cifar-10-batches-bin").is_dir():
        folder = root / "cifar-10-batches-bin"
    if not folder.is_dir():
        raise DatasetNotFoundError(
            f"CIFAR-10 not found: {folder} is not a folder; expected the `cifar-10-batches-bin` "
            f"folder or its parent. {_CIFAR10_HELP}"
        )
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        pickled = [
            d / "data_batch_1"
            for d in (folder, root / "cifar-10-batches-py")
            if (d / "data_batch_1").is_file()
        ]
        if pickled:
            raise DatasetNotFoundError(
                f"Only the Python (pickle) version of CIFAR-10 was found ({pickled[0]}); nbdist "
                f"does not read it, because unpickling a file can run arbitrary code. Expected "
                f"the binary version's {', '.join(names)}. {_CIFAR10_HELP}"
            )
        raise DatasetNotFoundError(
            f"CIFAR-10 binary files missing from {folder}: {', '.join(missing)}; expected all of "
            f"{', '.join(names)}. {_CIFAR10_HELP}"
        )
    train = _read_cifar10_records([folder / name for name in _CIFAR10_TRAIN])
    test = _read_cifar10_records([folder / _CIFAR10_TEST])
    return train, test


def _read_cifar10_records(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    chunks = []
    for file in files:
        data = file.read_bytes()
        if not data or len(data) % _CIFAR10_RECORD:
            raise DatasetFormatError(
                f"{file} has {len(data)} bytes, not a positive multiple of {_CIFAR10_RECORD} "
                f"(one label byte + 3x32x32 pixel bytes per record); it is truncated or not a "
                f"CIFAR-10 binary batch. Re-download it."
            )
        records = np.frombuffer(data, dtype=np.uint8).reshape(-1, _CIFAR10_RECORD)
        if int(records[:, 0].max()) > 9:
            raise DatasetFormatError(
                f"{file} holds label {int(records[:, 0].max())}; expected labels 0..9. It may be "
                f"a CIFAR-100 file (two label bytes per record) or damaged. Use the CIFAR-10 "
                f"binary files."
            )
        chunks.append(records)
    records = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    y = records[:, 0].copy()
    # Records store each image channel-first (3, 32, 32); Keras wants (32, 32, 3).
    x = np.ascontiguousarray(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return x, y


def load_digits() -> Splits:
    """Load scikit-learn's bundled 8x8 digits: real images that need no download at all.

    Split in file order, the first 1500 samples for training and the other 297 for testing.
    Returns uint8 images ``(N, 8, 8)`` with values 0..16 and uint8 labels ``(N,)`` in 0..9.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_digits()
        >>> x_train.shape, x_test.shape
        ((1500, 8, 8), (297, 8, 8))
    """
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits  # scikit-learn: optional
    except ImportError as exc:
        raise DependencyError(
            f"load_digits needs scikit-learn, which could not be imported ({exc}). Install it "
            f"with `pip install scikit-learn`, or use load_fashion_mnist() or make_synthetic()."
        ) from exc
    bunch = sklearn_load_digits()
    x = np.asarray(bunch.images).astype(np.uint8)
    y = np.asarray(bunch.target).astype(np.uint8)
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def make_synthetic(
    n: int = 1024,
    shape: tuple[int, ...] = (8,),
    classes: int = 3,
    seed: int = 0,
    test_fraction: float = 0.25,
) -> Splits:
    """Make a seeded, easily learnable classification problem, for tests and quick demos.

    Each class is a Gaussian blob around its own random centre, well apart relative to the
    unit noise, so a small model reaches high accuracy in an epoch or two. The same arguments
    give the same arrays (for a given NumPy version). Returns float32 ``x`` of shape
    ``(N, *shape)`` and int32 labels in ``0..classes-1``; the last ``round(n * test_fraction)``
    samples are the test set.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = make_synthetic(n=100, shape=(4,), classes=2)
        >>> x_train.shape, y_test.shape
        ((75, 4), (25,))
    """
    shape = tuple(shape)
    if not _is_int(n) or n < 2:
        raise ConfigError(
            f"make_synthetic: n must be an integer >= 2 (Received: n={n!r}); "
            f"it is the total number of samples, train and test together."
        )
    if not shape or not all(_is_int(d) and d > 0 for d in shape):
        raise ConfigError(
            f"make_synthetic: shape must be a non-empty tuple of positive integers "
            f"(Received: shape={shape!r}), e.g. shape=(8,) or shape=(28, 28)."
        )
    if not _is_int(classes) or classes < 2:
        raise ConfigError(
            f"make_synthetic: classes must be an integer >= 2 (Received: "
            f"classes={classes!r}); a classification problem needs two classes."
        )
    if not _is_int(seed) or seed < 0:
        raise ConfigError(
            f"make_synthetic: seed must be a non-negative integer (Received: "
            f"seed={seed!r}), e.g. seed=0."
        )
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise ConfigError(
            f"make_synthetic: test_fraction must be a number (Received: "
            f"test_fraction={test_fraction!r}), e.g. 0.25."
        )
    n_test = round(n * test_fraction)
    if not 0 < test_fraction < 1 or not 1 <= n_test <= n - 1:
        raise ConfigError(
            f"make_synthetic: test_fraction={test_fraction!r} with n={n} gives {n_test} test "
            f"samples; expected a fraction in (0, 1) leaving at least one sample in each split. "
            f"Pass e.g. test_fraction=0.25, or a larger n."
        )
    rng = np.random.default_rng(seed)
    features = math.prod(shape)
    centres = rng.normal(0.0, 2.0, size=(classes, features))
    y = rng.permutation(np.arange(n) % classes).astype(np.int32)
    x = (centres[y] + rng.normal(0.0, 1.0, size=(n, features))).astype(np.float32)
    x = x.reshape((n, *shape))
    n_train = n - n_test
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
