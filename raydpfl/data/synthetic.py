"""FedProx's Synthetic(alpha, beta) federated classification data."""

from __future__ import annotations

import numpy as np

from raydpfl.data._checks import check_int, check_nonnegative, check_rng

__all__ = ["make_synthetic"]


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
    alpha = check_nonnegative("alpha", alpha)
    beta = check_nonnegative("beta", beta)
    num_clients = check_int("num_clients", num_clients, 1)
    check_rng(rng)
    num_features = check_int("num_features", num_features, 1)
    num_classes = check_int("num_classes", num_classes, 2)
    min_samples = check_int("min_samples", min_samples, 1)
    if max_samples is not None:
        max_samples = check_int("max_samples", max_samples, min_samples)

    sizes = rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)

    # Diagonal covariance, so sampling x is v + sqrt(diag) * z rather than a full
    # multivariate_normal (same distribution, far cheaper).
    x_scale = np.arange(1, num_features + 1, dtype=np.float64) ** (-1.2 / 2.0)

    if iid:
        w_shared = rng.normal(0.0, 1.0, size=(num_classes, num_features))
        b_shared = rng.normal(0.0, 1.0, size=num_classes)
    else:
        u = rng.normal(0.0, np.sqrt(alpha), size=num_clients)
        big_b = rng.normal(0.0, np.sqrt(beta), size=num_clients)

    clients: list[tuple[np.ndarray, np.ndarray]] = []
    for k in range(num_clients):
        if iid:
            w, b, v = w_shared, b_shared, np.zeros(num_features)
        else:
            w = rng.normal(u[k], 1.0, size=(num_classes, num_features))
            b = rng.normal(u[k], 1.0, size=num_classes)
            v = rng.normal(big_b[k], 1.0, size=num_features)
        x = v + x_scale * rng.standard_normal(size=(int(sizes[k]), num_features))
        # argmax of softmax equals argmax of the logits; softmax would only add overflow.
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        clients.append((x.astype(np.float32), y))
    return clients
