"""Tests for nbdist.datasets beyond Fashion-MNIST: CIFAR-10's binary files, the digits and
synthetic sets, and that importing the module stays light."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nbdist.datasets import load_cifar10, load_digits, make_synthetic
from nbdist.errors import ConfigError, DatasetFormatError, DatasetNotFoundError, DependencyError
from tests.helpers import refuse_network


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders must work offline: any connection attempt fails the test."""
    refuse_network(monkeypatch, "nbdist.datasets")


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
