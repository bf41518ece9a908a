"""`IndexTable`: per-client index arrays as one CSR table (issue 19)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from raydpfl.data.federated import IndexTable, synthetic_federated


def test_reads_like_a_tuple_of_arrays():
    arrays = [np.array([0, 3], dtype=np.int64), np.zeros(0, dtype=np.int64), np.array([5])]
    table = IndexTable.from_arrays(arrays)
    assert len(table) == 3
    for got, want in zip(table, arrays, strict=True):
        assert got.dtype == np.int64 and got.tolist() == want.tolist()
    assert table[-1].tolist() == [5] and [a.tolist() for a in table[0:2]] == [[0, 3], []]
    assert table.sizes().tolist() == [2, 0, 1]
    assert not table[0].flags.writeable  # views of the shared table are never written
    with pytest.raises(IndexError):
        table[3]
    back = pickle.loads(pickle.dumps(table, protocol=5))
    assert isinstance(back, IndexTable) and [a.tolist() for a in back] == [
        a.tolist() for a in arrays
    ]


@pytest.mark.parametrize(
    "offsets, indices",
    [([1, 2], [0, 1]), ([0, 2, 1], [0]), ([0, 3], [0, 1]), ([0.0, 1.0], [0])],
)
def test_rejects_a_malformed_table(offsets, indices):
    with pytest.raises(ValueError):
        IndexTable(np.asarray(offsets), np.asarray(indices, dtype=np.int64))


@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_synthetic_population_is_what_the_per_client_split_gave(fraction):
    """With nothing held out, the table is each client's own rows; with a test share,
    the per-client split (tuples) is kept."""
    kw = dict(
        alpha=0.0,
        beta=0.0,
        num_clients=300,
        iid=True,
        num_features=4,
        num_classes=3,
        min_samples=2,
        max_samples=5,
        client_test_fraction=fraction,
    )
    ds = synthetic_federated(rng=np.random.default_rng(0), **kw)
    sizes = ds.train_sizes() + np.array([len(t) for t in ds.client_test])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    if fraction == 0:
        assert isinstance(ds.client_train, IndexTable)
        for k, idx in enumerate(ds.client_train):
            assert idx.tolist() == list(range(offsets[k], offsets[k + 1]))
        assert all(len(t) == 0 for t in ds.client_test) and len(ds.x_test) == 0
    else:
        assert isinstance(ds.client_train, tuple)
        for k in range(ds.num_clients):
            both = sorted([*ds.client_train[k].tolist(), *ds.client_test[k].tolist()])
            assert both == list(range(offsets[k], offsets[k + 1]))
