"""Readers for bring-your-own data: CIFAR-100 (binary), LEAF JSON (FEMNIST, Shakespeare)
and image folders.

Every reader returns an `ArrayDataset` and is registered as a dataset in
`raydpfl.registry` (by `raydpfl.config.schema`, as ``"raydpfl.data.readers:load_*"``
targets with their options dataclasses), so a config names it like any other:
``data: {dataset: cifar100, options: {labels: coarse}}``. Only formats that parse
without executing code are read: raw bytes, JSON and images decoded by Pillow; nothing
is unpickled. Bad input raises a one-line `ValueError` naming the file and what is wrong
(wrong size, truncated JSON, a missing ``user_data`` field, ...), and missing files a
`DatasetNotFoundError` naming the folders searched, before any training starts.

- ``cifar100``: the binary version (``cifar-100-binary/train.bin``, ``test.bin``): each
  record is 1 coarse-label byte, 1 fine-label byte and 3072 pixel bytes (R, G, B planes,
  row-major). Fine (100) or coarse (20) labels.
- ``femnist`` and ``shakespeare``: LEAF's JSON (``{"users": [...], "num_samples": [...],
  "user_data": {user: {"x": [...], "y": [...]}}}``) in ``train/`` and ``test/`` folders, as
  LEAF's ``preprocess.sh`` writes them. Every record carries its user as a natural client
  id (`ArrayDataset.client_ids`) for the ``natural`` partition.
- ``image_folder``: ``root/<class name>/*.png|jpg|jpeg`` (or ``root/train/...`` and
  ``root/test/...``), classes and files in sorted order, resized to a fixed size.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from raydpfl.data.datasets import (
    DATASET_MD5,
    DATASET_URLS,
    ArrayDataset,
    DatasetNotFoundError,
    _extract_cifar,
    _fetch,
    _resolve_root,
    binary_records,
)

__all__ = [
    "CIFAR100_LABELS",
    "DOWNLOADABLE",
    "LEAF_DATASETS",
    "SHAKESPEARE_LETTERS",
    "download_cifar100",
    "find_cifar100_files",
    "find_leaf_dirs",
    "load_cifar100",
    "load_femnist",
    "load_image_folder",
    "load_shakespeare",
    "read_cifar100_binary",
    "read_leaf_json",
]

# ---------------------------------------------------------------------------- CIFAR-100
_CIFAR100_DIR = "cifar-100-binary"
_CIFAR100_TARBALL = "cifar-100-binary.tar.gz"
_CIFAR100_RECORD = 2 + 3 * 32 * 32
_CIFAR100_FILES = {"train": "train.bin", "test": "test.bin"}
_CIFAR100_SIZES = {"train": 50_000 * _CIFAR100_RECORD, "test": 10_000 * _CIFAR100_RECORD}
#: Label kind -> number of classes.
CIFAR100_LABELS = {"fine": 100, "coarse": 20}
# (mean, std) per channel after scaling to [0, 1], of the CIFAR-100 training set.
_CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
_CIFAR100_STD = (0.2673, 0.2564, 0.2762)

# The published tarball (https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-100 binary
# version (suitable for C programs)", 161 MB) and its MD5 as listed there.
DATASET_MD5.setdefault("cifar100", {_CIFAR100_TARBALL: "03b5dce01913d631647c71ecec9e9cb8"})
DATASET_URLS.setdefault("cifar100", "https://www.cs.toronto.edu/~kriz/")


def read_cifar100_binary(
    path: str | os.PathLike[str], labels: str = "fine"
) -> tuple[np.ndarray, np.ndarray]:
    """Reads one CIFAR-100 binary file (``train.bin`` or ``test.bin``).

    Each 3074-byte record is the coarse label (0..19), the fine label (0..99) and 3072
    pixel bytes (1024 red, 1024 green, 1024 blue, row-major).

    Args:
        path: The file.
        labels: "fine" (100 classes) or "coarse" (20 superclasses).

    Returns:
        `(x, y)`: x uint8 of shape (N, 3, 32, 32), y int64 of shape (N,).

    Raises:
        ValueError: `labels` is unknown, the size is not a positive multiple of 3074 bytes
            (a truncated file, or CIFAR-10's 3073-byte records), or a label is out of range.
    """
    if labels not in CIFAR100_LABELS:
        raise ValueError(f"labels must be one of {tuple(CIFAR100_LABELS)}, got {labels!r}")
    path = Path(path)
    records = binary_records(
        path, _CIFAR100_RECORD, "CIFAR-100 binary record (truncated, or not CIFAR-100)"
    )
    for column, kind in ((0, "coarse"), (1, "fine")):
        top = int(records[:, column].max())
        if top >= CIFAR100_LABELS[kind]:
            raise ValueError(
                f"{path}: {kind} label {top} outside 0..{CIFAR100_LABELS[kind] - 1}; "
                "not a CIFAR-100 binary file"
            )
    y = records[:, 0 if labels == "coarse" else 1].astype(np.int64)
    return records[:, 2:].reshape(-1, 3, 32, 32).copy(), y


def find_cifar100_files(root: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """``{"train": ..., "test": ...}``: the first of `root`, `root/cifar100` (each also
    through its ``cifar-100-binary/`` folder) that holds both ``train.bin`` and ``test.bin``.

    Raises:
        DatasetNotFoundError: No searched folder holds both files.
    """
    base = _resolve_root(root)
    for directory in (d for b in (base, base / "cifar100") for d in (b / _CIFAR100_DIR, b)):
        found = {k: directory / f for k, f in _CIFAR100_FILES.items()}
        if all(p.is_file() for p in found.values()):
            return found
    raise DatasetNotFoundError(
        f"cifar100: train.bin and test.bin not found under {base} or {base / 'cifar100'} "
        f"(or their {_CIFAR100_DIR}/ folder); run `raydpfl data download cifar100 --root "
        f"{base}`"
    )


def _standardise(x_uint8: np.ndarray, mean: Iterable[float], std: Iterable[float]) -> np.ndarray:
    x = x_uint8.astype(np.float32)
    x *= np.float32(1.0 / 255.0)
    x -= np.asarray(tuple(mean), dtype=np.float32).reshape(1, -1, 1, 1)
    x /= np.asarray(tuple(std), dtype=np.float32).reshape(1, -1, 1, 1)
    return x


def _image_dataset(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    mean_std: tuple[Iterable[float], Iterable[float]],
    num_classes: int,
) -> ArrayDataset:
    """uint8 (N, C, H, W) train and test images, each standardised per channel by
    `mean_std`, with their labels."""
    (x_train, y_train), (x_test, y_test) = train, test
    return ArrayDataset(
        name=name,
        x_train=_standardise(x_train, *mean_std),
        y_train=y_train,
        x_test=_standardise(x_test, *mean_std),
        y_test=y_test,
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in x_train.shape[1:]),
    )


def load_cifar100(
    root: str | os.PathLike[str] | None = None, labels: str = "fine"
) -> ArrayDataset:
    """CIFAR-100 from its binary files, standardised per channel, shape (N, 3, 32, 32).

    Args:
        root: Data root (see `find_cifar100_files`); None means `default_data_root()`.
        labels: "fine" (100 classes) or "coarse" (20 superclasses).
    """
    if labels not in CIFAR100_LABELS:
        raise ValueError(f"labels must be one of {tuple(CIFAR100_LABELS)}, got {labels!r}")
    files = find_cifar100_files(root)
    x_train, y_train = read_cifar100_binary(files["train"], labels)
    x_test, y_test = read_cifar100_binary(files["test"], labels)
    return _image_dataset(
        "cifar100",
        (x_train, y_train),
        (x_test, y_test),
        (_CIFAR100_MEAN, _CIFAR100_STD),
        CIFAR100_LABELS[labels],
    )


def download_cifar100(root: str | os.PathLike[str] | None = None, timeout_s: float = 60.0) -> Path:
    """Downloads the CIFAR-100 binary tarball into `root/cifar100`, checks its published
    MD5 and extracts ``cifar-100-binary/``; nothing is fetched when both files are there
    with the right size.

    Raises:
        raydpfl.data.DownloadError: A network failure, an MD5 mismatch or a corrupt archive.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    dest = _resolve_root(root) / "cifar100"
    dest.mkdir(parents=True, exist_ok=True)
    batch_dir = dest / _CIFAR100_DIR
    if all(
        (batch_dir / f).is_file() and (batch_dir / f).stat().st_size == _CIFAR100_SIZES[k]
        for k, f in _CIFAR100_FILES.items()
    ):
        return dest
    tarball = _fetch("cifar100", _CIFAR100_TARBALL, dest, timeout_s)
    _extract_cifar("cifar100", tarball, dest)
    return dest


#: Datasets of this module that `raydpfl data download` fetches -> their downloader.
DOWNLOADABLE = {"cifar100": download_cifar100}

# ---------------------------------------------------------------------------- LEAF
#: LEAF's Shakespeare vocabulary (models/utils/language_utils.py: ALL_LETTERS); a
#: character's token is its index here.
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
_LETTER_INDEX = {c: i for i, c in enumerate(SHAKESPEARE_LETTERS)}
_SHAKESPEARE_SEQ = 80
_FEMNIST_PIXELS = 28 * 28
_FEMNIST_CLASSES = 62
#: The LEAF datasets read here.
LEAF_DATASETS = ("femnist", "shakespeare", "sent140")


def find_leaf_dirs(name: str, root: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """``{"train": dir, "test": dir}``: the first of `root`, `root/<name>`,
    `root/<name>/data` whose ``train/`` and ``test/`` folders both hold ``*.json`` files
    (LEAF writes ``leaf/data/<name>/data/{train,test}``).

    Raises:
        DatasetNotFoundError: No searched folder has both.
    """
    base = _resolve_root(root)
    searched = [base, base / name, base / name / "data"]
    for directory in searched:
        dirs = {split: directory / split for split in ("train", "test")}
        if all(d.is_dir() and any(d.glob("*.json")) for d in dirs.values()):
            return dirs
    raise DatasetNotFoundError(
        f"{name}: no train/ and test/ folders of LEAF *.json files under "
        f"{' or '.join(str(d) for d in searched)}; LEAF's preprocess.sh writes them "
        "(https://github.com/TalwalkarLab/leaf)"
    )


def read_leaf_json(path: str | os.PathLike[str]) -> dict[str, tuple[list, list]]:
    """One LEAF JSON file as ``{user: (x, y)}``, in the order of its ``users`` list.

    Raises:
        ValueError: Not JSON (e.g. truncated), not an object, ``users`` or ``user_data``
            missing or of the wrong type, a user without ``x``/``y`` lists of equal
            length, or ``num_samples`` disagreeing with them; the message names the file
            and the field or user.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid LEAF JSON (truncated or corrupt?): {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a LEAF file is a JSON object, got {type(doc).__name__}")
    for key, kind in (("users", list), ("user_data", dict)):
        if key not in doc:
            raise ValueError(f"{path}: missing field {key!r} (not a LEAF JSON file)")
        if not isinstance(doc[key], kind):
            raise ValueError(f"{path}: field {key!r} must be a JSON {kind.__name__}")
    users, user_data = doc["users"], doc["user_data"]
    counts = doc.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise ValueError(f"{path}: field 'num_samples' must be a list with one count per user")
    out: dict[str, tuple[list, list]] = {}
    for i, user in enumerate(users):
        record = user_data.get(str(user))
        if not isinstance(record, dict):
            raise ValueError(f"{path}: user {user!r} is listed in 'users' but not in 'user_data'")
        x, y = record.get("x"), record.get("y")
        if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
            raise ValueError(
                f"{path}: user_data[{user!r}] needs lists 'x' and 'y' of equal length"
            )
        if counts is not None and counts[i] != len(y):
            raise ValueError(
                f"{path}: num_samples[{i}] = {counts[i]!r} but user {user!r} has {len(y)} records"
            )
        out[str(user)] = (x, y)
    return out


def _read_leaf(name: str, root, encode) -> ArrayDataset:
    """Reads every file of both splits; `encode(path, user, x, y) -> (x array, y array)`."""
    dirs = find_leaf_dirs(name, root)
    splits: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for split, directory in dirs.items():
        rows = []
        for path in sorted(directory.glob("*.json")):
            for user, (x, y) in read_leaf_json(path).items():
                rows.append((user, *encode(path, user, x, y)))
        splits[split] = rows
    names = tuple(sorted({user for rows in splits.values() for user, _, _ in rows}))
    index = {user: i for i, user in enumerate(names)}

    def stack(rows, item, shape, dtype):
        arrays = [r[item] for r in rows]
        return np.concatenate(arrays) if arrays else np.zeros((0, *shape), dtype=dtype)

    first = next((r for rows in splits.values() for r in rows), None)
    if first is None:
        raise ValueError(f"{name}: the LEAF files under {dirs['train'].parent} list no users")
    x_shape, x_dtype = first[1].shape[1:], first[1].dtype
    data = {}
    for split, rows in splits.items():
        ids = [np.full(len(r[2]), index[r[0]], dtype=np.int64) for r in rows]
        data[split] = (
            stack(rows, 1, x_shape, x_dtype),
            stack(rows, 2, (), np.int64),
            np.concatenate(ids) if ids else np.zeros(0, np.int64),
        )
    return ArrayDataset(
        name=name,
        x_train=data["train"][0],
        y_train=data["train"][1],
        x_test=data["test"][0],
        y_test=data["test"][1],
        num_classes=_FEMNIST_CLASSES if name == "femnist" else len(SHAKESPEARE_LETTERS),
        input_shape=tuple(int(d) for d in x_shape),
        client_ids=data["train"][2],
        client_ids_test=data["test"][2],
        client_names=names,
    )


def _labels(path: Path, user: str, y: list, num_classes: int) -> np.ndarray:
    try:
        labels = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: user_data[{user!r}]['y'] must be a list of integers") from None
    if labels.ndim != 1 or np.any(labels != np.round(labels)):
        raise ValueError(f"{path}: user_data[{user!r}]['y'] must be a list of integers")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{path}: user_data[{user!r}]['y'] has label {int(labels.max())}, outside "
            f"0..{num_classes - 1}"
        )
    return labels.astype(np.int64)


def _encode_femnist(path: Path, user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    try:
        pixels = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        pixels = None
    if pixels is None or (len(x) and pixels.shape != (len(x), _FEMNIST_PIXELS)):
        raise ValueError(
            f"{path}: user_data[{user!r}]['x'] must hold lists of {_FEMNIST_PIXELS} numbers "
            "(28x28 FEMNIST images)"
        )
    if not np.all(np.isfinite(pixels)):
        raise ValueError(f"{path}: user_data[{user!r}]['x'] holds a non-finite value")
    return pixels.reshape(-1, 1, 28, 28), _labels(path, user, y, _FEMNIST_CLASSES)


def load_femnist(root: str | os.PathLike[str] | None = None) -> ArrayDataset:
    """LEAF's FEMNIST: 28×28 handwritten characters (62 classes: digits, upper- and
    lower-case letters) by writer, from LEAF's JSON folders (see `find_leaf_dirs`).

    x is LEAF's 784 floats per record as stored (LEAF scales pixels to [0, 1]), shaped
    (N, 1, 28, 28) float32; y int64 in 0..61. Each record's writer is its natural client
    id (`client_ids`, `client_ids_test`; the writer of id i is `client_names[i]`), so
    ``partition: {kind: natural}`` gives one client per writer.
    """
    return _read_leaf("femnist", root, _encode_femnist)


def _encode_text(path: Path, user: str, text: object, where: str) -> list[int]:
    if not isinstance(text, str):
        raise ValueError(f"{path}: user_data[{user!r}][{where!r}] must hold strings")
    try:
        return [_LETTER_INDEX[c] for c in text]
    except KeyError as exc:
        raise ValueError(
            f"{path}: user_data[{user!r}][{where!r}] has character {exc.args[0]!r}, outside "
            "LEAF's 80-character Shakespeare vocabulary"
        ) from None


def _encode_shakespeare(path: Path, user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    tokens = [_encode_text(path, user, s, "x") for s in x]
    if any(len(t) != _SHAKESPEARE_SEQ for t in tokens):
        raise ValueError(
            f"{path}: user_data[{user!r}]['x'] must hold {_SHAKESPEARE_SEQ}-character strings"
        )
    targets = [_encode_text(path, user, s, "y") for s in y]
    if any(len(t) != 1 for t in targets):
        raise ValueError(f"{path}: user_data[{user!r}]['y'] must hold single characters")
    x_arr = np.asarray(tokens, dtype=np.int64).reshape(-1, _SHAKESPEARE_SEQ)
    return x_arr, np.asarray([t[0] for t in targets], dtype=np.int64)


def load_shakespeare(root: str | os.PathLike[str] | None = None) -> ArrayDataset:
    """LEAF's Shakespeare: next-character prediction by speaking role.

    x is each 80-character string as int64 tokens (the index of each character in LEAF's
    80-character vocabulary `SHAKESPEARE_LETTERS`), shape (N, 80); y is the next
    character's token, so `num_classes` is 80. The model must embed integer tokens
    (`char_transformer` does). Each record's role is its natural client id.
    """
    return _read_leaf("shakespeare", root, _encode_shakespeare)


_WORD = re.compile(r"[a-z0-9']+")
#: Token ids reserved by `load_sent140`: padding and words outside the vocabulary.
SENT140_PAD, SENT140_UNKNOWN = 0, 1


def _tweet(path: Path, user: str, record: object) -> str:
    """LEAF's Sent140 x: the raw row [id, date, query, user, text] (the text is last), or
    the text itself."""
    text = record[-1] if isinstance(record, list) and record else record
    if not isinstance(text, str):
        raise ValueError(
            f"{path}: user_data[{user!r}]['x'] must hold tweets (a string, or LEAF's row "
            "whose last field is the text)"
        )
    return text


def load_sent140(
    root: str | os.PathLike[str] | None = None, vocab_size: int = 10000, max_length: int = 25
) -> ArrayDataset:
    """LEAF's Sent140: tweet sentiment (y 0 negative, 1 positive) by Twitter user.

    Each tweet is lower-cased and split into words (``[a-z0-9']+``); the vocabulary is the
    `vocab_size` − 2 most frequent words of the *train* split (ties by first appearance),
    after the ids `SENT140_PAD` (0) and `SENT140_UNKNOWN` (1). x is the first
    `max_length` word ids, padded with 0: int64 (N, max_length); a token model
    (`char_transformer` with ``vocab_size``) embeds them. LEAF's GloVe embeddings are not
    used. Each record's user is its natural client id.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 3:
        raise ValueError(f"vocab_size must be an integer >= 3, got {vocab_size!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    dirs = find_leaf_dirs("sent140", root)
    rows: dict[str, list[tuple[str, list[str], int]]] = {}
    for split, directory in dirs.items():
        rows[split] = []
        for path in sorted(directory.glob("*.json")):
            for user, (x, y) in read_leaf_json(path).items():
                labels = _labels(path, user, y, 2)
                for record, label in zip(x, labels, strict=True):
                    words = _WORD.findall(_tweet(path, user, record).lower())
                    rows[split].append((user, words, int(label)))
    if not rows["train"]:
        raise ValueError(f"sent140: the LEAF files under {dirs['train'].parent} list no users")
    counts: dict[str, int] = {}
    for _, words, _ in rows["train"]:
        for w in words:
            counts[w] = counts.get(w, 0) + 1
    order = sorted(counts, key=lambda w: -counts[w])  # stable: ties keep first appearance
    vocab = {w: i + 2 for i, w in enumerate(order[: vocab_size - 2])}
    names = tuple(sorted({user for split in rows.values() for user, _, _ in split}))
    index = {user: i for i, user in enumerate(names)}

    def encode(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.full((len(rows[split]), max_length), SENT140_PAD, dtype=np.int64)
        for i, (_, words, _) in enumerate(rows[split]):
            ids = [vocab.get(w, SENT140_UNKNOWN) for w in words[:max_length]]
            x[i, : len(ids)] = ids
        y = np.array([label for _, _, label in rows[split]], dtype=np.int64)
        ids = np.array([index[user] for user, _, _ in rows[split]], dtype=np.int64)
        return x, y, ids

    (x_train, y_train, id_train), (x_test, y_test, id_test) = encode("train"), encode("test")
    return ArrayDataset(
        name="sent140",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=2,
        input_shape=(max_length,),
        client_ids=id_train,
        client_ids_test=id_test,
        client_names=names,
    )


# ---------------------------------------------------------------------------- image folders
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_IMAGE_SPLIT_SEED = 0
#: The most pixels one image file may declare: 64 Mpx (8192 x 8192), below Pillow's own
#: decompression-bomb limits (89 Mpx warns, 179 Mpx raises), checked from the header
#: before any pixel is decoded. Every image is resized to `size` x `size` anyway; a file
#: declaring more is a decompression bomb or a mistake, refused by name.
MAX_IMAGE_PIXELS = 8192 * 8192


def _class_dirs(directory: Path) -> list[Path]:
    return sorted((d for d in directory.iterdir() if d.is_dir()), key=lambda d: d.name)


def _images(class_dir: Path) -> list[Path]:
    return sorted(
        (p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES),
        key=lambda p: p.name,
    )


def _read_images(files: list[Path], size: int, mode: str) -> np.ndarray:
    import warnings

    from PIL import Image, UnidentifiedImageError  # imported lazily; an optional dependency

    out = np.empty((len(files), size, size, 3 if mode == "RGB" else 1), dtype=np.uint8)
    for i, path in enumerate(files):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path) as img:
                    width, height = img.size  # from the header; nothing decoded yet
                    if width * height > MAX_IMAGE_PIXELS:
                        raise ValueError(
                            f"{path}: declares {width} x {height} pixels, more than an image "
                            f"may have ({MAX_IMAGE_PIXELS:,}: a decompression bomb?)"
                        )
                    img = img.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
                    out[i] = np.asarray(img, dtype=np.uint8).reshape(size, size, -1)
        except ValueError as exc:
            if str(exc).startswith(f"{path}: declares"):
                raise
            raise ValueError(f"{path}: not a readable image ({exc})") from None
        except (
            UnidentifiedImageError,
            OSError,
            Image.DecompressionBombError,
            Image.DecompressionBombWarning,
        ) as exc:
            raise ValueError(f"{path}: not a readable image ({exc})") from None
    return out.transpose(0, 3, 1, 2)


def load_image_folder(
    root: str | os.PathLike[str] | None = None,
    size: int = 32,
    grayscale: bool = False,
    test_fraction: float = 0.2,
) -> ArrayDataset:
    """Images in one folder per class, as torchvision's ImageFolder lays them out.

    `root` holds either ``train/<class>/`` and ``test/<class>/`` folders (the test classes
    must be train classes) or ``<class>/`` folders directly, which are then split into
    train and test by class with `test_fraction` and a fixed seed (0). Classes are the
    sorted folder names (label i is the i-th); files (``.png``, ``.jpg``, ``.jpeg``) are
    read in sorted order, converted to RGB (or grayscale) and resized to size×size
    (bilinear). Pixels are scaled to [0, 1] and standardised per channel with the train
    split's mean and std. Needs Pillow.

    Raises:
        DatasetNotFoundError: `root` is missing or holds no class folder.
        ValueError: A class folder holds no image, a file is not a readable image, an
            option is out of range, or a test class is not a train class.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ValueError("image_folder needs Pillow: pip install pillow") from None
    if root is None:
        raise DatasetNotFoundError("image_folder: set experiment.data.root to the image folder")
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DatasetNotFoundError(f"image_folder: no folder {base}")
    split = (base / "train").is_dir() and (base / "test").is_dir()
    train_dir = base / "train" if split else base
    classes = [d.name for d in _class_dirs(train_dir)]
    if not classes:
        raise DatasetNotFoundError(f"image_folder: {train_dir} holds no class folders")
    index = {c: i for i, c in enumerate(classes)}

    def listing(directory: Path) -> tuple[list[Path], list[int]]:
        files, labels = [], []
        for class_dir in _class_dirs(directory):
            if class_dir.name not in index:
                raise ValueError(
                    f"{class_dir}: class {class_dir.name!r} is not a class of {train_dir}"
                )
            images = _images(class_dir)
            if not images:
                raise ValueError(f"{class_dir}: no .png/.jpg/.jpeg images in this class folder")
            files += images
            labels += [index[class_dir.name]] * len(images)
        return files, labels

    mode = "L" if grayscale else "RGB"
    files, labels = listing(train_dir)
    x_all, y_all = _read_images(files, size, mode), np.asarray(labels, dtype=np.int64)
    if split:
        test_files, test_labels = listing(base / "test")
        x_train, y_train = x_all, y_all
        x_test, y_test = _read_images(test_files, size, mode), np.asarray(test_labels, np.int64)
    else:
        rng = np.random.default_rng(_IMAGE_SPLIT_SEED)
        test_idx = []
        for c in range(len(classes)):
            members = rng.permutation(np.flatnonzero(y_all == c))
            test_idx.append(members[: round(test_fraction * len(members))])
        test_mask = np.zeros(len(y_all), dtype=bool)
        test_mask[np.concatenate(test_idx)] = True
        x_train, y_train = x_all[~test_mask], y_all[~test_mask]
        x_test, y_test = x_all[test_mask], y_all[test_mask]
    scaled = x_train.astype(np.float64) / 255.0
    mean = scaled.mean(axis=(0, 2, 3))
    std = np.maximum(scaled.std(axis=(0, 2, 3)), 1e-6)
    return _image_dataset(
        "image_folder", (x_train, y_train), (x_test, y_test), (mean, std), len(classes)
    )
