"""Bring-your-own-data readers (issue 22): CIFAR-100 binary, LEAF JSON, image folders.

Every fixture is written in the real on-disk format under tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from raydpfl import registry
from raydpfl.config.load import config_from_dict
from raydpfl.config.schema import ConfigError
from raydpfl.data import federate, load_femnist, load_shakespeare, read_leaf_json
from raydpfl.data.datasets import DATASET_MD5, DatasetNotFoundError
from raydpfl.data.readers import (
    SHAKESPEARE_LETTERS,
    download_cifar100,
    load_cifar100,
    load_image_folder,
    read_cifar100_binary,
)

# --------------------------------------------------------------------------- CIFAR-100


def _cifar100_bytes(n: int, seed: int) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 20, n, dtype=np.uint8)
    fine = rng.integers(0, 100, n, dtype=np.uint8)
    pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    records = np.concatenate([coarse[:, None], fine[:, None], pixels], axis=1)
    return records.tobytes(), coarse, fine, pixels


def _write_cifar100(directory: Path, n_train: int = 12, n_test: int = 5) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        data, coarse, fine, pixels = _cifar100_bytes(n, seed)
        (directory / f"{split}.bin").write_bytes(data)
        out[split] = (coarse, fine, pixels)
    return out


def test_cifar100_record_layout_fine_and_coarse(tmp_path: Path) -> None:
    data, coarse, fine, pixels = _cifar100_bytes(7, 0)
    (tmp_path / "train.bin").write_bytes(data)

    x, y_fine = read_cifar100_binary(tmp_path / "train.bin")
    _, y_coarse = read_cifar100_binary(tmp_path / "train.bin", labels="coarse")

    assert x.shape == (7, 3, 32, 32) and x.dtype == np.uint8
    np.testing.assert_array_equal(x.reshape(7, -1), pixels)  # R, G, B planes, row-major
    np.testing.assert_array_equal(y_fine, fine.astype(np.int64))
    np.testing.assert_array_equal(y_coarse, coarse.astype(np.int64))


def test_cifar100_is_found_in_its_extracted_folder_and_standardised(tmp_path: Path) -> None:
    written = _write_cifar100(tmp_path / "cifar100" / "cifar-100-binary")

    fine = load_cifar100(tmp_path)
    coarse = load_cifar100(tmp_path, labels="coarse")

    assert (fine.num_classes, coarse.num_classes) == (100, 20)
    assert fine.x_train.shape == (12, 3, 32, 32) and fine.x_train.dtype == np.float32
    assert fine.x_test.shape == (5, 3, 32, 32)
    np.testing.assert_array_equal(coarse.y_test, written["test"][0])
    red = written["train"][2][0, 0] / 255.0
    assert fine.x_train[0, 0, 0, 0] == pytest.approx((red - 0.5071) / 0.2673, rel=1e-5)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x00" * (3074 * 2 - 1), "not a positive multiple of the 3074-byte"),
        (b"\x00" * 3073 * 2, "3074-byte"),  # CIFAR-10's 3073-byte records
        (b"", "not a positive multiple"),
        (bytes([20, 0]) + b"\x00" * 3072, "coarse label 20 outside 0..19"),
        (bytes([0, 100]) + b"\x00" * 3072, "fine label 100 outside 0..99"),
    ],
)
def test_cifar100_bad_files_name_the_file(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes(payload)

    with pytest.raises(ValueError, match=message) as info:
        read_cifar100_binary(path)
    assert str(path) in str(info.value)


def test_cifar100_missing_files_say_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="raydpfl data download cifar100"):
        load_cifar100(tmp_path)


def test_cifar100_download_checks_the_md5_and_extracts(tmp_path: Path, monkeypatch) -> None:
    """The download path without a network: the fetch is served from a local tarball."""
    assert DATASET_MD5["cifar100"] == {
        "cifar-100-binary.tar.gz": "03b5dce01913d631647c71ecec9e9cb8"
    }
    src = tmp_path / "src"
    _write_cifar100(src / "cifar-100-binary", 3, 2)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        archive.add(src / "cifar-100-binary", arcname="cifar-100-binary")
    blob = buf.getvalue()
    monkeypatch.setitem(
        DATASET_MD5["cifar100"], "cifar-100-binary.tar.gz", hashlib.md5(blob).hexdigest()
    )

    class _Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    requested = []

    def fake_urlopen(url, timeout):
        requested.append(url)
        return _Response(blob)

    monkeypatch.setattr("urllib.request.urlopen", fake_urlopen)
    dest = download_cifar100(tmp_path / "data")

    assert requested == ["https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz"]
    assert load_cifar100(tmp_path / "data").x_train.shape == (3, 3, 32, 32)
    assert dest == tmp_path / "data" / "cifar100"


def test_cli_download_cifar100_offline_says_what_to_place_where(tmp_path, capsys, monkeypatch):
    import urllib.error

    from raydpfl.cli.main import main

    def offline(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    code = main(["data", "download", "cifar100", "--root", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0
    assert "cifar-100-binary.tar.gz" in err and "network" in err


# --------------------------------------------------------------------------- LEAF


def _leaf_doc(users: dict[str, tuple[list, list]]) -> dict:
    return {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }


def _femnist_users(rng: np.random.Generator, names: list[str], n: int) -> dict:
    return {
        u: (rng.random((n + i, 784)).round(3).tolist(), rng.integers(0, 62, n + i).tolist())
        for i, u in enumerate(names)
    }


def _write_femnist(root: Path) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("test", 1)):
        d = root / "femnist" / "data" / split
        d.mkdir(parents=True)
        (d / f"all_data_0_niid_{split}.json").write_text(
            json.dumps(_leaf_doc(_femnist_users(rng, ["f0001_02", "f0000_14"], n)))
        )
        (d / f"all_data_1_niid_{split}.json").write_text(
            json.dumps(_leaf_doc(_femnist_users(rng, ["f0100_41"], n)))
        )


def test_femnist_reads_leaf_json_with_writers_as_client_ids(tmp_path: Path) -> None:
    _write_femnist(tmp_path)

    ds = load_femnist(tmp_path)

    assert ds.name == "femnist" and ds.num_classes == 62 and ds.input_shape == (1, 28, 28)
    assert ds.client_names == ("f0000_14", "f0001_02", "f0100_41")  # sorted writers
    # file order, then each file's `users` order: f0001_02 (4), f0000_14 (5), f0100_41 (4)
    assert ds.client_ids.tolist() == [1] * 4 + [0] * 5 + [2] * 4
    assert ds.client_ids_test.tolist() == [1] * 1 + [0] * 2 + [2] * 1
    assert ds.x_train.shape == (13, 1, 28, 28) and ds.x_train.dtype == np.float32
    first = json.loads((tmp_path / "femnist/data/train/all_data_0_niid_train.json").read_text())[
        "user_data"
    ]["f0001_02"]
    np.testing.assert_allclose(ds.x_train[0].ravel(), first["x"][0], rtol=1e-6)
    assert ds.y_train[:4].tolist() == first["y"]


def test_femnist_natural_partition_gives_one_client_per_writer(tmp_path: Path) -> None:
    _write_femnist(tmp_path)
    ds = load_femnist(tmp_path)

    fed = federate(
        ds,
        num_clients=3,
        partition="natural",
        rng=np.random.default_rng(0),
        client_test_fraction=0.0,
    )

    sizes = sorted(len(p) for p in fed.client_train)
    assert sizes == [4, 4, 5]
    for part in fed.client_train:
        assert len(np.unique(ds.client_ids[part])) == 1
    # each client is named by its writer, the one whose records it holds
    assert fed.client_names == ("f0000_14", "f0001_02", "f0100_41")
    for name, part in zip(fed.client_names, fed.client_train, strict=True):
        assert {ds.client_names[i] for i in ds.client_ids[part]} == {name}


def test_natural_client_names_reach_clients_parquet(tmp_path: Path) -> None:
    """A run on a natural partition says which writer each client_id is."""
    import pyarrow.parquet as pq

    from raydpfl.api import run_simulation
    from tests.conftest import small_config

    _write_femnist(tmp_path)
    fed = federate(
        load_femnist(tmp_path),
        num_clients=3,
        partition="natural",
        rng=np.random.default_rng(0),
        client_test_fraction=0.0,
    )
    config = small_config(
        experiment__algorithm={
            "name": "fedavg",
            "rounds": 1,
            "clients_per_round": 3,
            "local_steps": 1,
            "batch_size": 2,
        },  # fmt: skip
        experiment__model={"name": "mlp"},
    )
    run_simulation(config, dataset=fed, run_dir=tmp_path / "run")
    table = pq.read_table(tmp_path / "run" / "clients.parquet").to_pandas()
    assert dict(zip(table["client_id"], table["client_name"], strict=True)) == dict(
        enumerate(fed.client_names)
    )
    plain = run_simulation(config, run_dir=tmp_path / "plain")  # no natural names: no column
    assert "client_name" not in pq.read_table(tmp_path / "plain" / "clients.parquet").column_names
    del plain


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"users": ["a"], "user_data": {"a": {"x": [[0.1', "not valid LEAF JSON"),
        ('{"users": ["a"], "num_samples": [1]}', "missing field 'user_data'"),
        ('{"user_data": {}}', "missing field 'users'"),
        ("[1, 2]", "a LEAF file is a JSON object"),
        ('{"users": ["a"], "user_data": {}}', "user 'a' is listed in 'users' but not"),
        ('{"users": ["a"], "user_data": {"a": {"x": [1], "y": []}}}', "equal length"),
        (
            '{"users": ["a"], "num_samples": [3], "user_data": {"a": {"x": [], "y": []}}}',
            r"num_samples\[0\] = 3",
        ),
    ],
)
def test_bad_leaf_files_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)

    with pytest.raises(ValueError, match=message) as info:
        read_leaf_json(path)
    assert str(path) in str(info.value)


def test_femnist_wrong_image_size_or_label_names_the_user(tmp_path: Path) -> None:
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
    (tmp_path / "test" / "t.json").write_text(json.dumps(_leaf_doc({"u": ([[0.0] * 784], [1])})))
    bad = tmp_path / "train" / "t.json"
    bad.write_text(json.dumps(_leaf_doc({"u": ([[0.0] * 783], [1])})))
    with pytest.raises(ValueError, match=r"user_data\['u'\]\['x'\] must hold lists of 784"):
        load_femnist(tmp_path)
    bad.write_text(json.dumps(_leaf_doc({"u": ([[0.0] * 784], [62])})))
    with pytest.raises(ValueError, match=r"label 62, outside 0\.\.61"):
        load_femnist(tmp_path)


def test_leaf_missing_folders_name_what_was_searched(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="train/ and test/ folders of LEAF"):
        load_femnist(tmp_path)


def test_shakespeare_tokens_use_leafs_80_character_vocabulary(tmp_path: Path) -> None:
    assert len(SHAKESPEARE_LETTERS) == 80
    line = "To be, or not to be: that is the question.\n" * 2
    x = [line[i : i + 80] for i in range(3)]
    y = [line[80], line[81], line[82]]
    for split in ("train", "test"):
        (tmp_path / "shakespeare" / split).mkdir(parents=True)
        doc = _leaf_doc({"THE_TRAGEDY_OF_HAMLET_HAMLET": (x, y), "KING_LEAR_LEAR": (x[:1], y[:1])})
        (tmp_path / "shakespeare" / split / "s.json").write_text(json.dumps(doc))

    ds = load_shakespeare(tmp_path)

    assert ds.num_classes == 80 and ds.input_shape == (80,) and ds.x_train.dtype == np.int64
    assert "".join(SHAKESPEARE_LETTERS[t] for t in ds.x_train[1]) == x[1]
    assert [SHAKESPEARE_LETTERS[t] for t in ds.y_train[:3]] == y
    assert ds.client_ids.tolist() == [1, 1, 1, 0]  # KING_LEAR_LEAR sorts first
    bad = _leaf_doc({"u": (["é" * 80], ["a"])})
    (tmp_path / "shakespeare" / "train" / "s.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="outside LEAF's 80-character"):
        load_shakespeare(tmp_path)


# --------------------------------------------------------------------------- image folders


def _png(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (10, 6)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_image_folder_sorted_classes_resized_and_split(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    for i in range(5):
        _png(tmp_path / "imgs" / "zebra" / f"{i}.png", (250, 250, 250))
        _png(tmp_path / "imgs" / "ant" / f"{i}.jpg", (10, 10, 10), (7, 9))

    ds = load_image_folder(tmp_path / "imgs", size=8, test_fraction=0.2)

    assert ds.num_classes == 2 and ds.input_shape == (3, 8, 8)
    assert (len(ds.y_train), len(ds.y_test)) == (8, 2)
    assert sorted(ds.y_test.tolist()) == [0, 1]  # stratified: one of each class
    ants = ds.x_train[ds.y_train == 0]
    zebras = ds.x_train[ds.y_train == 1]
    assert (ants < 0).all() and (zebras > 0).all()  # "ant" (dark) is label 0
    gray = load_image_folder(tmp_path / "imgs", size=4, grayscale=True)
    assert gray.input_shape == (1, 4, 4)


def test_image_folder_train_test_folders_and_bad_images(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    for split in ("train", "test"):
        for cls, color in (("cat", (200, 0, 0)), ("dog", (0, 0, 200))):
            _png(tmp_path / split / cls / "a.png", color)
    ds = load_image_folder(tmp_path, size=4)
    assert (len(ds.y_train), len(ds.y_test)) == (2, 2)

    (tmp_path / "train" / "dog" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"broken\.png: not a readable image"):
        load_image_folder(tmp_path, size=4)
    (tmp_path / "train" / "dog" / "broken.png").unlink()
    (tmp_path / "test" / "bird").mkdir()
    _png(tmp_path / "test" / "bird" / "b.png", (1, 2, 3))
    with pytest.raises(ValueError, match="class 'bird' is not a class of"):
        load_image_folder(tmp_path, size=4)
    with pytest.raises(DatasetNotFoundError, match="no folder"):
        load_image_folder(tmp_path / "nowhere")


# --------------------------------------------------------------------------- config and registry


def test_readers_are_in_the_one_registry_with_options() -> None:
    for name in ("cifar100", "femnist", "shakespeare", "image_folder"):
        assert registry.is_registered("dataset", name)
    assert registry.get("dataset", "cifar100").load() is load_cifar100


def _data_config(tmp_path: Path, **data) -> dict:
    return {
        "experiment": {
            "data": {"root": str(tmp_path), **data},
            "algorithm": {"clients_per_round": 1},
        },
        "runtime": {"seed": 3},
    }


def test_a_config_loads_femnist_natural_and_cifar100_coarse(tmp_path: Path) -> None:
    from raydpfl.experiment.build import load_federated

    _write_femnist(tmp_path)
    cfg = config_from_dict(
        _data_config(tmp_path, dataset="femnist", num_clients=2, partition={"kind": "natural"})
    )
    fed = load_federated(cfg.experiment.data, cfg.runtime.seed)
    assert fed.num_clients == 2 and fed.num_classes == 62

    _write_cifar100(tmp_path / "cifar100", 40, 4)
    cfg = config_from_dict(
        _data_config(
            tmp_path,
            dataset="cifar100",
            num_clients=4,
            options={"labels": "coarse"},
            partition={"kind": "k_classes", "classes_per_client": 2},
        )
    )
    fed = load_federated(cfg.experiment.data, cfg.runtime.seed)
    assert fed.num_classes == 20 and fed.num_clients == 4


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    from raydpfl.experiment.build import load_federated, preflight

    with pytest.raises(ConfigError, match="labels: must be one of fine, coarse"):
        preflight(
            config_from_dict(
                _data_config(tmp_path, dataset="cifar100", options={"labels": "medium"})
            )
        )
    cfg = config_from_dict(_data_config(tmp_path, dataset="digits", partition={"kind": "natural"}))
    with pytest.raises(ConfigError, match="partition 'natural' needs a dataset with natural"):
        load_federated(cfg.experiment.data, cfg.runtime.seed)
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    (tmp_path / "train" / "a.json").write_text('{"users": []')
    (tmp_path / "test" / "a.json").write_text('{"users": []')
    cfg = config_from_dict(_data_config(tmp_path, dataset="femnist"))
    with pytest.raises(ConfigError, match=r"experiment.data: .*a.json: not valid LEAF JSON"):
        load_federated(cfg.experiment.data, cfg.runtime.seed)
