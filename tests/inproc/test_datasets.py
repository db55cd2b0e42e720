"""Tests for nbdist.datasets: offline loaders, their search order and their error messages."""

from __future__ import annotations

import gzip
import pickle
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nbdist import datasets
from nbdist.datasets import load_cifar10, load_digits, load_fashion_mnist, make_synthetic
from nbdist.errors import ConfigError, DatasetFormatError, DatasetNotFoundError, DependencyError

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders must work offline: any connection attempt fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("nbdist.datasets tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No NBDIST_DATA and empty system folders, so only what a test writes is found."""
    monkeypatch.delenv("NBDIST_DATA", raising=False)
    system = tmp_path / "system"
    monkeypatch.setattr(
        datasets, "FASHION_MNIST_DIRS", (str(system / "debian"), str(system / "keras"))
    )
    return system


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode a uint8 array as an IDX file: magic 0x0000 08 ndim, big-endian dims, data."""
    assert array.dtype == np.uint8
    return (
        struct.pack(f">BBBB{array.ndim}I", 0, 0, 0x08, array.ndim, *array.shape) + array.tobytes()
    )


def write_fashion_mnist(
    folder: Path, *, n_train: int = 5, n_test: int = 3, compress: bool = True, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write a tiny Fashion-MNIST look-alike and return the arrays it holds."""
    rng = np.random.default_rng(seed)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train, dtype=np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in IDX_NAMES.items():
        data = idx_bytes(arrays[key])
        if compress:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


def assert_splits_equal(loaded: datasets.Splits, expected: dict[str, np.ndarray]) -> None:
    (x_train, y_train), (x_test, y_test) = loaded
    for key, array in zip(IDX_NAMES, (x_train, y_train, x_test, y_test), strict=True):
        assert array.dtype == np.uint8
        np.testing.assert_array_equal(array, expected[key])


# --- Fashion-MNIST: reading IDX files ---------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False], ids=["gzip", "plain"])
def test_idx_files_round_trip_exactly(isolated: Path, tmp_path: Path, compress: bool) -> None:
    expected = write_fashion_mnist(tmp_path / "data", compress=compress)
    assert_splits_equal(load_fashion_mnist(tmp_path / "data"), expected)


def test_loaded_arrays_are_writable(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data")
    (x_train, y_train), _ = load_fashion_mnist(str(tmp_path / "data"))
    x_train[0, 0, 0] = 7  # e.g. in-place shuffling or augmentation must not fail
    y_train[0] = 1


def test_mixed_gzip_and_plain_files_load(isolated: Path, tmp_path: Path) -> None:
    expected = write_fashion_mnist(tmp_path / "data", compress=True)
    name = IDX_NAMES["y_test"]
    (tmp_path / "data" / f"{name}.gz").unlink()
    (tmp_path / "data" / name).write_bytes(idx_bytes(expected["y_test"]))
    assert_splits_equal(load_fashion_mnist(tmp_path / "data"), expected)


def test_truncated_idx_file_names_the_file(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    victim = tmp_path / "data" / IDX_NAMES["x_train"]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(DatasetFormatError, match="truncated") as info:
        load_fashion_mnist(tmp_path / "data")
    assert str(victim) in str(info.value)


def test_truncated_gzip_file_is_a_format_error(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=True)
    victim = tmp_path / "data" / f"{IDX_NAMES['x_test']}.gz"
    victim.write_bytes(victim.read_bytes()[:-20])
    with pytest.raises(DatasetFormatError, match="gzip") as info:
        load_fashion_mnist(tmp_path / "data")
    assert str(victim) in str(info.value)


def test_file_without_idx_magic_is_a_format_error(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    victim = tmp_path / "data" / IDX_NAMES["y_train"]
    victim.write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(DatasetFormatError, match="not an IDX file") as info:
        load_fashion_mnist(tmp_path / "data")
    assert str(victim) in str(info.value)


def test_file_longer_than_its_header_is_a_format_error(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    victim = tmp_path / "data" / IDX_NAMES["y_test"]
    victim.write_bytes(victim.read_bytes() + b"\x00")
    with pytest.raises(DatasetFormatError, match="longer than its header"):
        load_fashion_mnist(tmp_path / "data")


def test_label_count_must_match_image_count(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    labels = np.zeros(4, dtype=np.uint8)  # 5 training images were written
    (tmp_path / "data" / IDX_NAMES["y_train"]).write_bytes(idx_bytes(labels))
    with pytest.raises(DatasetFormatError, match="5 images but .* 4 labels"):
        load_fashion_mnist(tmp_path / "data")


def test_images_of_the_wrong_size_are_a_format_error(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    images = np.zeros((5, 32, 32), dtype=np.uint8)
    (tmp_path / "data" / IDX_NAMES["x_train"]).write_bytes(idx_bytes(images))
    with pytest.raises(DatasetFormatError, match=r"\(N, 28, 28\)"):
        load_fashion_mnist(tmp_path / "data")


def test_labels_outside_0_to_9_are_a_format_error(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path / "data", compress=False)
    labels = np.array([0, 1, 2, 3, 10], dtype=np.uint8)
    (tmp_path / "data" / IDX_NAMES["y_train"]).write_bytes(idx_bytes(labels))
    with pytest.raises(DatasetFormatError, match="label 10"):
        load_fashion_mnist(tmp_path / "data")


# --- Fashion-MNIST: where it is found ---------------------------------------------------------


def test_explicit_path_beats_nbdist_data(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = write_fashion_mnist(tmp_path / "explicit", seed=1)
    write_fashion_mnist(tmp_path / "env", seed=2)
    monkeypatch.setenv("NBDIST_DATA", str(tmp_path / "env"))
    assert_splits_equal(load_fashion_mnist(tmp_path / "explicit"), explicit)


def test_nbdist_data_beats_system_folders(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = write_fashion_mnist(tmp_path / "env", seed=2)
    write_fashion_mnist(isolated / "debian", seed=3)
    monkeypatch.setenv("NBDIST_DATA", str(tmp_path / "env"))
    assert_splits_equal(load_fashion_mnist(), env)


def test_nbdist_data_may_hold_a_fashion_mnist_subfolder(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = write_fashion_mnist(tmp_path / "env" / "fashion-mnist", seed=2)
    monkeypatch.setenv("NBDIST_DATA", str(tmp_path / "env"))
    assert_splits_equal(load_fashion_mnist(), env)


def test_incomplete_nbdist_data_falls_through_to_system_folders(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "env").mkdir()
    monkeypatch.setenv("NBDIST_DATA", str(tmp_path / "env"))
    debian = write_fashion_mnist(isolated / "debian", seed=3)
    assert_splits_equal(load_fashion_mnist(), debian)


def test_debian_folder_beats_keras_cache(isolated: Path) -> None:
    debian = write_fashion_mnist(isolated / "debian", seed=3)
    write_fashion_mnist(isolated / "keras", seed=4)
    assert_splits_equal(load_fashion_mnist(), debian)


def test_keras_cache_is_the_last_resort(isolated: Path) -> None:
    keras = write_fashion_mnist(isolated / "keras", seed=4)
    assert_splits_equal(load_fashion_mnist(), keras)


def test_explicit_path_without_files_does_not_fall_back(isolated: Path, tmp_path: Path) -> None:
    write_fashion_mnist(isolated / "debian")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="path=") as info:
        load_fashion_mnist(tmp_path / "empty")
    assert str(isolated / "debian") not in str(info.value)


def test_missing_everywhere_lists_every_place_and_the_fix(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partial = tmp_path / "env"
    partial.mkdir()
    (partial / "train-images-idx3-ubyte.gz").write_bytes(b"")
    monkeypatch.setenv("NBDIST_DATA", str(partial))
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist()
    message = str(info.value)
    for place in (partial, partial / "fashion-mnist", isolated / "debian", isolated / "keras"):
        assert str(place) in message
    assert "missing train-labels-idx1-ubyte[.gz]" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "NBDIST_DATA" in message
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_from_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NBDIST_DATA", raising=False)
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist()
    assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
    assert y_train.shape == (60000,) and y_test.shape == (10000,)
    assert x_train.dtype == y_train.dtype == np.uint8
    assert set(np.unique(y_train)) == set(np.unique(y_test)) == set(range(10))
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert y_train[:5].tolist() == [9, 0, 0, 3, 0]  # the published first labels


# --- CIFAR-10 binary --------------------------------------------------------------------------


def cifar_records(labels: list[int], seed: int) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Channel-last images, labels, and the same data in CIFAR-10's binary record format."""
    images = np.random.default_rng(seed).integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
    blob = b"".join(
        bytes([label]) + image.transpose(2, 0, 1).tobytes()  # records are channel-first
        for label, image in zip(labels, images, strict=True)
    )
    return images, np.array(labels, dtype=np.uint8), blob


def write_cifar10(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i in range(1, 6):
        x, y, blob = cifar_records([i, 9 - i], seed=i)
        (folder / f"data_batch_{i}.bin").write_bytes(blob)
        xs.append(x)
        ys.append(y)
    x_test, y_test, blob = cifar_records([3, 1, 4], seed=6)
    (folder / "test_batch.bin").write_bytes(blob)
    return np.concatenate(xs), np.concatenate(ys), x_test, y_test


def test_cifar10_binary_round_trips_channel_last(tmp_path: Path) -> None:
    x_train, y_train, x_test, y_test = write_cifar10(tmp_path / "cifar-10-batches-bin")
    (lx_train, ly_train), (lx_test, ly_test) = load_cifar10(tmp_path / "cifar-10-batches-bin")
    assert lx_train.shape == (10, 32, 32, 3) and lx_test.shape == (3, 32, 32, 3)
    assert lx_train.dtype == ly_train.dtype == np.uint8
    np.testing.assert_array_equal(lx_train, x_train)
    np.testing.assert_array_equal(ly_train, y_train)
    np.testing.assert_array_equal(lx_test, x_test)
    np.testing.assert_array_equal(ly_test, y_test)


def test_cifar10_pixel_lands_at_row_col_channel(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    write_cifar10(folder)
    record = bytearray(3073)
    record[0] = 7
    # Record layout: label, then 1024 red, 1024 green, 1024 blue bytes, each plane row-major.
    record[1 + 2 * 1024 + 5 * 32 + 17] = 200  # blue, row 5, column 17
    record[1 + 0 * 1024 + 31 * 32 + 0] = 99  # red, row 31, column 0
    (folder / "test_batch.bin").write_bytes(bytes(record))
    _, (x_test, y_test) = load_cifar10(folder)
    assert y_test.tolist() == [7]
    assert x_test[0, 5, 17, 2] == 200 and x_test[0, 31, 0, 0] == 99
    assert int(x_test.sum()) == 299
    assert x_test.flags.c_contiguous


def test_cifar10_accepts_the_parent_of_cifar_10_batches_bin(tmp_path: Path) -> None:
    _, y_train, _, _ = write_cifar10(tmp_path / "cifar-10-batches-bin")
    (_, ly_train), _ = load_cifar10(str(tmp_path))
    np.testing.assert_array_equal(ly_train, y_train)


def test_cifar10_missing_files_are_listed(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    (tmp_path / "test_batch.bin").unlink()
    with pytest.raises(
        DatasetNotFoundError, match=r": data_batch_3\.bin, test_batch\.bin; expected"
    ):
        load_cifar10(tmp_path)


def test_cifar10_nonexistent_folder_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="not a folder"):
        load_cifar10(tmp_path / "nowhere")


def test_cifar10_file_of_wrong_size_is_a_format_error(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    victim = tmp_path / "data_batch_2.bin"
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(DatasetFormatError, match="3073") as info:
        load_cifar10(tmp_path)
    assert str(victim) in str(info.value)


def test_cifar10_label_above_9_is_a_format_error(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    (tmp_path / "test_batch.bin").write_bytes(bytes([42]) + bytes(3072))
    with pytest.raises(DatasetFormatError, match="label 42"):
        load_cifar10(tmp_path)


@pytest.mark.parametrize("layout", ["same-folder", "cifar-10-batches-py"])
def test_cifar10_pickle_version_is_refused_with_a_reason(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("nbdist.datasets tried to unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(np, "load", refuse)
    folder = tmp_path if layout == "same-folder" else tmp_path / "cifar-10-batches-py"
    folder.mkdir(exist_ok=True)
    for name in ("data_batch_1", "data_batch_2", "test_batch", "batches.meta"):
        (folder / name).write_bytes(b"\x80\x04 not really a pickle")
    with pytest.raises(DatasetNotFoundError, match="pickle") as info:
        load_cifar10(tmp_path)
    assert "binary version" in str(info.value)


# --- digits -----------------------------------------------------------------------------------


def test_load_digits_splits_1500_train_and_297_test() -> None:
    pytest.importorskip("sklearn")
    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.shape == (1500, 8, 8) and x_test.shape == (297, 8, 8)
    assert y_train.shape == (1500,) and y_test.shape == (297,)
    assert x_train.dtype == y_train.dtype == np.uint8
    assert int(x_train.max()) == 16 and set(np.unique(y_train)) == set(range(10))
    (x_again, _), _ = load_digits()
    np.testing.assert_array_equal(x_again, x_train)


def test_load_digits_without_sklearn_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(DependencyError, match="pip install scikit-learn") as info:
        load_digits()
    assert isinstance(info.value, ImportError)


# --- synthetic --------------------------------------------------------------------------------


def test_make_synthetic_is_deterministic_for_a_seed() -> None:
    first, second = make_synthetic(seed=5), make_synthetic(seed=5)
    for a, b in zip((*first[0], *first[1]), (*second[0], *second[1]), strict=True):
        np.testing.assert_array_equal(a, b)
    other = make_synthetic(seed=6)
    assert not np.array_equal(first[0][0], other[0][0])


def test_make_synthetic_shapes_dtypes_and_split() -> None:
    (x_train, y_train), (x_test, y_test) = make_synthetic(
        n=200, shape=(4, 4, 1), classes=5, test_fraction=0.1
    )
    assert x_train.shape == (180, 4, 4, 1) and x_test.shape == (20, 4, 4, 1)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int32
    assert set(np.unique(y_train)) == set(range(5))
    assert np.bincount(np.concatenate([y_train, y_test])).tolist() == [40] * 5


def test_make_synthetic_is_learnable() -> None:
    (x_train, y_train), (x_test, y_test) = make_synthetic(n=1024, shape=(8,), classes=3)
    centroids = np.stack([x_train[y_train == c].mean(axis=0) for c in range(3)])
    distances = ((x_test[:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    assert (distances.argmin(axis=1) == y_test).mean() > 0.95


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n must be"),
        ({"n": -5}, "n must be"),
        ({"n": 10.5}, "n must be"),
        ({"n": True}, "n must be"),
        ({"shape": ()}, "shape must be"),
        ({"shape": (8, 0)}, "shape must be"),
        ({"shape": (2.5,)}, "shape must be"),
        ({"classes": 1}, "classes must be"),
        ({"seed": -1}, "seed must be"),
        ({"seed": None}, "seed must be"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": "0.2"}, "test_fraction must be a number"),
        ({"n": 3, "test_fraction": 0.01}, "0 test samples"),
    ],
)
def test_make_synthetic_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make_synthetic(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


# --- module hygiene ---------------------------------------------------------------------------


def test_importing_datasets_loads_no_tensorflow_keras_or_sklearn() -> None:
    code = (
        "import sys, nbdist.datasets; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
