"""ALI-DPFL: DP federated learning with adaptive local iterations (seed 002).

Spec: shared/specs/ali-dpfl.md (cited as §). Every client runs DP-SGD (Poisson rate q,
flat per-sample clipping at C, Gaussian noise σC); the server averages the local
models with p_i ∝ |D_i| and, after every aggregation, picks the next round's number
of local iterations τ* from the convergence bound (Eq. 9), under two caps:

- R_s, the most communication rounds (`rounds_budget`, the config's `rounds`);
- R_c, the most DP-SGD iterations per client, derived from the budget (ε, δ) at fixed
  q and σ (Algorithm 3, `ali_dpfl_theory.iteration_budget`).

Round k runs τ_k = min(τ*, R_c − t) iterations (§5 [REC]: the last round is truncated
so the total never exceeds R_c; ``last_round="skip"`` replays the authors' code, which
stops instead). With R_s ≥ R_c every round uses τ = 1 (Lemma 1).

μ, the curvature estimate τ* needs, is the secant estimate of §4.6.1:
μ = Σ_i p_i ‖∇F̂_i(w^i) − ∇F̂_i(w)‖ / ‖w^i − w‖, with w^i the client's local model and w
the new aggregate. The gradients are mean *unclipped, un-noised* gradients on a probe
of each client's training records, computed by a ``mu_stats`` follow-up task after
aggregation: raw-data statistics the paper leaves unaccounted. They are named in
`unaccounted_releases` (together with the Γ estimate's loss changes when
``gamma_mode="code_estimate"``).

`DPFedAvgFixedTau` is the paper's "τ = k" baseline (FedAvg + DP-SGD, §6.6): exactly τ
iterations per round for K = min(R_s, ⌊R_c/τ⌋) rounds (A17), same DP-SGD and caps.

Privacy (unit: one training record of one client, add/remove adjacency): each round's
task declares τ_k uses of `SubsampledGaussian(σ, C, q)`, charged `PrivacyCost(σ, q, τ_k)`
to the client's ledger before dispatch; the ledger's accountant is the source of truth
for the reported ε. R_c only decides when to stop: under ``rc_mode="paper_compat"`` it
follows the paper's classic conversion, which may overshoot the budget by ≤ 0.01 in
classic terms, but the ledger refuses any task that its own (tighter) accountant would put
above ε.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    UniformCohortAlgorithm,
)
from raydpfl.algorithms.local_dp_sgd import ACTUAL_DIVISOR_RELEASE, Normalizer, dp_sgd_local_update
from raydpfl.papers.ali_dpfl.theory import TAU_MAX, round_tau, tau_star
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses

#: Guards the division by ‖w^i − w‖ in the μ estimate (§4.6.1 [REC]).
MU_EPS = 1e-12

GammaMode = Literal["fixed", "code_estimate"]
TauFormula = Literal["paper", "code", "consistent"]
LastRound = Literal["truncate", "skip"]
MuEstimator = Literal["paper", "code_torch", "code_mindspore"]
#: The authors' code adds 1e-6 to the μ denominator (§4.6.1 [CODE]); the paper's form 1e-12.
CODE_MU_EPS = 1e-6


def mean_gradient(model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor):
    """∇ of the mean cross-entropy of `model` at `params` on (x, y), flattened to one vector."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return torch.cat([g.reshape(-1) for g in grads])


def secant_mu(
    grad_diff_norms: Sequence[float],
    model_distances: Sequence[float],
    weights: Sequence[float],
    eps: float = MU_EPS,
) -> float:
    """μ = Σ_i p_i ‖∇F_i(w^i) − ∇F_i(w)‖ / (‖w^i − w‖ + eps) with p_i = weights/Σ weights
    (§4.6.1; the authors' code estimators put other numerators over the same distances).

    Returns NaN when no client reported (the caller then keeps the previous τ).
    """
    num = np.asarray(grad_diff_norms, dtype=float)
    den = np.asarray(model_distances, dtype=float)
    p = np.asarray(weights, dtype=float)
    if num.size == 0 or p.sum() <= 0:
        return float("nan")
    return float(np.sum(p / p.sum() * num / (den + eps)))


def displacement_norm(before: Params, after: Params) -> float:
    """‖w_after − w_before‖ over every tensor: the numerator of the authors' PyTorch μ
    (§4.6.1 [CODE, PyTorch]: the "gradient" difference it takes is of model copies around
    the last local step, i.e. that step's noisy update)."""
    return math.sqrt(sum(float((after[n] - before[n]).double().pow(2).sum()) for n in after))


class AliDpfl(UniformCohortAlgorithm):
    """ALI-DPFL (Algorithm 2 of the paper): DP-SGD clients, adaptive τ* on the server.

    Args:
        clients_per_round: Cohort size (the paper: all N = 10 clients every round).
        rounds_budget: R_s.
        iteration_budget: R_c (per client, from `iteration_budget`).
        lr: η (constant, plain SGD).
        clip_norm: C.
        noise_multiplier: σ (fixed; the budget sets R_c, not σ).
        sampling_rate: q.
        num_params: d, the model's trainable parameters.
        min_batch: B̂ = max(1, q·min_i |D_i|) (A21).
        gamma: Γ, the heterogeneity hyperparameter (10 for Dir(0.05); Table V).
        gamma_mode: ``fixed`` (the paper) or ``code_estimate`` (the authors' code: Γ ←
            |Σ p_i Δloss_i| over each client's last local step, §4.6.2).
        mu_probe_size: Records in each client's μ probe; None = all its records.
        mu_estimator: The numerator of μ (§4.6.1, A9). ``paper``: ‖∇F̂_i(w^i) − ∇F̂_i(w)‖
            on a probe of raw records, a follow-up task after aggregation (unaccounted).
            ``code_torch`` (the authors' PyTorch code): ‖w_after − w_before‖ of the last
            local step, the noisy step itself (a function of DP-SGD's outputs, so nothing
            is released beyond the charged steps). ``code_mindspore`` (their MindSpore
            port): ‖∇ℓ_B(w_after) − ∇ℓ_B(w_before)‖ on the last step's batch, unclipped
            and un-noised (unaccounted). Both code forms divide by ‖w^i − w(k+1)‖ + 1e-6.
        tau_formula: Eq. 9 (``paper``), the code's (2 + 2/T) (``code``) or the β = 2/μ
            consistent form (``consistent``), see `tau_star`.
        tau_init: τ of the first round (A14: 1).
        tau_max: Upper clamp of τ* ([CODE]: 100).
        last_round: ``truncate`` (τ_k = min(τ*, R_c − t)) or ``skip`` (stop when τ* does
            not fit, the code's behaviour).
        normalizer: DP-SGD divisor. ``expected`` divides the noisy clipped sum by q·|D_i|
            (the default: a fixed public divisor, so the released step is the sampled
            Gaussian mechanism the accountant analyses). ``actual`` divides by the
            realised |B| and skips empty batches (the paper's Eq. 3 and A8); the
            divisor then depends on the data, which the SGM analysis does not cover,
            so runs with it are labelled in `unaccounted_releases`. ``fixed`` divides by
            the constant `fixed_divisor` (the authors' code: 64, A7); a public constant,
            so as sound as ``expected`` (it rescales each client's step by q·|D_i|/64).
        fixed_divisor: The divisor of ``normalizer="fixed"``.
    """

    name = "ali_dpfl"
    is_private = True
    linear_aggregation = False  # μ needs each client's local model

    def __init__(
        self,
        *,
        clients_per_round: int,
        rounds_budget: int,
        iteration_budget: int,
        lr: float,
        clip_norm: float,
        noise_multiplier: float,
        sampling_rate: float,
        num_params: int,
        min_batch: float,
        gamma: float = 10.0,
        gamma_mode: GammaMode = "fixed",
        mu_probe_size: int | None = 512,
        mu_estimator: MuEstimator = "paper",
        tau_formula: TauFormula = "paper",
        tau_init: int = 1,
        tau_max: int = TAU_MAX,
        last_round: LastRound = "truncate",
        normalizer: Normalizer = "expected",
        fixed_divisor: float = 64.0,
    ) -> None:
        if iteration_budget < 1:
            raise ValueError(f"iteration_budget (R_c) must be >= 1, got {iteration_budget}")
        if rounds_budget < 1:
            raise ValueError(f"rounds_budget (R_s) must be >= 1, got {rounds_budget}")
        self.clients_per_round = clients_per_round
        self.rounds_budget = rounds_budget
        self.iteration_budget = iteration_budget
        self.lr = lr
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampling_rate
        self.num_params = num_params
        self.min_batch = max(1.0, float(min_batch))
        self.gamma = gamma
        self.gamma_mode = gamma_mode
        self.mu_probe_size = mu_probe_size
        if mu_estimator not in ("paper", "code_torch", "code_mindspore"):
            raise ValueError(
                f"mu_estimator must be paper, code_torch or code_mindspore, got {mu_estimator!r}"
            )
        self.mu_estimator = mu_estimator
        self.tau_formula = tau_formula
        self.tau_max = tau_max
        self.last_round = last_round
        self.normalizer = normalizer
        self.fixed_divisor = fixed_divisor
        # Lemma 1: with at least as many rounds as iterations, τ = 1 throughout.
        self.adaptive = rounds_budget < iteration_budget
        # Server state (the client half never reads it).
        self.iterations_done = 0  # t, per client (every client runs the same schedule)
        self.rounds_done = 0  # k
        self.tau_next = max(1, min(tau_init, tau_max)) if self.adaptive else 1
        self.tau_current = 0
        self._local_models: dict[int, Params] = {}
        self._weights: dict[int, float] = {}
        self._new_params: Params = {}
        self._code_numerators: dict[int, float] = {}  # the code estimators', from training

    # ---- server half ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "iterations_done": self.iterations_done,
            "rounds_done": self.rounds_done,
            "tau_next": self.tau_next,
            "tau_current": self.tau_current,
            "gamma": self.gamma,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.iterations_done = int(state["iterations_done"])
        self.rounds_done = int(state["rounds_done"])
        self.tau_next = int(state["tau_next"])
        self.tau_current = int(state["tau_current"])
        self.gamma = float(state["gamma"])

    def _tau_for_round(self) -> int:
        remaining = self.iteration_budget - self.iterations_done
        return min(self.tau_next, remaining)

    def stop_reason(self) -> str | None:
        remaining = self.iteration_budget - self.iterations_done
        if remaining <= 0:
            return f"R_c exhausted ({self.iterations_done} DP-SGD iterations per client)"
        if self.last_round == "skip" and self.tau_next > remaining:
            return (
                f"R_c nearly exhausted: the next tau ({self.tau_next}) does not fit in the "
                f"{remaining} iteration(s) left (last_round=skip)"
            )
        if self.rounds_done >= self.rounds_budget:
            return f"R_s exhausted ({self.rounds_done} rounds)"
        return None

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        tau = self._tau_for_round()
        self.tau_current = tau
        self.iterations_done += tau
        self.rounds_done += 1
        step = SubsampledGaussian(self.noise_multiplier, self.clip_norm, self.sampling_rate)
        steps = (uses(step, tau),)
        extras = {"estimate_gamma": 1.0} if self.gamma_mode == "code_estimate" else {}
        if self.adaptive and self.mu_estimator != "paper":
            extras["mu_probe"] = 1.0 if self.mu_estimator == "code_torch" else 2.0
        return [
            ClientTask(
                client_id=c,
                round_idx=round_idx,
                local_steps=tau,
                lr=self.lr,
                mechanisms=steps,
                extras=extras,
            )
            for c in cohort
        ]

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        new = super().aggregate(global_params, tasks, results)  # FedAvg's weighted mean
        if self.gamma_mode == "code_estimate":
            self._estimate_gamma(results)
        self._local_models, self._weights = {}, {}
        if self.adaptive:
            # w^i = w + Δ_i, kept until the μ statistics of this round are in.
            for r in results:
                self._local_models[r.client_id] = {
                    n: global_params[n] + r.update[n] for n in global_params
                }
                self._weights[r.client_id] = r.weight
                if "mu_numerator" in r.metrics:
                    self._code_numerators[r.client_id] = r.metrics["mu_numerator"]
            self._new_params = new
        return new

    def _estimate_gamma(self, results: Sequence[ClientResult]) -> None:
        """Γ ← |Σ_i p_i Δloss_i| over each client's last local step (§4.6.2 [CODE])."""
        reported = [r for r in results if "last_step_loss_change" in r.metrics]
        total = sum(r.weight for r in reported)
        if total > 0:
            self.gamma = abs(
                sum(r.weight * r.metrics["last_step_loss_change"] for r in reported) / total
            )

    def followups_due(
        self, round_idx: int, results: Sequence[ClientResult], new_params: Params
    ) -> bool:
        """A ``mu_stats`` follow-up per client when the paper's μ decides the next τ."""
        if not self.adaptive or self._ends_after_this_round() or self.mu_estimator != "paper":
            return False  # the code estimators' numerators came with the training results
        self._new_params = new_params
        return True

    def followup_task(self, round_idx: int, result: ClientResult) -> ClientTask:
        probe = float(self.mu_probe_size) if self.mu_probe_size is not None else 0.0
        return ClientTask(
            client_id=result.client_id,
            round_idx=round_idx,
            local_steps=0,
            lr=0.0,
            kind="mu_stats",
            payload=self._local_models[result.client_id],
            extras={"probe_size": probe},
        )

    def _ends_after_this_round(self) -> bool:
        """The run ends after this round whatever τ* is (so no μ is needed)."""
        return (
            self.iterations_done >= self.iteration_budget or self.rounds_done >= self.rounds_budget
        )

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        out = {"tau": float(self.tau_current), "iterations_done": float(self.iterations_done)}
        if self.mu_estimator == "paper":
            reported = {r.client_id: r.metrics["mu_grad_diff"] for r in followups}
            eps = MU_EPS
        elif self._ends_after_this_round():
            reported, eps = {}, CODE_MU_EPS
        else:
            reported, eps = dict(self._code_numerators), CODE_MU_EPS
        if self.adaptive and reported:
            new = self._new_params
            distances, numerators, weights = [], [], []
            for client, numerator in reported.items():
                local = self._local_models[client]
                distances.append(
                    math.sqrt(sum(float((local[n] - new[n]).pow(2).sum()) for n in new))
                )
                numerators.append(numerator)
                weights.append(self._weights[client])
            mu = secant_mu(numerators, distances, weights, eps)
            # T = min(R_s·τ_prev, R_c) with the totals, not what remains (§4.6, A13).
            total = min(self.rounds_budget * max(self.tau_current, 1), self.iteration_budget)
            out.update(mu=mu, gamma=float(self.gamma), tau_T=float(total))
            if math.isfinite(mu) and mu > 0:  # else keep the previous τ
                raw = tau_star(
                    mu=mu,
                    gamma=self.gamma,
                    total_iterations=total,
                    clip_norm=self.clip_norm,
                    noise_multiplier=self.noise_multiplier,
                    num_params=self.num_params,
                    min_batch=self.min_batch,
                    variant=self.tau_formula,
                )
                # Truncation to R_c − t happens when the next round is planned.
                self.tau_next = round_tau(raw, tau_max=self.tau_max)
                out["tau_raw"] = raw
        self._local_models, self._weights, self._new_params = {}, {}, {}
        self._code_numerators = {}
        out["tau_next"] = float(self.tau_next)
        return out

    def unaccounted_releases(self) -> list[str]:
        out = [
            "client_dataset_sizes (aggregation weights p_i and, if normalizer=expected, "
            "the DP-SGD divisor q*|D_i|; B-hat = q*min|D_i|)"
        ]
        if self.adaptive and self.mu_estimator == "paper":
            out.append(
                "mu_statistics (per client and round: the norm of the difference of the mean "
                "unclipped gradients at its local model and at the new global model, on a "
                "probe of its raw training records; feeds tau*, not privatised)"
            )
        if self.adaptive and self.mu_estimator == "code_mindspore":
            out.append(
                "mu_statistics (per client and round, the authors' MindSpore estimator: the "
                "norm of the difference of the mean unclipped gradients on the last local "
                "step's batch before and after that step; feeds tau*, not privatised)"
            )
        if self.gamma_mode == "code_estimate":
            out.append(
                "gamma_estimate (per client and round: the loss change over its last local "
                "step on that step's batch; not privatised)"
            )
        if self.normalizer == "actual":
            out.append(ACTUAL_DIVISOR_RELEASE)
        out.append(
            "client_training_metrics (mean realised Poisson batch size and clipped fraction, "
            "in rounds.parquet)"
        )
        return out

    # ---- client half ---------------------------------------------------------------
    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == "mu_stats":
            return self._mu_stats(ctx, params, data, task)
        if task.kind != "train":
            raise ValueError(f"ali_dpfl has no task kind {task.kind!r}")
        probe = {1.0: _torch_mu_probe, 2.0: _mindspore_mu_probe(ctx.model)}.get(
            float(task.extras.get("mu_probe", 0.0))
        )
        return dp_sgd_local_update(
            ctx,
            params,
            data,
            task,
            normalizer=self.normalizer,
            fixed_divisor=self.fixed_divisor,
            track_last_loss=bool(task.extras.get("estimate_gamma", 0.0)),
            last_step_probe=probe,
        )

    def _mu_stats(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        """‖∇F̂_i(w^i) − ∇F̂_i(w)‖ on one probe of the client's records (§4.6.1 [REC])."""
        assert task.payload is not None  # set by followup_tasks
        n = data.num_examples
        probe = int(task.extras.get("probe_size", 0.0)) or n
        positions = torch.randperm(n, generator=ctx.generator, device=ctx.generator.device)
        x, y = data.batch(positions[: min(probe, n)])
        at_local = mean_gradient(ctx.model, dict(task.payload), x, y)
        at_global = mean_gradient(ctx.model, params, x, y)
        return ClientResult(
            client_id=task.client_id,
            update={},
            weight=0.0,
            num_examples=n,
            metrics={"mu_grad_diff": float((at_local - at_global).norm())},
        )


def _torch_mu_probe(before: Params, after: Params, x, y) -> dict[str, float]:
    """The authors' PyTorch μ numerator: the last local step's displacement."""
    return {"mu_numerator": displacement_norm(before, after)}


def _mindspore_mu_probe(model: torch.nn.Module):
    """The authors' MindSpore μ numerator: the last batch's mean-gradient difference."""

    def probe(before: Params, after: Params, x, y) -> dict[str, float]:
        diff = mean_gradient(model, after, x, y) - mean_gradient(model, before, x, y)
        return {"mu_numerator": float(diff.norm())}

    return probe


class DPFedAvgFixedTau(AliDpfl):
    """FedAvg + DP-SGD with a fixed τ under ALI-DPFL's caps (the paper's "τ = k" rows).

    K = min(R_s, ⌊R_c/τ⌋) rounds of exactly τ iterations (A17), so the total stays
    within R_c and ε. No μ statistics are gathered.
    """

    name = "dp_fedavg_fixed_tau"

    def __init__(self, *, local_steps: int, **kwargs) -> None:
        if local_steps < 1:
            raise ValueError(f"local_steps (tau) must be >= 1, got {local_steps}")
        kwargs.update(gamma_mode="fixed", last_round="skip")
        super().__init__(**kwargs)
        self.adaptive = False  # τ never changes: no μ statistics, no τ*
        self.tau_next = local_steps
