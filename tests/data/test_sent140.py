"""LEAF's Sent140 in its real JSON layout: words to ids from the train split's vocabulary,
users as natural clients, bad files named, and a token model trained on it with DP-SGD."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raydpfl.data.readers import SENT140_PAD, SENT140_UNKNOWN, load_sent140

TWEETS = {
    "alice": (["I love this sunny day", "so happy today :)", "love love it"], [1, 1, 1]),
    "bob": (["this is terrible", "I hate rainy days", "so sad"], [0, 0, 0]),
}


def _row(i: int, user: str, text: str) -> list:
    """LEAF's Sent140 x: [tweet id, date, query, user, text]."""
    return [str(1000 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text]


def _write(root: Path, tweets: dict = TWEETS) -> None:
    for split in ("train", "test"):
        users = {
            u: {"x": [_row(i, u, t) for i, t in enumerate(x)], "y": y}
            for u, (x, y) in tweets.items()
        }
        doc = {
            "users": list(users),
            "num_samples": [len(v["y"]) for v in users.values()],
            "user_data": users,
        }
        (root / "sent140" / "data" / split).mkdir(parents=True)
        (root / "sent140" / "data" / split / "all_data.json").write_text(json.dumps(doc))


def test_words_become_ids_of_the_train_vocabulary_and_users_become_clients(tmp_path):
    _write(tmp_path)
    ds = load_sent140(tmp_path, vocab_size=6, max_length=5)
    assert ds.input_shape == (5,) and ds.num_classes == 2 and ds.x_train.dtype == np.int64
    # vocabulary of 6: pad 0, unknown 1, then "love" (3 uses), then "i", "this", "so" (2
    # uses each, in order of first appearance); "sunny", "day", "sad" are unknown
    assert ds.x_train[0].tolist() == [3, 2, 4, SENT140_UNKNOWN, SENT140_UNKNOWN]
    assert ds.x_train[2].tolist() == [2, 2, SENT140_UNKNOWN, SENT140_PAD, SENT140_PAD]
    assert ds.x_train[5].tolist() == [5, SENT140_UNKNOWN] + [SENT140_PAD] * 3  # "so sad"
    assert ds.client_names == ("alice", "bob")
    assert ds.client_ids.tolist() == [0, 0, 0, 1, 1, 1] and ds.y_train.tolist() == [
        1,
        1,
        1,
        0,
        0,
        0,
    ]


def test_bad_sent140_files_name_the_file_and_field(tmp_path):
    _write(tmp_path, {"carol": ([42], [1])})
    with pytest.raises(
        ValueError, match=r"all_data.json: user_data\['carol'\]\['x'\] must hold tweets"
    ):
        load_sent140(tmp_path)
    with pytest.raises(ValueError, match="vocab_size"):
        load_sent140(tmp_path, vocab_size=2)


def test_a_token_model_trains_on_sent140_with_dp_sgd_by_user(tmp_path):
    import raydpfl

    _write(tmp_path)
    result = raydpfl.run_simulation(
        {
            "experiment": {
                "data": {
                    "dataset": "sent140",
                    "root": str(tmp_path),
                    "num_clients": 2,
                    "partition": {"kind": "natural", "min_samples_per_client": 1},
                    "client_test_fraction": 0.0,
                    "options": {"vocab_size": 50, "max_length": 8},
                },
                "model": {
                    "name": "char_transformer",
                    "options": {"vocab_size": 50, "width": 16, "layers": 1},
                },
                "algorithm": {
                    "name": "dp_fedavg",
                    "rounds": 2,
                    "clients_per_round": 2,
                    "local_steps": 2,
                },
                "privacy": {
                    "epsilon": 50.0,
                    "delta": 1e-3,
                    "noise_multiplier": 1.0,
                    "sampling_rate": 0.5,
                },
            },
            "runtime": {"backend": "local", "seed": 0, "progress": False},
        }
    )
    assert result.summary["rounds_completed"] == 2
    assert 0 < result.summary["epsilon_max"] <= 50.0
