"""Tests for dataset discovery and loading."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from raydpfl.data import (
    DATASETS,
    ArrayDataset,
    DatasetNotFoundError,
    default_data_root,
    find_dataset_files,
    load_dataset,
)

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
needs_fashion = pytest.mark.skipif(
    not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").is_file(),
    reason="Debian package dataset-fashion-mnist is not installed",
)


def _write_idx(path: Path, array: np.ndarray, compressed: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compressed else payload)


def _write_tiny_mnist(directory: Path, compressed: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compressed else ""
    for prefix, n in (("train", 6), ("t10k", 4)):
        _write_idx(
            directory / f"{prefix}-images-idx3-ubyte{suffix}",
            np.full((n, 28, 28), 255, dtype=np.uint8),
            compressed,
        )
        _write_idx(
            directory / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, compressed
        )


@pytest.fixture(scope="module")
def fashion() -> ArrayDataset:
    return load_dataset("fashion_mnist", root="/nonexistent-raydpfl-root")


@needs_fashion
def test_fashion_mnist_has_expected_shapes_and_labels(fashion: ArrayDataset) -> None:
    assert fashion.x_train.shape == (60000, 1, 28, 28)
    assert fashion.x_test.shape == (10000, 1, 28, 28)
    assert fashion.x_train.dtype == np.float32 and fashion.y_train.dtype == np.int64
    assert fashion.input_shape == (1, 28, 28) and fashion.num_classes == 10
    assert set(np.unique(fashion.y_train)) == set(range(10))
    np.testing.assert_array_equal(np.bincount(fashion.y_train), np.full(10, 6000))


@needs_fashion
def test_fashion_mnist_is_standardised(fashion: ArrayDataset) -> None:
    assert abs(float(fashion.x_train.mean())) < 0.02
    assert abs(float(fashion.x_train.std()) - 1.0) < 0.02


def test_find_dataset_files_accepts_gz_and_raw_under_root_or_subdir(tmp_path: Path) -> None:
    _write_tiny_mnist(tmp_path / "a", compressed=True)
    _write_tiny_mnist(tmp_path / "b" / "mnist", compressed=False)

    gz_files = find_dataset_files("mnist", tmp_path / "a")
    raw_files = find_dataset_files("mnist", tmp_path / "b")

    assert gz_files["train_images"] == tmp_path / "a" / "train-images-idx3-ubyte.gz"
    assert raw_files["test_labels"] == tmp_path / "b" / "mnist" / "t10k-labels-idx1-ubyte"


def test_find_dataset_files_finds_extracted_cifar_batches(tmp_path: Path) -> None:
    batch_dir = tmp_path / "cifar10" / "cifar-10-batches-bin"
    batch_dir.mkdir(parents=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (batch_dir / name).write_bytes(b"")

    files = find_dataset_files("cifar10", tmp_path)

    assert files["test_batch"] == batch_dir / "test_batch.bin"


def test_load_mnist_from_tiny_files_scales_and_normalises(tmp_path: Path) -> None:
    _write_tiny_mnist(tmp_path / "mnist", compressed=True)

    data = load_dataset("mnist", tmp_path)

    assert data.x_train.shape == (6, 1, 28, 28) and data.x_test.shape == (4, 1, 28, 28)
    np.testing.assert_allclose(data.x_train, (1.0 - 0.1307) / 0.3081, rtol=1e-6)
    np.testing.assert_array_equal(data.y_test, [0, 1, 2, 3])


def test_missing_files_raise_actionable_not_found(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="raydpfl data download mnist") as info:
        find_dataset_files("mnist", tmp_path)

    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_partial_file_set_is_not_found(tmp_path: Path) -> None:
    _write_tiny_mnist(tmp_path, compressed=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()

    with pytest.raises(DatasetNotFoundError):
        find_dataset_files("mnist", tmp_path)


@needs_fashion
def test_fashion_mnist_falls_back_to_debian_directory(tmp_path: Path) -> None:
    files = find_dataset_files("fashion_mnist", tmp_path)

    assert files["train_images"].parent == DEBIAN_FASHION


def test_root_found_before_debian_directory(tmp_path: Path) -> None:
    _write_tiny_mnist(tmp_path / "fashion_mnist", compressed=False)

    files = find_dataset_files("fashion_mnist", tmp_path)

    assert files["train_images"].parent == tmp_path / "fashion_mnist"


def test_default_root_honours_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYDPFL_DATA", "~/somewhere")
    assert default_data_root() == Path.home() / "somewhere"
    monkeypatch.delenv("RAYDPFL_DATA")
    assert default_data_root() == Path.home() / ".cache" / "raydpfl" / "data"


def test_unknown_dataset_lists_choices() -> None:
    with pytest.raises(ValueError, match="fashion_mnist"):
        load_dataset("imagenet")


def test_digits_loads_with_deterministic_stratified_split() -> None:
    first, second = load_dataset("digits"), load_dataset("digits")

    assert first.x_train.shape[1:] == (1, 8, 8) and first.input_shape == (1, 8, 8)
    assert len(first.y_train) + len(first.y_test) == 1797
    assert len(first.y_test) == pytest.approx(0.2 * 1797, abs=10)
    assert first.x_train.dtype == np.float32 and first.y_train.dtype == np.int64
    np.testing.assert_array_equal(first.y_test, second.y_test)
    test_share = np.bincount(first.y_test) / np.bincount(np.r_[first.y_train, first.y_test])
    np.testing.assert_allclose(test_share, 0.2, atol=0.01)
    pooled = np.concatenate([first.x_train, first.x_test])
    assert abs(float(pooled.mean())) < 1e-4 and abs(float(pooled.std()) - 1) < 1e-4


def test_datasets_constant_lists_supported_names() -> None:
    assert DATASETS == ("mnist", "fashion_mnist", "cifar10", "digits", "diabetes")
