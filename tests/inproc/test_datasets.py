"""Tests for nbdist.datasets: offline loaders, their search order and their error messages."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from nbdist import datasets
from nbdist.datasets import load_fashion_mnist
from nbdist.errors import DatasetFormatError, DatasetNotFoundError
from tests.helpers import refuse_network

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
    refuse_network(monkeypatch, "nbdist.datasets")


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
    assert x_train.flags.writeable and y_train.flags.writeable
    assert (x_train[0, 0, 0], y_train[0]) == (7, 1)


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
