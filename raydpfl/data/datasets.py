"""Centralised datasets: file discovery, safe readers, loading and download.

Only formats that can be parsed without executing code are supported: IDX files for
MNIST/Fashion-MNIST and the *binary* CIFAR-10 batches. Nothing is ever unpickled from a
user-supplied path. `digits` and `diabetes` ship with scikit-learn (offline); `diabetes` is
the one regression dataset (float targets).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DATASETS",
    "DATASET_FILES",
    "DATASET_MD5",
    "DATASET_URLS",
    "REGRESSION_DATASETS",
    "ArrayDataset",
    "DatasetNotFoundError",
    "DownloadError",
    "default_data_root",
    "download_dataset",
    "find_dataset_files",
    "load_dataset",
    "read_cifar10_binary",
    "read_idx",
]


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset are not present in any searched directory."""


class DownloadError(RuntimeError):
    """A dataset could not be downloaded or failed checksum verification."""


DATASETS: tuple[str, ...] = ("mnist", "fashion_mnist", "cifar10", "digits", "diabetes")
#: Datasets whose targets are real values (float32 `y`, one model output, MSE).
REGRESSION_DATASETS: tuple[str, ...] = ("diabetes",)

_IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_CIFAR_DIR = "cifar-10-batches-bin"
_CIFAR_TARBALL = "cifar-10-binary.tar.gz"
_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_RECORDS_PER_BATCH = 10_000

# Logical file key -> file name. IDX names are listed uncompressed; a ".gz" sibling is
# accepted too. CIFAR batch names are relative to a directory that is searched both
# directly and through its `cifar-10-batches-bin/` subdirectory.
DATASET_FILES: dict[str, dict[str, str]] = {
    "mnist": dict(_IDX_FILES),
    "fashion_mnist": dict(_IDX_FILES),
    "cifar10": {
        **{f"data_batch_{i}": f"data_batch_{i}.bin" for i in range(1, 6)},
        "test_batch": "test_batch.bin",
    },
    "digits": {},
    "diabetes": {},
}

# Dataset -> downloaded file name -> published MD5 (of the file as served by the mirror).
DATASET_MD5: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    "cifar10": {_CIFAR_TARBALL: "c32a1d4ab5d03f1284b67883e8d87530"},
    "digits": {},
    "diabetes": {},
}

# Dataset -> base URL; the download URL of a file is base + file name.
DATASET_URLS: dict[str, str] = {
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "fashion_mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "cifar10": "https://www.cs.toronto.edu/~kriz/",
}

# Distribution packages install some datasets system-wide; searched after `root`.
_SYSTEM_DIRS: dict[str, tuple[Path, ...]] = {
    "fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}
_SYSTEM_HINTS: dict[str, str] = {"fashion_mnist": "apt-get install dataset-fashion-mnist"}

# (mean, std) after scaling pixels to [0, 1]; per channel for CIFAR-10.
_NORMALISATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}

_DIGITS_TEST_FRACTION = 0.2
_DIGITS_SPLIT_SEED = 0
_DIABETES_TEST_FRACTION = 0.2
_DIABETES_SPLIT_SEED = 0
_DOWNLOAD_CHUNK = 1 << 20


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A centralised dataset held in memory as numpy arrays.

    Attributes:
        name: The dataset's name: a built-in's (`DATASETS`) or, for your own arrays, any
            label you like (it names the data in outputs; nothing is looked up by it).
        x_train: float32 array of shape (N, *input_shape), already normalised.
        y_train: int64 labels of shape (N,); float32 targets for a regression dataset.
        x_test: float32 array of shape (M, *input_shape), normalised like `x_train`.
        y_test: int64 labels (float32 targets) of shape (M,).
        num_classes: Number of classes; labels lie in [0, num_classes). 1 for regression
            (the model's single output).
        input_shape: Shape of one example, e.g. (1, 28, 28).
        client_ids: Optional int64 natural client id of every train record, shape (N,)
            (e.g. a LEAF FEMNIST writer), used by the `natural` partition; None when the
            data has no natural clients.
        client_ids_test: Optional int64 natural client id of every test record, shape
            (M,) (the `natural` partition of `pool="all"` needs it).
        client_names: Optional name of each natural id (id i is `client_names[i]`).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    client_ids: np.ndarray | None = None
    client_ids_test: np.ndarray | None = None
    client_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for ids, labels, field_name in (
            (self.client_ids, self.y_train, "client_ids"),
            (self.client_ids_test, self.y_test, "client_ids_test"),
        ):
            if ids is None:
                continue
            array = np.asarray(ids)
            if array.shape != (len(labels),) or not (
                np.issubdtype(array.dtype, np.integer) or array.size == 0
            ):
                raise ValueError(
                    f"{self.name}: {field_name} must be a 1-D integer array with one id per "
                    f"record ({len(labels)}), got shape {array.shape} dtype {array.dtype}"
                )
            if array.size and array.min() < 0:
                raise ValueError(f"{self.name}: {field_name} must be >= 0")


# --------------------------------------------------------------------------- readers

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """Reads a file, transparently decompressing gzip (detected by magic, not suffix)."""
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head != b"\x1f\x8b":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: corrupt or truncated gzip stream ({exc})") from exc


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Reads an IDX file (the MNIST container format), raw or gzip-compressed.

    Args:
        path: Path to the IDX file; gzip compression is detected from the content.

    Returns:
        An array with the shape stored in the header and the native-endian version of
        the stored dtype (uint8 for image and label files).

    Raises:
        ValueError: If the magic number is invalid (non-zero leading bytes, unknown dtype
            code, zero dimensions) or the payload size does not match the header.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0 or code not in _IDX_DTYPES or ndim == 0:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{data[:4].hex()} "
            "(expected 0x0000, a dtype code in {08,09,0B,0C,0D,0E} and ndim >= 1)"
        )
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(f"{path}: truncated IDX header (ndim={ndim}, {len(data)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header_len
    if actual != expected:
        raise ValueError(
            f"{path}: IDX payload is {actual} bytes but header shape {shape} needs {expected}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    # Copy into a writable, native-endian array (frombuffer views are read-only).
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_cifar10_binary(
    paths: Sequence[str | os.PathLike[str]],
) -> tuple[np.ndarray, np.ndarray]:
    """Reads CIFAR-10 batches in the *binary* format (`cifar-10-batches-bin`).

    Each record is one label byte followed by 3072 pixel bytes (1024 red, 1024 green,
    1024 blue, row-major). The python-pickle version of CIFAR-10 is deliberately not
    supported: nothing is unpickled from user-supplied paths, because unpickling can
    execute arbitrary code.

    Args:
        paths: Batch files to read, concatenated in the given order.

    Returns:
        `(x, y)` with x uint8 of shape (N, 3, 32, 32) and y int64 of shape (N,).

    Raises:
        ValueError: If `paths` is empty, a file size is not a multiple of 3073 bytes, or
            a label is outside 0..9.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if len(paths) == 0:
        raise ValueError("paths must name at least one CIFAR-10 binary batch file")
    xs, ys = [], []
    for raw_path in paths:
        path = Path(raw_path)
        records = binary_records(path, _CIFAR_RECORD, "CIFAR-10 binary record")
        labels = records[:, 0].astype(np.int64)
        if labels.max() > 9:
            raise ValueError(f"{path}: label {int(labels.max())} outside 0..9; not CIFAR-10")
        xs.append(records[:, 1:].reshape(-1, 3, 32, 32).copy())
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys)


def binary_records(path: Path, record_bytes: int, what: str) -> np.ndarray:
    """The file at `path` as a read-only uint8 array of `record_bytes`-byte rows.

    Raises:
        ValueError: The size is not a positive multiple of `record_bytes` (the message
            names the record as `what`).
    """
    data = path.read_bytes()
    if len(data) == 0 or len(data) % record_bytes != 0:
        raise ValueError(
            f"{path}: size {len(data)} is not a positive multiple of the "
            f"{record_bytes}-byte {what}"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(-1, record_bytes)


# --------------------------------------------------------------------------- discovery


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")


def default_data_root() -> Path:
    """Returns `$RAYDPFL_DATA`, or `~/.cache/raydpfl/data` when unset, user-expanded."""
    return Path(os.environ.get("RAYDPFL_DATA", "~/.cache/raydpfl/data")).expanduser()


def _resolve_root(root: str | os.PathLike[str] | None) -> Path:
    return default_data_root() if root is None else Path(root).expanduser()


def _candidate_dirs(name: str, root: Path) -> list[Path]:
    dirs = [root, root / name, *_SYSTEM_DIRS.get(name, ())]
    if name == "cifar10":
        dirs = [d for base in dirs for d in (base / _CIFAR_DIR, base)]
    return dirs


def _match_files(name: str, directory: Path) -> dict[str, Path] | None:
    found: dict[str, Path] = {}
    for key, filename in DATASET_FILES[name].items():
        options = [filename] if name == "cifar10" else [filename, filename + ".gz"]
        match = next((directory / o for o in options if (directory / o).is_file()), None)
        if match is None:
            return None
        found[key] = match
    return found


def find_dataset_files(name: str, root: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Locates the files of a dataset on disk.

    Searches, in order, `root`, `root/<name>` and, for fashion_mnist only,
    `/usr/share/datasets/fashion-mnist` (Debian package `dataset-fashion-mnist`). For
    cifar10 each of these is also searched through its `cifar-10-batches-bin/`
    subdirectory. IDX files may be gzip-compressed (`.gz`) or not. All files of a
    dataset must be in the same directory; the first complete directory wins.

    Args:
        name: Dataset name, one of `DATASETS`.
        root: Data root; None means `default_data_root()`.

    Returns:
        Logical file key (see `DATASET_FILES`) -> path. Empty for digits, which ships
        with scikit-learn.

    Raises:
        ValueError: If `name` is not in `DATASETS`.
        DatasetNotFoundError: If no searched directory holds all the files.
    """
    _check_name(name)
    if name in ("digits", "diabetes"):
        return {}
    root_path = _resolve_root(root)
    for directory in _candidate_dirs(name, root_path):
        found = _match_files(name, directory)
        if found is not None:
            return found
    searched_dirs = [root_path, root_path / name, *_SYSTEM_DIRS.get(name, ())]
    searched = " or ".join(str(d) for d in searched_dirs)
    fix = f"run `raydpfl data download {name} --root {root_path}`"
    if name in _SYSTEM_HINTS:
        fix += f" or `{_SYSTEM_HINTS[name]}`"
    raise DatasetNotFoundError(f"{name}: files not found under {searched}; {fix}")


# --------------------------------------------------------------------------- loading


def _normalise(x_uint8: np.ndarray, name: str) -> np.ndarray:
    mean, std = _NORMALISATION[name]
    x = x_uint8.astype(np.float32)
    x *= np.float32(1.0 / 255.0)
    # Broadcast per-channel constants over (N, C, H, W); MNIST-style data has C == 1.
    x -= np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    x /= np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return x


def _load_idx_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"{images_path}: expected uint8 images of shape (N, H, W)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"{labels_path}: expected {len(images)} labels, got {labels.shape}")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_path}: label {int(labels.max())} outside 0..9")
    return images[:, None, :, :], labels.astype(np.int64)


def _load_mnist_like(name: str, root: str | os.PathLike[str] | None) -> ArrayDataset:
    files = find_dataset_files(name, root)
    x_train, y_train = _load_idx_pair(files["train_images"], files["train_labels"])
    x_test, y_test = _load_idx_pair(files["test_images"], files["test_labels"])
    return ArrayDataset(
        name=name,
        x_train=_normalise(x_train, name),
        y_train=y_train,
        x_test=_normalise(x_test, name),
        y_test=y_test,
        num_classes=10,
        input_shape=tuple(int(d) for d in x_train.shape[1:]),
    )


def _load_cifar10(root: str | os.PathLike[str] | None) -> ArrayDataset:
    files = find_dataset_files("cifar10", root)
    x_train, y_train = read_cifar10_binary([files[f"data_batch_{i}"] for i in range(1, 6)])
    x_test, y_test = read_cifar10_binary([files["test_batch"]])
    return ArrayDataset(
        name="cifar10",
        x_train=_normalise(x_train, "cifar10"),
        y_train=y_train,
        x_test=_normalise(x_test, "cifar10"),
        y_test=y_test,
        num_classes=10,
        input_shape=(3, 32, 32),
    )


def _stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    test = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        test.append(members[: round(test_fraction * len(members))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return train_idx, test_idx


def _load_digits() -> ArrayDataset:
    # Imported lazily: scikit-learn is slow to import and only digits needs it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float64) / 16.0).reshape(-1, 1, 8, 8)
    x = ((x - x.mean()) / x.std()).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = _stratified_split(y, _DIGITS_TEST_FRACTION, _DIGITS_SPLIT_SEED)
    return _split_dataset("digits", x, y, train_idx, test_idx, num_classes=10)


def _load_diabetes() -> ArrayDataset:
    # Imported lazily, like digits.
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.float64)
    order = np.random.default_rng(_DIABETES_SPLIT_SEED).permutation(len(y))
    n_test = round(_DIABETES_TEST_FRACTION * len(y))
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    # Standardised with the train split's statistics only (no test information leaks in).
    x_mean, x_std = x[train_idx].mean(axis=0), x[train_idx].std(axis=0)
    y_mean, y_std = y[train_idx].mean(), y[train_idx].std()
    xs = ((x - x_mean) / x_std).astype(np.float32)
    ys = ((y - y_mean) / y_std).astype(np.float32)
    return _split_dataset("diabetes", xs, ys, train_idx, test_idx, num_classes=1)


def _split_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    train_idx: np.ndarray,
    test_idx: np.ndarray,
    *,
    num_classes: int,
) -> ArrayDataset:
    """One pool of records (x, y) cut into its train and test rows."""
    return ArrayDataset(
        name=name,
        x_train=x[train_idx],
        y_train=y[train_idx],
        x_test=x[test_idx],
        y_test=y[test_idx],
        num_classes=num_classes,
        input_shape=tuple(x.shape[1:]),
    )


def load_dataset(name: str, root: str | os.PathLike[str] | None = None) -> ArrayDataset:
    """Loads a centralised dataset into memory, normalised and channels-first.

    Pixels are scaled to [0, 1] and then standardised with the usual constants: MNIST
    mean 0.1307 / std 0.3081; Fashion-MNIST 0.2860 / 0.3530; CIFAR-10 per channel mean
    (0.4914, 0.4822, 0.4465) / std (0.2470, 0.2435, 0.2616). Shapes are (N, 1, 28, 28)
    for mnist/fashion_mnist and (N, 3, 32, 32) for cifar10.

    `digits` is scikit-learn's `load_digits` (1797 8x8 images, values 0..16): divided by
    16, standardised with the scalar mean/std of all 1797 images, shaped (N, 1, 8, 8)
    and split 80/20 into train/test, stratified by class, with a fixed
    `numpy.random.default_rng(0)` so the split is identical on every call (1438 train / 359 test).

    `diabetes` is scikit-learn's `load_diabetes` (442 patients, 10 features, a real-valued
    disease-progression target): the offline stand-in for the DPFL-BCS paper's Lending Club
    regression, which has the same 10 features (so the same 11-parameter linear model) but
    is not available offline. The raw (unscaled) features are split 80/20 at random with a
    fixed `numpy.random.default_rng(0)` (354 train / 88 test); every feature and the target
    are then standardised with the mean and std of the TRAIN split only, so the targets are
    float32 with mean 0 and variance 1 on the train split, and a test MSE of about 1 is what
    predicting the train mean scores. `num_classes` is 1 (one output) and `y` is float32.

    Args:
        name: Dataset name, one of `DATASETS`.
        root: Data root for file-based datasets; None means `default_data_root()`.

    Returns:
        The loaded `ArrayDataset`.

    Raises:
        ValueError: If `name` is unknown or a file is malformed.
        DatasetNotFoundError: If the files are not found (see `find_dataset_files`).
    """
    _check_name(name)
    if name == "digits":
        return _load_digits()
    if name == "diabetes":
        return _load_diabetes()
    if name == "cifar10":
        return _load_cifar10(root)
    return _load_mnist_like(name, root)


# --------------------------------------------------------------------------- download


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_DOWNLOAD_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _network_error(name: str, url: str, dest: Path, exc: BaseException) -> DownloadError:
    files = ", ".join(DATASET_MD5[name])
    if name == "cifar10":
        files += f" (or its extracted {_CIFAR_DIR}/ folder)"
    return DownloadError(
        f"{name}: network unreachable or mirror unavailable while fetching {url} "
        f"({_one_line(exc)}); download manually and place {files} in {dest}"
    )


_NETWORK_ERRORS = (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException)


def _fetch(name: str, filename: str, dest: Path, timeout_s: float) -> Path:
    """Downloads one file into `dest` atomically, verifying its published MD5."""
    target = dest / filename
    expected = DATASET_MD5[name][filename]
    if target.is_file() and _md5(target) == expected:
        return target
    url = DATASET_URLS[name] + filename
    # A temp file in the same directory keeps os.replace atomic (same filesystem) and
    # never leaves a half-written file under the final name.
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=f".{filename}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out:
            # Only the network calls are wrapped, so a full disk is not reported as an
            # unreachable network.
            try:
                response = urllib.request.urlopen(url, timeout=timeout_s)
            except _NETWORK_ERRORS as exc:
                raise _network_error(name, url, dest, exc) from exc
            with response:
                while True:
                    try:
                        chunk = response.read(_DOWNLOAD_CHUNK)
                    except _NETWORK_ERRORS as exc:
                        raise _network_error(name, url, dest, exc) from exc
                    if not chunk:
                        break
                    out.write(chunk)
                    digest.update(chunk)
        actual = digest.hexdigest()
        if actual != expected:
            raise DownloadError(
                f"{name}: MD5 mismatch for {filename} from {url} (expected {expected}, "
                f"got {actual}); retry, or place a verified copy in {dest}"
            )
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def _cifar_extracted(dest: Path) -> bool:
    batch_dir = dest / _CIFAR_DIR
    expected_size = _CIFAR_RECORD * _CIFAR_RECORDS_PER_BATCH
    return all(
        (batch_dir / f).is_file() and (batch_dir / f).stat().st_size == expected_size
        for f in DATASET_FILES["cifar10"].values()
    )


def _extract_cifar(name: str, tarball: Path, dest: Path) -> None:
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            # filter="data" rejects absolute paths, `..`, links outside dest and devices.
            archive.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DownloadError(
            f"{name}: could not extract {tarball} ({_one_line(exc)}); delete it and retry"
        ) from exc


def download_dataset(
    name: str, root: str | os.PathLike[str] | None = None, timeout_s: float = 60.0
) -> Path:
    """Downloads a dataset from its canonical mirror into `root/<name>`.

    Every file is written to a temporary file in the destination directory, checked
    against its published MD5 (`DATASET_MD5`) and only then renamed into place; files
    already present with the right checksum are not fetched again. CIFAR-10 is the
    binary tarball, kept next to its extraction `cifar-10-batches-bin/`; nothing is
    fetched when all six batches are already there with the right size. `digits` ships
    with scikit-learn and needs no download.

    Args:
        name: Dataset name, one of `DATASETS`.
        root: Data root; None means `default_data_root()`.
        timeout_s: Socket timeout in seconds for each request; must be > 0.

    Returns:
        The directory holding the dataset (`root/<name>`); for digits, `root/digits`
        without creating it.

    Raises:
        ValueError: If `name` is unknown or `timeout_s` is not positive.
        DownloadError: On any network failure, checksum mismatch or corrupt archive.
    """
    _check_name(name)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    dest = _resolve_root(root) / name
    if name in ("digits", "diabetes"):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    if name == "cifar10":
        if _cifar_extracted(dest):
            return dest
        tarball = _fetch(name, _CIFAR_TARBALL, dest, timeout_s)
        _extract_cifar(name, tarball, dest)
        return dest
    for filename in DATASET_MD5[name]:
        _fetch(name, filename, dest, timeout_s)
    return dest
