"""Tests for download_dataset with a fake network (no real traffic)."""

from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from raydpfl.data import (
    DATASET_MD5,
    DATASET_URLS,
    DownloadError,
    download_dataset,
    read_cifar10_binary,
)

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


class _FakeResponse(io.BytesIO):
    """Stands in for the object urlopen returns (a readable context manager)."""


def _serve(monkeypatch: pytest.MonkeyPatch, payloads: dict[str, bytes]) -> list[str]:
    requested: list[str] = []

    def fake_urlopen(url: str, timeout: float) -> _FakeResponse:
        requested.append(url)
        return _FakeResponse(payloads[url.rsplit("/", 1)[-1]])

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    return requested


def _trust(monkeypatch: pytest.MonkeyPatch, name: str, payloads: dict[str, bytes]) -> None:
    for filename, data in payloads.items():
        monkeypatch.setitem(DATASET_MD5[name], filename, hashlib.md5(data).hexdigest())


def _tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_checksum_tables_hold_published_values() -> None:
    assert set(DATASET_MD5["mnist"]) == set(MNIST_FILES)
    assert DATASET_MD5["mnist"]["train-images-idx3-ubyte.gz"] == (
        "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    )
    assert DATASET_MD5["fashion_mnist"]["t10k-labels-idx1-ubyte.gz"] == (
        "bb300cfdad3c16e7a12a480ee83cd310"
    )
    assert DATASET_MD5["cifar10"] == {"cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"}
    assert DATASET_URLS["mnist"] == "https://ossci-datasets.s3.amazonaws.com/mnist/"


def test_verified_download_lands_and_is_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = {f: f.encode() * 100 for f in MNIST_FILES}
    _trust(monkeypatch, "mnist", payloads)
    requested = _serve(monkeypatch, payloads)

    dest = download_dataset("mnist", tmp_path)
    download_dataset("mnist", tmp_path)

    assert dest == tmp_path / "mnist"
    assert sorted(p.name for p in dest.iterdir()) == sorted(MNIST_FILES)
    assert (dest / MNIST_FILES[0]).read_bytes() == payloads[MNIST_FILES[0]]
    assert len(requested) == len(MNIST_FILES)
    assert requested[0].startswith(DATASET_URLS["mnist"])


def test_checksum_mismatch_raises_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = {f: b"tampered" for f in MNIST_FILES}
    _serve(monkeypatch, payloads)

    with pytest.raises(DownloadError, match="MD5 mismatch"):
        download_dataset("mnist", tmp_path)

    assert list((tmp_path / "mnist").iterdir()) == []


def test_network_failure_explains_manual_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(url: str, timeout: float) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)

    with pytest.raises(DownloadError) as info:
        download_dataset("fashion_mnist", tmp_path)

    message = str(info.value)
    assert "network unreachable" in message and "place" in message
    assert "train-images-idx3-ubyte.gz" in message and str(tmp_path / "fashion_mnist") in message
    assert "\n" not in message
    assert list((tmp_path / "fashion_mnist").iterdir()) == []


def test_timeout_during_read_is_a_download_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class _Stalls(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            raise TimeoutError("timed out")

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: _Stalls())

    with pytest.raises(DownloadError, match="network unreachable"):
        download_dataset("mnist", tmp_path, timeout_s=0.1)


def test_digits_needs_no_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(url: str, timeout: float) -> None:
        raise AssertionError("digits must not touch the network")

    monkeypatch.setattr(urllib.request, "urlopen", forbidden)

    download_dataset("digits", tmp_path)

    assert not (tmp_path / "digits").exists()


def test_cifar_tarball_is_verified_and_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    record = bytes([3]) + bytes(3072)  # label 3, all-black image
    payloads = {
        "cifar-10-binary.tar.gz": _tarball({f"cifar-10-batches-bin/{n}": record for n in names})
    }
    _trust(monkeypatch, "cifar10", payloads)
    _serve(monkeypatch, payloads)

    dest = download_dataset("cifar10", tmp_path)
    _, labels = read_cifar10_binary([dest / "cifar-10-batches-bin" / "test_batch.bin"])

    np.testing.assert_array_equal(labels, [3])
    assert (dest / "cifar-10-binary.tar.gz").is_file()


def test_cifar_tarball_escaping_destination_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = {"cifar-10-binary.tar.gz": _tarball({"../escaped.bin": b"x"})}
    _trust(monkeypatch, "cifar10", payloads)
    _serve(monkeypatch, payloads)

    with pytest.raises(DownloadError, match="extract"):
        download_dataset("cifar10", tmp_path / "root")

    assert not (tmp_path / "root" / "escaped.bin").exists()


def test_nonpositive_timeout_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        download_dataset("mnist", tmp_path, timeout_s=0)
