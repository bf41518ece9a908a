"""Per-sample clipping without materialising every per-sample gradient ("book-keeping").

For a layer y = f(a; θ) the per-sample gradient of Σ_i ℓ_i with respect to θ is a
function of the layer's input a_i and of the gradient of the loss at its output,
g_i = ∂ℓ_i/∂y_i. One forward pass records every (a_i, g_i) pair and one backward pass
to the layer *outputs* (no weight gradients) fills in the g_i. From them:

1. per-sample norms ‖∇θ ℓ_i‖ are computed layer by layer, without forming the
   per-sample gradients where a cheaper identity exists (below);
2. the weights a_i = weight_rule(‖∇ℓ_i‖) (clipping: min(1, C/‖∇ℓ_i‖)) are applied to
   the g_i, and each layer's weighted gradient Σ_i a_i ∇θ ℓ_i is formed with one
   ordinary weight-gradient product.

This is the book-keeping method of Bu et al., "Differentially Private Optimization on
Large Model at Small Cost" (ICML 2023), with the ghost norm of Goodfellow (2015) and
Li et al. (2022) for the layers where it is cheaper. The cost is a forward pass, one
input-gradient backward pass and one weight-gradient pass: what non-private training
pays, plus the norms.

Layer rules (B samples; a layer with T positions has A_i ∈ R^{T×p}, G_i ∈ R^{T×q}):

- Linear on (B, p):  ∇W_i = g_i a_iᵀ  ⇒  ‖∇W_i‖² = ‖g_i‖²·‖a_i‖²;  ∇b_i = g_i.
- Linear on (B, T, p), Conv2d (A_i = unfolded input patches, p = C_in·k_h·k_w,
  T = output positions):  ∇W_i = G_iᵀ A_i.  Either the ghost norm
  ‖G_iᵀA_i‖² = ⟨A_i A_iᵀ, G_i G_iᵀ⟩ at cost T²(p+q), or the materialised product at
  cost T·p·q — whichever is cheaper for the layer's shape.  ∇b_i = Σ_t G_i[t].
- GroupNorm (affine): ∇γ_i = Σ_spatial g_i ⊙ x̂_i, ∇β_i = Σ_spatial g_i (x̂ the
  normalised input), both small enough to form directly.

Where the per-sample weight gradients are formed (FedAvgCNN's two convolutions), the
weighted sum is a matrix-vector product with the weights, and the per-sample bias
gradients are kept too. Conv2d patches are cut by one strided copy, several times
faster than im2col: from a channels-last copy of the input (p ordered (k_h, k_w, C_in),
reordered once for the summed weight; contiguous runs of k_w·C_in values), or, when an
output row is longer than that (few input channels: FedAvgCNN's conv1), from the
channels-first input (runs of an output row; the per-sample gradient is then formed as
(p, q)). Every large temporary has the same shape from step to step; the
backends keep freed blocks in the heap (`raydpfl.backends.allocator`) so that they are
reused instead of being faulted in again.

More layers have rules in `raydpfl.privacy.per_sample` (Embedding, LayerNorm, RMSNorm,
nn.MultiheadAttention), which this engine dispatches to; a layer without parameters of
its own (frozen: LoRA's base) is not recorded. A model with any other parameterised layer is not
supported; `first_unsupported(model)` names the layer and the caller falls back to
`PerSampleGradients` (torch.func). (`supports(model)` asks about the three rules of this
module alone: the grouped multi-client engine, `raydpfl.privacy.per_sample.multi_client`, has no
others.) Nor is a parameter shared by two layers (tied weights) or a non-Linear layer
called more than once in one forward pass: its per-sample gradient is the sum of the
calls' gradients, whose norm is not the root of the calls' summed squared norms, so the
clipping bound would not hold. A Linear layer's calls are merged into one record of
stacked positions, which is exact (`per_sample.repeated`: recurrent cells). Only the
forward pass shows a repeated call, or a layer applied to a tensor without the batch
axis (checked every step, and once by a forward pass at a second batch size, which
finds a shared input as long as the batch); the engine then raises `SharedLayerError`
internally and hands that model to `PerSampleGradients` for good.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.privacy import per_sample
from raydpfl.privacy.per_sample import repeated
from raydpfl.privacy.per_sample.base import CallNotClippable
from raydpfl.privacy.per_sample.dpsgd import (
    Params,
    PerSampleGradients,
    StepStats,
    WeightRule,
    needs_losses,
    per_sample_norms,
)
from raydpfl.privacy.per_sample.param_binding import ParameterBinding

_SUPPORTED = (nn.Linear, nn.Conv2d, nn.GroupNorm)


class SharedLayerError(CallNotClippable):
    """A layer ran more than once in one forward pass: book-keeping cannot clip it."""


def check_no_shared_layers(records: list) -> None:
    """Raises `SharedLayerError` if a module appears twice among a pass's `records`."""
    seen: set[int] = set()
    for rec in records:
        if id(rec.module) in seen:
            raise SharedLayerError(
                f"layer {rec.prefix or type(rec.module).__name__!r} runs more than once per "
                "forward pass; its per-sample norm needs materialised per-sample gradients"
            )
        seen.add(id(rec.module))


def supports(model: nn.Module) -> bool:
    """True when every module that owns parameters has a book-keeping rule of this module
    (Linear, Conv2d, GroupNorm: the ones the grouped multi-client engine also has) and no
    parameter is shared by two modules (a layer called twice shows only at run time)."""
    return first_unsupported(model, core_only=True) is None


def first_unsupported(model: nn.Module, *, core_only: bool = False) -> str | None:
    """None when `BookkeepingClipping` has a rule for every module that owns parameters
    (here or in `raydpfl.privacy.per_sample`; only here with `core_only`) and no
    parameter is shared by two modules; otherwise one phrase naming the first layer
    that has none and why, e.g. "layer 'rnn' (LSTM) has no per-sample rule"."""
    owners: set[int] = set()
    covered = {
        id(child)
        for module in model.modules()
        if not core_only
        for child in per_sample.owned_children(module)
    }
    for name, module in model.named_modules():
        own = [id(p) for p in module.parameters(recurse=False)]
        label = f"layer {name or '<root>'!r} ({type(module).__name__})"
        if core_only and not own and isinstance(module, _SUPPORTED):
            # frozen (its weights buffers, e.g. LoRA's base): the grouped multi-client
            # engine replaces every such layer's forward and reads its parameters
            return f"{label} is frozen (no parameters), which the grouped engine cannot run"
        if not own or id(module) in covered:
            continue
        if owners.intersection(own):  # tied weights
            return f"{label} shares a parameter with another layer (tied weights)"
        owners.update(own)
        rule = None if core_only else per_sample.rule_for(module)
        if rule is not None:
            reason = rule.refusal(module)
            if reason is not None:
                return f"{label} has no per-sample rule: {reason}"
            continue
        if not isinstance(module, _SUPPORTED):
            return f"{label} has no per-sample rule"
        if isinstance(module, nn.Conv2d) and (
            module.groups != 1 or module.padding_mode != "zeros"
        ):
            return f"{label} has no per-sample rule for groups != 1 or non-zero padding"
        if isinstance(module, nn.GroupNorm) and not module.affine:
            return f"{label} has no per-sample rule without an affine"
    return None


@dataclass
class _Record:
    """One layer call of the current batch: its input, its output and (later) ∂ℓ/∂output."""

    module: nn.Module
    prefix: str
    inputs: torch.Tensor
    output: torch.Tensor
    grad: torch.Tensor | None = None
    # The per-sample weight gradients (B, q, p), kept when the norm rule formed them:
    # the weighted sum is then a cheap contraction instead of another backward product.
    # For Conv2d the p axis runs over (k_h, k_w, C_in), not the weight's (C_in, k_h, k_w)
    # (patches are cut from a channels-last copy of the input): `_as_weight` reorders.
    per_sample: torch.Tensor | None = None
    # The per-sample bias gradients (B, q) of a Conv2d or (B, T, p) Linear, kept from the
    # norm rule for the same reason.
    per_sample_bias: torch.Tensor | None = None
    # A Conv2d's per_sample is (B, p, q) with p in the weight's (C_in, k_h, k_w) order
    # (from channels-first patches, `_conv_patches_cf`) instead of (B, q, p).
    per_sample_pq: bool = False
    # What a `raydpfl.privacy.per_sample` rule keeps between its norm and its weighted sum.
    rule_cache: dict | None = None


class BookkeepingClipping:
    """Clipped per-sample gradient sums from layer inputs and output gradients.

    Same interface as `raydpfl.privacy.per_sample.dpsgd.PerSampleGradients.clipped_sum`; gives the
    same result up to float error (tested on every model of the zoo).
    """

    def __init__(self, model: nn.Module, max_chunk: int = 1024) -> None:
        missing = first_unsupported(model)
        if missing is not None:
            raise ValueError(
                f"{type(model).__name__} has a layer without a book-keeping rule: {missing}"
            )
        self.model = model
        self.max_chunk = max_chunk
        self._records: list[_Record] | None = None
        # set once a forward pass shows a layer called twice (`SharedLayerError`)
        self._fallback: PerSampleGradients | None = None
        # set once a forward pass at a second batch size showed every recorded input
        # following the batch (`_probe_batch_axis`)
        self._batch_axis_probed = False
        self._prefix = {m: name for name, m in model.named_modules()}
        self._binding = ParameterBinding(model)  # cheaper than functional_call per step
        covered = {id(c) for m in model.modules() for c in per_sample.owned_children(m)}
        for module in model.modules():
            if id(module) in covered or not _owns_parameters(module):
                continue  # a frozen layer (its weights buffers: LoRA's base) is not clipped
            rule = per_sample.rule_for(module)
            if rule is not None and hasattr(rule, "record_call"):  # needs the whole call
                module.register_forward_hook(self._call_recorder(rule), with_kwargs=True)
            elif isinstance(module, _SUPPORTED + per_sample.RULE_TYPES):
                module.register_forward_hook(self._record)

    def _record(
        self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor
    ) -> None:
        # Hooks stay registered for the model's lifetime; they only record while a
        # clipped sum is being computed (evaluation shares the model).
        if self._records is not None:
            self._records.append(_Record(module, self._prefix[module], inputs[0].detach(), output))

    def _call_recorder(self, rule):  # type: ignore[no-untyped-def]
        """A forward hook (with kwargs) that records what `rule.record_call` keeps."""

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if self._records is not None:
                inputs, out = rule.record_call(module, args, kwargs, output)
                self._records.append(_Record(module, self._prefix[module], inputs, out))

        return hook

    def clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        *,
        into: Params | None = None,
        scale: float = 1.0,
        low_rank: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[Params, StepStats]:
        """Σ_i a_i ∇ℓ_i with a_i = weight_rule(‖∇ℓ_i‖), plus step statistics.

        A `raydpfl.privacy.per_sample.dpsgd.LossWeightRule` gets a_i = weight_rule(‖∇ℓ_i‖, ℓ_i),
        the per-sample losses of the same forward pass. With `into` the sum is added to
        those tensors in place (a Linear layer's weight sum accumulates inside its GEMM)
        and they are returned; `scale` multiplies the sum before it is added (only with
        `into`). `into` may be the parameters themselves (`dp_sgd_step_`'s fused update)
        when `adds_into_params` says so: every layer's sum is formed after the chunk's
        forward and backward passes, from its records alone.

        `low_rank` (a dict, with `into`): the weight of a Linear layer on 2-d inputs is
        not added to; its scaled sum is left as factors instead, low_rank[name] =
        (scale·G, A) with G (B, q) the weighted output gradients and A (B, p) the inputs,
        the sum being GᵀA: the caller adds it together with the noise in one pass over
        the weight (`raydpfl.privacy.noise.counter_noise.add_normal_`). The vmap fallback
        leaves it empty (everything is added)."""
        if scale != 1.0 and into is None:
            raise ValueError("clipped_sum: scale needs `into`")
        if low_rank is not None and into is None:
            raise ValueError("clipped_sum: low_rank needs `into`")
        if self._fallback is None:
            try:
                return self._clipped_sum(params, x, y, weight_rule, into, scale, low_rank)
            except CallNotClippable as e:  # raised before anything was added to `into`
                self._use_fallback(e)
        assert self._fallback is not None
        if scale == 1.0:
            return self._fallback.clipped_sum(params, x, y, weight_rule, into=into)
        summed, stats = self._fallback.clipped_sum(params, x, y, weight_rule)
        assert into is not None
        for name, part in summed.items():
            into[name].add_(part, alpha=scale)
        return into, stats

    def adds_into_params(self, batch_size: int) -> bool:
        """Whether `clipped_sum` can add a scaled sum into the parameters themselves for a
        batch of `batch_size` (`dp_sgd_step_`'s fused update): the book-keeping rules, not
        the fallback, and one chunk, so no forward pass runs after the sum is added."""
        return self._fallback is None and batch_size <= self.max_chunk

    def _use_fallback(self, error: CallNotClippable) -> None:
        warnings.warn(
            f"{type(self.model).__name__}: {error}; using torch.func per-sample gradients "
            "(runtime.engine: vmap) for this model",
            stacklevel=3,
        )
        self._fallback = PerSampleGradients(self.model)

    def _clipped_sum(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight_rule: WeightRule,
        into: Params | None,
        scale: float = 1.0,
        low_rank: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[Params, StepStats]:
        # Without `into`, each parameter's first contribution is a fresh tensor that is
        # kept: no zero-filled accumulator (a second chunk adds to it).
        total: Params = dict(into) if into is not None else {}
        clipped, norm_sum = 0, 0.0
        with_losses = needs_losses(weight_rule)
        for start in range(0, x.shape[0], self.max_chunk):
            xb, yb = x[start : start + self.max_chunk], y[start : start + self.max_chunk]
            norms, records, losses = self._norms_and_losses(params, xb, yb)
            args = (norms, losses) if with_losses else (norms,)
            weights = weight_rule(*args)  # type: ignore[call-arg]
            for rec in records:
                _add_weighted_grads(rec, weights, total, scale, low_rank)
            stats = torch.stack([(weights < 1.0).sum().to(norms.dtype), norms.sum()]).tolist()
            clipped += int(stats[0])
            norm_sum += stats[1]
        # The caller's parameter order (the noise is drawn in it); zeros for an empty batch.
        out = {n: total[n] if n in total else torch.zeros_like(p) for n, p in params.items()}
        return out, StepStats.of(int(x.shape[0]), clipped, norm_sum)

    def norms(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample gradient norms ‖∇ℓ_i‖ over all parameters (flat)."""
        if self._fallback is None:
            try:
                return self._norms_and_losses(params, x, y)[0]
            except CallNotClippable as e:
                self._use_fallback(e)
        assert self._fallback is not None
        return per_sample_norms(self._fallback.grads(params, x, y))

    def _probe_batch_axis(self, leaves: Params, x: torch.Tensor, records: list[_Record]) -> None:
        """Once per engine: a forward pass (no gradients) on a batch of p copies of the
        first sample, p larger than every leading size the real pass showed, to find a
        layer whose input only looked batched (a lookup on ``arange(T)`` when T happened
        to equal the batch size): its leading size does not follow the batch, and it
        raises `SharedLayerError` (the model goes to vmap) before anything is summed."""
        sizes = [repeated.leading_size(rec) for rec in records]
        probe = max([x.shape[0], *(n for n in sizes if n is not None)]) + 1
        self._records = []
        # the RNG streams are left as they were (a model with dropout draws in forward)
        cuda = [x.device.index or 0] if x.device.type == "cuda" else []
        try:
            with torch.no_grad(), self._binding.bound(leaves), torch.random.fork_rng(cuda):
                self.model(x[:1].expand(probe, *x.shape[1:]).contiguous())
            seen = self._records
        finally:
            self._records = None
        _check_calls(seen, probe)
        self._batch_axis_probed = True

    def _norms(
        self, params: Params, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, list[_Record]]:
        norms, records, _ = self._norms_and_losses(params, x, y)
        return norms, records

    def _norms_and_losses(
        self, params: Params, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, list[_Record], torch.Tensor]:
        if x.shape[0] == 0:  # no records, no norms (the rules' shapes need a sample)
            empty = torch.zeros(0, device=x.device)
            return empty, [], empty
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        self._records = []
        try:
            with torch.enable_grad(), self._binding.bound(leaves):
                logits = self.model(x)
                losses = F.cross_entropy(logits, y, reduction="none")
                records = self._records
                _check_calls(records, x.shape[0])  # before the backward pass
                grads = torch.autograd.grad(losses.sum(), [r.output for r in records])
        finally:
            self._records = None
        if not self._batch_axis_probed:
            self._probe_batch_axis(leaves, x, records)
        for rec, g in zip(records, grads, strict=True):
            rec.grad = g.detach()
            rec.output = rec.output.detach()
        records = repeated.merge_repeated(records)  # a Linear's calls: one record
        norms_sq = torch.zeros(x.shape[0], dtype=losses.dtype, device=x.device)
        for rec in records:
            norms_sq += _norm_sq(rec)
        return norms_sq.sqrt(), records, losses.detach()


def _owns_parameters(module: nn.Module) -> bool:
    """Whether `module`, or a child its rule covers, has parameters of its own."""
    children = per_sample.owned_children(module)
    return any(True for m in (module, *children) for _ in m.parameters(recurse=False))


def _check_calls(records: list[_Record], batch: int) -> None:
    """Raises `SharedLayerError` for a call no rule can clip: a non-Linear layer called
    twice, or a layer whose input does not lead with the batch axis."""
    found = repeated.first_unclippable(records, batch)
    if found is None:
        return
    kind, rec = found
    name = rec.prefix or type(rec.module).__name__
    if kind == "repeat":
        raise SharedLayerError(
            f"layer {name!r} runs more than once per forward pass; its per-sample norm "
            "needs materialised per-sample gradients"
        )
    raise SharedLayerError(
        f"layer {name!r} is applied to a tensor without the batch axis first (shared by "
        "all samples), so its per-sample gradients cannot be split from its output gradient"
    )


# ---- layer rules --------------------------------------------------------------------
def _positions(rec: _Record) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, G) with shapes (B, T, p) and (B, T, q) for Linear-like layers and Conv2d.

    For Conv2d, A's p axis is ordered (k_h, k_w, C_in) (see `_conv_patches`)."""
    m, a, g = rec.module, rec.inputs, rec.grad
    assert g is not None
    if isinstance(m, nn.Conv2d):
        return _conv_patches(m, a), g.flatten(2).transpose(1, 2)
    return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])


def _conv_patches(m: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """The unfolded input patches (B, T, k_h·k_w·C_in), ordered (k_h, k_w, C_in).

    Cut from a channels-last copy of the (zero-padded) input by one strided view and one
    copy whose inner runs are k_w·C_in contiguous values: on one CPU thread ~5x faster
    than `F.unfold`'s im2col (FedAvgCNN's conv2), which gathers element by element.
    Norms and Gram products do not depend on the order of p; `_as_weight` reorders the
    weight."""
    nhwc = _padded(m, a).permute(0, 2, 3, 1)
    if not nhwc.is_contiguous():
        nhwc = nhwc.contiguous()
    b, h, w, c = nhwc.shape
    sb, sh, sw, sc = nhwc.stride()
    (kh, kw), (dh, dw), (th, tw), (ho, wo) = _geometry(m, h, w)
    view = nhwc.as_strided((b, ho, wo, kh, kw, c), (sb, sh * th, sw * tw, sh * dh, sw * dw, sc))
    return view.reshape(b, ho * wo, kh * kw * c)


def _conv_patches_cf(m: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """The unfolded input patches (B, C_in·k_h·k_w, T), p in the weight's (C_in, k_h, k_w)
    order (`F.unfold`'s layout), cut from a contiguous (N, C, H, W) input by one strided
    view and one copy whose inner runs are an output row (W_out values when the stride
    along W is 1). For few input channels and wide outputs (FedAvgCNN's conv1: 1 channel,
    rows of 24) these runs are far longer than `_conv_patches`' k_w·C_in (5): ~7x faster
    at a batch of 30, and the (B, p, q) product after it is ~1.4x faster too."""
    a = _padded(m, a)
    if not a.is_contiguous():
        a = a.contiguous()
    b, c, h, w = a.shape
    sb, sc, sh, sw = a.stride()
    (kh, kw), (dh, dw), (th, tw), (ho, wo) = _geometry(m, h, w)
    view = a.as_strided((b, c, kh, kw, ho, wo), (sb, sc, sh * dh, sw * dw, sh * th, sw * tw))
    return view.reshape(b, c * kh * kw, ho * wo)


def _padded(m: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """The layer's input with its zero padding applied (as the convolution saw it)."""
    pad = m._reversed_padding_repeated_twice
    return F.pad(a, pad) if any(pad) else a


def _geometry(m: nn.Conv2d, h: int, w: int) -> tuple[tuple[int, int], ...]:
    """(kernel, dilation, stride, output size) as (H, W) pairs for a padded h×w input."""
    (kh, kw), (dh, dw), (th, tw) = m.kernel_size, m.dilation, m.stride
    ho, wo = (h - dh * (kh - 1) - 1) // th + 1, (w - dw * (kw - 1) - 1) // tw + 1
    return (kh, kw), (dh, dw), (th, tw), (ho, wo)


def _channels_first_pays(m: nn.Conv2d, out_width: int) -> bool:
    """Whether `_conv_patches_cf`'s contiguous runs (an output row, if the stride along W
    is 1) are longer than `_conv_patches`' (k_w·C_in, if the dilation along W is 1)."""
    cf_run = out_width if m.stride[1] == 1 else 1
    cl_run = m.kernel_size[1] * m.in_channels if m.dilation[1] == 1 else m.in_channels
    return cf_run > cl_run


def _as_weight(rec: _Record, flat: torch.Tensor, lead: tuple[int, ...] = ()) -> torch.Tensor:
    """A contraction of `rec.per_sample` over samples, (*lead, q·p) values in its
    (q, p) order (or (p, q) order, `per_sample_pq`), laid out as (*lead, *weight.shape)."""
    m = rec.module
    if isinstance(m, nn.Conv2d):
        q, c, kh, kw = m.weight.shape
        nd = len(lead)
        if rec.per_sample_pq:
            out = flat.reshape(*lead, c, kh, kw, q)
            return out.permute(*range(nd), nd + 3, nd, nd + 1, nd + 2).contiguous()
        out = flat.reshape(*lead, q, kh, kw, c)
        return out.permute(*range(nd), nd, nd + 3, nd + 1, nd + 2).contiguous()
    return flat.reshape(*lead, *m.weight.shape)


def _sq_norms(t: torch.Tensor) -> torch.Tensor:
    """Σ of squares per leading index, without a squared temporary of t's size."""
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def _norm_sq(rec: _Record) -> torch.Tensor:
    """Σ over the layer's parameters of ‖∇θ ℓ_i‖², per sample."""
    m, g = rec.module, rec.grad
    assert g is not None
    rule = per_sample.rule_for(m)
    if rule is not None:
        return rule.norm_sq(rec)
    if isinstance(m, nn.GroupNorm):
        gamma, beta = _groupnorm_per_sample(rec)
        return gamma.pow(2).sum(1) + beta.pow(2).sum(1)
    if isinstance(m, nn.Linear) and rec.inputs.dim() == 2:
        g_sq = g.pow(2).sum(1)
        out = g_sq * rec.inputs.pow(2).sum(1)
        return out + g_sq if m.bias is not None else out
    conv = isinstance(m, nn.Conv2d)
    if conv:  # T output positions, p = C_in·k_h·k_w, q = C_out
        t, p, q = g.shape[2] * g.shape[3], m.weight[0].numel(), g.shape[1]
    else:
        t, p, q = rec.inputs[0].numel() // rec.inputs.shape[-1], rec.inputs.shape[-1], g.shape[-1]
    if t * t * (p + q) < t * p * q:  # ghost norm: ⟨A Aᵀ, G Gᵀ⟩
        a_mat, g_mat = _positions(rec)
        out = (
            torch.bmm(a_mat, a_mat.transpose(1, 2)) * torch.bmm(g_mat, g_mat.transpose(1, 2))
        ).sum((1, 2))
    elif conv and _channels_first_pays(m, g.shape[3]):  # form it as (B, p, q)
        rec.per_sample = torch.bmm(_conv_patches_cf(m, rec.inputs), g.flatten(2).transpose(1, 2))
        rec.per_sample_pq = True
        out = _sq_norms(rec.per_sample)
    else:  # the per-sample weight gradient is small: form it (and keep it)
        a_mat, g_mat = _positions(rec)
        rec.per_sample = torch.bmm(g_mat.transpose(1, 2), a_mat)
        out = _sq_norms(rec.per_sample)
    if m.bias is not None:
        bias = g.flatten(2).sum(2) if conv else g.reshape(g.shape[0], -1, g.shape[-1]).sum(1)
        if rec.per_sample is not None:
            rec.per_sample_bias = bias
        out = out + bias.pow(2).sum(1)
    return out


def _groupnorm_per_sample(rec: _Record) -> tuple[torch.Tensor, torch.Tensor]:
    m, g = rec.module, rec.grad
    assert isinstance(m, nn.GroupNorm) and g is not None
    x_hat = F.group_norm(rec.inputs, m.num_groups, eps=m.eps)
    dims = tuple(range(2, g.dim()))
    return (g * x_hat).sum(dims), g.sum(dims)


def _add_weighted_grads(
    rec: _Record,
    weights: torch.Tensor,
    total: Params,
    scale: float = 1.0,
    low_rank: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> None:
    """Adds scale·Σ_i a_i ∇θ ℓ_i for the layer's parameters to `total` (keyed by full
    names), in place where `total` has the name, as a fresh tensor (scale 1 only) where it
    has not; a Linear weight on 2-d inputs goes to `low_rank` as factors instead when it
    is given (`BookkeepingClipping.clipped_sum`; a second chunk's rows are appended)."""
    m, g = rec.module, rec.grad
    assert g is not None
    prefix = f"{rec.prefix}." if rec.prefix else ""
    w = weights.to(g.dtype)
    out: Params = {}
    rule = per_sample.rule_for(m)
    if rule is not None:
        out = rule.weighted(rec, w)
    elif rec.per_sample is not None:  # Σ_i a_i ∇W_i from the kept per-sample gradients
        out["weight"] = _as_weight(rec, torch.mv(rec.per_sample.flatten(1).t(), w))
        if m.bias is not None:
            assert rec.per_sample_bias is not None
            out["bias"] = torch.mv(rec.per_sample_bias.t(), w)
    else:
        shape = (-1,) + (1,) * (g.dim() - 1)
        gw = g * w.view(shape)
        if isinstance(m, nn.GroupNorm):
            x_hat = F.group_norm(rec.inputs, m.num_groups, eps=m.eps)
            dims = (0, *range(2, g.dim()))
            out["weight"], out["bias"] = (gw * x_hat).sum(dims), gw.sum(dims)
        elif isinstance(m, nn.Conv2d):
            out["weight"] = torch.nn.grad.conv2d_weight(
                rec.inputs,
                m.weight.shape,
                gw,
                stride=m.stride,
                padding=m.padding,
                dilation=m.dilation,
            )
            if m.bias is not None:
                out["bias"] = gw.sum((0, 2, 3))
        else:  # Linear: the largest layers; their weight sum accumulates inside the GEMM
            a2, g2 = rec.inputs.reshape(-1, rec.inputs.shape[-1]), gw.reshape(-1, gw.shape[-1])
            acc = total.get(prefix + "weight")
            if low_rank is not None and acc is not None and rec.inputs.dim() == 2:
                g_scaled = g2 * scale
                before = low_rank.get(prefix + "weight")
                if before is not None:  # a second chunk: its rows after the first's
                    g_scaled, a2 = torch.cat((before[0], g_scaled)), torch.cat((before[1], a2))
                low_rank[prefix + "weight"] = (g_scaled, a2)
            elif acc is not None:
                acc.addmm_(g2.t(), a2, alpha=scale)
            else:
                out["weight"] = g2.t() @ a2
            if m.bias is not None:
                out["bias"] = g2.sum(0)
    for k, v in out.items():
        name = prefix + k
        if name in total:
            total[name].add_(v, alpha=scale)
        else:
            assert scale == 1.0  # `clipped_sum` only scales into given tensors
            total[name] = v
