"""Adap DP-FL: DP-SGD clients with adaptive clipping and a decaying noise multiplier.

Baseline of ALI-DPFL's evaluation (spec shared/specs/ali-dpfl.md §6.6, A18). Source:
J. Fu, Z. Chen, X. Han, "Adap DP-FL: Differentially Private Federated Learning with
Adaptive Noise", TrustCom 2022 (arXiv 2211.15893). We could read the abstract and
third-party descriptions of the paper (a paper digest, notes of an unrelated
reimplementation), not its method section; everything below that goes beyond them is
marked [ASSUMED].

What the paper says (abstract, spec §6.6): every client trains with DP-SGD; because
gradients differ between clients and shrink as training converges, the clip bound is
adapted per client and per round, and the noise multiplier is decreased when the loss
has decreased over the last rounds (the spec: the last 4).

What this module does:

- Clients run τ (`local_steps`, the spec's 3) DP-SGD steps per round with the same
  machinery as ALI-DPFL (the shared loop `local_dp_sgd.dp_sgd_local_update`: Poisson
  rate q, flat per-sample clipping at C_k^t, Gaussian noise σ_t·C_k^t on the clipped
  sum, division by q·|D_k|).
  The server takes the |D_k|-weighted mean of the updates (FedAvg).
- **Adaptive clip bound.** C_k^t = α · s_k, where s_k is the mean L2 norm of client k's
  *noisy* DP-SGD gradients g̃ = (Σ clip(g_i) + N(0, σ²C²I)) / (q|D_k|) in the last round
  it took part in (C_k = `clip_norm` before its first round). The noisy gradients are
  the DP-SGD releases themselves, so s_k is post-processing and costs no budget: this is
  the paper's argument as the third-party descriptions report it. Workers are
  stateless, so the client reports s_k with its update and the server keeps C_k for
  its next round.
  [ASSUMED] "mean over the round's τ steps of ‖g̃‖"; α (`clip_factor`) = 1 by default.
  ``clip_estimator="debiased"`` instead uses sqrt(max(0, mean ‖g̃‖² − d(σC/(q|D_k|))²)),
  an estimate of the norm of the clean clipped mean gradient (still post-processing:
  d, σ, C, q, |D_k| are public). Optional clamps `clip_min` / `clip_max`.
  Caveat (not in the paper): the noise alone has norm ≈ σC√d/(q|D_k|), so with
  ``noisy`` the bound grows geometrically whenever α·σ√d/(q|D_k|) > 1, and with
  ``debiased`` it shrinks whenever the clipped mean gradient is shorter than C; use the
  clamps for long runs.
- **Noise schedule.** σ_{t+1} = β·σ_t (`noise_decay`) if the monitored loss decreased
  strictly in each of the last `patience` (4) recorded rounds, else σ_{t+1} = σ_t
  (floored at `min_noise_multiplier`). [ASSUMED] a sliding window (a run of 6
  decreases decays at its 4th, 5th and 6th round); the paper's β is unknown to us, so
  it has no default.
- **Which loss.** ``loss_source="dp_followup"`` (default): after each aggregation the
  cohort evaluates the new global model on a Poisson(q_ℓ) sample of its training
  records, with each record's cross-entropy clipped to [0, L] and N(0, (σ_ℓ·L)²) added
  to the sum, divided by q_ℓ·|D_k| (a sampled Gaussian query, charged to the ledger as
  `PrivacyCost(σ_ℓ, q_ℓ, 1)` like any task); the server averages with weights |D_k|.
  [ASSUMED] a third-party description mentions a central validation loss, which needs
  a public validation set we do not have. ``loss_source="metric"`` reads `metrics[loss_key]`
  in `after_round` instead (a loss the caller supplies, e.g. on public data); it is then
  named in `unaccounted_releases`.

Privacy (unit: one training record of one client, add/remove adjacency). Round t
declares `PrivacyCost(σ_t, q, τ)` for every cohort member (σ_t relative to that client's
C_k^t, which is the step's sensitivity, so C_k^t does not enter the cost) and, for the
loss follow-up, `PrivacyCost(σ_ℓ, q_ℓ, 1)`. The ledger composes the varying σ itself.
The algorithm keeps the history of a client that takes part in every round (every
real client's history is a subsequence of it, and composition only adds loss, so its ε
bounds theirs; with partial cohorts this is conservative) and stops (A18:
"accumulate the per-step RDP with its varying σ and stop when ε is reached"):

- before a round, when that round's training cost would take the history above ε
  (`compute_epsilon` with the ledger's accountant and δ, passed in), or after R_s rounds;
- the loss follow-up is sent only if, after it, one more round at the current σ (the
  cheapest next round: σ only decreases) would still fit, so no budget is spent on a
  statistic that can no longer be used.

Released without accounting: the clients' dataset sizes (aggregation weights, DP-SGD
divisor q·|D_k|, the debiasing term) and the DP-SGD diagnostics every DP-SGD algorithm
here reports; see `unaccounted_releases`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from raydpfl.algorithms.base import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    UniformCohortAlgorithm,
    trained_result,
)
from raydpfl.algorithms.local_dp_sgd import (
    ACTUAL_DIVISOR_RELEASE,
    Normalizer,
    dp_sgd_local_update,
    noisy_loss_query,
)
from raydpfl.privacy.accounting.accountants import (
    HistoryEntry,
    compute_epsilon,
    validate_accountant,
    validate_delta,
)
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses

LossSource = Literal["dp_followup", "metric"]
ClipEstimator = Literal["noisy", "debiased"]

#: Task kind of the noisy-loss follow-up.
DP_LOSS = "dp_loss"


def adaptive_clip_norm(
    *,
    mean_noisy_norm: float,
    mean_noisy_sq_norm: float,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch: float,
    num_params: int,
    clip_factor: float = 1.0,
    estimator: ClipEstimator = "noisy",
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> float | None:
    """The next clip bound C_k from one client's noisy DP-SGD gradients of a round.

    Args:
        mean_noisy_norm: mean over the round's steps of ‖g̃‖ (``noisy``).
        mean_noisy_sq_norm: mean over the same steps of ‖g̃‖² (``debiased``).
        clip_norm, noise_multiplier: C and σ the round used.
        expected_batch: q·|D_k|, the DP-SGD divisor.
        num_params: d.
        clip_factor: α.
        estimator: ``noisy`` → α·mean ‖g̃‖; ``debiased`` → α·sqrt(max(0, mean ‖g̃‖² −
            d·(σC/(q|D_k|))²)).
        clip_min, clip_max: Optional clamps.

    Returns:
        The new bound, or None when it is not a positive finite number (the caller then
        keeps the previous bound).
    """
    if estimator == "noisy":
        stat = mean_noisy_norm
    elif estimator == "debiased":
        noise_sq = num_params * (noise_multiplier * clip_norm / expected_batch) ** 2
        stat = math.sqrt(max(0.0, mean_noisy_sq_norm - noise_sq))
    else:
        raise ValueError(f"clip_estimator must be 'noisy' or 'debiased', got {estimator!r}")
    c = clip_factor * stat
    if clip_min is not None:
        c = max(c, clip_min)
    if clip_max is not None:
        c = min(c, clip_max)
    return c if math.isfinite(c) and c > 0 else None


def loss_decreased(losses: Sequence[float], patience: int) -> bool:
    """Whether each of the last `patience` losses is strictly below the one before it."""
    if len(losses) < patience + 1:
        return False
    return all(b < a for a, b in itertools.pairwise(losses[-(patience + 1) :]))


class AdapDpFl(UniformCohortAlgorithm):
    """Adap DP-FL (see the module docstring for what is the paper's and what is assumed).

    Args:
        clients_per_round: Cohort size.
        rounds_budget: R_s, the most rounds.
        local_steps: τ, DP-SGD steps per round (spec A18: 3).
        lr: η (> 0; plain SGD).
        sampling_rate: q.
        clip_norm: C, every client's bound before its first round.
        noise_multiplier: σ_0.
        noise_decay: β in (0, 1].
        epsilon, delta: The per-client budget (ε, δ) the run must stay within.
        accountant: The ledger's accountant (one of `privacy.accounting.accountants.ACCOUNTANTS`).
        num_params: d (needed by ``clip_estimator="debiased"``).
        patience: Consecutive loss decreases that trigger a decay (spec: 4).
        clip_factor: α in C_k = α·s_k.
        clip_estimator: ``noisy`` (the paper, as reported) or ``debiased``.
        clip_min, clip_max: Optional clamps on C_k.
        min_noise_multiplier: Floor on σ_t.
        loss_source: ``dp_followup`` (a charged noisy loss query) or ``metric``.
        loss_key: The metrics key read when ``loss_source="metric"`` (the server scores
            ``test_loss`` only after `after_round`, so that key is NaN there and ignored).
        loss_sampling_rate: q_ℓ of the loss query (default q).
        loss_noise_multiplier: σ_ℓ of the loss query (default σ_0).
        loss_clip: L, per-record cross-entropy clip of the loss query.
        normalizer: DP-SGD divisor, as in `AliDpfl` (``actual`` is labelled unaccounted).
    """

    name = "adap_dp_fl"
    is_private = True
    linear_aggregation = False  # C_k needs each client's own statistics

    def __init__(
        self,
        *,
        clients_per_round: int,
        rounds_budget: int,
        local_steps: int,
        lr: float,
        sampling_rate: float,
        clip_norm: float,
        noise_multiplier: float,
        noise_decay: float,
        epsilon: float,
        delta: float,
        accountant: str = "rdp",
        num_params: int | None = None,
        patience: int = 4,
        clip_factor: float = 1.0,
        clip_estimator: ClipEstimator = "noisy",
        clip_min: float | None = None,
        clip_max: float | None = None,
        min_noise_multiplier: float = 0.0,
        loss_source: LossSource = "dp_followup",
        loss_key: str = "validation_loss",
        loss_sampling_rate: float | None = None,
        loss_noise_multiplier: float | None = None,
        loss_clip: float = 5.0,
        normalizer: Normalizer = "expected",
    ) -> None:
        if rounds_budget < 1 or local_steps < 1 or patience < 1:
            raise ValueError("rounds_budget, local_steps and patience must be >= 1")
        if lr <= 0:
            raise ValueError(f"lr must be > 0 (the noisy gradients are read off Δ/η), got {lr}")
        if not 0.0 < noise_decay <= 1.0:
            raise ValueError(f"noise_decay must be in (0, 1], got {noise_decay}")
        if clip_norm <= 0 or noise_multiplier <= 0 or loss_clip <= 0:
            raise ValueError("clip_norm, noise_multiplier and loss_clip must be > 0")
        if clip_estimator == "debiased" and num_params is None:
            raise ValueError("clip_estimator='debiased' needs num_params")
        if loss_source not in ("dp_followup", "metric"):
            raise ValueError(f"loss_source must be 'dp_followup' or 'metric', got {loss_source!r}")
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
        self.clients_per_round = clients_per_round
        self.rounds_budget = rounds_budget
        self.local_steps = local_steps
        self.lr = lr
        self.sampling_rate = sampling_rate
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.noise_decay = noise_decay
        self.epsilon = float(epsilon)
        self.delta = validate_delta(delta)
        self.accountant = validate_accountant(accountant)
        self.num_params = num_params
        self.patience = patience
        self.clip_factor = clip_factor
        self.clip_estimator = clip_estimator
        self.clip_min = clip_min
        self.clip_max = clip_max
        self.min_noise_multiplier = min_noise_multiplier
        self.loss_source = loss_source
        self.loss_key = loss_key
        self.loss_sampling_rate = (
            sampling_rate if loss_sampling_rate is None else loss_sampling_rate
        )
        self.loss_noise_multiplier = (
            noise_multiplier if loss_noise_multiplier is None else loss_noise_multiplier
        )
        self.loss_clip = loss_clip
        self.normalizer = normalizer
        # Server state (the client half never reads it).
        self.sigma = noise_multiplier  # σ of the next round
        self.clip_norms: dict[int, float] = {}  # C_k for each client's next round
        self.history: list[HistoryEntry] = []  # a client that takes part in every round
        self.losses: list[float] = []
        self.rounds_done = 0
        self._round_sigma = noise_multiplier
        self._round_clips: list[float] = []

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The schedule: σ of the next round, every client's C_k, the every-round client's
        accounting history, the recorded losses and the rounds done (all scalars: JSON;
        Python floats round-trip exactly). The round's σ and clips are written too,
        though `after_round` has already reported them when a checkpoint is taken."""
        return {
            "sigma": self.sigma,
            "clip_norms": {str(c): v for c, v in sorted(self.clip_norms.items())},
            "history": [list(e) for e in self.history],
            "losses": [None if math.isnan(v) else v for v in self.losses],
            "rounds_done": self.rounds_done,
            "round_sigma": self._round_sigma,
            "round_clips": list(self._round_clips),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict` (a NaN loss was stored as null and comes back as NaN)."""
        self.sigma = float(state["sigma"])
        self.clip_norms = {int(c): float(v) for c, v in state["clip_norms"].items()}
        self.history = [(float(s), float(q), int(k)) for s, q, k in state["history"]]
        self.losses = [math.nan if v is None else float(v) for v in state["losses"]]
        self.rounds_done = int(state["rounds_done"])
        self._round_sigma = float(state["round_sigma"])
        self._round_clips = [float(v) for v in state["round_clips"]]

    # ---- accounting ----------------------------------------------------------------
    def _train_entry(self, sigma: float) -> HistoryEntry:
        return (sigma, self.sampling_rate, self.local_steps)

    def _loss_entry(self) -> HistoryEntry:
        return (self.loss_noise_multiplier, self.loss_sampling_rate, 1)

    def epsilon_with(self, entries: Sequence[HistoryEntry] = ()) -> float:
        """ε of the every-round client's history followed by `entries`."""
        return compute_epsilon([*self.history, *entries], self.delta, self.accountant)

    def clip_for(self, client_id: int) -> float:
        """C_k the client would use in its next round."""
        return self.clip_norms.get(client_id, self.clip_norm)

    # ---- server half ---------------------------------------------------------------
    def stop_reason(self) -> str | None:
        if self.rounds_done >= self.rounds_budget:
            return f"R_s exhausted ({self.rounds_done} rounds)"
        eps = self.epsilon_with([self._train_entry(self.sigma)])
        if eps > self.epsilon:
            return (
                f"privacy budget: the next round (sigma={self.sigma:.4g}) would take epsilon "
                f"to {eps:.4g} > {self.epsilon:g} after {self.rounds_done} rounds"
            )
        return None

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        sigma = self.sigma
        self.history.append(self._train_entry(sigma))
        self.rounds_done += 1
        self._round_sigma = sigma
        tasks = [
            ClientTask(
                client_id=c,
                round_idx=round_idx,
                local_steps=self.local_steps,
                lr=self.lr,
                mechanisms=(
                    uses(
                        SubsampledGaussian(sigma, self.clip_for(c), self.sampling_rate),
                        self.local_steps,
                    ),
                ),
            )
            for c in cohort
        ]
        self._round_clips = [t.clip_norm for t in tasks if t.clip_norm is not None]
        return tasks

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        new_params = super().aggregate(global_params, tasks, results)  # FedAvg's mean
        # each client's C_k for its next round (no effect on this round's aggregate)
        by_client = {t.client_id: t for t in tasks}
        for r in results:
            task = by_client[r.client_id]
            assert task.clip_norm is not None and task.sampling_rate is not None
            if "noisy_grad_norm" not in r.metrics:
                continue  # no step ran (normalizer=actual, all batches empty)
            new = adaptive_clip_norm(
                mean_noisy_norm=r.metrics["noisy_grad_norm"],
                mean_noisy_sq_norm=r.metrics["noisy_grad_sq_norm"],
                clip_norm=task.clip_norm,
                noise_multiplier=task.noise_multiplier,
                expected_batch=task.sampling_rate * r.num_examples,
                num_params=self.num_params or 0,
                clip_factor=self.clip_factor,
                estimator=self.clip_estimator,
                clip_min=self.clip_min,
                clip_max=self.clip_max,
            )
            if new is not None:
                self.clip_norms[r.client_id] = new
        return new_params

    @property
    def loss_query(self) -> SubsampledGaussian:
        """The loss follow-up's sampled Gaussian query: q_ℓ, clip L, σ_ℓ."""
        return SubsampledGaussian(
            self.loss_noise_multiplier, self.loss_clip, self.loss_sampling_rate
        )

    def followups_due(
        self, round_idx: int, results: Sequence[ClientResult], new_params: Params
    ) -> bool:
        """A noisy-loss follow-up per client (``loss_source="dp_followup"``) when it is
        still of use; its charge then joins the every-round client's history."""
        if self.loss_source != "dp_followup" or not results:
            return False
        if self.rounds_done >= self.rounds_budget:
            return False  # no round left to use σ in
        loss_entry = self._loss_entry()
        # Only if one more round at the current σ (the cheapest next round) still fits.
        if self.epsilon_with([loss_entry, self._train_entry(self.sigma)]) > self.epsilon:
            return False
        self.history.append(loss_entry)
        # the schedule's history is the charge
        assert self.loss_query.cost(1).as_triple() == loss_entry
        return True

    def followup_task(self, round_idx: int, result: ClientResult) -> ClientTask:
        return ClientTask(
            client_id=result.client_id,
            round_idx=round_idx,
            local_steps=0,
            lr=0.0,
            mechanisms=(uses(self.loss_query, 1),),
            kind=DP_LOSS,
        )

    def after_round(
        self,
        round_idx: int,
        metrics: Mapping[str, float],
        followups: Sequence[ClientResult] = (),
    ) -> dict[str, float]:
        loss: float | None = None
        if self.loss_source == "dp_followup":
            reported = [r for r in followups if "dp_loss" in r.metrics]
            total = sum(r.weight for r in reported)
            if total > 0:
                loss = sum(r.weight * r.metrics["dp_loss"] for r in reported) / total
        else:
            value = metrics.get(self.loss_key)
            if value is not None and math.isfinite(float(value)):
                loss = float(value)
        decayed = False
        if loss is not None:
            self.losses.append(loss)
            if loss_decreased(self.losses, self.patience):
                self.sigma = max(self.sigma * self.noise_decay, self.min_noise_multiplier)
                decayed = True
        out = {
            "noise_multiplier": float(self._round_sigma),
            "noise_multiplier_next": float(self.sigma),
            "noise_decayed": float(decayed),
            "clip_norm_mean": float(np.mean(self._round_clips)) if self._round_clips else 0.0,
            "epsilon_every_round_client": self.epsilon_with(),
        }
        if loss is not None:
            out["schedule_loss"] = loss
        return out

    def unaccounted_releases(self) -> list[str]:
        out = [
            "client_dataset_sizes (aggregation weights, the DP-SGD divisor q*|D_i| and, for "
            "clip_estimator=debiased, the noise-norm correction)",
            "client_training_metrics (mean realised Poisson batch size and clipped fraction, "
            "in rounds.parquet)",
        ]
        if self.loss_source == "metric":
            out.append(
                f"noise_schedule_loss (metrics[{self.loss_key!r}] drives the sigma schedule; "
                "treated as public, not charged)"
            )
        if self.normalizer == "actual":
            out.append(ACTUAL_DIVISOR_RELEASE)
        return out

    # ---- client half ---------------------------------------------------------------
    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        if task.kind == DP_LOSS:
            return dp_loss_query(ctx, params, data, task)
        if task.kind != "train":
            raise ValueError(f"adap_dp_fl has no task kind {task.kind!r}")
        return self._train(ctx, params, data, task)

    def _train(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        """τ DP-SGD steps (one `dp_sgd_local_update` call each, same RNG stream as one
        τ-step call) plus the noisy gradients' norms, read off each step's update."""
        start = {n: p.clone() for n, p in params.items()}
        one_step = dataclasses.replace(task, local_steps=1)
        norms, batch_sizes, clipped = [], [], []
        for _ in range(task.local_steps):
            step = dp_sgd_local_update(ctx, params, data, one_step, normalizer=self.normalizer)
            batch_sizes.append(step.metrics["mean_batch_size"])
            if self.normalizer == "actual" and step.metrics["mean_batch_size"] == 0:
                continue  # skipped step: no noisy gradient was formed
            clipped.append(step.metrics["clipped_fraction"])
            sq = sum(float(t.pow(2).sum()) for t in step.update.values())
            norms.append(math.sqrt(sq) / task.lr)  # ‖g̃‖ = ‖Δ_step‖ / η
        metrics = {
            "mean_batch_size": float(np.mean(batch_sizes)),
            "clipped_fraction": float(np.mean(clipped)) if clipped else 0.0,
        }
        if norms:
            metrics["noisy_grad_norm"] = float(np.mean(norms))
            metrics["noisy_grad_sq_norm"] = float(np.mean(np.square(norms)))
        return trained_result(task, data, params, start, metrics)


def dp_loss_query(
    ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
) -> ClientResult:
    """(Σ_{i∈B} min(ℓ_i, L) + N(0, σ_ℓ²L²)) / (q_ℓ·|D|) of the model `params`.

    B is a Poisson(q_ℓ) sample of the client's training records, ℓ_i the cross-entropy
    of record i; q_ℓ, L and σ_ℓ are the task's declared `SubsampledGaussian`.
    Each record adds at most L to the sum, so this is one step of the sampled Gaussian
    mechanism, `PrivacyCost(σ_ℓ, q_ℓ, 1)`: FedFDP's loss upload, through the same
    `local_dp_sgd.noisy_loss_query` (losses also clipped below at 0, a NaN loss counted
    as L), in float32 as this algorithm always computed it.
    """
    n = data.num_examples
    # the shared noisy loss query (FedFDP's loss upload), in the losses' float32
    value, _ = noisy_loss_query(ctx, params, data, task, precision="native")
    return ClientResult(
        client_id=task.client_id,
        update={},
        weight=float(n),
        num_examples=n,
        metrics={"dp_loss": value},
    )
