"""The privacy kernel: each mechanism's charge is its own parameters, its noise has the
claimed distribution, and a session hands out only declared mechanisms and counts them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.accounting.single_release import gaussian_sigma_analytic
from raydpfl.privacy.mechanisms.kernel import (
    CertifiedGaussianRelease,
    ExponentialSelection,
    GaussianRelease,
    LaplaceRelease,
    MechanismUse,
    PrivacyContractError,
    PrivacySession,
    Receipt,
    SubsampledGaussian,
    check_receipt,
    uses,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the charge is the mechanism's own parameters --------------------------------------
def test_each_mechanism_charges_exactly_its_parameters():
    assert SubsampledGaussian(1.3, 0.7, 0.05).cost(9) == PrivacyCost(1.3, 0.05, 9)
    assert GaussianRelease(2.0, 4.0).cost(1) == PrivacyCost(2.0, 1.0, 1)
    assert LaplaceRelease(3.0, 0.5).cost(2) == PrivacyCost(3.0, 1.0, 2, "laplace")
    sigma = gaussian_sigma_analytic(1.0, 0.5, 1e-5)
    assert CertifiedGaussianRelease(sigma, 2.0, 0.5, 1e-5).cost(1) == PrivacyCost(
        sigma, 1.0, 1, "approx_dp", epsilon=0.5, delta=1e-5
    )
    assert ExponentialSelection(0.25).cost(1) == PrivacyCost(8.0, 1.0, 1)
    assert uses(SubsampledGaussian(1.0, 1.0, 0.1), 5).cost == PrivacyCost(1.0, 0.1, 5)


def test_a_certified_release_refuses_a_sigma_that_does_not_deliver_its_epsilon():
    sigma = gaussian_sigma_analytic(1.0, 1.0, 1e-5)
    CertifiedGaussianRelease(sigma, 1.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="does not certify"):
        CertifiedGaussianRelease(sigma * 0.99, 1.0, 1.0, 1e-5)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: SubsampledGaussian(-1.0, 1.0, 0.1), "noise_multiplier"),
        (lambda: SubsampledGaussian(1.0, float("nan"), 0.1), "clip_norm"),
        (lambda: SubsampledGaussian(1.0, 1.0, 1.5), "sampling_rate"),
        (lambda: GaussianRelease(1.0, -2.0), "sensitivity"),
        (lambda: LaplaceRelease(0.0, 1.0), "scale_multiplier"),
        (lambda: ExponentialSelection(0.0), "epsilon"),
        (lambda: MechanismUse(SubsampledGaussian(1.0, 1.0, 0.1), -1), "count"),
        (lambda: MechanismUse(PrivacyCost(1.0, 0.1, 1), 1), "kernel's mechanism types"),  # type: ignore[arg-type]
    ],
)
def test_bad_parameters_are_refused_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


# ---- the noise has the claimed distribution ----------------------------------------------
def test_gaussian_release_noise_has_std_sigma_times_sensitivity():
    mech = GaussianRelease(1.5, 0.4)
    live = PrivacySession([uses(mech, 1)], _gen(1)).get()
    # output perturbation of a zero update: the release is its noise alone
    z = live.perturb_update({"z": torch.zeros(200_000)})["z"].double().numpy()
    assert stats.kstest(z / 0.6, "norm").pvalue > 1e-3
    assert abs(z.std() - 0.6) < 0.01


def test_laplace_release_noise_has_scale_b_times_sensitivity():
    live = PrivacySession([uses(LaplaceRelease(2.0, 0.25), 1)], _gen(2)).get()
    z = live.perturb_update({"z": torch.zeros(200_000)})["z"].double().numpy()
    assert stats.kstest(z, "laplace", args=(0.0, 0.5)).pvalue > 1e-3


def _bound(declared, gen: torch.Generator, n: int = 1000, features: int = 125):
    """A session bound, as a worker binds it, to `n` all-zero records of a bias-free
    linear model (every per-sample gradient exactly 0: a release is its noise alone)."""
    from torch import nn

    from raydpfl.privacy.mechanisms.kernel import ClientRecords
    from raydpfl.privacy.per_sample.engines import make_engine

    model = nn.Linear(features, 2, bias=False)
    records = ClientRecords(
        torch.zeros(n, features), torch.zeros(n, dtype=torch.long), torch.arange(n)
    )
    params = {"weight": torch.zeros(2, features)}
    session = PrivacySession(declared, gen)._bind(records, model, make_engine(model, "vmap"))
    return session, params


def test_subsampled_gaussian_adds_sigma_c_to_the_clipped_sum_and_samples_at_q():
    mech = SubsampledGaussian(2.0, 0.5, 0.3)
    session, params = _bound([uses(mech, 400)], _gen(3))
    live = session.dp_sgd()
    sizes, noise = [], []
    for _ in range(400):
        batch = live.sample()
        sizes.append(batch.size)
        grad, _ = live.gradient(params, batch, divisor=1.0)
        noise.append(grad["weight"].double().flatten().numpy())
    assert abs(np.mean(sizes) - 300) < 3 * math.sqrt(1000 * 0.3 * 0.7 / 400) + 1
    z = np.concatenate(noise)
    assert abs(z.std() - 1.0) < 0.01 and stats.kstest(z, "norm").pvalue > 1e-3


# ---- the session: only declared mechanisms, every invocation counted --------------------
def test_the_session_counts_invocations_into_the_receipt():
    a, b = SubsampledGaussian(1.0, 1.0, 0.5), GaussianRelease(1.0, 1.0)
    session, params = _bound([uses(a, 3), uses(b, 1)], _gen(), n=10, features=3)
    dp = session.get(a)
    for _ in range(2):
        dp.step_(params, dp.sample(), lr=0.1, divisor=5.0)
    session.get(GaussianRelease).perturb_update({"w": torch.zeros(3)})
    assert session.receipt().uses == (MechanismUse(a, 2), MechanismUse(b, 1))


def test_only_completed_invocations_count():
    """A sample released elsewhere never completes: the receipt comes back one short, and
    a second sample is refused; only an empty batch may be skipped."""
    mech = SubsampledGaussian(1.0, 1.0, 0.5)
    session, _ = _bound([uses(mech, 1)], _gen(), n=100, features=3)
    dp = session.dp_sgd()
    batch = dp.sample()
    assert batch.size > 0
    assert dp.count == 0
    with pytest.raises(PrivacyContractError, match="only an open invocation with an empty"):
        dp.skip_empty(batch)
    with pytest.raises(PrivacyContractError, match="before the previous one was released"):
        dp.sample()
    empty_session, _ = _bound([uses(SubsampledGaussian(1.0, 1.0, 0.0), 1)], _gen(), 100, 3)
    empty = empty_session.dp_sgd()
    batch = empty.sample()
    assert batch.is_empty  # q = 0: always empty
    empty.skip_empty(batch)
    assert empty.count == 1


def test_an_undeclared_mechanism_is_refused():
    session = PrivacySession([uses(SubsampledGaussian(10.0, 1.0, 0.1), 5)], _gen())
    with pytest.raises(PrivacyContractError, match="did not declare"):
        session.get(SubsampledGaussian(0.01, 1.0, 0.1))
    with pytest.raises(PrivacyContractError, match="LaplaceRelease"):
        session.get(LaplaceRelease)
    with pytest.raises(PrivacyContractError, match="exactly one"):
        PrivacySession([], _gen()).dp_sgd()


def test_a_release_needs_its_own_invocation():
    declared = [uses(SubsampledGaussian(1.0, 1.0, 0.5), 2), uses(GaussianRelease(1.0, 1.0), 1)]
    session, params = _bound(declared, _gen(), n=10, features=3)
    dp = session.dp_sgd()
    batch = dp.sample()
    dp.step_(params, batch, lr=0.1, divisor=5.0)
    with pytest.raises(PrivacyContractError, match="without its own Poisson sample"):
        dp.step_(params, batch, lr=0.1, divisor=5.0)  # a second release of one sample


def test_a_session_that_no_worker_bound_releases_nothing():
    dp = PrivacySession([uses(SubsampledGaussian(1.0, 1.0, 0.5), 1)], _gen()).dp_sgd()
    with pytest.raises(PrivacyContractError, match="not bound to a client's records"):
        dp.sample()


def test_check_receipt_refuses_any_difference_and_names_client_and_round():
    mech = SubsampledGaussian(1.0, 1.0, 0.1)
    check_receipt(3, 4, "train", (uses(mech, 5),), Receipt((uses(mech, 5),)))
    check_receipt(3, 4, "train", (), None)
    # the same mechanism in two entries is one total (the session counts on the first)
    check_receipt(3, 4, "train", (uses(mech, 3), uses(mech, 2)), Receipt((uses(mech, 5),)))
    for got in (Receipt((uses(mech, 10),)), Receipt((uses(mech, 0),)), None):
        with pytest.raises(PrivacyContractError, match=r"client 3, round 5 \(train task\)"):
            check_receipt(3, 4, "train", (uses(mech, 5),), got)


def test_opacus_largest_alpha_notice_goes_to_the_log_not_the_terminal(caplog):
    """A tiny ε (huge σ) makes opacus warn once per evaluation that the largest order was
    optimal; raydpfl logs it (INFO) instead of printing it, and ε is unchanged."""
    import logging
    import warnings

    from raydpfl.privacy.accounting.accountants import compute_epsilon

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        eps = compute_epsilon([(200.0, 0.01, 1)], 1e-5, "rdp")
    assert 0 < eps < 1
    assert not [w for w in caught if "Optimal order" in str(w.message)]
    assert any("Optimal order is the largest alpha" in r.getMessage() for r in caplog.records)
