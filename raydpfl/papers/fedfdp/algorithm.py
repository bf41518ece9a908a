"""FedFDP (Algorithm 2 of "FedFDP: Fairness-Aware Federated Learning with Differential
Privacy", Ling et al.; seed 001; shared/specs/fedfdp.md §5–§7).

Per round t, every selected client i:

1. (``train`` task) takes τ DP-SGD steps (τ = 1 in the paper) from w_t on Poisson(q)
   batches with *fair clipping*: per-sample weight c_j from s_j = 1 + λ(ℓ_j − F(w_t))
   (Eq. 13). Default rule ``abs`` (sign-safe, §11 A5): c_j = sign(s_j)·min(|s_j|, C/‖g_j‖),
   so ‖c_j g_j‖ ≤ C for every λ and the step is SGM(q, σ) (`theory.fair_clip_weights`).
   ``paper`` is Eq. 13 verbatim, min(s_j, C/‖g_j‖): when some s_j < 0 that sample's
   contribution is unbounded and the run is NOT DP; the client reports it and the run's
   `unaccounted_releases` says so.
2. (``loss`` follow-up, charged separately) releases the loss of its updated local model
   w_{t+1}^i on an *independent* Poisson(q_l) batch: Σ_j min(C_l^i, max(0, ℓ_j)) +
   N(0, σ_l²C_l^i²), divided by q_l·|D_i| (Eqs. 14–15): SGM(q_l, σ_l). The two
   mechanisms compose additively (§6.4).

The server averages models (p_i ∝ |D_i|), sets F(w_{t+1}) = Σ p_i F̃_i over the clients
that released (Alg. 2 S6), and C_l^i ← max(floor, multiplier·F̃_i) (post-processing).

λ: ``fixed`` (the config's λ; sweep it), or re-optimised after every round from the
convergence bound (§7): ``closed_form`` (the paper's Cardano root) or ``numeric``. The
bound's constants are public or post-processing of DP releases only, so the guarantee
holds: G = C (every clipped contribution has norm ≤ C), Q0 = −F(w_t) (losses are ≥ 0),
Q1 = max_i C_l^i − F(w_t) (the loss clip range), d, B̂ = min_i q|D_i|, σ, C; L, μ, Γ and
‖w_1 − w*‖² come from the config (the paper never estimates them). A degenerate bound
(§7.5, the usual case since Q0 < 0) raises `DegenerateBoundWarning` and gives λ* = 0
(numeric) or is skipped (closed form keeps the previous λ).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    trained_result,
)
from raydpfl.papers.fedfdp.convergence import (
    BoundConstants,
    DegenerateBoundWarning,
    lambda_star_cardano,
    lambda_star_numeric,
)
from raydpfl.papers.fedfdp.fedfair import aggregate_losses, weighted_variance
from raydpfl.papers.fedfdp.loss_upload import LossUpload, LossUploadFollowups, release_loss
from raydpfl.papers.fedfdp.pfl_base import PflBase, local_sgd
from raydpfl.papers.fedfdp.theory import (
    fair_clip_weights,
    fair_clip_weights_paper,
    fairness_scale,
)
from raydpfl.privacy.per_sample.dpsgd import LossWeightRule

ClipMode = Literal["abs", "descent", "zero", "paper"]
LambdaMode = Literal["fixed", "closed_form", "numeric"]


class FairClipRule(LossWeightRule):
    """The per-sample weight rule of Eq. 13 for one step; records diagnostics.

    Diagnostics (kept on the client, reported as non-private training metrics): the
    fraction of samples with s_j < 0, whether a weight went negative under ``paper``.
    """

    def __init__(self, *, global_loss: float, lam: float, clip_norm: float, mode: ClipMode):
        self.global_loss, self.lam, self.clip_norm, self.mode = global_loss, lam, clip_norm, mode
        self.samples = 0
        self.negative_scale = 0
        self.negative_weight = False
        # Eq. 13 verbatim can give negative weights (unbounded sensitivity): the config
        # must opt in (allow_not_dp), the builder sets the run-level opt-out
        # (kernel.UNBOUNDED_WEIGHT_RULES) and the platform lists the run as unbounded.
        super().__init__(self._weights)

    def _weights(self, norms: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        s = fairness_scale(losses, self.global_loss, self.lam)
        self.samples += int(s.numel())
        self.negative_scale += int((s < 0).sum())
        if self.mode == "paper":
            w, neg = fair_clip_weights_paper(
                norms, losses, self.global_loss, self.lam, self.clip_norm
            )
            self.negative_weight |= neg
            return w
        return fair_clip_weights(
            norms, losses, self.global_loss, self.lam, self.clip_norm, negative=self.mode
        )


class FedFDP(LossUploadFollowups, PflBase):
    """FedFDP: fair clipping DP-SGD + the private loss upload (two charged mechanisms)."""

    name = "fedfdp"
    is_private = True

    def __init__(
        self,
        *,
        lam: float,
        loss_upload: LossUpload,
        clip_mode: ClipMode = "abs",
        initial_global_loss: float = 0.0,
        lambda_mode: LambdaMode = "fixed",
        bound_constants: BoundConstants | None = None,
        drop_mu_sq: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if lambda_mode != "fixed" and bound_constants is None:
            raise ValueError(f"lambda_mode={lambda_mode} needs bound constants")
        self.lam = lam
        self.loss_upload = loss_upload
        self.clip_mode = clip_mode
        self.global_loss = initial_global_loss
        self.lambda_mode = lambda_mode
        self.bound_constants = bound_constants
        self.drop_mu_sq = drop_mu_sq
        self.not_dp_rounds: list[int] = []
        self.degenerate_rounds = 0
        self._start: Params | None = None
        self._last: dict[str, float] = {}

    # ---- server half -------------------------------------------------------------
    def _round_extras(self) -> dict[str, float]:
        return {"lam": self.lam, "global_loss": self.global_loss}

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        self._start = global_params
        if any(r.metrics.get("negative_weight", 0.0) > 0 for r in results):
            self.not_dp_rounds.append(tasks[0].round_idx + 1 if tasks else -1)
        return super().aggregate(global_params, tasks, results)

    def loss_model(self, result: ClientResult) -> dict[str, torch.Tensor]:
        """The client's updated model w_t + Δ_i: its loss is released (Alg. 2 L9–L11)."""
        assert self._start is not None
        start = self._start
        return {f"w.{n}": start[n] + result.update[n] for n in start}

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        super().after_round(round_idx, metrics, followups)
        self._start = None
        out: dict[str, float] = {}
        released = [r for r in followups if "noisy_loss" in r.metrics]
        if released:
            self.loss_upload.update(released)
            weights = [r.weight for r in released]
            self.global_loss = aggregate_losses(
                [r.metrics["noisy_loss"] for r in released], weights
            )
            out["fedfdp_psi_local_trainbatch"] = weighted_variance(
                [r.metrics["raw_loss"] for r in released], weights
            )
        out["fedfdp_global_loss"] = self.global_loss
        out["fedfdp_loss_clip_mean"] = float(
            np.mean([self.loss_upload.bound(r.client_id) for r in released])
            if released
            else self.loss_upload.clip_init
        )
        out["fedfdp_lambda"] = self.lam  # the λ used this round
        if self.lambda_mode != "fixed":
            self._update_lambda(released)
        return out

    def bound_constants_now(self, released: Sequence[ClientResult]) -> BoundConstants:
        """The bound's constants from public values and DP releases only (see module doc)."""
        assert self.bound_constants is not None
        bounds = [self.loss_upload.bound(r.client_id) for r in released] or [
            self.loss_upload.clip_init
        ]
        f = max(self.global_loss, 0.0)
        q1 = max(max(bounds) - f, 1e-6)
        return replace(self.bound_constants, Q0=min(-f, q1), Q1=q1)

    def _update_lambda(self, released: Sequence[ClientResult]) -> None:
        constants = self.bound_constants_now(released)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DegenerateBoundWarning)
            try:
                if self.lambda_mode == "numeric":
                    lam = lambda_star_numeric(constants, drop_mu_sq=self.drop_mu_sq).lam
                else:
                    lam = lambda_star_cardano(constants, drop_mu_sq=self.drop_mu_sq)
            except (ValueError, ZeroDivisionError):
                lam = float("nan")
        degenerate = any(issubclass(w.category, DegenerateBoundWarning) for w in caught)
        if degenerate:
            self.degenerate_rounds += 1
            if self.degenerate_rounds == 1:
                warnings.warn(
                    "FedFDP λ*: the convergence bound is degenerate (§7.5: Q0 < 0 or "
                    "𝒢(0) ≥ 0), so it has no interior optimum; numeric gives λ* = 0, "
                    "closed_form keeps the previous λ. Prefer lambda_mode=fixed with a sweep.",
                    DegenerateBoundWarning,
                    stacklevel=2,
                )
            if self.lambda_mode == "closed_form":
                return
        if math.isfinite(lam) and lam >= 0:
            self.lam = float(lam)

    def unaccounted_releases(self) -> list[str]:
        out = [
            *super().unaccounted_releases(),
            "client_diagnostics (fraction of samples with negative fairness factor; raw "
            "noiseless loss of the loss batch behind fedfdp_psi_local_trainbatch)",
        ]
        if self.not_dp_rounds:
            out.append(
                "NOT DIFFERENTIALLY PRIVATE: clip_mode=paper produced negative fair-clip "
                f"weights (unbounded sensitivity) in rounds {self.not_dp_rounds[:20]}; the "
                "reported epsilon does not hold for this run"
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "lam": self.lam,
            "global_loss": self.global_loss,
            "loss_upload": self.loss_upload.state_dict(),
            "not_dp_rounds": self.not_dp_rounds,
            "degenerate_rounds": self.degenerate_rounds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.lam = float(state.get("lam", self.lam))
        self.global_loss = float(state.get("global_loss", self.global_loss))
        self.loss_upload.load_state_dict(state.get("loss_upload", {}))
        self.not_dp_rounds = list(state.get("not_dp_rounds", []))
        self.degenerate_rounds = int(state.get("degenerate_rounds", 0))

    # ---- client half -------------------------------------------------------------
    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == "loss":
            return release_loss(ctx, params, data, task)
        assert task.clip_norm is not None
        rule = FairClipRule(
            global_loss=float(task.extras["global_loss"]),
            lam=float(task.extras["lam"]),
            clip_norm=task.clip_norm,
            mode=self.clip_mode,
        )
        start, metrics = local_sgd(
            ctx,
            params,
            data,
            task,
            private=True,
            weight_rule=rule,
            normalizer=self.normalizer,
            fixed_divisor=self.fixed_divisor,
        )
        metrics["negative_scale_fraction"] = rule.negative_scale / max(rule.samples, 1)
        metrics["negative_weight"] = float(rule.negative_weight)
        return trained_result(task, data, params, start, metrics)
