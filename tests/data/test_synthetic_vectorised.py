"""The vectorised Synthetic(α, β) generator gives the per-client loop's bits (issue 19)."""

from __future__ import annotations

import numpy as np
import pytest

import raydpfl.data.synthetic as synthetic
from raydpfl.data import make_synthetic
from raydpfl.data.synthetic import make_synthetic_pooled


def loop_reference(
    alpha,
    beta,
    num_clients,
    rng,
    *,
    num_features=60,
    num_classes=10,
    iid=False,
    min_samples=50,
    max_samples=None,
):
    """The generator as it was before issue 19: one Python step per client."""
    sizes = rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    x_scale = np.arange(1, num_features + 1, dtype=np.float64) ** (-1.2 / 2.0)
    if iid:
        w_shared = rng.normal(0.0, 1.0, size=(num_classes, num_features))
        b_shared = rng.normal(0.0, 1.0, size=num_classes)
    else:
        u = rng.normal(0.0, np.sqrt(alpha), size=num_clients)
        big_b = rng.normal(0.0, np.sqrt(beta), size=num_clients)
    clients = []
    for k in range(num_clients):
        if iid:
            w, b, v = w_shared, b_shared, np.zeros(num_features)
        else:
            w = rng.normal(u[k], 1.0, size=(num_classes, num_features))
            b = rng.normal(u[k], 1.0, size=num_classes)
            v = rng.normal(big_b[k], 1.0, size=num_features)
        x = v + x_scale * rng.standard_normal(size=(int(sizes[k]), num_features))
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        clients.append((x.astype(np.float32), y))
    return clients


CASES = [
    dict(alpha=0.5, beta=0.5, num_clients=30, min_samples=40, max_samples=300),
    dict(
        alpha=1.0,
        beta=0.0,
        num_clients=200,
        num_features=7,
        num_classes=3,
        min_samples=2,
        max_samples=9,
    ),
    dict(
        alpha=0.0,
        beta=0.0,
        num_clients=500,
        iid=True,
        num_features=16,
        num_classes=4,
        min_samples=2,
        max_samples=4,
    ),
    dict(alpha=1.0, beta=1.0, num_clients=5, num_classes=2, min_samples=1),
]


@pytest.mark.parametrize("block", [None, 97])
@pytest.mark.parametrize("margin", [None, 0.0, 1e9])
@pytest.mark.parametrize("case", CASES)
def test_bits_equal_the_per_client_loop(case, margin, block, monkeypatch):
    # block: many small blocks (and clients larger than a block); margin 0 trusts every
    # vectorised argmax, 1e9 recomputes every client's labels the loop's way.
    if block is not None:
        monkeypatch.setattr(synthetic, "_BLOCK_NORMALS", block)
    if margin is not None:
        monkeypatch.setattr(synthetic, "_TIE_MARGIN", margin)
    ref = loop_reference(rng=np.random.default_rng(11), **case)
    rng = np.random.default_rng(11)
    got = make_synthetic(rng=rng, **case)
    assert len(got) == len(ref)
    for (gx, gy), (rx, ry) in zip(got, ref, strict=True):
        assert gx.dtype == rx.dtype and gy.dtype == ry.dtype
        assert gx.tobytes() == rx.tobytes() and gy.tobytes() == ry.tobytes()
    # The generator is left where the loop left it.
    tail = np.random.default_rng(11)
    loop_reference(rng=tail, **case)
    assert rng.standard_normal() == tail.standard_normal()


def test_pooled_is_the_concatenation():
    case = CASES[1]
    x, y, sizes = make_synthetic_pooled(rng=np.random.default_rng(3), **case)
    ref = loop_reference(rng=np.random.default_rng(3), **case)
    assert sizes.tolist() == [len(r[1]) for r in ref]
    assert x.tobytes() == np.concatenate([r[0] for r in ref]).tobytes()
    assert y.tobytes() == np.concatenate([r[1] for r in ref]).tobytes()


def test_a_wrong_cut_would_be_seen():
    """Negative control: the comparison sees a stream consumed in another order."""
    case = CASES[0]
    ref = loop_reference(rng=np.random.default_rng(11), **case)
    rng = np.random.default_rng(11)
    rng.standard_normal()  # one draw out of step
    got = make_synthetic(rng=rng, **case)
    assert any(g[0].tobytes() != r[0].tobytes() for g, r in zip(got, ref, strict=True))
