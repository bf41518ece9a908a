"""Client-level DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta & Xu, "Practical and
Private (Deep) Learning without Sampling or Shuffling", ICML 2021; the federated form of
McMahan et al.'s Gboard deployments).

Privacy unit: one client. No sampling amplification is relied on. The population is
walked in epochs: each epoch a public permutation of the N clients (from the run seed) is
cut into T = ⌊N/K⌋ rounds of K clients, so every client joins at most one round per epoch
(the N mod K clients left over sit the epoch out). Each round:

1. each client of the round runs τ non-private SGD steps from the global model and clips
   its update Δ to L2 norm S (`raydpfl.algorithms.dp_fedavg_client.clip_update`);
2. the platform adds the round's sum g_t = Σ_k clip(Δ_k) to the epoch's running sum and
   releases the *noisy prefix sum* Ŝ_t = Σ_{i≤t} g_i + Σ_{nodes} z_node through the binary
   tree (`tree_node_for`, `prefix_nodes`): node [a, b] carries its own N(0, σ²S²), and the
   prefix [1, t] is the sum of the ⌈popcount(t)⌉ dyadic nodes that cover it, so its noise
   variance is popcount(t)·σ²S² (Kairouz et al., Alg. 1 and §B; no Honaker estimator);
3. the server half, which receives only Ŝ_t (`ReleasedSum`), sets
   θ_t = θ_start + η_s·Ŝ_t / K: FTRL with the quadratic regulariser centred at the
   epoch's starting model (Eq. 2 with the pseudo-gradient −Δ), restarted every epoch
   (the "tree restart" of §4).

One epoch is dp-accounting's ``SingleEpochTreeAggregationDpEvent(σ, T)`` (zero-out
adjacency: one client's updates replaced by zeros; `raydpfl.privacy.accounting.client_level`),
charged before the epoch's first round. Every round's release is the kernel mechanism
`raydpfl.privacy.mechanisms.client_level_mechanisms.TreeAggregationRelease` (declared by
`round_mechanisms`; the first round of a tree charges the tree's event, the later ones
are covered by it). The platform makes every round's release and keeps what is not
released: the epoch's clean running sum and the noise of the nodes still in use (at most
one per tree level) are its `TreeState`, on the server, checkpointed by the server, so a
resumed run, or one in secure-noise mode (draws from os.urandom), reuses each node's
noise rather than drawing it again. Node noise is drawn from a stream derived from (run
seed, epoch, node), so the same run gives the same bits on any backend. The server half
keeps only the epoch's starting model (a released model). This module imports no Ray.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import (
    ClientTask,
    Params,
)
from raydpfl.algorithms.dp_fedavg_client import ClientLevelAlgorithm
from raydpfl.algorithms.tensor_state import pack_tensors, unpack_tensor_state
from raydpfl.privacy.accounting.client_level import ClientLevelCost, tree_schedule
from raydpfl.privacy.mechanisms.client_level_mechanisms import (  # noqa: F401 (re-exported)
    NODE_PURPOSE,
    ReleasedSum,
    TreeAggregationRelease,
    population_charge,
    round_session,
    tree_node_for,
    tree_node_generator,
)
from raydpfl.privacy.mechanisms.kernel import MechanismUse, uses

#: Purpose tag of the epoch order streams (the node noise's: `NODE_PURPOSE`).
ORDER_PURPOSE = "dp_ftrl_epoch_order"


# ---- the tree, as small pure functions -------------------------------------------------------
def prefix_nodes(t: int) -> list[tuple[int, int]]:
    """The dyadic nodes whose sum is the prefix [1, t]: one per set bit of t, highest
    level first (e.g. t = 6 → [1, 4] and [5, 6])."""
    out, start = [], 0
    for level in range(t.bit_length() - 1, -1, -1):
        if t >> level & 1:
            out.append((level, start >> level))
            start += 1 << level
    return out


def prefix_noise_variance(t: int, node_std: float) -> float:
    """popcount(t)·std²: the variance of the prefix's noise in each coordinate."""
    return bin(t).count("1") * node_std**2


def epoch_order(seed: int, epoch: int, num_clients: int) -> np.ndarray:
    """The epoch's public permutation of the clients (from the run seed and the epoch)."""
    tag = zlib.crc32(ORDER_PURPOSE.encode("utf-8"))
    return np.random.default_rng([int(seed), int(epoch), tag]).permutation(num_clients)


def node_generator(seed: int, epoch: int, node: tuple[int, int], secure: bool) -> Any:
    """The stream of one tree node's noise: (seed, epoch, level, index), or os.urandom
    (the stream `TreeAggregationRelease` draws from: `tree_node_generator`)."""
    return tree_node_generator(seed, epoch, node, secure)


# ---- the algorithm ---------------------------------------------------------------------------
class DPFTRLClientLevel(ClientLevelAlgorithm):
    """Client-level DP-FTRL with tree restarts every epoch (see the module docstring).

    Args:
        num_clients: N (public).
        cohort_size: K clients per round; an epoch has T = N // K rounds.
        rounds: The run's rounds (the last tree may be shorter: its charge says so).
        local_steps, lr, batch_size: τ non-private SGD steps of minibatch B at rate η.
        clip_norm: S, the bound on each client's update.
        noise_multiplier: σ; every tree node carries N(0, σ²S²).
        server_lr: η_s, the FTRL step (θ = θ_start + η_s Ŝ_t / K).
        clipping: ``flat`` or ``per_layer``.
        seed: The run seed (epoch orders and node noise).
    """

    name = "dp_ftrl_client"

    def __init__(
        self,
        *,
        num_clients: int,
        cohort_size: int,
        rounds: int,
        local_steps: int,
        lr: float,
        batch_size: int,
        clip_norm: float,
        noise_multiplier: float,
        server_lr: float = 1.0,
        clipping: str = "flat",
        seed: int = 0,
    ) -> None:
        super().__init__(
            num_clients, local_steps, lr, batch_size, clip_norm, noise_multiplier, clipping, seed
        )
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        if not 1 <= cohort_size <= num_clients:
            raise ValueError(
                f"cohort_size K={cohort_size} must be in [1, population {num_clients}]"
            )
        self.cohort_size = int(cohort_size)
        self.tree_rounds = self.num_clients // self.cohort_size  # T, rounds per epoch
        self.rounds = int(rounds)
        self.schedule = tree_schedule(self.rounds, self.tree_rounds)
        # Validates σ, N, K and T in one place (ValueError naming the field).
        self.cost = ClientLevelCost(
            noise_multiplier, "tree", num_clients, None, cohort_size, 1, self.tree_rounds
        )
        self.server_lr = float(server_lr)
        # Server-half state within an epoch (checkpointed): the model at the epoch's start
        # (a released model). The clean running sum and the nodes' noise are the
        # platform's (`TreeState`), never this object's.
        self._start: Params | None = None

    @property
    def expected_cohort(self) -> float:
        return float(self.cohort_size)

    def _position(self, round_idx: int) -> tuple[int, int]:
        """(epoch, 1-based round within the epoch's tree)."""
        epoch, r = divmod(round_idx, self.tree_rounds)
        return epoch, r + 1

    # ---- server half -----------------------------------------------------------------------
    def round_mechanism(self, round_idx: int) -> TreeAggregationRelease:
        """Round t of the epoch's tree (a shorter last tree has its own length)."""
        epoch, t = self._position(round_idx)
        rounds = self.schedule[epoch] if epoch < len(self.schedule) else self.tree_rounds
        return TreeAggregationRelease(
            self.noise_multiplier,
            self.clip_norm,
            self.num_clients,
            self.cohort_size,
            rounds,
            epoch,
            t,
        )

    def round_mechanisms(self, round_idx: int) -> tuple[MechanismUse, ...]:
        """Every round draws one node of its epoch's tree."""
        return (uses(self.round_mechanism(round_idx), 1),)

    def select(self, round_idx: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        self._start_round(round_idx, num_clients)
        epoch, t = self._position(round_idx)
        order = epoch_order(self.seed, epoch, num_clients)
        k = self.cohort_size
        return sorted(int(c) for c in order[(t - 1) * k : t * k])

    def aggregate_release(
        self, global_params: Params, tasks: Sequence[ClientTask], released: ReleasedSum
    ) -> Params:
        """θ_start + η_s Ŝ_t / K, Ŝ_t the platform's noisy prefix sum of the epoch's tree;
        a tree's first round (or a run without an epoch start) starts from θ."""
        if released.mechanism.round_in_tree == 1 or self._start is None:  # type: ignore[attr-defined]
            self._start = {n: p.detach().clone() for n, p in global_params.items()}
        scale = self.server_lr / self.cohort_size
        prefix = released.noisy_sum
        return {n: start + scale * prefix[n] for n, start in self._start.items()}

    def unaccounted_releases(self) -> list[str]:
        return [
            "client_updates_to_server (the trusted server sees each client's clipped update "
            "before the tree noise; the guarantee covers the released models)",
            "client_training_metrics (mean pre-clip update norm, clipped fraction and local "
            "training loss over the round's clients, in rounds.parquet)",
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"has_epoch": self._start is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._start = None

    def tensor_state(self) -> dict[str, torch.Tensor]:
        if self._start is None:
            return {}
        return pack_tensors("epoch_start", self._start)

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        shared, _ = unpack_tensor_state(tensors, shared=("epoch_start",), per_client=())
        self._start = shared.get("epoch_start")
