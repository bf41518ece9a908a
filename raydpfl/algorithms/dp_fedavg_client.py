"""Client-level DP-FedAvg (McMahan, Ramage, Talwar & Zhang, ICLR 2018, Algorithm 1).

Privacy unit: one client (all its training records). Each round:

1. the server samples a cohort from the N clients: ``poisson`` (each client independently
   with rate q) or ``fixed`` (K clients uniformly without replacement);
2. each sampled client runs τ steps of *non-private* minibatch SGD from the global model
   and clips its update Δ_k to L2 norm S (`clip_update`; flat, or per layer with
   S/√L per parameter tensor so the whole stays within S);
3. the platform sums the clipped updates with uniform weights and adds N(0, σ²S²) once
   through the round's `ClientGaussianSum` mechanism (`raydpfl.privacy.mechanisms.
   client_level_mechanisms`: drawn with `raydpfl.privacy.per_sample.dpsgd.gaussian_like`
   from a stream derived from (run seed, round), or from os.urandom in secure-noise
   mode); the server half receives only that release (a `ReleasedSum`) and divides by
   the *expected* cohort size E = q·N or K, a public constant (`dp_fedavg_update`: the
   fixed-denominator estimator f̃_f of the paper, §2, with w_k = 1, W = N);
4. θ ← θ + (Σ_k clip_S(Δ_k) + z) / E (server learning rate 1).

Distributed noise (``noise: distributed``, fixed-size sampling only): each client adds
N(0, σ²S²/K) to its clipped update (its task declares the round's `GaussianShare`, drawn
through its worker's `PrivacySession`) and the server only sums, so the sum carries
exactly N(0, σ²S²) as in the central variant: the same event (`DistributedGaussianSum`),
the same ε.

Adaptive clipping (``adaptive_clipping``; Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS
2021, Algorithm 1 with the geometric update): each client also reports the bit
b_k = 1[‖Δ_k‖ ≤ S_t]; the platform releases Σ_k (b_k − ½) + N(0, σ_b²)
(`ReleasedSum.noisy_clip_count`), the server half turns it into the noisy unclipped
fraction b̃ and sets S_{t+1} = S_t·exp(−η_C (b̃ − γ)). The two Gaussian
releases of a round (updates: sensitivity S_t, noise z_Δ S_t; centred bits: sensitivity
½, noise σ_b) compose to one Gaussian with noise multiplier σ when
z_Δ = (σ⁻² − (2σ_b)⁻²)^(−½) (`update_noise_multiplier`), so the round's accounting is
unchanged: the same `ClientLevelCost(σ)`. Both releases are the round's
`AdaptiveClipGaussianSum`, which computes z_Δ from σ and σ_b itself.

Server optimizers (``server_optimizer``) act on the noisy mean update Δ̄ after the
release (post-processing, no privacy cost): ``sgd`` θ ← θ + η_s Δ̄; ``momentum``
(DP-FedAvgM) m ← βm + Δ̄, θ ← θ + η_s m; ``adagrad``, ``adam``, ``yogi`` (FedAdagrad,
FedAdam, FedYogi: Reddi et al., ICLR 2021, Algorithm 2) m ← β₁m + (1−β₁)Δ̄, v by each
rule, θ ← θ + η_s m/(√v + τ). The step is `raydpfl.algorithms.server_optimizers.server_step`,
shared with record-level FedAvg, DP-FedAvg, FedProx and DP-FedProx.

Accounting is at the population level (`raydpfl.privacy.accounting.client_level`): the server half
declares the round's mechanism (`round_mechanisms`); the server charges its event once,
before the round is dispatched, to the run's `ClientLevelLedger` (`round_privacy_cost`
is derived from it), makes the round's release itself after summing the uploads, and
hands the server half (`aggregate_release`) only the `ReleasedSum`; a further release in
the round is refused. Tasks declare no per-client cost (distributed: a share charged with
the round). `aggregate_sum` is the direct-call path (tests, notebooks): the same release
on a `WeightedUpdateSum` the caller holds, then `aggregate_release`; the server never
calls it, and refuses a client-level class that overrides it. This module imports no Ray.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from raydpfl.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientResult,
    ClientTask,
    Params,
    ServerRound,
    WeightedUpdateSum,
    privacy_session,
    uniform_cohort,
    with_round,
)
from raydpfl.algorithms.fedavg import FedAvg

# The server's step on the released mean update, shared with the record-level algorithms
# (`server_step` and `SERVER_OPTIMIZERS` were first defined here: still importable from here)
from raydpfl.algorithms.server_optimizers import (  # noqa: F401
    SERVER_OPTIMIZERS,
    ServerOptimizer,
    server_step,
)
from raydpfl.privacy.accounting.client_level import ClientLevelCost
from raydpfl.privacy.mechanisms.client_level_mechanisms import (  # noqa: F401 (re-exported)
    COUNT_NOISE_PURPOSE,
    NOISE_PURPOSE,
    WITHIN_CLIP_METRIC,
    AdaptiveClipGaussianSum,
    ClientGaussianSum,
    DistributedGaussianSum,
    GaussianShare,
    ReleasedSum,
    RoundUploads,
    add_aggregate_noise,
    aggregate_noise_std,
    distributed_noise_std,
    population_charge,
    release_directly,
    round_noise_generator,
    round_session,
    update_noise_multiplier,
)
from raydpfl.privacy.mechanisms.client_level_mechanisms import (
    update_l2_norm as update_norm,  # ‖Δ‖₂ over all tensors together (float64)
)
from raydpfl.privacy.mechanisms.kernel import MechanismUse, uses
from raydpfl.privacy.noise import secure_noise


# ---- the paper's math, as small pure functions -----------------------------------------------
def clip_update(
    update: Mapping[str, torch.Tensor], clip_norm: float, per_layer: bool = False
) -> dict[str, torch.Tensor]:
    """McMahan et al. 2018, Algorithm 1, ``ClipFn``: the update scaled into the L2 ball.

    Flat: Δ · min(1, S/‖Δ‖₂). Per layer ("per-layer clipping", §3 of the paper): each of
    the L tensors Δ_j · min(1, S_j/‖Δ_j‖₂) with S_j = S/√L, so ‖clip(Δ)‖₂ ≤ √(L·S²/L) = S:
    the sensitivity the accountant assumes holds either way.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if per_layer:
        bound = clip_norm / math.sqrt(max(len(update), 1))
        return {n: _scaled_into(t, bound, update_norm({n: t})) for n, t in update.items()}
    norm = update_norm(update)
    return {n: _scaled_into(t, clip_norm, norm) for n, t in update.items()}


def _scaled_into(t: torch.Tensor, bound: float, norm: float) -> torch.Tensor:
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    return t * factor


def dp_fedavg_update(
    global_params: Mapping[str, torch.Tensor],
    noisy_sum: Mapping[str, torch.Tensor],
    expected_cohort: float,
) -> dict[str, torch.Tensor]:
    """θ + (Σ_k clip(Δ_k) + z) / E: the fixed-denominator estimator f̃_f (McMahan et al.
    2018, §2, uniform weights w_k = 1, W = N, E = qW), server learning rate 1. E is a
    public constant, so one client moves the mean by at most S/E before noise."""
    return {n: global_params[n] + noisy_sum[n] / expected_cohort for n in global_params}


def noisy_unclipped_fraction(
    within: float, count: int, noise: float, expected_cohort: float
) -> float:
    """b̃ = (Σ_k (b_k − ½) + N(0, σ_b²)) / E + ½ (Andrew et al. 2021, Algorithm 1, with
    centred bits so that one client moves the sum by at most ½); `within` = Σ_k b_k,
    `count` the clients that reported, `noise` the Gaussian draw."""
    return (within - 0.5 * count + noise) / expected_cohort + 0.5


def unclipped_fraction(noisy_clip_count: float, expected_cohort: float) -> float:
    """b̃ = Σ̃ / E + ½ from the released centred count Σ̃ = Σ_k (b_k − ½) + N(0, σ_b²)
    (`ReleasedSum.noisy_clip_count`): `noisy_unclipped_fraction` on released values only."""
    return noisy_clip_count / expected_cohort + 0.5


def geometric_clip_update(
    clip_norm: float, unclipped_fraction: float, target_quantile: float, clip_lr: float
) -> float:
    """S_{t+1} = S_t · exp(−η_C (b̃ − γ)) (Andrew et al. 2021, Eq. for the geometric
    update): S shrinks when more than the target fraction γ of updates were unclipped."""
    return clip_norm * math.exp(-clip_lr * (unclipped_fraction - target_quantile))


def poisson_cohort(uniforms: np.ndarray, rate: float) -> list[int]:
    """Clients whose uniform draw falls below q: each independently with probability q."""
    return [int(c) for c in np.flatnonzero(np.asarray(uniforms) < rate)]


def noise_generator(
    seed: int, round_idx: int, secure: bool = False, purpose: str = NOISE_PURPOSE
) -> torch.Generator:
    """The server noise's stream for (run seed, round, purpose): independent of the workers
    and of the order clients ran; a `SecureGenerator` in secure-noise mode (the streams
    the round's mechanisms draw from: `round_noise_generator`)."""
    return round_noise_generator(seed, round_idx, secure, purpose)


# ---- the algorithms ----------------------------------------------------------------------------
class ClientLevelAlgorithm(Algorithm):
    """What client-level DP-FedAvg and DP-FTRL share (privacy unit: one client).

    A public population of N clients; each chosen client runs τ non-private SGD steps of
    minibatch B at rate η (FedAvg's client) and uploads its update Δ clipped to S (flat
    or per layer, `upload`) with weight 1; the round's population-level charge is the
    event of the mechanisms the server half declares (`round_mechanisms`).

    Subclasses set the population and the cohort (`select`, which starts with
    `_start_round`), the round's mechanisms (`round_mechanisms`) and the model built from
    the round's release (`aggregate_release`). The platform, not the subclass, sums the
    uploads and makes the release.
    """

    is_private = True
    linear_aggregation = True
    privacy_unit: ClassVar[str] = "client"
    #: Whether each result reports b_k = [‖Δ‖ ≤ S] (``update_within_clip``).
    reports_within_clip: ClassVar[bool] = False

    def __init__(
        self,
        num_clients: int,
        local_steps: int,
        lr: float,
        batch_size: int,
        clip_norm: float,
        noise_multiplier: float,
        clipping: str,
        seed: int,
    ) -> None:
        if not clip_norm > 0:
            raise ValueError(f"clip_norm (S) must be > 0, got {clip_norm}")
        if clipping not in ("flat", "per_layer"):
            raise ValueError(f"clipping must be flat or per_layer, got {clipping!r}")
        self.num_clients = int(num_clients)
        self.local_steps = local_steps
        self.lr = lr
        self.batch_size = batch_size
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.clipping = clipping
        self.seed = int(seed)
        self.noise_calibrated = False  # set by the builder when σ came from the budget
        self._round = 0

    # ---- server half -----------------------------------------------------------------------
    def round_privacy_cost(self, round_idx: int) -> ClientLevelCost | None:
        """The round's population-level charge, made before dispatch: the event of the
        round's declared mechanisms (DP-FedAvg: one round of the subsampled Gaussian;
        DP-FTRL: the whole epoch's tree before its first round, a shorter last tree for
        its own rounds, None on the epoch's other rounds)."""
        return population_charge(self.round_mechanisms(round_idx))

    def _start_round(self, round_idx: int, num_clients: int) -> None:
        """Checks the run's population against N and records the round being selected."""
        if num_clients != self.num_clients:
            raise ValueError(f"built for {self.num_clients} clients, the run has {num_clients}")
        self._round = round_idx

    def task_fields(self) -> dict[str, Any]:
        """This round's `ClientTask` fields beyond client, round, τ, η and B (the same for
        every client of the round)."""
        return {}

    def aggregate_release(
        self, global_params: Params, tasks: Sequence[ClientTask], released: ReleasedSum
    ) -> Params:
        """The server half: the new global parameters from the round's release, made by
        the platform (`ReleasedSum`: the noised sum, the number of uploads, the noisy
        count with adaptive clipping). It may take ``server_round`` like `aggregate`."""
        raise NotImplementedError(f"{type(self).__name__} builds no model from a release")

    def aggregate_sum(
        self,
        global_params: Params,
        tasks: Sequence[ClientTask],
        total: WeightedUpdateSum,
        server_round: ServerRound | None = None,
    ) -> Params:
        """The direct-call path (tests, notebooks): the release the platform would make of
        `total` in this round (`release_directly`: the same streams, the same bits), then
        `aggregate_release`. The server never calls it: it makes the release itself and
        refuses a client-level class that overrides this (the override would see the
        un-noised sum)."""
        uploads = RoundUploads(total.total, total.count, dict(total.metric_sums))
        released = release_directly(
            self, self._round, self.round_mechanisms, self.seed, uploads, tasks, global_params
        )
        return with_round(self.aggregate_release, server_round)(global_params, tasks, released)

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        self._round = round_idx
        fields = self.task_fields()
        return [
            ClientTask(
                client_id=c,
                round_idx=round_idx,
                local_steps=self.local_steps,
                lr=self.lr,
                batch_size=self.batch_size,
                **fields,
            )
            for c in cohort
        ]

    # ---- client half -----------------------------------------------------------------------
    def upload(
        self, ctx: ClientContext, task: ClientTask, update: Params
    ) -> tuple[Params, float, float]:
        """What the client sends from its update Δ: Δ clipped to the round's S (the task's
        ``update_clip_norm`` where it carries one, else `clip_norm`), flat or per layer.
        Returns (the upload, ‖Δ‖, S)."""
        norm = update_norm(update)
        clip = float(task.extras.get("update_clip_norm", self.clip_norm))
        return clip_update(update, clip, self.clipping == "per_layer"), norm, clip

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        """τ non-private SGD steps (FedAvg's client), then the upload (`upload`)."""
        trained = FedAvg.local_update(self, ctx, params, data, task)  # type: ignore[arg-type]
        # the task's session (the worker's, or a direct call's, bound to `data`)
        ctx = dataclasses.replace(ctx, privacy=privacy_session(ctx, task, data))
        update, norm, clip = self.upload(ctx, task, trained.update)
        metrics = {
            "train_loss": trained.metrics.get("train_loss", float("nan")),
            "update_norm": norm,
            "update_clipped": float(norm > clip),
        }
        if self.reports_within_clip:
            # b_k of adaptive clipping: summed (exactly: 0/1 floats) with the updates;
            # only its noisy sum is used (its mean in rounds.parquet is a diagnostic).
            metrics[WITHIN_CLIP_METRIC] = float(norm <= clip)
        return ClientResult(
            client_id=task.client_id,
            update=update,
            weight=1.0,
            num_examples=trained.num_examples,
            metrics=metrics,
        )


class DPFedAvgClientLevel(ClientLevelAlgorithm):
    """Client-level DP-FedAvg (see the module docstring).

    Args:
        num_clients: N, the population (public).
        sampling: ``poisson`` or ``fixed``.
        sampling_rate: q in (0, 1] (``poisson``).
        cohort_size: K in [1, N] (``fixed``).
        local_steps, lr, batch_size: τ non-private SGD steps of minibatch size B at rate η.
        clip_norm: S, the bound on each client's update.
        noise_multiplier: σ; the aggregate's noise std is σ·S.
        clipping: ``flat`` or ``per_layer`` (S/√L per parameter tensor).
        noise: ``central`` (the server adds N(0, σ²S²)) or ``distributed`` (each client
            adds N(0, σ²S²/K); fixed-size sampling only).
        seed: The run seed (the aggregate noise's stream).
        adaptive_clipping, target_quantile, clip_lr, clip_count_stddev: Andrew et al.
            2021 (γ, η_C, σ_b; σ_b None = 0.05·E); `clip_norm` is then S's start value.
        server_optimizer, server_lr, server_momentum, server_beta2, server_adam_eps:
            the server's step on the noisy mean update (`server_step`).
    """

    name = "dp_fedavg_client"
    reports_within_clip = True

    def __init__(
        self,
        *,
        num_clients: int,
        sampling: str,
        local_steps: int,
        lr: float,
        batch_size: int,
        clip_norm: float,
        noise_multiplier: float,
        sampling_rate: float | None = None,
        cohort_size: int | None = None,
        clipping: str = "flat",
        noise: str = "central",
        seed: int = 0,
        adaptive_clipping: bool = False,
        target_quantile: float = 0.5,
        clip_lr: float = 0.2,
        clip_count_stddev: float | None = None,
        server_optimizer: str = "sgd",
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        server_beta2: float = 0.99,
        server_adam_eps: float = 1e-3,
    ) -> None:
        super().__init__(
            num_clients, local_steps, lr, batch_size, clip_norm, noise_multiplier, clipping, seed
        )
        if noise not in ("central", "distributed"):
            raise ValueError(f"noise must be central or distributed, got {noise!r}")
        if noise == "distributed" and sampling != "fixed":
            raise ValueError("distributed noise needs fixed-size client sampling, not poisson")
        # Validates q, K, N and σ in one place (ValueError naming the field).
        self.cost = ClientLevelCost(
            noise_multiplier, sampling, num_clients, sampling_rate, cohort_size, 1
        )
        self.sampling = sampling
        self.sampling_rate = sampling_rate
        self.cohort_size = cohort_size
        self.noise = noise
        # settings checked, state (m, v) kept and checkpointed by the shared optimizer
        self._server_opt = ServerOptimizer(
            server_optimizer, server_lr, server_momentum, server_beta2, server_adam_eps
        )
        if adaptive_clipping and noise != "central":
            raise ValueError("adaptive clipping needs central noise")
        self.adaptive_clipping = bool(adaptive_clipping)
        self.target_quantile = float(target_quantile)
        self.clip_lr = float(clip_lr)
        self.clip_count_stddev = (
            float(clip_count_stddev)
            if clip_count_stddev is not None
            else 0.05 * self.cost.expected_cohort
        )
        self.current_clip_norm = self.clip_norm  # S_t (moves with adaptive clipping)
        self._round_clip: dict[str, float] = {}
        # z_Δ (reported in the privacy statement): σ itself without adaptive clipping;
        # larger with it (the count takes a share). Computed by the round's mechanism
        # (`AdaptiveClipGaussianSum`, which also validates σ_b against σ), never stated.
        self.update_noise_multiplier = self.round_mechanism().update_noise_multiplier

    @property
    def server_optimizer(self) -> str:
        """The server optimizer's name (``sgd`` ... ``yogi``)."""
        return self._server_opt.optimizer

    @property
    def expected_cohort(self) -> float:
        """E = q·N (poisson) or K (fixed): the public denominator."""
        return self.cost.expected_cohort

    # ---- server half -----------------------------------------------------------------------
    def round_mechanism(
        self,
    ) -> ClientGaussianSum | AdaptiveClipGaussianSum | DistributedGaussianSum:
        """The mechanism of the round about to run: the Gaussian on the sum of updates
        clipped to S_t (central), with the count of unclipped updates (adaptive), or the
        sum of the clients' shares (distributed)."""
        if self.noise == "distributed":
            assert self.cohort_size is not None
            return DistributedGaussianSum(
                self.noise_multiplier, self.clip_norm, self.num_clients, self.cohort_size
            )
        common = (self.sampling, self.num_clients, self.sampling_rate, self.cohort_size)
        if self.adaptive_clipping:
            return AdaptiveClipGaussianSum(
                self.noise_multiplier,
                self.current_clip_norm,
                *common,
                count_stddev=self.clip_count_stddev,
            )
        return ClientGaussianSum(self.noise_multiplier, self.current_clip_norm, *common)

    def round_mechanisms(self, round_idx: int) -> tuple[MechanismUse, ...]:
        """What the server half draws in the round: one invocation of its mechanism."""
        return (uses(self.round_mechanism(), 1),)

    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        self._start_round(round_idx, num_clients)
        secure = bool(getattr(self, "secure_noise", False))
        if self.sampling == "poisson":
            assert self.sampling_rate is not None
            u = secure_noise.uniform(num_clients).numpy() if secure else rng.random(num_clients)
            return poisson_cohort(u, self.sampling_rate)
        assert self.cohort_size is not None
        if secure:  # the K smallest of N secure uniforms: a uniform K-subset
            u = secure_noise.uniform(num_clients).numpy()
            return sorted(int(c) for c in np.argsort(u, kind="stable")[: self.cohort_size])
        return uniform_cohort(num_clients, self.cohort_size, rng)

    def task_fields(self) -> dict[str, Any]:
        mechanism = self.round_mechanism()
        # distributed: each client draws its share of the round's noise
        shares = (
            (uses(mechanism.share, 1),) if isinstance(mechanism, DistributedGaussianSum) else ()
        )
        # S_t: the round's bound (it moves with adaptive clipping); the task carries it
        # because the workers' copy of this object is the one built at start.
        return {"mechanisms": shares, "extras": {"update_clip_norm": self.current_clip_norm}}

    def aggregate_release(
        self, global_params: Params, tasks: Sequence[ClientTask], released: ReleasedSum
    ) -> Params:
        """θ + (Σ clip(Δ_k) + z) / E from the platform's release (distributed: the sum of
        the noised uploads; an empty cohort still gets the noise: the release happens
        every round), or the server optimizer's step on that mean; with adaptive
        clipping, S moves by the released noisy count."""
        summed = released.noisy_sum
        if self.adaptive_clipping:
            self._adapt_clip_norm(released)
        if self._server_opt.plain:
            return dp_fedavg_update(global_params, summed, self.expected_cohort)
        mean = {n: summed[n] / self.expected_cohort for n in global_params}
        return self._server_opt.step(global_params, mean)

    def _adapt_clip_norm(self, released: ReleasedSum) -> None:
        """The noisy unclipped fraction from the released count (the platform's
        `AdaptiveClipGaussianSum` release) and the next S (Andrew et al. 2021)."""
        if released.noisy_clip_count is None:
            raise ValueError(
                "adaptive clipping needs the round's noisy count of unclipped updates"
            )
        fraction = unclipped_fraction(released.noisy_clip_count, self.expected_cohort)
        used = self.current_clip_norm
        self.current_clip_norm = geometric_clip_update(
            used, fraction, self.target_quantile, self.clip_lr
        )
        self._round_clip = {
            "update_clip_norm": used,
            "noisy_unclipped_fraction": fraction,
            "next_update_clip_norm": self.current_clip_norm,
        }

    def after_round(
        self, round_idx: int, metrics: Mapping[str, float], followups: Sequence = ()
    ) -> dict[str, float]:
        """The round's S (and, with adaptive clipping, its noisy unclipped fraction and
        the next S: released values, derived from the noisy count)."""
        out = dict(self._round_clip) or {"update_clip_norm": self.current_clip_norm}
        self._round_clip = {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"current_clip_norm": self.current_clip_norm}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.current_clip_norm = float(state.get("current_clip_norm", self.clip_norm))

    def tensor_state(self) -> dict[str, torch.Tensor]:
        return self._server_opt.tensor_state()

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._server_opt.load_tensor_state(tensors)

    def unaccounted_releases(self) -> list[str]:
        out = [
            "client_updates_to_server (the trusted server sees each sampled client's clipped "
            "update before the aggregate noise; the guarantee covers the released models)"
            if self.noise == "central"
            else "client_updates_to_server (each sampled client's clipped update carries only "
            "its 1/K share of the noise; the guarantee covers the summed release)",
            "cohort_sizes (clients_trained per round in rounds.parquet)",
            "client_training_metrics (mean pre-clip update norm, clipped and unclipped "
            "fractions and local training loss over the round's clients, in rounds.parquet)",
        ]
        return out

    # ---- client half -----------------------------------------------------------------------
    def upload(
        self, ctx: ClientContext, task: ClientTask, update: Params
    ) -> tuple[Params, float, float]:
        """Δ clipped to the round's S (`ClientLevelAlgorithm.upload`) and, distributed,
        plus the client's declared share N(0, σ²S²/K) from its own stream."""
        out, norm, clip = super().upload(ctx, task, update)
        if self.noise == "distributed":  # the declared share, from the client's stream
            out = privacy_session(ctx, task).get(GaussianShare).add(out)
        return out, norm, clip
