"""`hf_dataset`: Hugging Face datasets read offline (a save_to_disk folder, a parquet
builder over data.root), images and vectors, a client-id column feeding the natural
partition, and bad input named before any training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from raydpfl.config import ConfigError  # noqa: E402
from raydpfl.config.load import config_from_dict  # noqa: E402
from raydpfl.data.hf import load_hf_dataset  # noqa: E402
from raydpfl.experiment.build import load_federated  # noqa: E402


def _vectors(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "features": rng.normal(size=(n, 6)).round(4).tolist(),
        "label": rng.integers(0, 3, n).tolist(),
        "user": [f"writer_{i % 4}" for i in range(n)],
    }


def _save_vectors(path: Path) -> Path:
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(_vectors(40, 0)),
            "test": datasets.Dataset.from_dict(_vectors(12, 1)),
        }
    )
    dd.save_to_disk(str(path))
    return path


def _save_images(path: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(2)

    def split(n):
        images = [
            Image.fromarray(rng.integers(0, 255, (9, 7, 3), dtype=np.uint8)) for _ in range(n)
        ]
        features = datasets.Features(
            {"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c", "d"])}
        )
        return datasets.Dataset.from_dict(
            {"img": images, "label": rng.integers(0, 4, n).tolist()}, features=features
        )

    datasets.DatasetDict({"train": split(10), "test": split(4)}).save_to_disk(str(path))
    return path


def test_vectors_labels_and_natural_ids_from_a_save_to_disk_folder(tmp_path):
    folder = _save_vectors(tmp_path / "vec")
    ds = load_hf_dataset(None, str(folder), feature_column="features", client_column="user")
    raw = _vectors(40, 0)
    assert ds.x_train.shape == (40, 6) and ds.input_shape == (6,)
    assert ds.y_train.tolist() == raw["label"] and ds.num_classes == 3
    np.testing.assert_allclose(ds.x_train.mean(axis=0), 0, atol=1e-5)  # standardised
    assert ds.client_names == ("writer_0", "writer_1", "writer_2", "writer_3")
    assert ds.client_ids.tolist() == [i % 4 for i in range(40)]
    assert ds.client_ids_test.tolist() == [i % 4 for i in range(12)]


def test_images_are_channels_first_resized_and_classes_come_from_classlabel(tmp_path):
    folder = _save_images(tmp_path / "img")
    ds = load_hf_dataset(None, str(folder), feature_column="img", image_size=8)
    assert ds.x_train.shape == (10, 3, 8, 8) and ds.x_test.shape == (4, 3, 8, 8)
    assert ds.num_classes == 4  # from the ClassLabel feature, not the labels seen


def test_a_parquet_builder_over_data_root(tmp_path):
    for split, seed, n in (("train", 0, 30), ("test", 1, 9)):
        datasets.Dataset.from_dict(_vectors(n, seed)).to_parquet(
            str(tmp_path / f"{split}.parquet")
        )
    ds = load_hf_dataset(tmp_path, "parquet", feature_column="features")
    assert ds.x_train.shape == (30, 6) and ds.x_test.shape == (9, 6)


def test_a_config_partitions_an_hf_dataset_by_its_client_column(tmp_path):
    _save_vectors(tmp_path / "vec")
    config = config_from_dict(
        {
            "experiment": {
                "data": {
                    "dataset": "hf_dataset",
                    "root": str(tmp_path),
                    "num_clients": 4,
                    "partition": {"kind": "natural"},
                    "options": {
                        "path": "vec",
                        "feature_column": "features",
                        "client_column": "user",
                    },
                },
                "algorithm": {"clients_per_round": 2},
            }
        }
    )
    fed = load_federated(config.experiment.data, 0)
    assert fed.num_clients == 4
    for train, test in zip(fed.client_train, fed.client_test, strict=True):
        rows = np.concatenate([train, test])
        # each client's records are one writer's (ids i % 4 in the pool's first 40 rows)
        assert len({int(r) % 4 for r in rows}) == 1


@pytest.mark.parametrize(
    "options,message",
    [
        ({"client_column": "writer"}, "options.client_column: no column 'writer'"),
        ({"label_column": "y"}, "options.label_column: no column 'y'"),
        ({"test_split": "validation"}, "options.test_split: no split 'validation'"),
    ],
)
def test_a_missing_column_or_split_is_named_with_the_ones_that_exist(tmp_path, options, message):
    folder = _save_vectors(tmp_path / "vec")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as err:
        load_hf_dataset(None, str(folder), feature_column="features", **options)
    assert "columns:" in str(err.value) or "splits:" in str(err.value)


def test_bad_options_and_missing_folders_are_refused(tmp_path):
    from raydpfl.experiment.build import preflight

    bad = config_from_dict({"experiment": {"data": {"dataset": "hf_dataset", "options": {}}}})
    with pytest.raises(ConfigError) as err:  # checked before any data is loaded
        preflight(bad)
    assert err.value.field.startswith("experiment.data.options") and "path" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="save_to_disk"):
        load_hf_dataset(None, str(tmp_path / "empty"))


def test_reading_keeps_hugging_faces_progress_bars_off_the_terminal_and_restores_them(tmp_path):
    import datasets

    folder = _save_vectors(tmp_path / "vec")
    seen = []
    real = datasets.load_from_disk

    def spy(*args, **kwargs):
        seen.append(datasets.is_progress_bar_enabled())
        return real(*args, **kwargs)

    datasets.enable_progress_bars()
    try:
        import unittest.mock

        with unittest.mock.patch.object(datasets, "load_from_disk", spy):
            load_hf_dataset(None, str(folder), feature_column="features")
        assert seen == [False]  # off while raydpfl reads
        assert datasets.is_progress_bar_enabled()  # the user's setting is back
    finally:
        datasets.enable_progress_bars()
