"""Client-level DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta & Xu, "Practical and
Private (Deep) Learning without Sampling or Shuffling", ICML 2021; the federated form of
McMahan et al.'s Gboard deployments).

Privacy unit: one client. No sampling amplification is relied on. The population is
walked in epochs: each epoch a public permutation of the N clients (from the run seed) is
cut into T = ⌊N/K⌋ rounds of K clients, so every client joins at most one round per epoch
(the N mod K clients left over sit the epoch out). Each round:

1. each client of the round runs τ non-private SGD steps from the global model and clips
   its update Δ to L2 norm S (`raydpfl.algorithms.dp_fedavg_client.clip_update`);
2. the server adds the round's sum g_t = Σ_k clip(Δ_k) to the epoch's running sum and
   releases the *noisy prefix sum* Ŝ_t = Σ_{i≤t} g_i + Σ_{nodes} z_node through the binary
   tree (`tree_node_for`, `prefix_nodes`): node [a, b] carries its own N(0, σ²S²), and the
   prefix [1, t] is the sum of the ⌈popcount(t)⌉ dyadic nodes that cover it, so its noise
   variance is popcount(t)·σ²S² (Kairouz et al., Alg. 1 and §B; no Honaker estimator);
3. θ_t = θ_start + η_s·Ŝ_t / K: FTRL with the quadratic regulariser centred at the
   epoch's starting model (Eq. 2 with the pseudo-gradient −Δ), restarted every epoch
   (the "tree restart" of §4).

One epoch is dp-accounting's ``SingleEpochTreeAggregationDpEvent(σ, T)`` (zero-out
adjacency: one client's updates replaced by zeros; `raydpfl.privacy.accounting.client_level`),
charged before the epoch's first round. Every round's release is the kernel mechanism
`raydpfl.privacy.mechanisms.client_level_mechanisms.TreeAggregationRelease` (declared by
`round_mechanisms`; the first round of a tree charges the tree's event, the later ones
are covered by it): the server hands the aggregation the round's session and refuses a
round that did not draw its one node through it. Node noise is drawn from a stream
derived from (run seed, epoch, node), so the same run gives the same bits on any
backend; the nodes
still in use (at most one per tree level) are kept as server state and checkpointed, so
a resumed run, or one in secure-noise mode (draws from os.urandom), reuses each node's
noise rather than drawing it again. This module imports no Ray.
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
    WeightedUpdateSum,
)
from raydpfl.algorithms.dp_fedavg_client import ClientLevelAlgorithm
from raydpfl.algorithms.tensor_state import (
    pack_client_tensors,
    pack_tensors,
    unpack_tensor_state,
)
from raydpfl.privacy.accounting.client_level import ClientLevelCost, tree_schedule
from raydpfl.privacy.mechanisms.client_level_mechanisms import (  # noqa: F401 (re-exported)
    NODE_PURPOSE,
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
        # Server state within an epoch (checkpointed): the model at the epoch's start, the
        # clean sum of the rounds so far, and the noise of the nodes still in use (one per
        # level at most: those of `prefix_nodes(t)`).
        self._start: Params | None = None
        self._clean: Params | None = None
        self._nodes: dict[int, Params] = {}

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

    def aggregate_sum(
        self, global_params: Params, tasks: Sequence[ClientTask], total: WeightedUpdateSum
    ) -> Params:
        """θ_start + η_s (Σ_{i≤t} g_i + noise of the prefix's nodes) / K."""
        _, t = self._position(self._round)
        if t == 1 or self._start is None or self._clean is None:
            self._start = {n: p.detach().clone() for n, p in global_params.items()}
            self._clean = {n: torch.zeros_like(p) for n, p in global_params.items()}
            self._nodes = {}
        if total.total is not None:
            for n in self._clean:
                self._clean[n].add_(total.total[n].to(self._clean[n].device))
        # the round's mechanism, live: the server's session, or (direct calls) a fresh one
        live = round_session(self, self._round, self.round_mechanisms, self.seed).get()
        level, _ = live.node
        # the node completing now replaces the lower-level nodes it covers
        self._nodes = {lv: z for lv, z in self._nodes.items() if lv > level}
        self._nodes[level] = live.node_noise(self._start)
        scale = self.server_lr / self.cohort_size
        out = {}
        for n, start in self._start.items():
            noisy = self._clean[n].clone()
            for lv in sorted(self._nodes, reverse=True):  # the prefix's nodes, highest first
                noisy.add_(self._nodes[lv][n])
            out[n] = start + scale * noisy
        return out

    def unaccounted_releases(self) -> list[str]:
        return [
            "client_updates_to_server (the trusted server sees each client's clipped update "
            "before the tree noise; the guarantee covers the released models)",
            "client_training_metrics (mean pre-clip update norm, clipped fraction and local "
            "training loss over the round's clients, in rounds.parquet)",
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"levels": sorted(self._nodes), "has_epoch": self._start is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._pending_levels = list(state.get("levels", []))

    def tensor_state(self) -> dict[str, torch.Tensor]:
        if self._start is None or self._clean is None:
            return {}
        out = {**pack_tensors("epoch_start", self._start), **pack_tensors("clean", self._clean)}
        out.update(pack_client_tensors("node", self._nodes))
        return out

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        shared, per_level = unpack_tensor_state(
            tensors, shared=("epoch_start", "clean"), per_client=("node",)
        )
        self._start = shared.get("epoch_start")
        self._clean = shared.get("clean")
        self._nodes = dict(per_level.get("node", {}))
        expected = getattr(self, "_pending_levels", None)
        if expected is not None and sorted(self._nodes) != sorted(expected):
            raise ValueError(
                f"checkpointed tree nodes {sorted(self._nodes)} do not match the state's "
                f"levels {sorted(expected)}"
            )
