"""Tests for the IDX and binary CIFAR-10 readers."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from raydpfl.data import read_cifar10_binary, read_idx


def _idx_bytes(array: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_round_trips_uint8_images(tmp_path: Path, compressed: bool) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    payload = _idx_bytes(images, 0x08)
    path = tmp_path / ("images.idx.gz" if compressed else "images.idx")
    path.write_bytes(gzip.compress(payload) if compressed else payload)

    result = read_idx(path)

    assert result.dtype == np.uint8
    np.testing.assert_array_equal(result, images)
    result[0, 0, 0] = 7  # the result must be writable, not a read-only buffer view


def test_read_idx_decodes_big_endian_int32_and_float32(tmp_path: Path) -> None:
    ints = np.arange(-3, 3, dtype=np.int32)
    floats = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "i.idx").write_bytes(_idx_bytes(ints, 0x0C))
    (tmp_path / "f.idx").write_bytes(_idx_bytes(floats, 0x0D))

    got_ints, got_floats = read_idx(tmp_path / "i.idx"), read_idx(tmp_path / "f.idx")

    np.testing.assert_array_equal(got_ints, ints)
    np.testing.assert_array_equal(got_floats, floats)


@pytest.mark.parametrize(
    "header",
    [b"\x01\x00\x08\x01", b"\x00\x00\x07\x01", b"\x00\x00\x08\x00"],
    ids=["nonzero-prefix", "unknown-dtype", "zero-ndim"],
)
def test_read_idx_rejects_bad_magic(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(header + struct.pack(">I", 3) + b"abc")

    with pytest.raises(ValueError, match=r"bad\.idx"):
        read_idx(path)


def test_read_idx_rejects_truncated_payload(tmp_path: Path) -> None:
    payload = _idx_bytes(np.zeros((4, 2, 2), dtype=np.uint8), 0x08)
    path = tmp_path / "short.idx"
    path.write_bytes(payload[:-1])

    with pytest.raises(ValueError, match=r"short\.idx"):
        read_idx(path)


def test_read_idx_rejects_truncated_gzip(tmp_path: Path) -> None:
    payload = gzip.compress(_idx_bytes(np.zeros((50, 8, 8), dtype=np.uint8), 0x08))
    path = tmp_path / "cut.idx.gz"
    path.write_bytes(payload[: len(payload) // 2])

    with pytest.raises(ValueError, match=r"cut\.idx\.gz"):
        read_idx(path)


def _cifar_batch(rng: np.random.Generator, n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    pixels = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    records = np.concatenate([labels[:, None], pixels.reshape(n, -1)], axis=1)
    return records.tobytes(), pixels, labels


def test_read_cifar10_binary_reads_and_concatenates_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    raw_a, x_a, y_a = _cifar_batch(rng, 3)
    raw_b, x_b, y_b = _cifar_batch(rng, 2)
    (tmp_path / "a.bin").write_bytes(raw_a)
    (tmp_path / "b.bin").write_bytes(raw_b)

    x, y = read_cifar10_binary([tmp_path / "a.bin", tmp_path / "b.bin"])

    assert x.shape == (5, 3, 32, 32) and x.dtype == np.uint8
    assert y.dtype == np.int64
    np.testing.assert_array_equal(x, np.concatenate([x_a, x_b]))
    np.testing.assert_array_equal(y, np.concatenate([y_a, y_b]))


def test_read_cifar10_binary_rejects_partial_record(tmp_path: Path) -> None:
    raw, _, _ = _cifar_batch(np.random.default_rng(2), 2)
    (tmp_path / "bad.bin").write_bytes(raw[:-5])

    with pytest.raises(ValueError, match=r"bad\.bin"):
        read_cifar10_binary([tmp_path / "bad.bin"])


def test_read_cifar10_binary_rejects_out_of_range_label(tmp_path: Path) -> None:
    raw, _, _ = _cifar_batch(np.random.default_rng(3), 1)
    (tmp_path / "bad.bin").write_bytes(bytes([200]) + raw[1:])

    with pytest.raises(ValueError, match="label"):
        read_cifar10_binary([tmp_path / "bad.bin"])
