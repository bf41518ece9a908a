"""FedFDP's per-sample mathematics: fair clipping and the private loss upload.

Paper: "FedFDP: Fairness-Aware Federated Learning with Differential Privacy" (Ling et al.;
seed 001, the LNCS version, is primary; equation numbers below are 001's). Implementation
spec: shared/specs/fedfdp.md, cited as §. Pure functions, no state; torch only where
per-sample tensors are involved. The accounting is `raydpfl.papers.fedfdp.accounting`,
the convergence bound and λ* `raydpfl.papers.fedfdp.convergence`.

- Fair clipping (Eq. 13): per-sample weights c_j with Σ_j c_j g_j the fairness-scaled,
  clipped gradient sum. `fair_clip_weights` is the sign-safe default (‖c_j g_j‖ ≤ C for
  every λ, §11 A5); `fair_clip_weights_paper` is Eq. 13 verbatim and reports whether a
  weight went negative (then the sum's sensitivity is unbounded and the run is not DP).
- The loss upload (Eqs. 14–15): per-sample losses clipped to [0, C_l], summed, Gaussian
  noise σ_l·C_l, divided by a caller-chosen denominator; the next round's C_l is the
  released value with a floor (§5.3, §11 A7).
"""

from __future__ import annotations

from typing import Literal

import torch

from raydpfl.algorithms.local_dp_sgd import clip_losses, private_mean_loss
from raydpfl.privacy.accounting._checks import _non_negative, _positive, _real
from raydpfl.privacy.per_sample.dpsgd import CLIP_EPS

__all__ = [
    "LOSS_CLIP_FLOOR",
    "clip_losses",
    "fair_clip_weights",
    "fair_clip_weights_paper",
    "fairness_scale",
    "next_loss_clip_bound",
    "private_mean_loss",
]

#: Default floor of the adaptive loss bound C_l (§11 A7 [REC]): keeps C_l out of the
#: absorbing state C_l = 0. Data-independent, so the max() is post-processing.
LOSS_CLIP_FLOOR: float = 1e-3


# --------------------------------------------------------------------------------------- #
# Fair clipping (Eq. 13)
# --------------------------------------------------------------------------------------- #
def _check_per_sample(norms: torch.Tensor, losses: torch.Tensor) -> None:
    for name, t in (("norms", norms), ("losses", losses)):
        if not isinstance(t, torch.Tensor) or t.ndim != 1:
            raise ValueError(f"{name} must be a 1-D torch.Tensor (one value per sample)")
    if norms.shape != losses.shape:
        raise ValueError(
            f"norms and losses must have the same length, got {norms.shape[0]} and "
            f"{losses.shape[0]}"
        )
    if bool(torch.isnan(norms).any()) or bool((norms < 0).any()):
        raise ValueError("norms must be >= 0 and not NaN")
    if bool(torch.isnan(losses).any()):
        raise ValueError("losses must not be NaN")


def fairness_scale(losses: torch.Tensor, global_loss: float, lam: float) -> torch.Tensor:
    """s_j = 1 + λ·Δ_j with Δ_j = ℓ_j − F(w_t): the per-sample factor of Eq. 11.

    Args:
        losses: 1-D tensor of per-sample losses ℓ_j = F_i(w_t^i, ξ_j) (±inf allowed).
        global_loss: F(w_t), the broadcast aggregate of last round's uploaded losses.
        lam: λ. The paper requires λ ≥ 0; any finite value is accepted here.

    Returns:
        s, a tensor like `losses`. λ = 0 gives exactly 1 (not 1 + 0·ℓ, which is NaN for an
        infinite loss), so FedFDP with λ = 0 is plain DP-SGD clipping bit for bit.
    """
    global_loss = _real(global_loss, "global_loss")
    lam = _real(lam, "lam")
    if lam == 0.0:
        return torch.ones_like(losses)
    return 1.0 + lam * (losses - global_loss)


def fair_clip_weights(
    norms: torch.Tensor,
    losses: torch.Tensor,
    global_loss: float,
    lam: float,
    clip_norm: float,
    *,
    negative: Literal["abs", "descent", "zero"] = "abs",
) -> torch.Tensor:
    """Sign-safe fair-clipping weights: Eq. 13 with its sensitivity restored (§11 A5).

    With s_j = 1 + λ(ℓ_j − F(w_t)) (`fairness_scale`), Eq. 13 is c_j = min(s_j, C/‖g_j‖).
    For s_j < 0 that min is s_j itself and ‖c_j g_j‖ = |s_j|·‖g_j‖ is unbounded (§5.1),
    so the weight for s_j < 0 is replaced according to `negative`:

    - ``abs`` (default, §11 A5 [REC]): c_j = sign(s_j)·min(|s_j|, C/(‖g_j‖ + 1e-6)), i.e.
      the fairness-scaled gradient s_j·g_j of Eq. 11 (an ascent step when s_j < 0), clipped
      to norm C. Continuous in s_j.
    - ``descent``: c_j = C/(‖g_j‖ + 1e-6), a full-norm descent step, which is what the
      authors' code intends (§5.1 [CODE]). Their literal expression s·min(C/(s‖g‖ + 1e-6), 1)
      is not used: for s < 0 with |s|·‖g‖ just above 1e-6 its denominator nears 0 and the
      weight, hence the norm, is unbounded.
    - ``zero``: c_j = 0 (s_j clamped to 0; the sample is dropped).

    For s_j ≥ 0 all three equal Eq. 13 (with the 1e-6 guard of
    `raydpfl.privacy.per_sample.dpsgd.clip_weights`; λ = 0 reproduces those weights exactly). Every
    mode keeps ‖c_j g_j‖ ≤ C for any λ and any losses, so Σ_j c_j g_j has L2 sensitivity C
    (add/remove one record) and the step stays the subsampled Gaussian mechanism.

    Args:
        norms: 1-D tensor of per-sample gradient norms ‖g_j‖ (≥ 0).
        losses: 1-D tensor of per-sample losses ℓ_j at the same model, same order.
        global_loss: F(w_t).
        lam: λ (any finite value).
        clip_norm: C > 0.
        negative: The rule for samples with s_j < 0, see above.

    Returns:
        Weights c_j (dtype and device of `norms`) with Σ_j c_j g_j the clipped sum of Eq. 12.

    Raises:
        ValueError: On malformed tensors, NaN inputs, C ≤ 0, or an unknown `negative`.
    """
    clip_norm = _positive(clip_norm, "clip_norm")
    if negative not in ("abs", "descent", "zero"):
        raise ValueError(f"negative must be one of abs, descent, zero, got {negative!r}")
    _check_per_sample(norms, losses)
    s = fairness_scale(losses, global_loss, lam).to(norms.dtype)
    cap = clip_norm / (norms + CLIP_EPS)
    # min(|s|, cap) is finite even for |s| = inf, where s·min(1, C/(|s|‖g‖)) would be inf·0.
    if negative == "abs":
        return torch.sign(s) * torch.minimum(s.abs(), cap)
    if negative == "descent":
        return torch.where(s < 0, cap, torch.minimum(s, cap))
    return torch.minimum(s.clamp(min=0.0), cap)


def fair_clip_weights_paper(
    norms: torch.Tensor,
    losses: torch.Tensor,
    global_loss: float,
    lam: float,
    clip_norm: float,
) -> tuple[torch.Tensor, bool]:
    """Eq. 13 verbatim: c_j = min(1 + λΔ_j, C/(‖g_j‖ + 1e-6)).

    Not DP whenever some 1 + λΔ_j < 0 (which needs λ > 1/(F(w_t) − ℓ_j), §5.1): that
    weight is negative and unbounded, so the clipped sum has no sensitivity bound. The flag
    lets the caller mark such a run as not differentially private.

    Args:
        norms, losses, global_loss, lam, clip_norm: As in `fair_clip_weights`.

    Returns:
        (weights, any_negative): the weights, and whether any weight is < 0.

    Raises:
        ValueError: On malformed tensors, NaN inputs, or C ≤ 0.
    """
    clip_norm = _positive(clip_norm, "clip_norm")
    _check_per_sample(norms, losses)
    s = fairness_scale(losses, global_loss, lam).to(norms.dtype)
    weights = torch.minimum(s, clip_norm / (norms + CLIP_EPS))
    return weights, bool((weights < 0).any())


# --------------------------------------------------------------------------------------- #
# The loss upload (Eqs. 14–15)
# --------------------------------------------------------------------------------------- #
# `clip_losses` (Eq. 15) and `private_mean_loss` (Eq. 14, Alg. 2 L9–L11) are the noisy
# loss query the DP algorithms share (`raydpfl.algorithms.local_dp_sgd`, imported above):
# Adap DP-FL's schedule loss is the same mechanism. FedFDP uses it in float64.


def next_loss_clip_bound(
    noisy_loss: float, *, floor: float = LOSS_CLIP_FLOOR, multiplier: float = 1.0
) -> float:
    """C_l^{i,t+1} = max(floor, multiplier·F̃_i^{t}) (Eq. 14 as read in §5.3; §11 A7).

    The paper sets the next bound to the noisy mean just released (post-processing, no
    extra privacy cost). With floor = 0 this is the authors' code, where a non-positive
    release makes C_l = 0 for ever (every later upload is exactly 0); the default floor
    1e-3 avoids that. `multiplier` > 1 counters the downward drift caused by clipping at
    the previous mean (E[min(X, c)] ≤ min(E X, c)); 1.0 is the paper.

    Args:
        noisy_loss: F̃_i released this round (any finite value).
        floor: ≥ 0, data-independent.
        multiplier: > 0.
    """
    noisy_loss = _real(noisy_loss, "noisy_loss")
    floor = _non_negative(floor, "floor")
    multiplier = _positive(multiplier, "multiplier")
    return max(floor, multiplier * noisy_loss)
