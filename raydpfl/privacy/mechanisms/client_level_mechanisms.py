"""Client-level mechanisms: the kernel's mechanisms for releases about a whole client.

`raydpfl.privacy.mechanisms.kernel` holds the record-level mechanisms a worker draws through; this
module holds the population-level ones a client-level algorithm's *server half* draws
through (and one worker-side share). Each is a frozen value with the two faces of every
kernel mechanism, reading the same fields:

- `cost(n)` — the `raydpfl.privacy.accounting.client_level.ClientLevelCost` the run's population
  ledger is charged before the round (the DpEvent; None when an earlier release of the
  same event already paid for it: a tree's later rounds);
- `live(streams)` — the server-side object that draws the noise from the round's streams
  (`ServerStreams`: the run seed, the round, secure-noise mode) and counts invocations.

The server half of a client-level algorithm declares its round's mechanisms
(``round_mechanisms(round_idx)``, a tuple of `MechanismUse`); the server charges
`population_charge` of them before the round is dispatched, opens a `PopulationSession`
on them, sets it on the algorithm as ``round_session`` for the aggregation, and then
refuses a round whose receipt differs from the declaration (`check_round_receipt`:
`PrivacyContractError` naming the round). So σ, S, the sampling and the number of noisy
releases per round are those the ledger charged; noise drawn outside the session, or a
round's noise drawn twice or skipped, stops the run.

Mechanisms (unit: one client, all its records; S the bound on each clipped update):

- `ClientGaussianSum(σ, S, sampling, N, q, K)` — DP-FedAvg's aggregate (McMahan et al.
  2018, Alg. 1): N(0, σ²S²) once on Σ_k clip_S(Δ_k); one invocation per round, charged
  ``ClientLevelCost(σ, sampling, N, q, K, n)``.
- `AdaptiveClipGaussianSum(σ, S_t, σ_b, ...)` — adaptive clipping (Andrew et al. 2021,
  Alg. 1): the update sum at noise multiplier z_Δ = (σ⁻² − (2σ_b)⁻²)^(−½), computed here
  from σ and σ_b (`update_noise_multiplier`), and the centred count of unclipped updates
  with N(0, σ_b²). The two Gaussians compose to one of multiplier σ, so one invocation
  (both releases) is charged as `ClientGaussianSum`'s ``ClientLevelCost(σ, ...)``.
- `DistributedGaussianSum(σ, S, N, K)` — the same aggregate with the noise split: each
  of the K clients adds its `GaussianShare` N(0, σ²S²/K) on its worker, through its task's
  `PrivacySession`; the server releases the plain sum once, charged as the fixed-size
  ``ClientLevelCost(σ, "fixed", N, K, n)``. The share is population-level: it is never
  charged to a client's ledger (`raydpfl.privacy.mechanisms.kernel.costs_of` leaves it out).
- `TreeAggregationRelease(σ, S, N, K, T, epoch, t)` — DP-FTRL's release of round t of an
  epoch's tree (Kairouz et al. 2021): the node completing at t carries N(0, σ²S²)
  (`tree_node_for`). The tree's event ``SingleEpochTreeAggregationDpEvent(σ, T)`` is
  charged by its first release (t = 1: ``ClientLevelCost(σ, "tree", N, K, n, T)``);
  rounds 2..T are covered by it (`cost` None) but still draw exactly one node each.

Noise streams are those the algorithms drew before this module (same generators, same
order, same float expressions): the aggregate and count from (seed, round, purpose)
(`round_noise_generator`), a tree node from (seed, epoch, level, index)
(`tree_node_generator`), or os.urandom in secure-noise mode. This module imports nothing
from `raydpfl.algorithms` or `raydpfl.simulation`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from raydpfl.privacy.accounting.client_level import ClientLevelCost
from raydpfl.privacy.mechanisms.kernel import (
    LiveMechanism,
    Mechanism,
    MechanismUse,
    OpenInvocation,
    PrivacyContractError,
    PrivacySession,
    Receipt,
    _seal,
    _set_reals,
    kernel_cost,
)
from raydpfl.privacy.noise import secure_noise
from raydpfl.privacy.per_sample.dpsgd import gaussian_like

Params = dict[str, torch.Tensor]

__all__ = [
    "COUNT_NOISE_PURPOSE",
    "NODE_PURPOSE",
    "NOISE_PURPOSE",
    "UPDATE_BOUND_TOLERANCE",
    "AdaptiveClipGaussianSum",
    "ClientGaussianSum",
    "DistributedGaussianSum",
    "GaussianShare",
    "PopulationMechanism",
    "PopulationSession",
    "ServerStreams",
    "TreeAggregationRelease",
    "check_round_receipt",
    "check_update_bound",
    "population_charge",
    "round_noise_generator",
    "round_session",
    "tree_node_for",
    "tree_node_generator",
    "update_l2_norm",
    "update_noise_multiplier",
]

#: The purpose tag of the server's aggregate-noise stream (DP-FedAvg, client level).
NOISE_PURPOSE = "client_level_noise"
#: The purpose tag of the noise on the count of unclipped updates (adaptive clipping).
COUNT_NOISE_PURPOSE = "client_level_clip_count"
#: The purpose tag of DP-FTRL's tree-node noise.
NODE_PURPOSE = "dp_ftrl_tree_node"
#: The attribute the server sets on a client-level algorithm for the round's aggregation.
ROUND_SESSION_ATTR = "round_session"


# ---- streams --------------------------------------------------------------------------------
def round_noise_generator(
    seed: int, round_idx: int, secure: bool = False, purpose: str = NOISE_PURPOSE
) -> Any:
    """The server noise's stream for (run seed, round, purpose): independent of the workers
    and of the order clients ran; a `SecureGenerator` in secure-noise mode."""
    if secure:
        return secure_noise.SecureGenerator()
    tag = zlib.crc32(purpose.encode("utf-8"))
    seq = np.random.SeedSequence([int(seed), round_idx + 1, 0, tag])
    gen = torch.Generator()
    gen.manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
    return gen


def tree_node_generator(seed: int, epoch: int, node: tuple[int, int], secure: bool) -> Any:
    """The stream of one tree node's noise: (seed, epoch, level, index), or os.urandom."""
    if secure:
        return secure_noise.SecureGenerator()
    tag = zlib.crc32(NODE_PURPOSE.encode("utf-8"))
    seq = np.random.SeedSequence([int(seed), int(epoch), node[0], node[1], tag])
    gen = torch.Generator()
    gen.manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
    return gen


@dataclass(frozen=True)
class ServerStreams:
    """Where a round's server-side noise comes from: the algorithm's run seed, the round,
    and whether secure-noise mode (os.urandom) is on. Each release derives its generator
    afresh from these (so a direct call, a resumed run and the server draw alike)."""

    seed: int
    round_idx: int
    secure: bool = False

    def round(self, purpose: str) -> Any:
        return round_noise_generator(self.seed, self.round_idx, self.secure, purpose)

    def tree_node(self, epoch: int, node: tuple[int, int]) -> Any:
        return tree_node_generator(self.seed, epoch, node, self.secure)


# ---- the math the mechanisms own -----------------------------------------------------------
def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−½): the update noise multiplier that, composed with the
    centred-bit count release (sensitivity ½, noise σ_b: multiplier 2σ_b), gives one
    Gaussian with multiplier z (Andrew et al. 2021, §3: Gaussian multipliers compose as
    z⁻² = z_Δ⁻² + (2σ_b)⁻²). Needs z < 2σ_b; z = 0 (no noise) gives 0."""
    if noise_multiplier == 0:
        return 0.0
    if not count_stddev > noise_multiplier / 2:
        raise ValueError(
            f"clip_count_stddev {count_stddev:g} must exceed noise_multiplier/2 = "
            f"{noise_multiplier / 2:g} (the count's noise alone would spend more than the "
            "whole budget); raise it or the cohort size"
        )
    return (noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5


#: Relative float slack on a client update's bound S (a clipped float32 update's norm,
#: computed in float64, may exceed S by a few ulps).
UPDATE_BOUND_TOLERANCE = 1e-5


def update_l2_norm(update: Mapping[str, torch.Tensor]) -> float:
    """‖Δ‖₂ over all tensors together, in float64 (NaN stays NaN)."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in update.values()))


def check_update_bound(update: Mapping[str, torch.Tensor], bound: float, where: str) -> None:
    """The platform's check on a client-level upload: ‖Δ‖₂ ≤ S (`PrivacyContractError`
    naming `where` otherwise), so no unclipped update leaves a worker."""
    norm = update_l2_norm(update)
    if not norm <= bound * (1.0 + UPDATE_BOUND_TOLERANCE):
        raise PrivacyContractError(
            f"{where}: the client's update has norm {norm:.6g} > S = {bound:g}; a client-level "
            "round's charge assumes every update clipped to S, so the run stops"
        )


def tree_node_for(t: int) -> tuple[int, int]:
    """(level, index) of the node that completes at round t (1-based within the tree):
    level ℓ = the number of trailing zeros of t, covering rounds [t − 2^ℓ + 1, t], the
    index-th node of its level (0-based). Kairouz et al. 2021, Alg. 1 (online tree)."""
    if t < 1:
        raise ValueError(f"t must be >= 1, got {t}")
    level = (t & -t).bit_length() - 1
    return level, (t >> level) - 1


def aggregate_noise_std(noise_multiplier: float, clip_norm: float) -> float:
    """σ·S: the std of the Gaussian added once to the sum of clipped updates (McMahan et
    al. 2018, Algorithm 1, with the noise on the sum rather than on the mean)."""
    return noise_multiplier * clip_norm


def distributed_noise_std(noise_multiplier: float, clip_norm: float, cohort_size: int) -> float:
    """σ·S/√K per client: K independent N(0, σ²S²/K) sum to N(0, σ²S²)."""
    return noise_multiplier * clip_norm / math.sqrt(cohort_size)


def add_aggregate_noise(total: Mapping[str, torch.Tensor], std: float, generator: Any) -> Params:
    """Σ + z with z ~ N(0, std² I), tensor by tensor in `total`'s order (`gaussian_like`,
    so secure-noise mode applies); std 0 draws nothing."""
    if std == 0:
        return {n: t.clone() for n, t in total.items()}
    return {n: t + gaussian_like(t, std, generator) for n, t in total.items()}


# ---- mechanisms -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PopulationMechanism(Mechanism):
    """A client-level mechanism the server half draws: `cost` is a `ClientLevelCost` (or
    None: paid by an earlier release), `live` takes the round's `ServerStreams`."""

    kind: ClassVar[str] = "population_mechanism"
    population_level: ClassVar[bool] = True

    def cost(self, invocations: int) -> ClientLevelCost | None:  # type: ignore[override]
        raise NotImplementedError

    def live(self, streams: ServerStreams, device: Any = None) -> Any:  # type: ignore[override]
        raise NotImplementedError

    def describe(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            parts.append(f"{f.name}={v:g}" if isinstance(v, float) else f"{f.name}={v}")
        return f"{self.kind}({', '.join(parts)})"


def _sampled_cost(
    sigma: float, sampling: str, population: int, q: float | None, k: int | None, n: int
) -> ClientLevelCost:
    return ClientLevelCost(sigma, sampling, population, q, k, n)


@dataclass(frozen=True)
class ClientGaussianSum(PopulationMechanism):
    """N(0, σ²S²) once on the sum of the round's updates, each clipped to S by its client
    (McMahan et al. 2018, Alg. 1); ``sampling`` ``poisson`` (rate q) or ``fixed`` (K of
    N). One invocation = one round's release."""

    kind: ClassVar[str] = "client_gaussian_sum"
    noise_multiplier: float
    clip_norm: float
    sampling: str
    population: int
    sampling_rate: float | None = None
    cohort_size: int | None = None

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier")
        _set_reals(self, "clip_norm", strict=True)
        if self.sampling not in ("poisson", "fixed"):
            raise ValueError(f"sampling must be poisson or fixed, got {self.sampling!r}")
        self.cost(1)  # validates N, q, K (ValueError naming the field)

    @property
    def update_noise_multiplier(self) -> float:
        """The multiplier of the update sum's noise (σ itself here)."""
        return self.noise_multiplier

    @property
    def noise_std(self) -> float:
        """The std of the noise on the sum: σ·S (z_Δ·S with adaptive clipping)."""
        return aggregate_noise_std(self.update_noise_multiplier, self.clip_norm)

    def cost(self, invocations: int) -> ClientLevelCost:
        return _sampled_cost(
            self.noise_multiplier,
            self.sampling,
            self.population,
            self.sampling_rate,
            self.cohort_size,
            invocations,
        )

    def live(self, streams: ServerStreams, device: Any = None) -> LiveGaussianSum:
        return LiveGaussianSum(self, streams)


@dataclass(frozen=True)
class AdaptiveClipGaussianSum(ClientGaussianSum):
    """Adaptive clipping's two releases of a round (Andrew et al. 2021, Alg. 1): the sum
    of updates clipped to S_t with N(0, z_Δ²S_t²), and Σ_k (b_k − ½) with N(0, σ_b²).
    z_Δ is computed here from σ and σ_b (`update_noise_multiplier`), so that the pair is
    one Gaussian of multiplier σ, charged as `ClientGaussianSum`'s cost."""

    kind: ClassVar[str] = "adaptive_clip_gaussian_sum"
    count_stddev: float = field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        _set_reals(self, "count_stddev")
        update_noise_multiplier(self.noise_multiplier, self.count_stddev)  # σ_b > σ/2

    @property
    def update_noise_multiplier(self) -> float:
        """z_Δ = (σ⁻² − (2σ_b)⁻²)^(−½)."""
        return update_noise_multiplier(self.noise_multiplier, self.count_stddev)

    def live(self, streams: ServerStreams, device: Any = None) -> LiveAdaptiveClipSum:
        return LiveAdaptiveClipSum(self, streams)


@dataclass(frozen=True)
class GaussianShare(Mechanism):
    """One client's share N(0, σ²S²/K) of a `DistributedGaussianSum`, drawn on its worker
    from its own stream (through its task's `PrivacySession`). Population-level: the sum
    of the K shares is charged once with the round, never a client's ledger."""

    kind: ClassVar[str] = "gaussian_share"
    population_level: ClassVar[bool] = True
    noise_multiplier: float
    clip_norm: float
    cohort_size: int

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier")
        _set_reals(self, "clip_norm", strict=True)
        k = self.cohort_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"cohort_size must be an int >= 1, got {k!r}")

    @property
    def noise_std(self) -> float:
        """σ·S/√K: K independent shares sum to N(0, σ²S²)."""
        return distributed_noise_std(self.noise_multiplier, self.clip_norm, self.cohort_size)

    def cost(self, invocations: int) -> None:  # type: ignore[override]
        """None: charged with its sum, at the population level."""
        return None

    def live(self, generator: torch.Generator, device: torch.device) -> LiveGaussianShare:
        return LiveGaussianShare(self, generator, device)


@dataclass(frozen=True)
class DistributedGaussianSum(PopulationMechanism):
    """The sum of K updates clipped to S, each carrying its client's `GaussianShare`
    N(0, σ²S²/K): N(0, σ²S²) on the sum, as `ClientGaussianSum` with fixed-size sampling,
    charged alike. The server draws nothing; its release checks that every task of the
    round declared exactly one share (the workers' receipts show it was drawn)."""

    kind: ClassVar[str] = "distributed_gaussian_sum"
    noise_multiplier: float
    clip_norm: float
    population: int
    cohort_size: int

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier")
        _set_reals(self, "clip_norm", strict=True)
        self.cost(1)

    @property
    def update_noise_multiplier(self) -> float:
        """σ: the shares sum to N(0, σ²S²)."""
        return self.noise_multiplier

    @property
    def share(self) -> GaussianShare:
        """What each client of the round declares and draws."""
        return GaussianShare(self.noise_multiplier, self.clip_norm, self.cohort_size)

    def cost(self, invocations: int) -> ClientLevelCost:
        return _sampled_cost(
            self.noise_multiplier, "fixed", self.population, None, self.cohort_size, invocations
        )

    def live(self, streams: ServerStreams, device: Any = None) -> LiveDistributedSum:
        return LiveDistributedSum(self, streams)


@dataclass(frozen=True)
class TreeAggregationRelease(PopulationMechanism):
    """Round t (1-based) of an epoch's tree of T rounds in DP-FTRL (Kairouz et al. 2021,
    Alg. 1): the node completing at t (`tree_node_for`) gets N(0, σ²S²), and the noisy
    prefix sum is released. The tree's event (``SingleEpochTreeAggregationDpEvent(σ, T)``,
    `ClientLevelCost` ``tree``) is charged by its first release (t = 1); the later
    releases of the tree are covered by it (`cost` None), yet each round draws exactly
    one node, checked like any release."""

    kind: ClassVar[str] = "tree_aggregation_release"
    noise_multiplier: float
    clip_norm: float
    population: int
    cohort_size: int
    tree_rounds: int
    epoch: int
    round_in_tree: int

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier")
        _set_reals(self, "clip_norm", strict=True)
        self._tree_cost(1)  # validates N, K, T
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {self.epoch!r}")
        t = self.round_in_tree
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"round_in_tree must be an int >= 1, got {t!r}")

    @property
    def noise_std(self) -> float:
        """σ·S, every node's std."""
        return self.noise_multiplier * self.clip_norm

    @property
    def node(self) -> tuple[int, int]:
        """(level, index) of the node this release completes."""
        return tree_node_for(self.round_in_tree)

    def _tree_cost(self, invocations: int) -> ClientLevelCost:
        return ClientLevelCost(
            self.noise_multiplier,
            "tree",
            self.population,
            None,
            self.cohort_size,
            invocations,
            self.tree_rounds,
        )

    def cost(self, invocations: int) -> ClientLevelCost | None:
        """The whole tree's event at its first round; None (already paid) after it."""
        return self._tree_cost(invocations) if self.round_in_tree == 1 else None

    def live(self, streams: ServerStreams, device: Any = None) -> LiveTreeRelease:
        return LiveTreeRelease(self, streams)


# ---- live forms ------------------------------------------------------------------------------
class LivePopulationMechanism:
    """A declared population-level mechanism in a round's session: it draws the noise from
    the round's streams and counts invocations."""

    def __init__(self, mechanism: PopulationMechanism, streams: ServerStreams) -> None:
        self.mechanism = mechanism
        self.streams = streams
        self.count = 0
        self._session: PopulationSession | None = None

    def _check_sum(self, released: Mapping[str, torch.Tensor]) -> None:
        """The release is of the round's actual sum of uploads: the server sets it on the
        session before the aggregation (`PopulationSession._expect`), so noising a dummy
        while the real sum goes out elsewhere is refused. No expectation: a direct call."""
        actual = None if self._session is None else self._session._actual
        if actual is None:
            return
        same = set(released) == set(actual) and all(
            torch.equal(released[n].to(actual[n].device), actual[n]) for n in actual
        )
        if not same:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: the released sum is not the round's sum of "
                "client uploads; the charged noise must be added to that sum"
            )


class LiveGaussianSum(LivePopulationMechanism):
    """`ClientGaussianSum` live: `release` is one invocation."""

    mechanism: ClientGaussianSum

    def release(self, clipped_sum: Mapping[str, torch.Tensor]) -> Params:
        """Σ + N(0, σ²S²): a new mapping (the inputs are not modified)."""
        self._check_sum(clipped_sum)
        self.count += 1
        gen = self.streams.round(NOISE_PURPOSE)
        return add_aggregate_noise(clipped_sum, self.mechanism.noise_std, gen)


class LiveAdaptiveClipSum(OpenInvocation, LivePopulationMechanism):
    """`AdaptiveClipGaussianSum` live: one invocation is `release` (the update sum at
    z_Δ·S_t) then `noisy_count` (σ_b); `count` counts completed invocations, so a round
    that skips the count, or releases the sum again before it, is seen on its receipt or
    refused here."""

    mechanism: AdaptiveClipGaussianSum

    def __init__(self, mechanism: AdaptiveClipGaussianSum, streams: ServerStreams) -> None:
        super().__init__(mechanism, streams)
        self._open = False

    def release(self, clipped_sum: Mapping[str, torch.Tensor]) -> Params:
        """Σ + N(0, z_Δ²S_t²); opens the invocation its `noisy_count` closes."""
        if self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a second update-sum release before the "
                "count of unclipped updates (one release of each per invocation)"
            )
        self._check_sum(clipped_sum)
        self._open = True
        gen = self.streams.round(NOISE_PURPOSE)
        return add_aggregate_noise(clipped_sum, self.mechanism.noise_std, gen)

    def noisy_count(self) -> float:
        """One N(0, σ_b²) draw for Σ_k (b_k − ½); closes the invocation."""
        self._complete(
            self._open,
            "the count of unclipped updates released without its update sum (release() first)",
        )
        gen = self.streams.round(COUNT_NOISE_PURPOSE)
        draw = gaussian_like(torch.zeros(1, dtype=torch.float64), self.mechanism.count_stddev, gen)
        return float(draw[0])


class LiveDistributedSum(LivePopulationMechanism):
    """`DistributedGaussianSum` live: `release` is one invocation; the noise is in the
    clients' shares, so it only checks that every task declared its one share."""

    mechanism: DistributedGaussianSum

    def release(self, summed: Params, tasks: Sequence[Any]) -> Params:
        self._check_sum(summed)
        self.count += 1
        share = self.mechanism.share
        for task in tasks:
            n = sum(u.count for u in task.mechanisms if u.mechanism == share)
            if n != 1:
                raise PrivacyContractError(
                    f"client {task.client_id}, round {task.round_idx + 1}: the distributed "
                    f"sum needs each client to declare one {share.describe()}, its task "
                    f"declares {n}; the sum would not carry the charged noise"
                )
        return summed


class LiveTreeRelease(LivePopulationMechanism):
    """`TreeAggregationRelease` live: `node_noise` draws the noise of this round's node
    (one invocation)."""

    mechanism: TreeAggregationRelease

    @property
    def node(self) -> tuple[int, int]:
        return self.mechanism.node

    def node_noise(self, like: Mapping[str, torch.Tensor]) -> Params:
        """N(0, σ²S²) shaped like each tensor of `like`, in its order (zeros for σS = 0)."""
        self.count += 1
        m = self.mechanism
        std = m.noise_std
        gen = self.streams.tree_node(m.epoch, m.node)
        return {
            n: (gaussian_like(p, std, gen) if std > 0 else torch.zeros_like(p))
            for n, p in like.items()
        }


class LiveGaussianShare(LiveMechanism):
    """A task's `GaussianShare` on the worker: `add` is one invocation."""

    mechanism: GaussianShare

    def add(self, update: Mapping[str, torch.Tensor]) -> Params:
        """update + N(0, σ²S²/K) per tensor, from the client's stream, in order. The
        platform checks ‖update‖ ≤ S first (the sensitivity the round's charge assumes)
        and the worker checks that the result uploads exactly what this returned."""
        check_update_bound(update, self.mechanism.clip_norm, self.mechanism.describe())
        self.count += 1
        std = self.mechanism.noise_std
        out = {n: t + gaussian_like(t, std, self._generator) for n, t in update.items()}
        self._released = out
        return out


# ---- the round's session and its check --------------------------------------------------------
class PopulationSession(PrivacySession):
    """A round's declared population-level mechanisms, live on the server."""

    def __init__(self, declared: Sequence[MechanismUse], streams: ServerStreams) -> None:
        self.declared = tuple(declared)
        for use in self.declared:
            if not isinstance(use, MechanismUse) or not isinstance(
                use.mechanism, PopulationMechanism
            ):
                raise PrivacyContractError(
                    "a client-level round declares population-level mechanisms "
                    "(raydpfl.privacy.mechanisms.client_level_mechanisms), got "
                    f"{getattr(use, 'mechanism', use)!r}"
                )
        self.streams = streams
        self.round_idx = streams.round_idx
        self._notes: dict[str, None] = {}
        self._actual: Mapping[str, torch.Tensor] | None = None
        self._live = [type(u.mechanism).live(u.mechanism, streams) for u in self.declared]  # type: ignore[call-arg]
        for live in self._live:
            live._session = self

    def _expect(self, total: Mapping[str, torch.Tensor] | None) -> None:
        """The round's actual sum of client uploads (the server's call), which a sum
        release must be of."""
        self._actual = None if total is None else dict(total)


def population_charge(declared: Sequence[MechanismUse]) -> ClientLevelCost | None:
    """The one population-ledger charge a round's declaration makes (None: nothing new,
    e.g. a tree's later round). One client-level event per round at most."""
    costs = [
        c
        for u in declared
        if u.mechanism.population_level and (c := kernel_cost(u.mechanism, u.count)) is not None
    ]
    if len(costs) > 1:
        raise ValueError(
            f"a client-level round charges one population-level event, the declaration "
            f"{_describe(declared)} makes {len(costs)}"
        )
    return costs[0] if costs else None


def _describe(declared: Sequence[MechanismUse]) -> str:
    return "; ".join(u.describe() for u in declared) or "no mechanism"


def check_round_receipt(
    round_idx: int, declared: Sequence[MechanismUse], receipt: Receipt | None
) -> None:
    """Raises `PrivacyContractError` (one line naming the round) unless the server half's
    receipt shows exactly the round's declared (and charged) releases."""
    got = () if receipt is None else tuple(u for u in receipt.uses if u.count)
    want = tuple(u for u in declared if u.count)
    if got != want:
        raise PrivacyContractError(
            f"round {round_idx + 1} (client-level, server half): charged {_describe(want)} "
            f"but the server half drew {_describe(got)} through the round's session; the "
            "run stops because what was released is not what the ledger charged"
        )


def round_session(
    owner: object,
    round_idx: int,
    declare: Callable[[int], Sequence[MechanismUse]],
    seed: int,
) -> PopulationSession:
    """The round's session: the one the server opened and set on `owner` (the algorithm)
    as ``round_session``, or, when the server half is called directly (tests,
    notebooks), a fresh one from ``declare(round_idx)`` on the same streams."""
    opened = getattr(owner, ROUND_SESSION_ATTR, None)
    if opened is not None:
        return opened
    return open_round_session(owner, round_idx, declare(round_idx), seed)


def open_round_session(
    owner: object, round_idx: int, declared: Sequence[MechanismUse], seed: int
) -> PopulationSession:
    """A session for `declared` on the streams of (seed, round) in `owner`'s noise mode
    (``secure_noise``: os.urandom)."""
    secure = bool(getattr(owner, "secure_noise", False))
    return PopulationSession(declared, ServerStreams(int(seed), int(round_idx), secure))


_seal(__name__)
