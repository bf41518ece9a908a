"""PE-DPFL: a classifier-perturbation regulariser locally, Gaussian noise on the upload.

Baseline of ALI-DPFL's evaluation (spec shared/specs/ali-dpfl.md §6.6, A18). Source:
X. Shen, Y. Liu, Z. Zhang, "Performance-Enhanced Federated Learning With Differential
Privacy for Internet of Things", IEEE IoT-J 2022 (doi 10.1109/JIOT.2022.3189361). We
could not read the paper; all we have is the spec's one-line description: "it adds a
regularisation term (classifier-perturbation regularisation) to the local objective and
adds noise directly to the model before upload" (settings: epoch = 1, τ = 3). Every
formula below is therefore [ASSUMED], chosen to match that description and to be
privacy-sound.

Client k, each round, from the global model w:

1. τ (`local_steps`) steps of plain SGD (no per-sample clipping, no noise) on Poisson(q)
   minibatches of its records (mean over the realised batch; an empty batch skips the
   step), on the regularised objective

       J(w) = ℓ(w) + λ·R(w),   R(w) = E_ξ[ℓ(w_body, w_cls + ξ)] − ℓ(w),   ξ ~ N(0, s²I),

   where ℓ is the batch's mean cross-entropy, w_cls the classifier (the parameters of
   the model's last parametrised module, e.g. ``linear`` of logreg, ``fc2`` of the MLP)
   and the expectation is estimated with `num_perturbations` fresh draws per step. R is
   the loss increase caused by a random perturbation of the classifier, i.e. of the
   kind the upload noise inflicts; by Jensen it is ≥ 0 in expectation for a linear
   classifier, so it is a penalty on the loss's sensitivity to that noise. Its gradient
   is ∇J = (1 − λ)∇ℓ(w) + λ·mean_j ∇ℓ(w_body, w_cls + ξ_j). λ = `reg_weight`;
   s = `perturbation_std`, by default the per-coordinate std of the noise the aggregate
   of a cohort with equal weights carries, 2zS/sqrt(clients_per_round).
2. Δ = w_τ − w is clipped to norm ≤ S (`update_clip_norm`) and uploaded as
   Δ̃ = Δ·min(1, S/‖Δ‖) + N(0, (2zS)² I); z = `noise_multiplier`.

The server takes the |D_k|-weighted mean of the Δ̃ (FedAvg).

Privacy (unit: one training record of one client, add/remove adjacency). Step 1 is not
private by itself; only Δ̃ leaves the client. Δ̃ is the Gaussian mechanism applied to
the clipped update, whose L2 sensitivity is 2S: adding or removing one record can turn
one clipped update into any other, and both lie in the ball of radius S (the update is
not a sum of per-record terms, so the tighter S of a sum query does not apply). With
noise std 2zS the noise multiplier relative to the sensitivity is z, and a full-batch
Gaussian release is the sampled Gaussian mechanism at q = 1, so every round charges a
participant `PrivacyCost(z, 1.0, 1)`, independent of τ and of q (the minibatches
sampled inside step 1 give no amplification: the upload depends on all of them).

Caps (A18): K = min(R_s, K_ε) rounds, K_ε the most rounds of that cost the ledger's
accountant allows within (ε, δ) (`calibration.max_steps_for`), counted as if every
client took part in every round (so no participant's ε can exceed the budget).
`calibrate_noise_multiplier` gives the z that makes a chosen K exactly affordable.

Released without accounting: the clients' dataset sizes (aggregation weights).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    UniformCohortAlgorithm,
    parameter_delta,
    privacy_session,
)
from raydpfl.privacy.accounting.accountants import validate_accountant, validate_delta
from raydpfl.privacy.accounting.calibration import max_steps_for, noise_multiplier_for
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.mechanisms.kernel import GaussianRelease, uses
from raydpfl.privacy.per_sample.dpsgd import poisson_sample

#: L2 sensitivity of a clipped update, in units of the clip bound S (add/remove one record).
SENSITIVITY_FACTOR = 2.0


def calibrate_noise_multiplier(
    epsilon: float, delta: float, rounds: int, accountant: str = "rdp"
) -> float:
    """The smallest z (to 1e-3, conservative) with which `rounds` PE-DPFL rounds fit (ε, δ)."""
    return noise_multiplier_for(epsilon, delta, 1.0, rounds, accountant)


def classifier_names(params: Params) -> list[str]:
    """Names of the classifier's parameters: those of the last parametrised module."""
    if not params:
        return []
    last = next(reversed(params))
    prefix = last.rsplit(".", 1)[0] + "." if "." in last else ""
    if not prefix:
        return [last]
    return [n for n in params if n.startswith(prefix) and "." not in n[len(prefix) :]]


def perturbed_objective(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    reg_weight: float,
    perturbation_std: float,
    classifier: Sequence[str],
    generator: torch.Generator,
    num_perturbations: int = 1,
) -> torch.Tensor:
    """J = ℓ(w) + λ·(mean_j ℓ(w_body, w_cls + ξ_j) − ℓ(w)), ξ_j ~ N(0, s²I) drawn from
    `generator` (classifier tensors in order, draw after draw)."""
    clean = F.cross_entropy(functional_call(model, params, (x,)), y)
    if reg_weight == 0.0 or perturbation_std == 0.0 or not classifier:
        return clean
    perturbed = torch.zeros((), dtype=clean.dtype, device=clean.device)
    for _ in range(num_perturbations):
        shifted = dict(params)
        for name in classifier:
            p = params[name]
            xi = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
            shifted[name] = p + perturbation_std * xi
        perturbed = perturbed + F.cross_entropy(functional_call(model, shifted, (x,)), y)
    perturbed = perturbed / num_perturbations
    return clean + reg_weight * (perturbed - clean)


class PeDpfl(UniformCohortAlgorithm):
    """PE-DPFL (see the module docstring: every formula is our assumption).

    Args:
        clients_per_round: Cohort size.
        rounds_budget: R_s.
        local_steps: τ, local SGD steps per round (spec A18: 3).
        lr: η.
        sampling_rate: q of the local (non-private) Poisson minibatches.
        update_clip_norm: S, the bound on ‖Δ‖ before noise.
        noise_multiplier: z; the upload noise std is 2zS (sensitivity 2S), the ledger's σ.
        epsilon, delta: Per-client budget; sets K_ε.
        accountant: The ledger's accountant.
        reg_weight: λ of the classifier-perturbation regulariser.
        perturbation_std: s; None = 2zS/sqrt(clients_per_round).
        num_perturbations: Draws of ξ per local step.
    """

    name = "pe_dpfl"
    is_private = True
    linear_aggregation = True

    def __init__(
        self,
        *,
        clients_per_round: int,
        rounds_budget: int,
        local_steps: int,
        lr: float,
        sampling_rate: float,
        update_clip_norm: float,
        noise_multiplier: float,
        epsilon: float,
        delta: float,
        accountant: str = "rdp",
        reg_weight: float = 0.1,
        perturbation_std: float | None = None,
        num_perturbations: int = 1,
    ) -> None:
        if rounds_budget < 1 or local_steps < 1 or num_perturbations < 1:
            raise ValueError("rounds_budget, local_steps and num_perturbations must be >= 1")
        if update_clip_norm <= 0 or noise_multiplier <= 0:
            raise ValueError("update_clip_norm and noise_multiplier must be > 0")
        if not 0.0 <= reg_weight <= 1.0:
            raise ValueError(f"reg_weight must be in [0, 1], got {reg_weight}")
        self.clients_per_round = clients_per_round
        self.rounds_budget = rounds_budget
        self.local_steps = local_steps
        self.lr = lr
        self.sampling_rate = sampling_rate
        self.update_clip_norm = update_clip_norm
        self.noise_multiplier = noise_multiplier
        self.epsilon = float(epsilon)
        self.delta = validate_delta(delta)
        self.accountant = validate_accountant(accountant)
        self.reg_weight = reg_weight
        self.noise_std = SENSITIVITY_FACTOR * noise_multiplier * update_clip_norm
        self.perturbation_std = (
            self.noise_std / math.sqrt(clients_per_round)
            if perturbation_std is None
            else perturbation_std
        )
        self.num_perturbations = num_perturbations
        # K_ε: rounds of PrivacyCost(z, 1, 1) within (ε, δ) under the ledger's accountant.
        self.budget_rounds = max_steps_for(
            self.epsilon, self.delta, noise_multiplier, 1.0, self.accountant
        )
        self.max_rounds = min(rounds_budget, self.budget_rounds)
        self.rounds_done = 0

    @property
    def release(self) -> GaussianRelease:
        """One round's upload: the update clipped to S plus N(0, (2zS)²), sensitivity 2S;
        charged `PrivacyCost(z, 1, 1)` to each participant."""
        return GaussianRelease(self.noise_multiplier, SENSITIVITY_FACTOR * self.update_clip_norm)

    @property
    def round_cost(self) -> PrivacyCost:
        """What one round charges each participant."""
        return self.release.cost(1)

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The rounds run so far: the only server state (K_ε and the cap are fixed at
        construction from the config, and the cohort comes from the round's RNG stream)."""
        return {"rounds_done": self.rounds_done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict`."""
        self.rounds_done = int(state["rounds_done"])

    # ---- server half ---------------------------------------------------------------
    def stop_reason(self) -> str | None:
        if self.rounds_done < self.max_rounds:
            return None
        if self.max_rounds == self.budget_rounds:
            return (
                f"privacy budget: {self.budget_rounds} rounds at z={self.noise_multiplier:g} "
                f"reach epsilon={self.epsilon:g}"
            )
        return f"R_s exhausted ({self.rounds_done} rounds)"

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        self.rounds_done += 1
        return [
            ClientTask(
                client_id=c,
                round_idx=round_idx,
                local_steps=self.local_steps,
                lr=self.lr,
                mechanisms=(uses(self.release, 1),),
            )
            for c in cohort
        ]

    def unaccounted_releases(self) -> list[str]:
        return ["client_dataset_sizes (aggregation weights p_i)"]

    # ---- client half ---------------------------------------------------------------
    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind != "train":
            raise ValueError(f"pe_dpfl has no task kind {task.kind!r}")
        upload = privacy_session(ctx, task, data).get(GaussianRelease)
        start = {n: p.clone() for n, p in params.items()}
        classifier = classifier_names(params)
        n = data.num_examples
        for _ in range(task.local_steps):
            # local minibatches (no amplification claimed: the upload depends on all)
            positions = poisson_sample(n, self.sampling_rate, ctx.generator)
            if positions.numel() == 0:
                continue
            x, y = data.batch(positions)
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            objective = perturbed_objective(
                ctx.model,
                leaves,
                x,
                y,
                reg_weight=self.reg_weight,
                perturbation_std=self.perturbation_std,
                classifier=classifier,
                generator=ctx.generator,
                num_perturbations=self.num_perturbations,
            )
            grads = torch.autograd.grad(objective, list(leaves.values()))
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p.sub_(g, alpha=task.lr)
        # The platform's output perturbation: clipped to S (half the declared sensitivity
        # 2S) and noised N(0, (z·2S)²); the result must upload exactly these tensors.
        update = upload.perturb_update(parameter_delta(params, start))
        return ClientResult(
            client_id=task.client_id, update=update, weight=float(n), num_examples=n
        )
