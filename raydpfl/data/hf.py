"""Hugging Face `datasets` as a raydpfl dataset (``experiment.data.dataset: hf_dataset``).

Reads a dataset the `datasets` library can open without a network: a folder written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a local builder (``parquet``,
``csv``, ``json``, ``imagefolder``) over the files in ``experiment.data.root``, or a Hub
id already in the local cache (``HF_DATASETS_OFFLINE=1`` keeps it off the network). Two
splits become the train pool and the central test set; one column gives the inputs
(images are converted to arrays and optionally resized; numbers and lists of numbers are
taken as they are), one the integer labels, and optionally one the natural client id of
each record (a writer, a user), which the ``natural`` partition reads — Flower Datasets'
NaturalIdPartitioner over any Hugging Face dataset.

The `datasets` package is imported only here, when such a dataset is loaded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.data.datasets import ArrayDataset, DatasetNotFoundError

__all__ = ["load_hf_dataset"]


def _open(path: str, root: str | os.PathLike[str] | None) -> Any:
    """The DatasetDict at `path` (a save_to_disk folder, a builder over `root`, or a
    cached Hub id)."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "hf_dataset needs the Hugging Face datasets package: pip install datasets"
        ) from None
    if not path:
        raise ValueError("hf_dataset: set experiment.data.options.path")
    folder = Path(path).expanduser()
    if not folder.is_absolute() and root is not None and (Path(root) / folder).is_dir():
        folder = Path(root) / folder
    with _no_progress_bars(datasets):
        return _open_quietly(datasets, path, folder, root)


@contextlib.contextmanager
def _no_progress_bars(datasets: Any) -> Iterator[None]:
    """Hugging Face's progress bars off while raydpfl reads (a run's terminal shows
    raydpfl's own progress); the user's setting is restored afterwards."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def _open_quietly(datasets: Any, path: str, folder: Path, root: Any) -> Any:
    if folder.is_dir():
        if not ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()):
            raise DatasetNotFoundError(
                f"hf_dataset: {folder} is not a folder written by save_to_disk (no "
                "dataset_dict.json or state.json)"
            )
        opened = datasets.load_from_disk(str(folder))
    else:
        kwargs = {"data_dir": str(root)} if root is not None else {}
        try:
            opened = datasets.load_dataset(path, **kwargs)
        except FileNotFoundError as e:
            raise DatasetNotFoundError(f"hf_dataset: {path!r}: {e}") from None
        except Exception as e:  # the library's own errors (connection, format) vary
            raise ValueError(
                f"hf_dataset: cannot open {path!r}: {str(e).splitlines()[0]}"
            ) from None
    if isinstance(opened, datasets.Dataset):
        raise ValueError(
            f"hf_dataset: {path!r} holds one split; save a DatasetDict with the train and "
            "test splits (dataset.train_test_split(...).save_to_disk(...))"
        )
    return opened


def _split(opened: Any, name: str, field: str) -> Any:
    if name not in opened:
        raise ValueError(
            f"hf_dataset: options.{field}: no split {name!r} (splits: {', '.join(opened)})"
        )
    return opened[name]


def _column(split: Any, column: str, field: str, split_name: str) -> list:
    if column not in split.column_names:
        raise ValueError(
            f"hf_dataset: options.{field}: no column {column!r} in split {split_name!r} "
            f"(columns: {', '.join(split.column_names)})"
        )
    return split[column]


def _inputs(values: list, image_size: int | None, where: str) -> np.ndarray:
    """Images → float32 (N, C, H, W) in [0, 1]; numbers or lists → float32 arrays."""
    first = values[0] if values else None
    if first is not None and hasattr(first, "convert") and hasattr(first, "size"):  # PIL
        from PIL import Image

        mode = "L" if first.mode in ("L", "1", "I", "F") else "RGB"
        arrays = []
        for image in values:
            image = image.convert(mode)
            if image_size is not None:
                image = image.resize((image_size, image_size), Image.BILINEAR)
            arrays.append(np.asarray(image, dtype=np.float32) / 255.0)
        try:
            x = np.stack(arrays)
        except ValueError:
            raise ValueError(
                f"hf_dataset: {where}: images of different sizes; set options.image_size"
            ) from None
        return x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    try:
        x = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(
            f"hf_dataset: {where}: inputs must be images, numbers or equal-length lists of numbers"
        ) from None
    return x[:, None] if x.ndim == 1 else x


def _labels(values: list, where: str) -> np.ndarray:
    y = np.asarray(values)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
        raise ValueError(f"hf_dataset: {where}: labels must be integers >= 0")
    return y.astype(np.int64)


def load_hf_dataset(
    root: str | os.PathLike[str] | None = None,
    path: str = "",
    train_split: str = "train",
    test_split: str = "test",
    feature_column: str = "image",
    label_column: str = "label",
    client_column: str | None = None,
    image_size: int | None = None,
) -> ArrayDataset:
    """A Hugging Face dataset as an `ArrayDataset` (see the module docstring).

    Inputs are standardised with the train split's mean and std per channel (images) or
    per feature (vectors). With `client_column`, each distinct value (sorted) becomes a
    natural client id (`ArrayDataset.client_ids`, `client_names`).

    Raises:
        DatasetNotFoundError: Nothing at `path`.
        ValueError: `datasets` not installed, a split or column that does not exist
            (named, with the ones that do), or values of the wrong kind.
    """
    opened = _open(path, root)
    train = _split(opened, train_split, "train_split")
    test = _split(opened, test_split, "test_split")
    x_train = _inputs(
        _column(train, feature_column, "feature_column", train_split), image_size, train_split
    )
    x_test = _inputs(
        _column(test, feature_column, "feature_column", test_split), image_size, test_split
    )
    y_train = _labels(_column(train, label_column, "label_column", train_split), train_split)
    y_test = _labels(_column(test, label_column, "label_column", test_split), test_split)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"hf_dataset: train inputs {x_train.shape[1:]} and test inputs "
            f"{x_test.shape[1:]} differ in shape"
        )
    axes = (0, 2, 3) if x_train.ndim == 4 else (0,)
    mean = x_train.mean(axis=axes, keepdims=True)
    std = x_train.std(axis=axes, keepdims=True)
    std = np.where(std > 0, std, 1.0)
    feature = train.features.get(label_column)
    num_classes = int(getattr(feature, "num_classes", 0) or 0) or int(
        max(y_train.max(initial=0), y_test.max(initial=0)) + 1
    )
    ids = ids_test = names = None
    if client_column is not None:
        raw = np.asarray(_column(train, client_column, "client_column", train_split)).astype(str)
        raw_test = (
            np.asarray(test[client_column]).astype(str)
            if client_column in test.column_names
            else None
        )
        names = sorted(set(raw) | (set(raw_test) if raw_test is not None else set()))
        index = {n: i for i, n in enumerate(names)}
        ids = np.array([index[v] for v in raw], dtype=np.int64)
        if raw_test is not None:
            ids_test = np.array([index[v] for v in raw_test], dtype=np.int64)
    return ArrayDataset(
        name="hf_dataset",
        x_train=((x_train - mean) / std).astype(np.float32),
        y_train=y_train,
        x_test=((x_test - mean) / std).astype(np.float32),
        y_test=y_test,
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in x_train.shape[1:]),
        client_ids=ids,
        client_ids_test=ids_test,
        client_names=() if names is None else tuple(names),
    )
