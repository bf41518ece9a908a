"""DP-SGD primitives: Poisson sampling, per-sample norms, clipping weights, noise.

One DP-SGD step on a client's records D (Abadi et al. 2016; design.md §4) is

    B      ~ Poisson(q):  each record in D independently with probability q
    g_i    = ∇ℓ(w; x_i)                               for i in B
    a_i    = min(1, C / ‖g_i‖₂)                        (flat clipping over all layers)
    s      = Σ_{i∈B} a_i g_i + N(0, σ²C² I)
    update = s / (q·|D|)                                (the *expected* batch size)

Under add/remove-one-record adjacency the sum Σ a_i g_i has L2 sensitivity C, so the
step is the Poisson-subsampled Gaussian mechanism with noise multiplier σ and rate q,
which is what `raydpfl.privacy.accounting.ledger` accounts for.

We divide by the expected batch size q·|D| rather than the realised |B|: the realised
size is data-dependent and would need its own privacy analysis (and is 0 for an empty
batch). An empty batch is a normal outcome of Poisson sampling: the step still adds
noise, still counts, and is still charged — never resampled (opacus #161).

The step is three stages — per-sample norms → per-sample weights → weighted gradient
sum — then noise. Clipping is one weight rule (`clip_weights`); other rules (e.g.
FedFDP's fair clipping) plug in at the weight stage without another training loop.
Two engines implement the stages (chosen by `raydpfl.privacy.per_sample.engines.make_engine`):
`PerSampleGradients` materialises per-sample gradients with torch.func;
`bookkeeping.BookkeepingClipping` gets the norms from layer inputs and output gradients
and never forms most per-sample gradients. Both give the same sum up to float error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, vmap

from raydpfl.privacy.noise import counter_noise, secure_noise

Params = dict[str, torch.Tensor]


class LossWeightRule:
    """A weight rule that also sees each sample's loss: ``fn(norms, losses) -> weights``.

    FedFDP's fair clipping (Eq. 13 of the FedFDP paper) scales each sample by
    1 + λ(ℓ_j − F) before clipping, so it needs the per-sample losses ℓ_j at the same
    parameters as the norms. Engines call a rule with ``needs_losses = True`` as
    ``rule(norms, losses)`` and every other rule as ``rule(norms)`` (unchanged path).
    The rule must still keep every ‖a_j g_j‖ ≤ C for the step to be DP.
    """

    needs_losses = True

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn

    def __call__(self, norms: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        return self.fn(norms, losses)


WeightRule = Callable[[torch.Tensor], torch.Tensor] | LossWeightRule


def needs_losses(rule: object) -> bool:
    """Whether `rule` is called with per-sample losses as well as norms."""
    return bool(getattr(rule, "needs_losses", False))


#: Guards the division in min(1, C/‖g‖); same constant as opacus. With it every clipped
#: norm is strictly below C.
CLIP_EPS = 1e-6


def poisson_sample(
    num_records: int, sampling_rate: float, generator: torch.Generator
) -> torch.Tensor:
    """Draws a Poisson sample: each record independently with probability `sampling_rate`.

    Args:
        num_records: |D|, the number of records to sample from.
        sampling_rate: q in [0, 1].
        generator: The client's RNG stream for this round.

    Returns:
        The sorted int64 indices of the sampled records (possibly empty).
    """
    if not 0.0 <= sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in [0, 1], got {sampling_rate}")
    mask = uniform_draws(num_records, generator) < sampling_rate
    return mask.nonzero().flatten()


def truncate_sample(
    positions: torch.Tensor, max_batch_size: int, generator: torch.Generator
) -> torch.Tensor:
    """Truncates a Poisson sample to at most `max_batch_size` records: when more were
    drawn, a uniformly random subset of exactly `max_batch_size` of them (without
    replacement), as dp-accounting's ``TruncatedSubsampledGaussianDpEvent`` assumes
    (Poisson sampling, "truncate the resulting sample to size truncated_batch_size by
    sampling a random subset"). A sample at or under the cap is returned as it is and
    draws nothing, so the stream is consumed exactly as by `poisson_sample` alone until
    a sample is truncated.

    The subset comes from `generator` (``torch.randperm``: every subset equally likely),
    or from `os.urandom` for a secure-noise stream (the order of 53-bit uniforms).

    Returns:
        The sorted positions kept (a subset of `positions`, sorted as they are).
    """
    count = int(positions.numel())
    if count <= max_batch_size:
        return positions
    if secure_noise.is_secure(generator):
        order = secure_noise.uniform(count).argsort().to(positions.device)
    else:
        order = torch.randperm(count, generator=generator, device=generator.device)
        order = order.to(positions.device)
    return positions[order[:max_batch_size].sort().values]


def uniform_draws(n: int, generator: torch.Generator) -> torch.Tensor:
    """`n` uniforms on [0, 1) on the generator's device: the draw behind every Poisson
    sample. From `generator` (``torch.rand``), or from `os.urandom` for a
    `secure_noise.SecureGenerator` (secure-noise mode)."""
    if secure_noise.is_secure(generator):
        return secure_noise.uniform(n).to(generator.device)
    return torch.rand(n, generator=generator, device=generator.device)


def per_sample_norms(per_sample_grads: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """‖g_i‖₂ over all parameters together (flat clipping), one value per sample."""
    squares = [g.flatten(1).pow(2).sum(1) for g in per_sample_grads.values()]
    return torch.stack(squares, dim=0).sum(0).sqrt()


def clip_weights(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Per-sample clipping weights a_i = min(1, C / (‖g_i‖ + 1e-6)), so ‖a_i g_i‖ < C."""
    return (clip_norm / (norms + CLIP_EPS)).clamp(max=1.0)


def weighted_sum(per_sample_grads: Mapping[str, torch.Tensor], weights: torch.Tensor) -> Params:
    """Σ_i a_i g_i for each parameter tensor."""
    return {
        name: torch.tensordot(weights.to(g.dtype), g, dims=([0], [0]))
        for name, g in per_sample_grads.items()
    }


def standard_normal_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One N(0, 1) draw per entry of `t` (its shape, device and dtype) from `generator`:
    the draw behind every Gaussian noise of a DP-SGD step, so all of them consume a
    client's stream alike. A `secure_noise.SecureGenerator` draws from `os.urandom`
    instead (secure-noise mode), a `counter_noise.CounterNoiseGenerator` from its
    sampler (``privacy.noise_sampler``)."""
    if secure_noise.is_secure(generator):
        return secure_noise.gaussian(t.shape, 1.0, t.dtype, t.device)
    if counter_noise.is_counter_noise(generator):  # privacy.noise_sampler: ziggurat, boxmuller
        return counter_noise.normal(t.shape, 1.0, generator, t.dtype)
    return torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)


def gaussian_like(t: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²) per entry of `t` (its shape, device and dtype) from `generator`.

    The same draws as ``std * standard_normal_like(t, generator)`` (torch scales inside
    its Gaussian kernel, so the product costs no pass of its own) and the generator
    ends in the same state (tested). Secure-noise mode: see `fill_gaussian_`."""
    return fill_gaussian_(
        torch.empty_like(t, memory_format=torch.contiguous_format), std, generator
    )


def fill_gaussian_(out: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Fills `out` with N(0, std²) draws in place and returns it: ``normal_`` from
    `generator`, or, for a `secure_noise.SecureGenerator`, `os.urandom` Gaussians (each
    the sum of 4 draws, scaled in float64; `raydpfl.privacy.noise.secure_noise`), or, for a
    `counter_noise.CounterNoiseGenerator`, its sampler's (``privacy.noise_sampler``)."""
    if secure_noise.is_secure(generator):
        return out.copy_(secure_noise.gaussian(out.shape, std, out.dtype, out.device))
    if counter_noise.is_counter_noise(generator):  # ziggurat, boxmuller: one stream draw
        return counter_noise.fill_normal_(out, std, generator)
    return out.normal_(0.0, std, generator=generator)


def add_gaussian_noise(tensors: Params, std: float, generator: torch.Generator) -> Params:
    """Adds i.i.d. N(0, std²) noise to every entry, in place, and returns `tensors`.

    Tensors are visited in their (insertion) order so the draw is reproducible.
    """
    if std < 0:
        raise ValueError(f"noise std must be >= 0, got {std}")
    if std == 0:
        return tensors
    for t in tensors.values():
        t.add_(standard_normal_like(t, generator), alpha=std)
    return tensors


@dataclass(frozen=True)
class StepStats:
    """What one DP-SGD step observed (kept on the client; not released)."""

    batch_size: int
    clipped_fraction: float
    mean_norm: float

    @classmethod
    def of(cls, batch_size: int, clipped: int, norm_sum: float) -> StepStats:
        """From counts: samples, samples whose weight was < 1, sum of their norms."""
        return cls(
            batch_size=batch_size,
            clipped_fraction=clipped / batch_size if batch_size else 0.0,
            mean_norm=norm_sum / batch_size if batch_size else 0.0,
        )


class ClippedSumEngine(Protocol):
    """Computes Σ_i a_i ∇ℓ_i with a_i = weight_rule(‖∇ℓ_i‖) for a resident model."""

    def clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        *,
        into: Params | None = None,
    ) -> tuple[Params, StepStats]:
        """The weighted per-sample gradient sum and the step's statistics.

        With `into` (one tensor per parameter, same names and shapes) the sum is added
        to those tensors in place and they are returned: an engine may fold the addition
        into its own products (a GEMM that accumulates) instead of forming the sum first.
        """
        ...


def record_loss(
    model: nn.Module, buffers: Mapping[str, torch.Tensor]
) -> Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]:
    """ℓ(params; x, y): the cross-entropy of one record (x, y) under `model` run
    functionally with `params` and `buffers` (the function `grad` and `vmap` take)."""

    def sample_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    return sample_loss


class PerSampleGradients:
    """Materialised per-sample gradients with `torch.func` (vmap of grad).

    The model is used functionally: parameters are passed in, never read from the
    module, so one resident model serves any number of clients. Large batches are
    processed in chunks of `max_chunk` samples; the weighted sum is exact either way
    because norms and weights are per sample.
    """

    def __init__(self, model: nn.Module, max_chunk: int = 256) -> None:
        self.model = model
        self.max_chunk = max_chunk
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        sample_loss = record_loss(model, self.buffers)
        self._per_sample_grad = vmap(grad(sample_loss), in_dims=(None, 0, 0))
        # Only for loss-aware rules, so the plain path stays bit-identical.
        self._per_sample_grad_and_loss = vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0))

    def grads(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> Params:
        """Per-sample gradients {name: (B, *shape)}."""
        return self._per_sample_grad(params, x, y)

    def clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        *,
        into: Params | None = None,
    ) -> tuple[Params, StepStats]:
        """Σ_i a_i g_i with a_i = weight_rule(‖g_i‖), plus step statistics.

        A `LossWeightRule` gets a_i = weight_rule(‖g_i‖, ℓ_i) instead. An empty batch
        gives zero tensors shaped like `params` (or `into` unchanged). With `into` the
        sum is added to those tensors in place (see `ClippedSumEngine`).
        """
        total = into if into is not None else {n: torch.zeros_like(p) for n, p in params.items()}
        n, clipped, norm_sum = x.shape[0], 0, 0.0
        with_losses = needs_losses(weight_rule)
        for start in range(0, n, self.max_chunk):
            xb, yb = x[start : start + self.max_chunk], y[start : start + self.max_chunk]
            if with_losses:
                grads, losses = self._per_sample_grad_and_loss(params, xb, yb)
                norms = per_sample_norms(grads)
                weights = weight_rule(norms, losses.detach())  # type: ignore[call-arg]
            else:
                grads = self.grads(params, xb, yb)
                norms = per_sample_norms(grads)
                weights = weight_rule(norms)  # type: ignore[call-arg]
            for name, part in weighted_sum(grads, weights).items():
                total[name].add_(part)
            clipped += int((weights < 1.0).sum())
            norm_sum += float(norms.sum())
        return total, StepStats.of(n, clipped, norm_sum)


def dp_sgd_gradient(
    engine: ClippedSumEngine,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
    weight_rule: WeightRule | None = None,
    check_bound: bool = True,
) -> tuple[Params, StepStats]:
    """The privatised gradient (Σ a_i g_i + N(0, σ²C²I)) / (q·|D|) of one DP-SGD step.

    Args:
        engine: Computes per-sample gradients for the resident model.
        params: Current parameters (not modified).
        x, y: The Poisson-sampled batch (may be empty).
        clip_norm: C > 0, the per-sample L2 bound; the sum's sensitivity.
        noise_multiplier: σ ≥ 0; the noise std is σ·C.
        expected_batch_size: q·|D| > 0, the fixed denominator.
        generator: The client's RNG stream; the noise is drawn from it.
        weight_rule: Maps per-sample norms to weights; must keep every ‖a_i g_i‖ ≤ C.
            Defaults to flat clipping at C.
    """
    rule = _checked_rule(
        clip_norm, noise_multiplier, expected_batch_size, weight_rule, check_bound
    )
    summed, stats = engine.clipped_sum(params, x, y, rule)
    add_gaussian_noise(summed, noise_multiplier * clip_norm, generator)
    for t in summed.values():
        t.div_(expected_batch_size)
    return summed, stats


def dp_sgd_step_(
    engine: ClippedSumEngine,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
    weight_rule: WeightRule | None = None,
    check_bound: bool = True,
) -> StepStats:
    """One DP-SGD step in place: params ← params − lr · `dp_sgd_gradient(...)`.

    The same clipped sum and the same noise draws (one draw per tensor, in parameter
    order, from `generator`: `gaussian_like`), applied as p ← p − (lr/B)·(z + s) with
    z ~ N(0, σ²C²I): equal to subtracting the privatised gradient up to float rounding.
    The noise is drawn first and the engine adds the clipped sum s into it
    (`ClippedSumEngine.clipped_sum(into=...)`), inside its weight-gradient products
    where it can, so the noisy sum costs no pass of its own and the update is one pass
    per tensor. The privacy argument is unchanged: the update is a post-processing of
    Σ a_i g_i + N(0, σ²C²I). The engine does not draw from `generator`, so drawing the
    noise before the sum leaves every draw where `dp_sgd_gradient` makes it.

    With a sampler that adds in place (``privacy.noise_sampler: boxmuller``) and the
    book-keeping engine, no noise tensor is formed at all (`_fuses_update`): the step's
    seeds are drawn first, in the same order, the engine adds −(lr/B)·s into the
    parameters inside its products and the sampler adds −(lr/B)·z into them in its own
    pass, p ← (p − (lr/B)·s) − (lr/B)·z: the same values up to float rounding, two
    passes over each parameter instead of five (the noise tensor's write, the sum
    into it, the update), ~0.2 ms of a FedAvgCNN step on one core. For a batch of at
    most `LOW_RANK_MAX_BATCH` the Linear weights take one pass: the engine leaves their
    sums as factors (G, A) and the sampler adds (p − (lr/B)·GᵀA) − (lr/B)·z value by
    value (``add_low_rank``), ~0.2 ms less at W2's batch of ~3.
    """
    rule = _checked_rule(
        clip_norm, noise_multiplier, expected_batch_size, weight_rule, check_bound
    )
    std = noise_multiplier * clip_norm
    scale = lr / expected_batch_size
    if std > 0 and _fuses_update(engine, x, generator):
        # No noise tensor: the seeds are drawn first (the draws the unfused path makes,
        # in the same order), the engine adds −(lr/B)·s into the parameters inside its
        # products, and the sampler adds −(lr/B)·σC·z into them in its own pass.
        seeds = [counter_noise.draw_seed(generator) for _ in params]
        # A small batch's Linear weight sums come back as factors, added with the noise
        # in one pass over the weight (`_low_rank_pays`).
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        low_rank = {"low_rank": factors} if _low_rank_pays(x, generator) else {}
        _, stats = engine.clipped_sum(params, x, y, rule, into=params, scale=-scale, **low_rank)  # type: ignore[call-arg]
        for (name, p), seed in zip(params.items(), seeds, strict=True):
            counter_noise.add_normal_(p, -scale * std, generator, seed, factors.get(name))  # type: ignore[arg-type]
        return stats
    noise = {n: gaussian_like(p, std, generator) for n, p in params.items()} if std > 0 else None
    summed, stats = engine.clipped_sum(params, x, y, rule, into=noise)
    for name, s in summed.items():  # the engine returns the caller's parameter order
        params[name].add_(s, alpha=-scale)
    return stats


def _fuses_update(engine: ClippedSumEngine, x: torch.Tensor, generator: torch.Generator) -> bool:
    """Whether `dp_sgd_step_` may skip the noise tensor: a counter-based sampler with an
    ``add`` kernel (``privacy.noise_sampler: boxmuller``), and an engine that can add a
    scaled sum of this batch into the parameters themselves (the book-keeping engine's
    `adds_into_params`; a wrapped engine, e.g. an audit's, takes the noise tensor as
    before)."""
    if not counter_noise.is_counter_noise(generator):
        return False
    if type(generator).add is None:  # type: ignore[attr-defined]
        return False
    adds_into_params = getattr(engine, "adds_into_params", None)
    return adds_into_params is not None and bool(adds_into_params(int(x.shape[0])))


#: The largest batch whose Linear weight sums `dp_sgd_step_` adds together with the noise
#: (the sampler's ``add_low_rank``: B products per weight value inside the noise pass)
#: rather than by a GEMM first. FedAvgCNN steps on one core (`benchmarks/dp_step.py`,
#: medians): 0.29 ms less at B = 2, 0.21 at 3, 0.09 at 4, 0.01 at 6, where the B
#: products per value cost what the GEMM's extra pass over the 2 MiB weight saves.
LOW_RANK_MAX_BATCH = 5


def _low_rank_pays(x: torch.Tensor, generator: torch.Generator) -> bool:
    """Whether `dp_sgd_step_`'s fused update takes Linear weight sums as factors: a batch
    of at most `LOW_RANK_MAX_BATCH` and a sampler with an ``add_low_rank`` kernel."""
    kernel = getattr(type(generator), "add_low_rank", None)
    return kernel is not None and 0 < int(x.shape[0]) <= LOW_RANK_MAX_BATCH


def _checked_rule(
    clip_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    weight_rule: WeightRule | None,
    check_bound: bool = True,
) -> WeightRule:
    """The argument checks of one DP-SGD step and its weight rule (flat clipping at C
    unless a `weight_rule` is given), shared by `dp_sgd_gradient` and `dp_sgd_step_`.
    A weight rule's every contribution is checked against C unless `check_bound` is
    False (the platform passes False only under the run-level unbounded setting, which
    it lists as an unaccounted release)."""
    if clip_norm <= 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if expected_batch_size <= 0:
        raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
    if noise_multiplier * clip_norm < 0:
        raise ValueError(f"noise std must be >= 0, got {noise_multiplier * clip_norm}")
    if weight_rule is not None:
        return BoundedWeightRule(weight_rule, clip_norm, check=check_bound)
    return lambda norms: clip_weights(norms, clip_norm)


class SensitivityError(ValueError):
    """A weight rule let one sample contribute more than the clip norm C: the noise was
    calibrated (and the ledger charged) for sensitivity C, so the step is refused."""


class BoundedWeightRule:
    """A caller's weight rule, checked at every step against the bound the accountant
    assumes: each contribution ‖a_i g_i‖ = |a_i|·‖g_i‖ finite and ≤ C.

    The built-in clipping rule keeps this by construction; a rule from an algorithm (e.g.
    FedFDP's fair clipping, or a registered algorithm's own) is checked here, where the
    norms and weights are already computed: a handful of vector operations per step
    against the per-sample gradients' cost.
    """

    #: Relative float slack on C (the rules compute min(1, C/‖g‖) in float32).
    TOLERANCE = 1e-5

    def __init__(self, rule: WeightRule, clip_norm: float, *, check: bool = True) -> None:
        self.rule = rule
        self.clip_norm = float(clip_norm)
        self.needs_losses = needs_losses(rule)
        self._check = bool(check)

    def __call__(self, norms: torch.Tensor, losses: torch.Tensor | None = None) -> torch.Tensor:
        rule: Any = self.rule
        weights = rule(norms, losses) if self.needs_losses else rule(norms)
        self.check(weights, norms)
        return weights

    def check(self, weights: torch.Tensor, norms: torch.Tensor) -> None:
        """Raises `SensitivityError` if any sample's contribution breaks the bound.

        Nothing on the rule can turn the check off: only the platform, under the run-level
        setting for a run that opted out of DP (FedFDP's ``clip_mode: paper``), builds
        this object with ``check=False``, and then lists the run as unbounded.
        """
        if weights.numel() == 0 or not self._check:
            return
        contribution = weights.abs() * norms  # ‖a_i g_i‖, whatever a_i's sign
        limit = self.clip_norm * (1.0 + self.TOLERANCE)
        bad = ~torch.isfinite(contribution) | (contribution > limit)
        if bool(bad.any()):
            worst = float(contribution.nan_to_num(nan=float("inf")).max())
            name = getattr(self.rule, "__qualname__", type(self.rule).__name__)
            raise SensitivityError(
                f"weight rule {name}: a sample contributes ‖a_i g_i‖ = {worst:.6g}, above "
                f"the clip norm C = {self.clip_norm:g} that the noise and the ledger assume; "
                "the step is refused"
            )
