"""Client-level mechanisms: the kernel's mechanisms for releases about a whole client.

`raydpfl.privacy.mechanisms.kernel` holds the record-level mechanisms a worker draws through; this
module holds the population-level ones the *platform* releases on the server for a
client-level algorithm (and one worker-side share). Each is a frozen value with the two
faces of every kernel mechanism, reading the same fields:

- `cost(n)` — the `raydpfl.privacy.accounting.client_level.ClientLevelCost` the run's population
  ledger is charged before the round (the DpEvent; None when an earlier release of the
  same event already paid for it: a tree's later rounds);
- `live(streams)` — the server-side object that draws the noise from the round's streams
  (`ServerStreams`: the run seed, the round, secure-noise mode) and counts invocations.

The server half of a client-level algorithm declares its round's mechanism
(``round_mechanisms(round_idx)``: one `MechanismUse`, count 1); the server charges
`population_charge` of it before the round is dispatched. After the workers' uploads are
summed, the **platform** makes the round's release (`PopulationSession.release_round`: the
declared mechanism invoked once on the round's actual sum, `RoundUploads`) and hands the
server half only the result, a `ReleasedSum` (the noised sum, the number of uploads, and
with adaptive clipping the noisy count); the un-noised sum and the clients' metric sums
never reach algorithm code. While the server half builds its model from it
(``aggregate_release``), the round's session is set on the algorithm as
``round_session``; the release closed it (any further draw through it is refused, and
it no longer holds the tree state), and its receipt is checked afterwards
(`check_round_receipt`: `PrivacyContractError` naming the round).

DP-FTRL's tree keeps state across rounds that is not noised (the running sum of the
epoch's rounds) and noise that must not reach the server half (the nodes in use): both
are the platform's (`TreeState`, kept and checkpointed by the server), and the release
is the tree's noisy prefix sum Ŝ_t.

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
  rounds 2..T are covered by it (`cost` None) but still draw exactly one node each. The
  release is the noisy prefix sum Ŝ_t = Σ_{i≤t} g_i + Σ_{v ∈ prefix(t)} z_v, computed by
  the platform from its `TreeState` in the order the algorithm computed it before.

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
    "WITHIN_CLIP_METRIC",
    "AdaptiveClipGaussianSum",
    "ClientGaussianSum",
    "DistributedGaussianSum",
    "GaussianShare",
    "PopulationMechanism",
    "PopulationSession",
    "ReleasedSum",
    "RoundUploads",
    "ServerStreams",
    "TreeAggregationRelease",
    "TreeState",
    "check_round_receipt",
    "check_update_bound",
    "check_upload_terms",
    "population_charge",
    "release_directly",
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
#: The attribute by which the server marks an algorithm it runs: no direct release then.
SERVED_ATTR = "_population_served"
#: The attribute holding a direct caller's tree state (tests, notebooks; never a server's).
DIRECT_TREE_ATTR = "_direct_tree_state"
#: The client metric carrying adaptive clipping's bit b_k = 1[‖Δ_k‖ ≤ S_t] (0.0 or 1.0).
WITHIN_CLIP_METRIC = "update_within_clip"


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


def check_upload_terms(weight: float, metrics: Mapping[str, float], where: str) -> None:
    """The platform's check on the rest of a client-level upload: weight exactly 1 (the
    sum's sensitivity S assumes Σ_k clip(Δ_k), not Σ_k w_k clip(Δ_k)) and, where the
    client reports adaptive clipping's bit, a bit (the count's sensitivity ½ assumes
    b_k ∈ {0, 1}). `PrivacyContractError` naming `where` otherwise."""
    if weight != 1.0:
        raise PrivacyContractError(
            f"{where}: a client-level upload has weight 1 (the round's charge bounds the "
            f"plain sum of updates clipped to S), got {weight!r}"
        )
    bit = metrics.get(WITHIN_CLIP_METRIC)
    if bit is not None and float(bit) not in (0.0, 1.0):
        raise PrivacyContractError(
            f"{where}: {WITHIN_CLIP_METRIC} is the bit 1[norm <= S] (0 or 1; the noisy "
            f"count's sensitivity is 1/2), got {bit!r}"
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


# ---- what the platform releases ---------------------------------------------------------------
@dataclass(frozen=True)
class RoundUploads:
    """The un-noised inputs of a client-level round's release, as the platform summed them:
    Σ_k clip_S(Δ_k) (each with its share, distributed; None when no upload arrived), the
    number of uploads, and the sums of their metrics (adaptive clipping's Σ_k b_k is
    ``metric_sums[WITHIN_CLIP_METRIC]``). Built by the server from the workers' sums and
    handed to the round's session; never to algorithm code."""

    total: Mapping[str, torch.Tensor] | None
    count: int
    metric_sums: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleasedSum:
    """What a client-level server half receives: the round's release, made by the platform.

    - ``noisy_sum``: the declared mechanism's output, in the model's parameter order:
      Σ_k clip_S(Δ_k) + N(0, σ²S²) (`ClientGaussianSum`; z_Δ·S_t with adaptive clipping),
      the sum of the clients' noised uploads (`DistributedGaussianSum`), or the epoch's
      noisy prefix sum Ŝ_t (`TreeAggregationRelease`); an empty round releases the noise
      alone;
    - ``clients``: the number of uploads summed (the platform also writes it to
      rounds.parquet as ``clients_trained`` and lists it as ``cohort_sizes``);
    - ``mechanism``: the declared (and charged) mechanism that released it;
    - ``noisy_clip_count``: adaptive clipping only, Σ_k (b_k − ½) + N(0, σ_b²).

    Nothing in it is un-noised client data: everything a server half computes from it is
    post-processing of the charged release."""

    noisy_sum: Mapping[str, torch.Tensor]
    clients: int
    mechanism: PopulationMechanism
    noisy_clip_count: float | None = None


class TreeState:
    """The platform's state of the current DP-FTRL tree, kept on the server (never by the
    algorithm): the epoch, the clean running sum Σ_{i≤t} g_i of its rounds so far, and the
    noise of the nodes still in use (at most one per level: those of the prefix). The
    server checkpoints it (`tensor_state`, `state_dict`), so a resumed run, and one in
    secure-noise mode, reuses each node's noise instead of drawing it again."""

    #: The prefix of its keys in a checkpoint's tensor file.
    PREFIX = "population/tree/"

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.clean: Params | None = None
        self.nodes: dict[int, Params] = {}

    def reset(self, epoch: int, like: Mapping[str, torch.Tensor]) -> None:
        """A new tree: a zero running sum shaped like the model, no node."""
        self.epoch = int(epoch)
        self.clean = {n: torch.zeros_like(p) for n, p in like.items()}
        self.nodes = {}

    def state_dict(self) -> dict[str, Any] | None:
        if self.clean is None:
            return None
        return {"epoch": self.epoch, "levels": sorted(self.nodes)}

    def tensor_state(self) -> dict[str, torch.Tensor]:
        if self.clean is None:
            return {}
        out = {f"{self.PREFIX}clean/{n}": t for n, t in self.clean.items()}
        for level, noise in self.nodes.items():
            out.update({f"{self.PREFIX}node/{level}/{n}": t for n, t in noise.items()})
        return out

    def load(self, state: Mapping[str, Any] | None, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores what `state_dict` and `tensor_state` returned (None, {}: no tree yet);
        raises `ValueError` when the two disagree (an altered checkpoint)."""
        self.__init__()  # type: ignore[misc]
        if state is None:
            if tensors:
                raise ValueError("checkpointed tree tensors without the tree's state")
            return
        clean: Params = {}
        nodes: dict[int, Params] = {}
        for key, t in tensors.items():
            rest = key[len(self.PREFIX) :]
            if rest.startswith("clean/"):
                clean[rest[len("clean/") :]] = t
            else:
                _, level, name = rest.split("/", 2)
                nodes.setdefault(int(level), {})[name] = t
        if sorted(nodes) != sorted(state.get("levels", [])) or not clean:
            raise ValueError(
                f"checkpointed tree nodes {sorted(nodes)} do not match the state's levels "
                f"{sorted(state.get('levels', []))}"
            )
        self.epoch, self.clean, self.nodes = int(state["epoch"]), clean, nodes


def _summed_like(uploads: RoundUploads, like: Mapping[str, torch.Tensor]) -> Params:
    """The round's sum in `like`'s order and on its devices (zeros when nothing arrived)."""
    if uploads.total is None:
        return {n: torch.zeros_like(t) for n, t in like.items()}
    return {n: uploads.total[n].to(like[n].device) for n in like}


# ---- live forms ------------------------------------------------------------------------------
class LivePopulationMechanism:
    """A declared population-level mechanism in a round's session: it draws the noise from
    the round's streams and counts invocations."""

    def __init__(self, mechanism: PopulationMechanism, streams: ServerStreams) -> None:
        self.mechanism = mechanism
        self.streams = streams
        self.count = 0
        self._session: PopulationSession | None = None

    def _check_open(self) -> None:
        """Refuses a draw once the round's release is made (`PopulationSession.release_round`
        closes the session before the server half sees it): a further release would draw
        the round's noise again, from the same stream, beside the one charged."""
        session = self._session
        if session is not None and session._released:
            raise PrivacyContractError(
                f"round {session.round_idx + 1} (client-level, server half): "
                f"{self.mechanism.describe()}: the round's release was already made by the "
                "platform; a server half draws nothing of its own"
            )


class LiveGaussianSum(LivePopulationMechanism):
    """`ClientGaussianSum` live: `release` is one invocation."""

    mechanism: ClientGaussianSum

    def release(self, clipped_sum: Mapping[str, torch.Tensor]) -> Params:
        """Σ + N(0, σ²S²): a new mapping (the inputs are not modified)."""
        self._check_open()
        self.count += 1
        gen = self.streams.round(NOISE_PURPOSE)
        return add_aggregate_noise(clipped_sum, self.mechanism.noise_std, gen)

    def _release_round(
        self, uploads: RoundUploads, tasks: Sequence[Any], like: Mapping[str, torch.Tensor]
    ) -> ReleasedSum:
        noisy = self.release(_summed_like(uploads, like))
        return ReleasedSum(noisy, uploads.count, self.mechanism)


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
        self._check_open()
        if self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a second update-sum release before the "
                "count of unclipped updates (one release of each per invocation)"
            )
        self._open = True
        gen = self.streams.round(NOISE_PURPOSE)
        return add_aggregate_noise(clipped_sum, self.mechanism.noise_std, gen)

    def noisy_count(self) -> float:
        """One N(0, σ_b²) draw for Σ_k (b_k − ½); closes the invocation."""
        self._check_open()
        self._complete(
            self._open,
            "the count of unclipped updates released without its update sum (release() first)",
        )
        gen = self.streams.round(COUNT_NOISE_PURPOSE)
        draw = gaussian_like(torch.zeros(1, dtype=torch.float64), self.mechanism.count_stddev, gen)
        return float(draw[0])

    def _release_round(
        self, uploads: RoundUploads, tasks: Sequence[Any], like: Mapping[str, torch.Tensor]
    ) -> ReleasedSum:
        """The update sum at z_Δ·S_t, then the centred count Σ_k b_k − ½·K + N(0, σ_b²)
        (the same float expression the algorithm evaluated before the platform did)."""
        noisy = self.release(_summed_like(uploads, like))
        within = float(uploads.metric_sums.get(WITHIN_CLIP_METRIC, 0.0))
        centred = within - 0.5 * uploads.count + self.noisy_count()
        return ReleasedSum(noisy, uploads.count, self.mechanism, noisy_clip_count=centred)


class LiveDistributedSum(LivePopulationMechanism):
    """`DistributedGaussianSum` live: `release` is one invocation; the noise is in the
    clients' shares, so it only checks that every task declared its one share."""

    mechanism: DistributedGaussianSum

    def release(self, summed: Params, tasks: Sequence[Any]) -> Params:
        self._check_open()
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

    def _release_round(
        self, uploads: RoundUploads, tasks: Sequence[Any], like: Mapping[str, torch.Tensor]
    ) -> ReleasedSum:
        return ReleasedSum(
            self.release(_summed_like(uploads, like), tasks), uploads.count, self.mechanism
        )


class LiveTreeRelease(LivePopulationMechanism):
    """`TreeAggregationRelease` live: `node_noise` draws the noise of this round's node
    (one invocation)."""

    mechanism: TreeAggregationRelease

    @property
    def node(self) -> tuple[int, int]:
        return self.mechanism.node

    def node_noise(self, like: Mapping[str, torch.Tensor]) -> Params:
        """N(0, σ²S²) shaped like each tensor of `like`, in its order (zeros for σS = 0)."""
        self._check_open()
        self.count += 1
        m = self.mechanism
        std = m.noise_std
        gen = self.streams.tree_node(m.epoch, m.node)
        return {
            n: (gaussian_like(p, std, gen) if std > 0 else torch.zeros_like(p))
            for n, p in like.items()
        }

    def _release_round(
        self, uploads: RoundUploads, tasks: Sequence[Any], like: Mapping[str, torch.Tensor]
    ) -> ReleasedSum:
        """Ŝ_t: the round's sum added to the tree's running sum, this round's node drawn
        (it replaces the lower-level nodes it covers), and the running sum plus the
        prefix's nodes, highest level first (Kairouz et al. 2021, Alg. 1)."""
        tree = self._session.tree if self._session is not None else None
        if tree is None:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a tree release needs the platform's tree state"
            )
        m = self.mechanism
        if m.round_in_tree == 1 or tree.clean is None or tree.epoch != m.epoch:
            tree.reset(m.epoch, like)
        assert tree.clean is not None
        if uploads.total is not None:
            for n in tree.clean:
                tree.clean[n].add_(uploads.total[n].to(tree.clean[n].device))
        level, _ = m.node
        tree.nodes = {lv: z for lv, z in tree.nodes.items() if lv > level}
        tree.nodes[level] = self.node_noise(tree.clean)
        prefix: Params = {}
        for n, clean in tree.clean.items():
            noisy = clean.clone()
            for lv in sorted(tree.nodes, reverse=True):  # the prefix's nodes, highest first
                noisy.add_(tree.nodes[lv][n])
            prefix[n] = noisy
        return ReleasedSum(prefix, uploads.count, m)


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

    def __init__(
        self,
        declared: Sequence[MechanismUse],
        streams: ServerStreams,
        tree: TreeState | None = None,
    ) -> None:
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
        self._released = False  # the round's release is made: nothing more is drawn
        #: The platform's DP-FTRL tree state (the server's; a direct caller's own); let go
        #: once the round is released (it holds the clean running sum).
        self.tree = tree
        self._live = [type(u.mechanism).live(u.mechanism, streams) for u in self.declared]  # type: ignore[call-arg]
        for live in self._live:
            live._session = self

    def release_round(
        self,
        uploads: RoundUploads,
        tasks: Sequence[Any],
        like: Mapping[str, torch.Tensor],
    ) -> ReleasedSum:
        """The platform's release of the round: its one declared mechanism, invoked once on
        `uploads` (the noise drawn in `like`'s parameter order, on its devices); `tasks`
        are the round's tasks (the distributed sum checks their shares). A round declares
        one population mechanism, once: anything else is refused here. The session is
        closed afterwards: any further draw through it is refused, and it lets go of the
        tree state (the server half may hold the session, never the clean sum)."""
        uses_ = [u for u in self.declared if u.count]
        if len(uses_) != 1 or uses_[0].count != 1:
            raise PrivacyContractError(
                f"round {self.round_idx + 1} (client-level): the platform releases one "
                f"declared population mechanism once per round, the round declares "
                f"{_describe(self.declared)}"
            )
        live = self._live[self.declared.index(uses_[0])]
        live._check_open()
        try:
            return live._release_round(uploads, tasks, like)  # type: ignore[no-any-return]
        finally:
            self._released, self.tree = True, None


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
    as ``round_session`` (its release already made: a further one is refused), or, when
    the algorithm is used directly (tests, notebooks), a fresh one from
    ``declare(round_idx)`` on the same streams, with the caller's own tree state. An
    algorithm a server runs gets no fresh session outside the server's rounds."""
    opened = getattr(owner, ROUND_SESSION_ATTR, None)
    if opened is not None:
        return opened
    if getattr(owner, SERVED_ATTR, False):
        raise PrivacyContractError(
            f"round {round_idx + 1} (client-level, server half): a release outside the "
            "round's session; the platform makes each round's release itself and hands the "
            "server half the result (aggregate_release)"
        )
    tree = owner.__dict__.get(DIRECT_TREE_ATTR)
    if tree is None:
        tree = TreeState()
        setattr(owner, DIRECT_TREE_ATTR, tree)
    return open_round_session(owner, round_idx, declare(round_idx), seed, tree)


def open_round_session(
    owner: object,
    round_idx: int,
    declared: Sequence[MechanismUse],
    seed: int,
    tree: TreeState | None = None,
) -> PopulationSession:
    """A session for `declared` on the streams of (seed, round) in `owner`'s noise mode
    (``secure_noise``: os.urandom), with the DP-FTRL tree state `tree`."""
    secure = bool(getattr(owner, "secure_noise", False))
    return PopulationSession(declared, ServerStreams(int(seed), int(round_idx), secure), tree)


def release_directly(
    owner: object,
    round_idx: int,
    declare: Callable[[int], Sequence[MechanismUse]],
    seed: int,
    uploads: RoundUploads,
    tasks: Sequence[Any],
    like: Mapping[str, torch.Tensor],
) -> ReleasedSum:
    """The release the server would make for `owner`'s round, for a direct caller (tests,
    notebooks: `ClientLevelAlgorithm.aggregate_sum`): the same streams, the same order,
    so the same bits. Inside a server's round it is a second release (refused)."""
    return round_session(owner, round_idx, declare, seed).release_round(uploads, tasks, like)


_seal(__name__)
