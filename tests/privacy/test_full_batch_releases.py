"""The platform's un-subsampled releases (`LiveRelease.mean_clipped_gradient`,
`perturb_update`, `LiveSelection.most_accurate`): what they compute equals a ground-truth
loop, the declared sensitivity is checked against the bound of what is computed, and the
client half's code cannot mix records or noise anything else."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.func import functional_call

from raydpfl.privacy.mechanisms.kernel import (
    AFTER_STEP_LOSS_NOTE,
    ClientRecords,
    ExponentialSelection,
    GaussianRelease,
    LaplaceRelease,
    PrivacyContractError,
    PrivacySession,
    uses,
)
from raydpfl.privacy.per_sample.engines import make_engine


def _records(n: int, features: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g) * 3.0
    y = torch.randint(0, 3, (n,), generator=g)
    return x, y


def _session(mechanism, n: int = 12, features: int = 4, seed: int = 1):
    model = nn.Linear(features, 3)
    torch.manual_seed(0)
    model.reset_parameters()
    x, y = _records(n, features)
    records = ClientRecords(x, y, torch.arange(n))
    session = PrivacySession([uses(mechanism, 1)], torch.Generator().manual_seed(seed))
    session._bind(records, model, make_engine(model, "vmap"))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return session, model, params, x, y


def _loss(model):
    def loss(params, const, x, y):
        return nn.functional.cross_entropy(functional_call(model, {**params, **const}, (x,)), y)

    return loss


def _ground_truth(model, params, x, y, clip: float, order: int, scale: float):
    """One backward pass per record, clipped in `order`, averaged, times `scale`."""
    total = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(x.shape[0]):
        leaves = {k: p.clone().requires_grad_(True) for k, p in params.items()}
        out = functional_call(model, leaves, (x[i : i + 1],))
        grads = torch.autograd.grad(
            nn.functional.cross_entropy(out, y[i : i + 1]), list(leaves.values())
        )
        flat = torch.cat([g.reshape(-1) for g in grads])
        norm = float(flat.abs().sum() if order == 1 else flat.norm())
        factor = min(1.0, clip / (norm + 1e-12))
        for k, g in zip(leaves, grads, strict=True):
            total[k] += factor * g
    return {k: scale * t / x.shape[0] for k, t in total.items()}


@pytest.mark.parametrize("n", [1, 5, 12])
@pytest.mark.parametrize("order", [1, 2])
def test_the_mean_clipped_gradient_equals_a_per_record_loop(n, order):
    clip, lr = 0.3, 0.5
    session, model, params, x, y = _session(GaussianRelease(0.0, 2 * lr * clip / n), n=n)
    out = session.get().mean_clipped_gradient(
        params, _loss(model), clip_norm=clip, scale=lr, norm=order
    )
    expected = _ground_truth(model, params, x, y, clip, order, lr)
    for k in expected:
        torch.testing.assert_close(out.update[k], expected[k], rtol=1e-5, atol=1e-7)
    assert session.receipt().uses[0].count == 1


def test_a_loss_that_mixes_records_still_sees_one_record_at_a_time():
    """A loss centring the batch would leak every record into each term; the platform
    calls it on batches of one, so it contributes nothing beyond one record's gradient."""
    n, clip = 8, 10.0
    session, model, params, x, y = _session(GaussianRelease(0.0, 2 * clip / n), n=n)

    def mixing(params, const, xb, yb):
        out = functional_call(model, params, (xb - xb.mean(0, keepdim=True),))
        return nn.functional.cross_entropy(out, yb)

    out = session.get().mean_clipped_gradient(params, mixing, clip_norm=clip)
    zero_input = _ground_truth(model, params, torch.zeros_like(x), y, clip, 2, 1.0)
    for k in zero_input:  # each record centred on itself is the zero input
        torch.testing.assert_close(out.update[k], zero_input[k], rtol=1e-5, atol=1e-7)


def test_a_declared_sensitivity_below_the_computed_bound_is_refused():
    n, clip, lr = 10, 1.0, 0.1
    session, model, params, *_ = _session(GaussianRelease(1.0, 0.5 * 2 * lr * clip / n), n=n)
    refusal = r"sensitivity 0\.02 .*above the declared 0\.01"
    with pytest.raises(PrivacyContractError, match=refusal):
        session.get().mean_clipped_gradient(params, _loss(model), clip_norm=clip, scale=lr)
    assert session.receipt().uses[0].count == 0
    # the loss reports are coordinates of the same vector: Θ/n each
    ok = 2 * lr * clip / n
    session, model, params, *_ = _session(GaussianRelease(1.0, ok), n=n)
    with pytest.raises(PrivacyContractError, match="above the declared"):
        session.get().mean_clipped_gradient(
            params, _loss(model), clip_norm=clip, scale=lr, loss_bound=1.0,
            loss_reports=("start",),
        )  # fmt: skip


def test_laplace_noise_needs_an_l1_clip():
    session, model, params, *_ = _session(LaplaceRelease(1.0, 1.0))
    with pytest.raises(PrivacyContractError, match="Laplace noise needs an L1 bound"):
        session.get().mean_clipped_gradient(params, _loss(model), clip_norm=0.1, norm=2)


def test_loss_reports_are_clamped_means_and_the_after_step_point_is_listed():
    n, clip, lr, bound = 12, 0.4, 0.7, 1.5
    sens = lr * (2 * clip + 2 * bound) / n
    session, model, params, x, y = _session(GaussianRelease(0.0, sens), n=n)
    out = session.get().mean_clipped_gradient(
        params, _loss(model), clip_norm=clip, scale=lr, loss_bound=bound,
        loss_reports=("start", "after_step"),
    )  # fmt: skip
    step = _ground_truth(model, params, x, y, clip, 2, lr)

    def clamped(at):
        with torch.no_grad():
            losses = nn.functional.cross_entropy(
                functional_call(model, at, (x,)), y, reduction="none"
            )
        return float(losses.clamp(0, bound).mean())

    after = {k: params[k] - step[k] for k in params}
    assert out.losses[0] == pytest.approx(lr * clamped(params), rel=1e-5)
    assert out.losses[1] == pytest.approx(lr * clamped(after), rel=1e-5)
    assert AFTER_STEP_LOSS_NOTE in session.receipt().notes


def test_an_unbound_release_refuses_the_full_batch_step():
    live = PrivacySession([uses(GaussianRelease(1.0, 1.0), 1)], torch.Generator()).get()
    model = nn.Linear(2, 2)
    params = dict(model.named_parameters())
    with pytest.raises(PrivacyContractError, match="not bound to a client's records"):
        live.mean_clipped_gradient(params, _loss(model), clip_norm=1.0)


@pytest.mark.parametrize("mechanism", [GaussianRelease(0.0, 0.8), LaplaceRelease(1e-12, 0.8)])
def test_output_perturbation_clips_to_half_the_sensitivity(mechanism):
    live = PrivacySession([uses(mechanism, 1)], torch.Generator().manual_seed(0)).get()
    update = {"a": torch.full((3,), 4.0), "b": torch.full((2,), -4.0)}
    out = live.perturb_update(update)
    assert out is update  # in place: the worker checks the upload is these tensors
    flat = torch.cat([t.reshape(-1) for t in out.values()])
    order = 1 if isinstance(mechanism, LaplaceRelease) else 2
    assert float(flat.norm(p=order)) == pytest.approx(0.4, rel=1e-5)
    small = {"a": torch.full((2,), 0.01)}
    again = PrivacySession([uses(mechanism, 1)], torch.Generator()).get().perturb_update(small)
    torch.testing.assert_close(again["a"], torch.full((2,), 0.01), atol=1e-9, rtol=0)


def test_output_perturbation_noise_has_std_sigma_times_sensitivity():
    live = PrivacySession(
        [uses(GaussianRelease(2.0, 0.25), 1)], torch.Generator().manual_seed(4)
    ).get()
    z = live.perturb_update({"z": torch.zeros(100_000)})["z"].double().numpy()
    assert stats.kstest(z / 0.5, "norm").pvalue > 1e-3


def _selection_session(eps: float, n: int = 200, seed: int = 0):
    model = nn.Linear(4, 3)
    x, y = _records(n)
    records = ClientRecords(x, y, torch.arange(n))
    session = PrivacySession(
        [uses(ExponentialSelection(eps), 1)], torch.Generator().manual_seed(seed)
    )
    session._bind(records, model, make_engine(model, "vmap"))
    return session, model, x, y


def _candidates(model, x, y):
    """Three candidate models of different accuracy: zeros, the model's own, negated."""
    base = {k: v.detach().clone() for k, v in model.named_parameters()}
    worse = {k: torch.zeros_like(v) for k, v in base.items()}
    return [worse, base, {k: -v for k, v in base.items()}]


def test_selection_picks_the_most_accurate_candidate_at_a_large_epsilon():
    session, model, x, y = _selection_session(1e6)
    cands = _candidates(model, x, y)
    with torch.no_grad():
        accs = [
            float((functional_call(model, c, (x,)).argmax(1) == y).float().mean()) for c in cands
        ]
    assert session.get().most_accurate(cands) == int(np.argmax(accs))
    assert session.receipt().uses[0].count == 1


def test_selection_at_a_tiny_epsilon_is_close_to_uniform():
    picks = []
    for seed in range(300):
        session, model, x, y = _selection_session(1e-6, seed=seed)
        picks.append(session.get().most_accurate(_candidates(model, x, y)))
    counts = np.bincount(picks, minlength=3)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_selection_needs_two_records():
    session, model, x, y = _selection_session(1.0, n=1)
    with pytest.raises(PrivacyContractError, match=">= 2 records"):
        session.get().most_accurate(_candidates(model, x, y))
