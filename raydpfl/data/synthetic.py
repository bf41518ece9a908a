"""FedProx's Synthetic(alpha, beta) federated classification data."""

from __future__ import annotations

import numpy as np

from raydpfl.data._checks import check_int, check_nonnegative, check_rng

__all__ = ["make_synthetic", "make_synthetic_pooled"]


def make_synthetic(
    alpha: float,
    beta: float,
    num_clients: int,
    rng: np.random.Generator,
    *,
    num_features: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    min_samples: int = 50,
    max_samples: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Generates FedProx's Synthetic(alpha, beta) data, one (x, y) pair per client.

    Follows Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020),
    §5.1, and their generator. Here N(mu, s) denotes a normal with mean mu and
    *variance* s, as in the paper (the reference script passes alpha and beta as
    standard deviations instead; the two agree for the usual alpha, beta in {0, 1}).
    For each client k:

    * u_k ~ N(0, alpha), B_k ~ N(0, beta);
    * W_k in R^{C x d} and b_k in R^C with entries ~ N(u_k, 1);
    * v_k in R^d with entries ~ N(B_k, 1);
    * x ~ N(v_k, Sigma) with Sigma diagonal, Sigma_jj = j^{-1.2} (j = 1..d);
    * y = argmax(softmax(W_k x + b_k)).

    alpha controls how much the local models differ and beta how much the local
    feature distributions differ. Note that u_k shifts every class logit of a client by
    the same amount, so alpha changes no label: label skew comes from beta and, already
    at alpha = beta = 0, from the per-client W_k and v_k (as in FedProx). The number of
    samples of client k is int(lognormal(4, 2)) + min_samples, as in FedProx, then
    capped at max_samples. Randomness is drawn in a fixed order (sizes, then priors,
    then clients in turn), so equal generators give equal data.

    With `iid=True` this is FedProx's Synthetic-IID: one shared W and b with entries
    ~ N(0, 1) and x ~ N(0, Sigma) for every client; alpha and beta are then unused
    (but still validated).

    Args:
        alpha: Variance of the per-client model mean u_k; >= 0.
        beta: Variance of the per-client feature mean B_k; >= 0.
        num_clients: Number of clients; >= 1.
        rng: Source of all randomness.
        num_features: Feature dimension d; >= 1.
        num_classes: Number of classes C; >= 2.
        iid: Generate Synthetic-IID instead of Synthetic(alpha, beta).
        min_samples: Offset added to the lognormal sample count; >= 1.
        max_samples: Optional cap on samples per client; >= min_samples.

    Returns:
        A list of `num_clients` pairs (x float32 of shape (n_k, d), y int64 of shape
        (n_k,)) with labels in [0, num_classes).

    Raises:
        ValueError: If an argument is out of range.
        TypeError: If `rng` is not a `numpy.random.Generator`.
    """
    x, y, sizes = make_synthetic_pooled(
        alpha,
        beta,
        num_clients,
        rng,
        num_features=num_features,
        num_classes=num_classes,
        iid=iid,
        min_samples=min_samples,
        max_samples=max_samples,
    )
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [
        (x[offsets[k] : offsets[k + 1]], y[offsets[k] : offsets[k + 1]]) for k in range(len(sizes))
    ]


def make_synthetic_pooled(
    alpha: float,
    beta: float,
    num_clients: int,
    rng: np.random.Generator,
    *,
    num_features: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    min_samples: int = 50,
    max_samples: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`make_synthetic`'s data as one pool: ``(x, y, sizes)``, the clients' records
    concatenated in client order (client k holds rows ``sum(sizes[:k])`` onwards).

    The same draws and the same bits as `make_synthetic` (and as the per-client loop it
    was before issue 19), generated in blocks of clients without a Python step per
    client: a million clients take seconds. Arguments as for `make_synthetic`.
    """
    alpha = check_nonnegative("alpha", alpha)
    beta = check_nonnegative("beta", beta)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    num_features = check_int("num_features", num_features, 1)
    num_classes = check_int("num_classes", num_classes, 2)
    min_samples = check_int("min_samples", min_samples, 1)
    if max_samples is not None:
        max_samples = check_int("max_samples", max_samples, min_samples)
    return _generate(
        alpha, beta, num_clients, rng, num_features, num_classes, iid, min_samples, max_samples
    )


#: Standard normals drawn per block of clients (bounds the generator's working memory).
_BLOCK_NORMALS = 1 << 21
#: A row whose two largest logits (from the vectorised product) are closer than this,
#: relative to the row's |x|·|w| + |b|, has its client's labels recomputed exactly as
#: the per-client loop did (its own BLAS product): float error in a d-term dot product
#: is below d·2⁻⁵³ of that scale, so every other row's argmax cannot differ.
_TIE_MARGIN = 1e-9


def _approx_logits(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x·wᵀ + b and |x|·|w|ᵀ + |b| for rows of x, one feature at a time (no BLAS call,
    whose threads only contend for so thin a product). Rounding may differ from the
    loop's BLAS product: rows near a tie are recomputed (see `_TIE_MARGIN`)."""
    logits = np.repeat(b[None, :], len(x), axis=0)
    for j in range(x.shape[1]):
        logits += x[:, j, None] * w[None, :, j]
    # A bound on every class's |x|·|w_c| + |b_c| (coarser is only more cautious).
    scale = np.abs(x).sum(axis=1, keepdims=True) * np.abs(w).max() + np.abs(b).max()
    return logits, scale


def _generate(
    alpha: float,
    beta: float,
    num_clients: int,
    rng: np.random.Generator,
    num_features: int,
    num_classes: int,
    iid: bool,
    min_samples: int,
    max_samples: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The generator, vectorised over clients (see `make_synthetic`).

    The per-client loop drew, for client k in turn, W_k (C·d normals), b_k (C), v_k (d)
    and its n_k·d feature normals (only the features when iid). `Generator.normal(m, 1)`
    is m + a standard normal, and consecutive draws concatenate, so one standard-normal
    draw per block of clients, cut at the same places, gives every value bit for bit.
    """
    d, c = num_features, num_classes
    sizes = rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    # Diagonal covariance, so sampling x is v + sqrt(diag) * z rather than a full
    # multivariate_normal (same distribution, far cheaper).
    x_scale = np.arange(1, d + 1, dtype=np.float64) ** (-1.2 / 2.0)
    if iid:
        w_shared = rng.normal(0.0, 1.0, size=(c, d))
        b_shared = rng.normal(0.0, 1.0, size=c)
        head = 0  # normals drawn per client before its features
    else:
        u = rng.normal(0.0, np.sqrt(alpha), size=num_clients)
        big_b = rng.normal(0.0, np.sqrt(beta), size=num_clients)
        head = c * d + c + d
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    x_out = np.empty((int(offsets[-1]), d), dtype=np.float32)
    y_out = np.empty(int(offsets[-1]), dtype=np.int64)
    per_client = head + sizes * d  # normals each client consumes
    k0 = 0
    while k0 < num_clients:
        # the block: as many clients as fit in _BLOCK_NORMALS (at least one)
        cum = np.cumsum(per_client[k0:])
        k1 = k0 + max(1, int(np.searchsorted(cum, _BLOCK_NORMALS, side="right")))
        n = sizes[k0:k1]
        z = rng.standard_normal(size=int(cum[k1 - k0 - 1]))
        base = np.concatenate([[0], cum[: k1 - k0 - 1]])  # each client's first normal
        rows = int(n.sum())
        row_client = np.repeat(np.arange(k1 - k0), n)  # block-local client of each row
        row_in_client = np.arange(rows) - np.repeat(offsets[k0:k1] - offsets[k0], n)
        if iid:  # no per-client draws before the features: they are the whole block
            zx = z.reshape(rows, d)
        else:
            feat = base[row_client] + head + row_in_client * d
            zx = z[feat[:, None] + np.arange(d)]
        if iid:
            w = b = None
            x = np.zeros(d) + x_scale * zx
            logits, scale = _approx_logits(x, w_shared, b_shared)
        else:
            uk = u[k0:k1]
            w = z[base[:, None] + np.arange(c * d)].reshape(-1, c, d) + uk[:, None, None]
            b = z[base[:, None] + c * d + np.arange(c)] + uk[:, None]
            v = z[base[:, None] + c * d + c + np.arange(d)] + big_b[k0:k1, None]
            x = v[row_client] + x_scale * zx
            logits = np.empty((rows, c))
            scale = np.empty((rows, c))
            step = max(1, _BLOCK_NORMALS // (c * d))
            for r in range(0, rows, step):
                wr, br, xr = (
                    w[row_client[r : r + step]],
                    b[row_client[r : r + step]],
                    x[r : r + step],
                )
                logits[r : r + step] = np.einsum("nd,ncd->nc", xr, wr) + br
                scale[r : r + step] = np.einsum("nd,ncd->nc", np.abs(xr), np.abs(wr)) + np.abs(br)
        # argmax of softmax equals argmax of the logits; softmax would only add overflow.
        y = np.argmax(logits, axis=1)
        if c > 1:
            top2 = np.partition(logits, c - 2, axis=1)[:, c - 2 :]
            near = (top2[:, 1] - top2[:, 0]) <= _TIE_MARGIN * scale.max(axis=1)
            near |= ~np.isfinite(top2).all(axis=1)  # never trust a non-finite row
            for k in np.unique(row_client[near]):
                lo, hi = offsets[k0 + k] - offsets[k0], offsets[k0 + k + 1] - offsets[k0]
                wk, bk = (w_shared, b_shared) if iid else (w[k], b[k])
                y[lo:hi] = np.argmax(x[lo:hi] @ wk.T + bk, axis=1)
        x_out[offsets[k0] : offsets[k1]] = x  # cast to float32 in place, as astype does
        y_out[offsets[k0] : offsets[k1]] = y
        k0 = k1
    return x_out, y_out, sizes
