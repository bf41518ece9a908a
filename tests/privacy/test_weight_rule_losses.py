"""Loss-aware weight rules: both engines hand the rule the per-sample losses (FedFDP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.papers.fedfdp.theory import fair_clip_weights
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping
from raydpfl.privacy.per_sample.dpsgd import (
    LossWeightRule,
    PerSampleGradients,
    clip_weights,
    needs_losses,
    per_sample_norms,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 4 * 4, 5),
        nn.ReLU(),
        nn.Linear(5, 4),
    )


def _batch(n: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 4, (n,), generator=g)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_plain_rules_are_not_given_losses():
    assert not needs_losses(lambda norms: norms)
    assert needs_losses(LossWeightRule(lambda norms, losses: norms))


def test_both_engines_pass_the_per_sample_losses_of_the_same_forward_pass():
    model = _model()
    params, (x, y) = _params(model), _batch()
    expected = F.cross_entropy(model(x), y, reduction="none").detach()
    for engine in (
        PerSampleGradients(model, max_chunk=4),
        BookkeepingClipping(model, max_chunk=4),
    ):
        seen: list[torch.Tensor] = []

        def rule(norms: torch.Tensor, losses: torch.Tensor, seen=seen) -> torch.Tensor:
            seen.append(losses)
            return torch.ones_like(norms)

        engine.clipped_sum(params, x, y, LossWeightRule(rule))
        torch.testing.assert_close(torch.cat(seen), expected, rtol=1e-5, atol=1e-6)


def test_plain_path_is_bit_identical_and_a_loss_rule_ignoring_losses_agrees():
    model = _model()
    params, (x, y) = _params(model), _batch()
    for engine in (PerSampleGradients(model), BookkeepingClipping(model)):
        a, _ = engine.clipped_sum(params, x, y, lambda n: clip_weights(n, 0.5))
        b, _ = engine.clipped_sum(params, x, y, lambda n: clip_weights(n, 0.5))
        c, _ = engine.clipped_sum(params, x, y, LossWeightRule(lambda n, _l: clip_weights(n, 0.5)))
        for k in a:
            assert torch.equal(a[k], b[k])
            torch.testing.assert_close(a[k], c[k], rtol=1e-5, atol=1e-7)


def test_engines_agree_on_the_fair_clipped_sum_and_every_summand_is_within_c():
    model = _model()
    params, (x, y) = _params(model), _batch(12)
    clip = 0.05
    rule = LossWeightRule(lambda n, loss: fair_clip_weights(n, loss, 2.0, 3.0, clip))
    s1, _ = PerSampleGradients(model).clipped_sum(params, x, y, rule)
    s2, _ = BookkeepingClipping(model).clipped_sum(params, x, y, rule)
    for k in s1:
        torch.testing.assert_close(s1[k], s2[k], rtol=1e-4, atol=1e-6)
    # λ = 3 with F = 2 makes some fairness factors negative; still ‖c_j g_j‖ ≤ C.
    engine = PerSampleGradients(model)
    grads, losses = engine._per_sample_grad_and_loss(params, x, y)
    weights = fair_clip_weights(per_sample_norms(grads), losses, 2.0, 3.0, clip)
    assert (1 + 3.0 * (losses - 2.0) < 0).any()
    scaled = {k: g * weights.view(-1, *[1] * (g.dim() - 1)) for k, g in grads.items()}
    assert (per_sample_norms(scaled) <= clip).all()
