"""DPFL-BCS: biased client selection under heterogeneous per-client DP (seed 003, issue 6).

Paper: Ma et al., "The Power of Bias: Optimizing Client Selection in Federated Learning with
Heterogeneous Differential Privacy"; spec shared/specs/dpfl-bcs.md (cited as §). The maths is
in this folder's `calibration`, `bound`, `planning`, `estimation` and `sampling` modules, the
client half in `client` (`BcsClientStep`); this module is the server half and the class.

Client half (Algorithm 2, §6.5 ClientStep): one full-batch step from the broadcast model.
Per-sample gradients of all D_n records are clipped (L2 to B for the Gaussian mechanism, L1 to
B for Laplace), averaged and scaled by η_t: g = η_t·(1/D_n)·Σ clip(∇f). In stage 1 (t ≤ T0)
the client also computes the per-sample losses clipped at Θ at ŵ^{t−1} and at the clean local
model ŵ^{t−1} − g (the paper's choice, §13.13), and releases the (d+2)-vector
[g; η_t·ℓ_a; η_t·ℓ_b] plus noise calibrated to Δg′ = 2η_t(B+Θ)/D_n (Eq. 13); in stage 2 it
releases g plus noise calibrated to Δg = 2η_tB/D_n (Lemmas 1–2). It uploads ĝ (as the update
−ĝ) and, in stage 1, the noisy losses F̂ = (η_t ℓ + z)/η_t.

Server half (Algorithm 1, §6.5): stage 1 selects by Proposition 1's plan (the capped IID
solution of P1 over the whole horizon, rounded to integers by largest remainder); at t = T0
it estimates Γ̂_n (Eq. 8), ρ̂_min (Eq. 9) and (L, μ, γ) by P2 (or takes Table III / fixed
values, §9.5), solves P1 exactly for T' = T − T0 with the remaining budgets and the cap
T_n ≤ T', rounds it, and switches p_n = T_n/(K·T'). Every round draws K distinct clients by
systematic PPS with inclusion probabilities K·p_n among those with budget and plan left
(§6.4), aggregates the noisy updates with equal weights 1/|S_t| (no importance reweighting),
and applies the optional server-side weight decay ŵ ← ŵ − η_t·λ·ŵ^{t−1} and server momentum
v ← βv + Δ, ŵ ← ŵ + v (both post-processing; §11.5 [REC], off by default). η_t = η0/(1 + t/τ)
(§11.5, t = 1..T).

Privacy (unit: one training record of one client; replace-one adjacency, hence the factor 2
in the sensitivities): client n has its own (ε_n, δ_n) for the whole run. At each stage start
its remaining budget is split evenly over its integer plan T_n ≥ 1 (Algorithm 2 line 5), in
the calibration's units, shrunk by a relative 1e-9 so rounding can never overdraw:

- Laplace: ε^l = ε_rem/T_n, b = Δ₁/ε^l, charged as a ``laplace`` release (pure ε^l).
- Gaussian ``zcdp`` (default): ρ^l = ρ_rem/T_n with ρ_n = zcdp_rho(ε_n, δ_n), σ = Δ/√(2ρ^l),
  charged as a full-batch Gaussian step (q = 1) with noise multiplier σ/Δ; the ``zcdp``
  accountant then reports ρ + 2√(ρ ln 1/δ_n) ≤ ε_n.
- Gaussian ``paper_alg2``: (ε^l, δ^l) = (ε_rem, δ_rem)/T_n, σ by Theorem 1 (analytic Gaussian
  when ε^l ≥ 1), charged as an ``approx_dp`` release declared (ε^l, δ^l) (basic composition).
- Gaussian ``thm2_c2``: σ = c2·Δ·√(T_n ln(1/δ_rem))/ε_rem, charged as a Gaussian step; only
  the ledger's accountant decides what it costs, and a client it would overdraw is refused.

The stage-1 loss values are part of the charged (d+2)-dimensional release. Each task's cost
is charged to the client's own ledger entry before dispatch; a refused client is never
selected again, nor is a client whose plan or budget is used up. Released without accounting:
the clients' (ε_n, δ_n) and D_n (reported in the clear and used for Φ_n; the selection
frequencies reveal them, §10) — see `unaccounted_releases`.

Baselines share this class (`selection="uniform"`): DPSGD (Gaussian), DMLDP (Laplace), WeiAvg
and PFA (aggregation rules in `dpfl_bcs_baselines`), and FedSGD (`BcsFedSgd`, no clipping or
noise). Uniform baselines split each budget over the uniform plan T_n = K·T/N and upload no
losses (§11.7 [REC]). PRIVATEFL and PRIVATEFL-BCS (Table I) subclass it in
`raydpfl.papers.dpfl_bcs.privatefl` (a per-client input transformation, trained jointly under the
same clip and noise, kept by the server half per client and shipped in the task payload).

Regression (``regression=True``, the paper's convex linear-regression case): the model has one
output, the targets are real values and the per-sample loss is the squared error (ŷ − y)²,
used for the clipped gradients and, clipped at Θ, for the stage-1 loss reports; everything
else (sensitivities, calibration, selection) is unchanged. Classification uses cross-entropy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from raydpfl.algorithms.base import (
    Algorithm,
    ClientResult,
    ClientTask,
    Params,
)
from raydpfl.algorithms.tensor_state import pack_tensors, unpack_tensor_state
from raydpfl.papers.dpfl_bcs import baselines as bl
from raydpfl.papers.dpfl_bcs.bound import p1_ratio
from raydpfl.papers.dpfl_bcs.calibration import (
    DEFAULT_C2,
    GaussianCalibration,
    NoiseConstants,
    gaussian_noise_std,
    gradient_sensitivity,
    laplace_noise_scale,
    noise_constants,
    paper_alg2_sigma,
    stage1_sensitivity,
)
from raydpfl.papers.dpfl_bcs.client import BcsClientStep
from raydpfl.papers.dpfl_bcs.estimation import (
    P2_START,
    Table3Row,
    estimate_noniid_degree,
    estimate_rho_min,
    solve_p2,
    stage1_global_loss,
)
from raydpfl.papers.dpfl_bcs.planning import round_plan, solve_p1
from raydpfl.papers.dpfl_bcs.sampling import sample_clients
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.accounting.single_release import (
    gaussian_sigma_zcdp,
    zcdp_epsilon,
    zcdp_rho,
)
from raydpfl.privacy.mechanisms.kernel import (
    CertifiedGaussianRelease,
    GaussianRelease,
    LaplaceRelease,
    laplace_noise,  # noqa: F401  (re-exported: the Laplace draw lives in the kernel)
    uses,
)

Mechanism = Literal["gaussian", "laplace", "none"]
Selection = Literal["bcs", "uniform"]
Aggregation = Literal["mean", "weiavg", "pfa"]
Constants = Literal["estimate", "table3", "fixed"]

#: Relative shrink of every per-participation share: floating-point rounding of T_n shares
#: can then never push a client's total above its budget.
BUDGET_SLACK = 1e-9
#: A remaining budget at or below this fraction of the total counts as spent.
SPENT_TOL = 1e-6


def learning_rate(lr0: float, tau: float, t: int) -> float:
    """η_t = η0/(1 + t/τ), the experiments' schedule (§11.5), rounds t = 1..T."""
    return lr0 / (1.0 + t / tau)


class DpflBcs(BcsClientStep, Algorithm):
    """DPFL-BCS (``selection="bcs"``) and its uniform-selection DP baselines."""

    name = "dpfl_bcs"
    is_private = True
    linear_aggregation = False

    def __init__(
        self,
        *,
        clients_per_round: int,
        rounds: int,
        lr: float,
        lr_decay_tau: float,
        clip_norm: float,
        mechanism: Mechanism,
        epsilons: Sequence[float],
        deltas: Sequence[float],
        train_sizes: Sequence[int],
        num_params: int,
        selection: Selection = "bcs",
        stage1_rounds: int = 10,
        calibration: GaussianCalibration = "zcdp",
        c2: float = DEFAULT_C2,
        loss_bound: float = math.log(10.0),
        aggregation: Aggregation = "mean",
        constants: Constants = "estimate",
        fixed_constants: Table3Row | None = None,
        z_override: float | None = None,
        sampler: Literal["systematic", "choice"] = "systematic",
        weight_decay: float = 0.0,
        server_momentum: float = 0.0,
        pfa_public_fraction: float = 0.5,
        pfa_rank: int = 1,
        regression: bool = False,
    ) -> None:
        self.k = int(clients_per_round)
        self.regression = bool(regression)  # MSE on one output and float targets
        self.rounds = int(rounds)
        self.lr0, self.lr_tau = float(lr), float(lr_decay_tau)
        self.clip = float(clip_norm)
        self.mechanism = mechanism
        self.selection = selection
        self.t0 = int(stage1_rounds) if selection == "bcs" else 0
        self.calibration = calibration
        self.c2 = float(c2)
        self.loss_bound = float(loss_bound)
        self.aggregation = aggregation
        self.constants = constants
        self.fixed_constants = fixed_constants
        self.z_override = z_override
        self.sampler = sampler
        self.weight_decay = float(weight_decay)
        self.server_momentum = float(server_momentum)
        self._velocity: Params | None = None  # server momentum v (checkpointed as tensors)
        self.pfa_public_fraction = float(pfa_public_fraction)
        self.pfa_rank = int(pfa_rank)
        self._init_clients(epsilons, deltas, train_sizes, num_params)
        self._init_plan()

    def _init_clients(
        self,
        epsilons: Sequence[float],
        deltas: Sequence[float],
        train_sizes: Sequence[int],
        num_params: int,
    ) -> None:
        """The clients' budgets and sizes, checked, and the run's per-client counters."""
        self.eps = np.asarray(epsilons, dtype=float)
        self.deltas = np.asarray(deltas, dtype=float)
        self.sizes = np.asarray(train_sizes, dtype=float)
        self.num_params = int(num_params)
        self.n = self.sizes.size
        if self.eps.shape != (self.n,) or self.deltas.shape != (self.n,):
            raise ValueError("epsilons, deltas and train_sizes must have one entry per client")
        if self.k > self.n:
            raise ValueError(f"clients_per_round ({self.k}) > number of clients ({self.n})")
        if self.selection == "bcs" and not 2 <= self.t0 < self.rounds:
            raise ValueError(f"stage1_rounds must be in [2, rounds), got {self.t0}")
        self.private = self.mechanism != "none"
        if self.private and np.any(self.eps <= 0):
            raise ValueError("every epsilon_n must be > 0")
        if self.mechanism == "gaussian" and np.any((self.deltas <= 0) | (self.deltas >= 1)):
            raise ValueError("the Gaussian mechanism needs every delta_n in (0, 1)")
        self.pfa_public = (
            bl.pfa_public_mask(self.eps, self.pfa_public_fraction)
            if self.aggregation == "pfa"
            else np.zeros(self.n, dtype=bool)
        )
        # Remaining budgets in the calibration's units (the ledger is the source of truth).
        self.rem_eps = self.eps.copy()
        self.rem_delta = self.deltas.copy() if self.mechanism == "gaussian" else np.zeros(self.n)
        self.rho_total = (
            np.array([zcdp_rho(e, d) for e, d in zip(self.eps, self.deltas, strict=True)])
            if self.mechanism == "gaussian" and self.calibration == "zcdp"
            else np.zeros(self.n)
        )
        self.rem_rho = self.rho_total.copy()
        self.excluded = np.zeros(self.n, dtype=bool)  # refused or exhausted: never again
        self.total_counts = np.zeros(self.n, dtype=np.int64)
        self.loss_before = np.full((max(self.t0, 1), self.n), np.nan)
        self.loss_after = np.full((max(self.t0, 1), self.n), np.nan)
        self.selected_stage1 = np.zeros((max(self.t0, 1), self.n), dtype=bool)
        self.estimates: dict[str, Any] = {}
        self.plan_history: dict[str, list[int]] = {}
        self.stage = 1 if self.selection == "bcs" else 2

    def _init_plan(self) -> None:
        """Installs the first stage's integer plan (stage 1 under BCS, else the only one)."""
        horizon = self.rounds - self.t0 if self.selection == "bcs" else self.rounds
        if self.selection == "bcs":
            # Stage 1: Proposition 1's plan over the whole horizon T, capped at T (§8.3, §8.5).
            phi = self._noise_constants(np.arange(self.n)).phi
            z = self._z(self._noise_constants(np.arange(self.n)).z)
            relaxed = solve_p1(phi, np.zeros(self.n), 0.0, self.k * self.rounds, self.rounds, z)
            self._start_stage(round_plan(relaxed, self.k * self.rounds, self.rounds), 1)
        elif not self.private:  # FedSGD: no budget, so no plan limits participation
            self._start_stage(np.full(self.n, horizon, dtype=np.int64), 2)
        else:
            uniform = np.full(self.n, self.k * horizon / self.n)
            self._start_stage(round_plan(uniform, self.k * horizon, horizon), 2)

    # ---- budgets and plans -----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_velocity"] = None  # server-only state
        return state

    def _z(self, z: float) -> float:
        return float(self.z_override) if self.z_override is not None else float(z)

    def _noise_constants(self, idx: np.ndarray) -> NoiseConstants:
        """(Λ, z, Φ_n) of Eq. (7) at the clients' remaining budgets (§9.1 [REC])."""
        mech = "laplace" if self.mechanism == "laplace" else "gaussian"
        return noise_constants(
            mech,
            self.clip,
            self.num_params,
            self.sizes[idx],
            epsilon=np.maximum(self.rem_eps[idx], 1e-300),
            delta=np.clip(self.rem_delta[idx], 1e-300, 1 - 1e-12) if mech == "gaussian" else None,
            rho=np.maximum(self.rem_rho[idx], 1e-300) if self.calibration == "zcdp" else None,
            calibration=self.calibration,
            c2=self.c2,
        )

    def _start_stage(self, plan: np.ndarray, stage: int) -> None:
        """Installs an integer plan: p_n, counters and each client's per-participation share."""
        self.stage = stage
        self.tplan = np.asarray(plan, dtype=np.int64)
        horizon = self.rounds - self.t0 if stage == 2 else self.rounds
        self.probs = self.tplan / float(self.tplan.sum()) if self.tplan.sum() else self.tplan * 0.0
        self.stage_counts = np.zeros(self.n, dtype=np.int64)
        self.plan_history[f"stage{stage}"] = [int(v) for v in self.tplan]
        self.horizon = horizon
        self.share = np.zeros(self.n)  # per-participation ε^l (or ρ^l)
        self.share_delta = np.zeros(self.n)
        self.multiplier = np.zeros(self.n)  # noise std (or Laplace scale) / sensitivity
        if not self.private:
            return
        for c in np.flatnonzero(self.tplan > 0):
            t_n = int(self.tplan[c])
            if self.mechanism == "laplace":
                self.share[c] = self.rem_eps[c] / t_n * (1 - BUDGET_SLACK)
                self.multiplier[c] = laplace_noise_scale(1.0, self.share[c], 1)
            elif self.calibration == "zcdp":
                self.share[c] = self.rem_rho[c] / t_n * (1 - BUDGET_SLACK)
                self.multiplier[c] = gaussian_sigma_zcdp(1.0, self.share[c])
            elif self.calibration == "paper_alg2":
                self.share[c] = self.rem_eps[c] / t_n * (1 - BUDGET_SLACK)
                self.share_delta[c] = self.rem_delta[c] / t_n * (1 - BUDGET_SLACK)
                self.multiplier[c] = paper_alg2_sigma(1.0, self.share[c], self.share_delta[c])
            else:  # thm2_c2: Lemma 1 literally; the ledger's accountant prices it
                self.share[c] = self.rem_eps[c] / t_n
                self.share_delta[c] = self.rem_delta[c] / t_n
                self.multiplier[c] = gaussian_noise_std(
                    1.0, self.rem_eps[c], self.rem_delta[c], t_n, calibration="thm2_c2", c2=self.c2
                )

    def cost_of(self, client: int) -> PrivacyCost | None:
        """What one participation of `client` in the current stage is charged."""
        mech = self.mechanism_of(client, 1.0)
        return None if mech is None else mech.cost(1)

    def mechanism_of(
        self, client: int, sensitivity: float
    ) -> GaussianRelease | LaplaceRelease | None:
        """The release one participation of `client` makes in the current stage: its
        noise multiplier (or Laplace scale) over the step's `sensitivity`."""
        if not self.private:
            return None
        mult = float(self.multiplier[client])
        if self.mechanism == "laplace":
            return LaplaceRelease(mult, sensitivity)
        if self.calibration == "paper_alg2":
            return CertifiedGaussianRelease(
                mult,
                sensitivity,
                epsilon=float(self.share[client]),
                delta=float(self.share_delta[client]),
            )
        return GaussianRelease(mult, sensitivity)

    def available(self) -> np.ndarray:
        """The candidate set 𝒜: plan left in this stage, budget left, never refused."""
        ok = (self.tplan > self.stage_counts) & ~self.excluded
        if self.private:
            if self.mechanism == "gaussian" and self.calibration == "zcdp":
                ok &= self.rem_rho > SPENT_TOL * np.maximum(self.rho_total, 1e-300)
            else:
                ok &= self.rem_eps > SPENT_TOL * self.eps
        return ok

    # ---- server half -----------------------------------------------------------------
    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        if num_clients != self.n:
            raise ValueError(f"built for {self.n} clients, the server has {num_clients}")
        avail = self.available()
        if not avail.any():
            return []
        weights = self.probs if self.selection == "bcs" else np.ones(self.n)
        if self.sampler == "choice":
            idx = np.flatnonzero(avail & (weights > 0))
            p = weights[idx] / weights[idx].sum()
            chosen = rng.choice(idx, size=min(self.k, idx.size), replace=False, p=p)
            return sorted(int(c) for c in chosen)
        return [int(c) for c in sample_clients(weights, self.k, rng, avail)]

    def lr_at(self, round_idx: int) -> float:
        """η_t of 0-based round `round_idx` (t = round_idx + 1)."""
        return learning_rate(self.lr0, self.lr_tau, round_idx + 1)

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        lr = self.lr_at(round_idx)
        stage1 = self.selection == "bcs" and round_idx < self.t0
        tasks = []
        for c in cohort:
            size = float(train_sizes[c])
            if stage1:
                sens = stage1_sensitivity(lr, self.clip, self.loss_bound, size)
            else:
                sens = gradient_sensitivity(lr, self.clip, size)
            release = self.mechanism_of(int(c), sens)
            tasks.append(
                ClientTask(
                    client_id=int(c),
                    round_idx=round_idx,
                    local_steps=1,
                    lr=lr,
                    mechanisms=() if release is None else (uses(release, 1),),
                    extras={"stage1": float(stage1)},
                )
            )
        self._planned = [int(c) for c in cohort]
        return tasks

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        dispatched = {t.client_id for t in tasks}
        for c in getattr(self, "_planned", []):
            if c not in dispatched:  # refused by the ledger: it never trains again
                self.excluded[c] = True
        self._planned = []
        round_idx = tasks[0].round_idx if tasks else None
        for t in tasks:
            self._spend(t.client_id)
        for r in results:
            if round_idx is not None and round_idx < self.t0 and "loss_before" in r.metrics:
                self.loss_before[round_idx, r.client_id] = r.metrics["loss_before"]
                self.loss_after[round_idx, r.client_id] = r.metrics["loss_after"]
                self.selected_stage1[round_idx, r.client_id] = True
        new = {n: t.clone() for n, t in global_params.items()}
        if not results:
            return new
        update = self._combine(results)
        if self.server_momentum:  # v ← βv + Δ, ŵ ← ŵ + v: post-processing (§11.5 [REC])
            if self._velocity is None:
                self._velocity = {n: u.clone() for n, u in update.items()}
            else:
                for n, u in update.items():
                    self._velocity[n].mul_(self.server_momentum).add_(u)
            update = self._velocity
        lr = tasks[0].lr
        for name, t in new.items():
            t.add_(update[name])
            if self.weight_decay:
                t.sub_(global_params[name], alpha=lr * self.weight_decay)
        return new

    def _combine(self, results: Sequence[ClientResult]) -> Params:
        """1/|S_t| mean (DPFL-BCS, DPSGD, DMLDP, FedSGD), ε-weights (WeiAvg) or PFA."""
        like = results[0].update
        vectors = [bl.flatten(r.update) for r in results]
        ids = [r.client_id for r in results]
        if self.aggregation == "mean":
            weights = np.full(len(results), 1.0 / len(results))
        else:
            weights = bl.weiavg_weights(self.eps[ids])
        if self.aggregation == "pfa":
            public = [i for i, c in enumerate(ids) if self.pfa_public[c]]
            private = [i for i, c in enumerate(ids) if not self.pfa_public[c]]
            if public and private:
                projected, _ = bl.project_onto_public(
                    torch.stack([vectors[i] for i in public]),
                    torch.stack([vectors[i] for i in private]),
                    self.pfa_rank,
                )
                for row, i in enumerate(private):
                    vectors[i] = projected[row]
        return bl.unflatten(bl.weighted_mean(vectors, weights), like)

    def _spend(self, c: int) -> None:
        self.stage_counts[c] += 1
        self.total_counts[c] += 1
        if not self.private:
            return
        if self.mechanism == "gaussian" and self.calibration == "zcdp":
            self.rem_rho[c] = max(0.0, self.rem_rho[c] - self.share[c])
            # The (ε, δ) left, for reporting: the conversion of the remaining ρ.
            self.rem_eps[c] = zcdp_epsilon(self.rem_rho[c], self.deltas[c])
        else:
            self.rem_eps[c] = max(0.0, self.rem_eps[c] - self.share[c])
            self.rem_delta[c] = max(0.0, self.rem_delta[c] - self.share_delta[c])

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        out = {"bcs_stage": float(self.stage), "bcs_available": float(self.available().sum())}
        if self.selection == "bcs" and round_idx == self.t0 - 1:
            out.update(self._switch_to_stage2())
        return out

    def _switch_to_stage2(self) -> dict[str, float]:
        """t = T0: Γ̂ (Eq. 8), ρ̂_min (Eq. 9), P2 or overrides, P1 for T − T0 (Alg. 1 22–27)."""
        t0, k = self.t0, self.k
        reported = ~np.all(np.isnan(self.loss_before), axis=0)
        gamma = (
            estimate_noniid_degree(self.loss_before, self.loss_after)
            if reported.any()
            else np.zeros(self.n)
        )
        counts = self.selected_stage1[: t0 - 1].sum(axis=0).astype(float)
        ref = self.loss_before[t0 - 1]
        est: dict[str, Any] = {"rho_min_fallback": False, "p2_fallback": False}
        try:
            rho_min = estimate_rho_min(counts, ref, k, t0)
        except ValueError:
            rho_min, est["rho_min_fallback"] = 1.0, True
        nc1 = noise_constants(
            "laplace" if self.mechanism == "laplace" else "gaussian",
            self.clip,
            self.num_params,
            self.sizes,
            epsilon=self.eps,
            delta=self.deltas if self.mechanism == "gaussian" else None,
            calibration=self.calibration,
            c2=self.c2,
        )
        z = self._z(nc1.z)
        p2 = None
        if self.constants == "estimate":
            try:
                p2 = solve_p2(
                    stage1_global_loss(ref),
                    counts,
                    nc1.phi,
                    gamma,
                    rho_min=max(rho_min, 0.0),
                    noise_lambda=nc1.noise_lambda,
                    z=z,
                    clients_per_round=k,
                    elapsed_rounds=t0 - 1,
                )
                lip, mu, offset = p2.smoothness, p2.strong_convexity, p2.lr_offset
            except (ValueError, RuntimeError):
                est["p2_fallback"] = True
                start = P2_START
                lip, mu, offset = start["smoothness"], start["strong_convexity"], 16.0
        else:
            assert self.fixed_constants is not None
            lip = self.fixed_constants.smoothness
            mu = self.fixed_constants.strong_convexity
            offset = self.fixed_constants.lr_offset
        active = np.flatnonzero(self.available_after_stage1())
        horizon = self.rounds - t0
        total = k * horizon
        plan = np.zeros(self.n, dtype=np.int64)
        ratio = float("nan")
        if active.size:
            nc2 = self._noise_constants(active)
            ratio = p1_ratio(lip, mu, offset, nc2.noise_lambda, k, horizon)
            if active.size * horizon <= total:
                plan[active] = horizon
            else:
                relaxed = solve_p1(nc2.phi, gamma[active], ratio, total, horizon, z)
                plan[active] = round_plan(relaxed, total, horizon)
        est.update(
            rho_min=rho_min,
            lr_offset=offset,
            smoothness=lip,
            strong_convexity=mu,
            ratio_R=ratio,
            z=z,
            noise_lambda_stage1=nc1.noise_lambda,
            noniid=[float(g) for g in gamma],
            constants_source=self.constants,
        )
        if p2 is not None:
            est.update(
                p2_init_distance_sq=p2.init_distance_sq,
                p2_grad_var=p2.grad_var,
                p2_residual=p2.residual,
                p2_sweeps=p2.sweeps,
            )
        if self.constants != "estimate":
            est["estimated_rho_min_used"] = rho_min
        self.estimates = est
        self._start_stage(plan, 2)
        return {
            "bcs_rho_min": float(rho_min),
            "bcs_lr_offset": float(offset),
            "bcs_smoothness": float(lip),
            "bcs_strong_convexity": float(mu),
            "bcs_ratio_R": float(ratio),
            "bcs_stage2_clients": float((plan > 0).sum()),
        }

    def available_after_stage1(self) -> np.ndarray:
        """Clients that keep budget after stage 1 and were never refused."""
        if not self.private:
            return ~self.excluded
        if self.mechanism == "gaussian" and self.calibration == "zcdp":
            left = self.rem_rho > SPENT_TOL * self.rho_total
        else:
            left = self.rem_eps > SPENT_TOL * self.eps
        return left & ~self.excluded

    def stop_reason(self) -> str | None:
        if not self.available().any():
            return "every client's participation plan or privacy budget is used up"
        return None

    def unaccounted_releases(self) -> list[str]:
        out = [
            "client_dataset_sizes (D_n, reported in the clear; sets Phi_n, the plan and the "
            "sensitivities)",
            "client_privacy_budgets (epsilon_n, delta_n, reported in the clear; the selection "
            "frequencies reveal them and D_n, spec §10)",
        ]
        return out

    def state_dict(self) -> dict[str, Any]:
        def arr(a: np.ndarray) -> list[Any]:
            return [None if isinstance(v, float) and math.isnan(v) else v for v in a.tolist()]

        return {
            "stage": self.stage,
            "plan": arr(self.tplan),
            "stage_counts": arr(self.stage_counts),
            "total_counts": arr(self.total_counts),
            "rem_eps": arr(self.rem_eps),
            "rem_delta": arr(self.rem_delta),
            "rem_rho": arr(self.rem_rho),
            "excluded": arr(self.excluded),
            "share": arr(self.share),
            "share_delta": arr(self.share_delta),
            "multiplier": arr(self.multiplier),
            "probs": arr(self.probs),
            "loss_before": [arr(r) for r in self.loss_before],
            "loss_after": [arr(r) for r in self.loss_after],
            "selected_stage1": [arr(r) for r in self.selected_stage1],
            "estimates": self.estimates,
            "plan_history": self.plan_history,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def arr(v: Any, dtype: Any = float) -> np.ndarray:
            return np.array([np.nan if x is None else x for x in v], dtype=dtype)

        self.stage = int(state["stage"])
        self.tplan = arr(state["plan"], np.int64)
        self.horizon = self.rounds - self.t0 if self.stage == 2 else self.rounds
        self.stage_counts = arr(state["stage_counts"], np.int64)
        self.total_counts = arr(state["total_counts"], np.int64)
        for key in ("rem_eps", "rem_delta", "rem_rho", "share", "share_delta", "multiplier"):
            setattr(self, key, arr(state[key]))
        self.probs = arr(state["probs"])
        self.excluded = arr(state["excluded"], bool)
        self.loss_before = np.array([arr(r) for r in state["loss_before"]])
        self.loss_after = np.array([arr(r) for r in state["loss_after"]])
        self.selected_stage1 = np.array([arr(r, bool) for r in state["selected_stage1"]])
        self.estimates = dict(state["estimates"])
        self.plan_history = {k: list(v) for k, v in state["plan_history"].items()}

    def tensor_state(self) -> dict[str, torch.Tensor]:
        """The server momentum v under ``velocity/<name>`` once it exists (β > 0)."""
        if self._velocity is None:
            return {}
        return pack_tensors("velocity", self._velocity)

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores v (no entry: no momentum step has run yet, v stays unset)."""
        shared, _ = unpack_tensor_state(tensors, shared=("velocity",))
        velocity = shared.get("velocity")
        if velocity is not None and not self.server_momentum:
            raise ValueError(
                "the checkpoint holds a server momentum velocity, but this run has "
                "dpfl_bcs.server_momentum = 0"
            )
        self._velocity = (
            {n: t.clone() for n, t in velocity.items()} if velocity is not None else None
        )


class BcsFedSgd(DpflBcs):
    """FedSGD (§11.7): uniform selection, one full-batch unclipped step, no noise, 1/K mean."""

    name = "bcs_fedsgd"
    is_private = False

    def unaccounted_releases(self) -> list[str]:
        return ["everything: non-private baseline (raw full-batch gradients)"]
