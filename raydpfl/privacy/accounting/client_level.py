"""Client-level DP accounting (DP-FedAvg, McMahan et al. 2018) and its population ledger.

The privacy unit is one *client*: all the training records of one client. Each round of
client-level DP-FedAvg samples a cohort from the population of N clients, sums the
sampled clients' updates clipped to L2 norm S and adds N(0, σ²S²) once (McMahan et al.,
"Learning Differentially Private Recurrent Language Models", ICLR 2018, Algorithm 1).
One round is therefore one subsampled Gaussian mechanism over the population:

* ``poisson``: each client joins independently with rate q. Add/remove-one-client
  adjacency; the clipped sum has L2 sensitivity S, so a round is the Poisson-subsampled
  Gaussian M_{q, σ} (the record-level accountants of `raydpfl.privacy.accounting.accountants` with
  clients in place of records).
* ``fixed``: a uniform cohort of K clients without replacement. Replace-one-client
  adjacency (N is public): replacing one client's records changes its clipped update
  from u to u', so the clipped sum has L2 sensitivity ‖u − u'‖ ≤ 2S and the Gaussian
  event's noise multiplier (noise std over that sensitivity) is σS / 2S = σ/2
  (`fixed_event_noise_multiplier`). Accounted with dp-accounting's
  ``SampledWithoutReplacementDpEvent(N, K, GaussianDpEvent(σ/2))`` under RDP
  (Wang, Balle & Kasiviswanathan, AISTATS 2019, Thm. 27); dp-accounting's PLD does not
  support that event, so ``pld`` and ``prv`` are refused for fixed-size sampling.
* ``tree`` (DP-FTRL, Kairouz et al., ICML 2021): no sampling. The population is walked
  in epochs; within an epoch each client joins at most one round of K clients, and the
  server releases prefix sums of the clipped sums through a binary tree whose every node
  carries N(0, σ²S²), restarted each epoch. One epoch of T rounds is dp-accounting's
  ``SingleEpochTreeAggregationDpEvent(σ, T)``: RDP α·⌈log₂(T+1)⌉/(2σ²) (App. D of the
  paper: one client touches one leaf, so at most ⌈log₂(T+1)⌉ nodes), under zero-out
  adjacency (one client's updates replaced by zeros: dp-accounting's ``REPLACE_SPECIAL``,
  the only relation it accounts this event under). A charge is one epoch, made before
  its first round; RDP only (``rdp``, ``dp_rdp``).

`ClientLevelLedger` is the one population-level ledger of a client-level run: its single
privacy unit, `POPULATION`, is charged one `ClientLevelCost` per round before the round
is dispatched, and the ε it holds is every client's ε. The charge is the event of the
round's declared mechanisms (`raydpfl.privacy.mechanisms.client_level_mechanisms`: each mechanism's
`cost(n)` is a `ClientLevelCost`, and its live form draws the noise the charge assumes).
It reads and writes the same to_dict/charge-log formats as
`raydpfl.privacy.accounting.ledger.PrivacyLedger`, so the server's charge log, checkpoints and
resume treat it like a per-client ledger with one entry.
A client-level ledger refuses record-level charges: a run never mixes units.

This module imports neither torch nor ray.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from raydpfl.privacy.accounting.accountants import (
    compute_epsilon,
    describe_accountant,
    validate_delta,
    validate_ledger_accountant,
)
from raydpfl.privacy.accounting.calibration import largest_feasible_steps, smallest_sigma
from raydpfl.privacy.accounting.ledger import LedgerSettings, json_sha256

__all__ = [
    "POPULATION",
    "SAMPLINGS",
    "ClientLevelCost",
    "ClientLevelLedger",
    "check_client_level_accountant",
    "client_level_epsilon",
    "client_level_max_rounds",
    "client_level_noise_multiplier",
    "fixed_event_noise_multiplier",
    "rounds_history",
    "tree_schedule",
]

#: The one privacy unit of a client-level ledger (the charge log's client id for it).
POPULATION = -1
#: Client-sampling schemes.
SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "tree")
Sampling = Literal["poisson", "fixed", "tree"]
#: Accountants that can account fixed-size (without-replacement) client sampling.
FIXED_ACCOUNTANTS: tuple[str, ...] = ("rdp", "dp_rdp")
_MECHANISM = {
    "poisson": "client_poisson_gaussian",
    "fixed": "client_fixed_gaussian",
    "tree": "client_tree_gaussian",
}
_FORMAT_VERSION = 1


def fixed_event_noise_multiplier(noise_multiplier: float) -> float:
    """σ/2: the Gaussian event's noise multiplier under replace-one-client adjacency.

    The server adds N(0, σ²S²) to Σ_k clip_S(Δ_k). Replacing one client's records moves
    its clipped update from u to u' with ‖u − u'‖₂ ≤ 2S, so the L2 sensitivity is 2S and
    the std-to-sensitivity ratio dp-accounting's ``GaussianDpEvent`` expects is σ/2
    (``_compute_rdp_sample_wor_gaussian``: "ratio of the standard deviation of the Gaussian
    noise to the l2-sensitivity"; Wang et al. 2019, Thm. 27).
    """
    return float(noise_multiplier) / 2.0


@dataclass(frozen=True)
class ClientLevelCost:
    """One charge of a client-level ledger: ``steps`` rounds of DP-FedAvg's aggregate.

    Attributes:
        noise_multiplier: σ; the aggregate's noise std is σ·S (S the update clip norm).
        sampling: ``poisson`` (rate `sampling_rate`) or ``fixed`` (`cohort_size` clients
            uniformly without replacement).
        population: N, the number of clients (public).
        sampling_rate: q in (0, 1] (``poisson`` only).
        cohort_size: K in [1, N] (``fixed`` and ``tree``).
        steps: Rounds composed (>= 0); ``tree``: epochs (trees) composed.
        tree_rounds: ``tree`` only: T, the rounds of each tree (epoch), T·K <= N so that
            each client joins at most one round of it.
    """

    noise_multiplier: float
    sampling: str
    population: int
    sampling_rate: float | None = None
    cohort_size: int | None = None
    steps: int = 1
    tree_rounds: int | None = None

    def __post_init__(self) -> None:
        sigma, n, steps = self.noise_multiplier, self.population, self.steps
        if not _is_real(sigma) or not math.isfinite(float(sigma)) or float(sigma) < 0:
            raise ValueError(f"noise_multiplier must be a finite real >= 0, got {sigma!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not _is_int(n) or int(n) < 1:
            raise ValueError(f"population must be an int >= 1, got {n!r}")
        if not _is_int(steps) or int(steps) < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        object.__setattr__(self, "noise_multiplier", float(sigma))
        object.__setattr__(self, "population", int(n))
        object.__setattr__(self, "steps", int(steps))
        if self.sampling != "tree" and self.tree_rounds is not None:
            raise ValueError("tree_rounds is for tree aggregation (DP-FTRL) only")
        if self.sampling == "poisson":
            q = self.sampling_rate
            if not _is_real(q) or not 0.0 < float(q) <= 1.0:
                raise ValueError(f"sampling_rate must be in (0, 1], got {q!r}")
            if self.cohort_size is not None:
                raise ValueError("cohort_size is for fixed-size sampling, not poisson")
            object.__setattr__(self, "sampling_rate", float(q))
        else:
            k = self.cohort_size
            if not _is_int(k) or not 1 <= int(k) <= int(n):
                raise ValueError(f"cohort_size must be an int in [1, population={n}], got {k!r}")
            if self.sampling_rate is not None:
                raise ValueError(f"sampling_rate is for poisson sampling, not {self.sampling}")
            object.__setattr__(self, "cohort_size", int(k))
        if self.sampling == "tree":
            t = self.tree_rounds
            if not _is_int(t) or not 1 <= int(t) <= int(n) // int(k):
                raise ValueError(
                    f"tree_rounds must be an int in [1, population // cohort_size = "
                    f"{int(n) // int(k)}] (each client at most once per tree), got {t!r}"
                )
            object.__setattr__(self, "tree_rounds", int(t))

    @property
    def rounds(self) -> int:
        """Rounds this charge covers: `steps`, or `steps` trees of `tree_rounds`."""
        return self.steps * (self.tree_rounds or 1) if self.sampling == "tree" else self.steps

    @property
    def expected_cohort(self) -> float:
        """E|cohort|: q·N (poisson) or K (fixed, tree); the public denominator."""
        if self.sampling == "poisson":
            assert self.sampling_rate is not None
            return self.sampling_rate * self.population
        assert self.cohort_size is not None
        return float(self.cohort_size)

    def with_steps(self, steps: int) -> ClientLevelCost:
        """The same mechanism composed `steps` times."""
        return ClientLevelCost(
            self.noise_multiplier,
            self.sampling,
            self.population,
            self.sampling_rate,
            self.cohort_size,
            steps,
            self.tree_rounds,
        )

    def dp_event(self) -> Any:
        """This charge as dp-accounting's typed event, one to one: ``steps`` compositions
        (``SelfComposedDpEvent``) of ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``
        (poisson), ``SampledWithoutReplacementDpEvent(N, K, GaussianDpEvent(σ/2))`` (fixed,
        replace-one: `fixed_event_noise_multiplier`) or
        ``SingleEpochTreeAggregationDpEvent(σ, T)`` (tree)."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent
        if self.sampling == "poisson":
            one: Any = dp_accounting.PoissonSampledDpEvent(
                self.sampling_rate, gaussian(self.noise_multiplier)
            )
        elif self.sampling == "fixed":
            one = dp_accounting.SampledWithoutReplacementDpEvent(
                self.population,
                self.cohort_size,
                gaussian(fixed_event_noise_multiplier(self.noise_multiplier)),
            )
        else:
            one = dp_accounting.SingleEpochTreeAggregationDpEvent(
                self.noise_multiplier, self.tree_rounds
            )
        return dp_accounting.SelfComposedDpEvent(one, self.steps)

    def key(self) -> tuple[Any, ...]:
        """Everything but `steps` (charges with equal keys merge)."""
        return (
            self.noise_multiplier,
            self.sampling,
            self.population,
            self.sampling_rate,
            self.cohort_size,
            self.tree_rounds,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (the charge log's and the ledger's entry)."""
        out: dict[str, Any] = {
            "mechanism": _MECHANISM[self.sampling],
            "noise_multiplier": self.noise_multiplier,
            "sampling": self.sampling,
            "population": self.population,
            "steps": self.steps,
        }
        if self.sampling == "poisson":
            out["sampling_rate"] = self.sampling_rate
        else:
            out["cohort_size"] = self.cohort_size
        if self.sampling == "tree":
            out["tree_rounds"] = self.tree_rounds
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClientLevelCost:
        """Inverse of `to_dict` (a malformed entry raises ValueError naming the field)."""
        try:
            cost = cls(
                noise_multiplier=d["noise_multiplier"],
                sampling=d["sampling"],
                population=d["population"],
                sampling_rate=d.get("sampling_rate"),
                cohort_size=d.get("cohort_size"),
                steps=d["steps"],
                tree_rounds=d.get("tree_rounds"),
            )
        except KeyError as e:
            raise ValueError(f"a client-level charge needs {e.args[0]!r}") from None
        if d.get("mechanism", _MECHANISM[cost.sampling]) != _MECHANISM[cost.sampling]:
            raise ValueError(f"mechanism {d.get('mechanism')!r} is not a client-level charge")
        return cost


# ---- accounting ---------------------------------------------------------------------------
def check_client_level_accountant(accountant: str, sampling: str) -> str:
    """`accountant` if it can account `sampling` at the client level, else ValueError."""
    validate_ledger_accountant(accountant)
    if sampling == "fixed" and accountant not in FIXED_ACCOUNTANTS:
        raise ValueError(
            f"{accountant!r} cannot account fixed-size client sampling (dp-accounting's "
            f"SampledWithoutReplacementDpEvent is RDP-only); use one of {FIXED_ACCOUNTANTS}"
        )
    if sampling == "tree" and accountant not in FIXED_ACCOUNTANTS:
        raise ValueError(
            f"{accountant!r} cannot account tree aggregation (dp-accounting's "
            f"SingleEpochTreeAggregationDpEvent is RDP-only); use one of {FIXED_ACCOUNTANTS}"
        )
    return accountant


def client_level_epsilon(
    history: Iterable[ClientLevelCost], delta: float, accountant: str = "rdp"
) -> float:
    """ε of the adaptive composition of client-level DP-FedAvg rounds at `delta`.

    Poisson rounds: the history ``[(σ, q, T)]`` under `compute_epsilon` (add/remove one
    client; any accountant). Fixed-size rounds: dp-accounting's ``RdpAccountant``
    (replace-one client) composing ``SampledWithoutReplacementDpEvent(N, K,
    GaussianDpEvent(σ/2))`` T times (see `fixed_event_noise_multiplier`); ``rdp`` and
    ``dp_rdp`` both mean this RDP analysis there. One run has one scheme and one
    population: a history mixing them is refused.
    """
    delta = validate_delta(delta)
    entries = [c for c in history if c.steps > 0]
    if not entries:
        return 0.0
    schemes = {(c.sampling, c.population) for c in entries}
    if len(schemes) > 1:
        raise ValueError(f"a client-level history mixes sampling schemes/populations {schemes}")
    sampling = entries[0].sampling
    check_client_level_accountant(accountant, sampling)
    if sampling == "poisson":
        return compute_epsilon(
            [(c.noise_multiplier, c.sampling_rate, c.steps) for c in entries], delta, accountant
        )
    if sampling == "tree":
        trees: dict[tuple[float, int], int] = {}
        for c in entries:
            assert c.tree_rounds is not None
            key = (c.noise_multiplier, c.tree_rounds)
            trees[key] = trees.get(key, 0) + c.steps
        return _tree_epsilon(tuple(sorted((s, t, n) for (s, t), n in trees.items())), delta)
    merged: dict[tuple[float, int], int] = {}
    for c in entries:
        assert c.cohort_size is not None
        merged[(c.noise_multiplier, c.cohort_size)] = (
            merged.get((c.noise_multiplier, c.cohort_size), 0) + c.steps
        )
    return _fixed_epsilon(
        tuple(sorted((s, k, t) for (s, k), t in merged.items())), entries[0].population, delta
    )


def _fixed_epsilon(
    entries: tuple[tuple[float, int, int], ...], population: int, delta: float
) -> float:
    """RDP ε of fixed-size (without replacement) Gaussian rounds, replace-one adjacency:
    exactly what ``RdpAccountant(REPLACE_ONE).compose(event, T)`` then ``get_epsilon``
    compute (T times one round's RDP vector, then dp-accounting's conversion), with the
    one-round vector cached so that charging round after round stays cheap."""
    from dp_accounting.rdp import rdp_privacy_accountant

    if any(sigma == 0.0 for sigma, _, _ in entries):
        return math.inf
    rdp = sum(steps * _wor_round_rdp(sigma, population, k) for sigma, k, steps in entries)
    eps, _ = rdp_privacy_accountant.compute_epsilon(
        rdp_privacy_accountant.DEFAULT_RDP_ORDERS, rdp, delta
    )
    return max(0.0, float(eps))


def _tree_epsilon(entries: tuple[tuple[float, int, int], ...], delta: float) -> float:
    """RDP ε of `n` trees of `T` rounds at σ for each (σ, T, n): what dp-accounting's
    ``RdpAccountant`` gives composing ``SelfComposedDpEvent(
    SingleEpochTreeAggregationDpEvent(σ, T), n)`` (Kairouz et al. 2021, App. D)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

    if any(sigma == 0.0 for sigma, _, _ in entries):
        return math.inf
    orders = rdp_acc.DEFAULT_RDP_ORDERS
    rdp = sum(
        n * np.asarray(rdp_acc._compute_rdp_single_epoch_tree_aggregation(sigma, t, orders))
        for sigma, t, n in entries
    )
    eps, _ = rdp_acc.compute_epsilon(orders, rdp, delta)
    return max(0.0, float(eps))


def tree_schedule(rounds: int, tree_rounds: int) -> list[int]:
    """The rounds of each tree (epoch) when `rounds` rounds run in trees of `tree_rounds`:
    full trees, then a shorter last one."""
    full, rest = divmod(int(rounds), int(tree_rounds))
    return [int(tree_rounds)] * full + ([rest] if rest else [])


def rounds_history(round_cost: ClientLevelCost, rounds: int) -> list[ClientLevelCost]:
    """The charges `rounds` rounds of `round_cost`'s mechanism make (its `steps` ignored):
    one composed charge, or for ``tree`` one charge per tree (a shorter last tree)."""
    if round_cost.sampling != "tree":
        return [round_cost.with_steps(rounds)]
    assert round_cost.tree_rounds is not None
    return [
        dataclasses.replace(round_cost, steps=1, tree_rounds=t)
        for t in tree_schedule(rounds, round_cost.tree_rounds)
    ]


@functools.lru_cache(maxsize=1024)
def _wor_round_rdp(sigma: float, population: int, cohort: int) -> np.ndarray:
    """One round's RDP at dp-accounting's default orders: the Gaussian of noise multiplier
    σ/2 on a uniform K-subset of N (Wang et al. 2019, Thm. 27, via dp-accounting), the same
    event a ``SampledWithoutReplacementDpEvent(N, K, GaussianDpEvent(σ/2))`` composes."""
    from dp_accounting.rdp import rdp_privacy_accountant

    out = rdp_privacy_accountant._compute_rdp_sample_wor_gaussian(
        q=cohort / population,
        noise_multiplier=fixed_event_noise_multiplier(sigma),
        orders=rdp_privacy_accountant.DEFAULT_RDP_ORDERS,
    )
    out = np.asarray(out, dtype=np.float64)
    out.setflags(write=False)
    return out


def client_level_noise_multiplier(
    target_epsilon: float,
    delta: float,
    round_cost: ClientLevelCost,
    rounds: int,
    accountant: str = "rdp",
    *,
    sigma_max: float = 1e3,
    precision: float = 1e-3,
) -> float:
    """Smallest σ (to `precision`, conservative end) with ε(`rounds` rounds) <= target.

    `round_cost`'s own σ is ignored. Same bracket-and-bisect as
    `raydpfl.privacy.accounting.calibration.noise_multiplier_for`; the returned σ is re-verified.
    """
    if not _is_real(target_epsilon) or not 0 < float(target_epsilon) < math.inf:
        raise ValueError(f"target_epsilon must be a finite real > 0, got {target_epsilon!r}")
    if not _is_int(rounds) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    target = float(target_epsilon)

    def eps(sigma: float) -> float:
        cost = dataclasses.replace(round_cost, noise_multiplier=sigma)
        return client_level_epsilon(rounds_history(cost, rounds), delta, accountant)

    return smallest_sigma(
        eps,
        target,
        sigma_max,
        precision,
        unreachable=(
            f"epsilon={target} is unreachable in {rounds} rounds with sigma <= {sigma_max}"
        ),
        target_label=f"{target}",
    )


def client_level_max_rounds(
    target_epsilon: float,
    delta: float,
    round_cost: ClientLevelCost,
    accountant: str = "rdp",
    *,
    history: Sequence[ClientLevelCost] = (),
) -> int:
    """The most further rounds of `round_cost` (its `steps` ignored) keeping ε <= target."""
    if not _is_real(target_epsilon) or not 0 < float(target_epsilon) < math.inf:
        raise ValueError(f"target_epsilon must be a finite real > 0, got {target_epsilon!r}")
    prior = list(history)

    def feasible(t: int) -> bool:
        more = rounds_history(round_cost, t) if t else []
        return client_level_epsilon([*prior, *more], delta, accountant) <= target_epsilon

    return largest_feasible_steps(feasible)


# ---- the population ledger ----------------------------------------------------------------
class ClientLevelLedger(LedgerSettings):
    """The population-level ledger of a client-level run (one privacy unit: `POPULATION`).

    Every round is charged here before it is dispatched; a charge that would push ε past
    `epsilon_budget` is refused (``would_exceed``), and the server then stops the run.
    The ε it holds is the guarantee of *every* client (client-level DP over the
    population), so `epsilons(ids)` gives it for each id. Record-level charges
    (`raydpfl.privacy.accounting.ledger.PrivacyCost`) are refused: units never mix in one run.

    Args:
        accountant: ``rdp``, ``prv``, ``dp_rdp`` or ``pld`` (fixed-size sampling: ``rdp``
            or ``dp_rdp``; checked on the first charge).
        delta: δ in (0, 1) (keep it below 1/N).
        epsilon_budget: Client-level ε budget (finite > 0), or None to record only.
        population: N, the number of clients.
    """

    unit = "client"

    def __init__(
        self, accountant: str, delta: float, epsilon_budget: float | None, population: int
    ) -> None:
        super().__init__(accountant, delta, epsilon_budget)
        if not _is_int(population) or population < 1:
            raise ValueError(f"population must be an int >= 1, got {population!r}")
        self._population = int(population)
        self._history: list[ClientLevelCost] = []
        self._eps: float | None = 0.0

    # ---- settings (the `PrivacyLedger` interface the server uses) ----------------------
    @property
    def population(self) -> int:
        return self._population

    @property
    def client_budgets(self) -> dict[int, tuple[float, float]]:
        """Always empty: one budget for every client."""
        return {}

    @property
    def num_charges(self) -> int:
        return len(self._history)

    def delta_of(self, client_id: int) -> float:
        return self._delta

    def budget_of(self, client_id: int) -> float | None:
        return self._budget

    # ---- queries ------------------------------------------------------------------------
    def _check(self, client_id: object, cost: object) -> ClientLevelCost:
        if not isinstance(cost, ClientLevelCost):
            raise ValueError(
                f"a client-level run cannot charge a {type(cost).__name__} (record-level "
                "DP-SGD cost): units never mix in one run; a client-level algorithm's tasks "
                "declare no per-client cost"
            )
        if client_id != POPULATION:
            raise ValueError(
                f"a client-level ledger charges the population (id {POPULATION}), not "
                f"client {client_id!r}"
            )
        if cost.population != self._population:
            raise ValueError(
                f"charge for a population of {cost.population}, ledger has {self._population}"
            )
        if self._history and cost.sampling != self._history[0].sampling:
            raise ValueError("a client-level run has one client-sampling scheme")
        check_client_level_accountant(self._accountant, cost.sampling)
        return cost

    def history(self, client_id: int = POPULATION) -> tuple[ClientLevelCost, ...]:
        return tuple(self._history)

    def rounds(self) -> int:
        """Rounds charged so far (a tree charge covers its `tree_rounds`)."""
        return sum(c.rounds for c in self._history)

    def epsilon(self, client_id: int = POPULATION) -> float:
        """The client-level ε (every client's) at `delta`."""
        if self._eps is None:
            self._eps = client_level_epsilon(self._history, self._delta, self._accountant)
        return self._eps

    def epsilon_after(self, client_id: int, cost: ClientLevelCost) -> float:
        cost = self._check(client_id, cost)
        return client_level_epsilon([*self._history, cost], self._delta, self._accountant)

    def would_exceed(self, client_id: int, cost: ClientLevelCost) -> bool:
        cost = self._check(client_id, cost)
        return self._budget is not None and self.epsilon_after(client_id, cost) > self._budget

    def charge(self, client_id: int, cost: ClientLevelCost) -> float:
        """Records `cost`; returns the new ε (ValueError if over budget: nothing recorded)."""
        eps = self.epsilon_after(client_id, cost)
        if self._budget is not None and eps > self._budget:
            raise ValueError(
                f"client-level epsilon would become {eps:.6g} > budget {self._budget:g}"
            )
        self._history.append(cost)
        self._eps = eps
        return eps

    def try_charge(self, client_id: int, cost: ClientLevelCost) -> float | None:
        """Records `cost` if the budget allows it: the new ε, or None (nothing recorded);
        the same contract as `PrivacyLedger.try_charge`, one accountant evaluation."""
        eps = self.epsilon_after(client_id, cost)
        if self._budget is not None and eps > self._budget:
            return None
        self._history.append(cost)
        self._eps = eps
        return eps

    def steps(self, client_id: int = POPULATION) -> int:
        return self.rounds()

    def charged_clients(self) -> list[int]:
        return [POPULATION] if self._history else []

    def epsilons(self, client_ids: Iterable[int]) -> np.ndarray:
        """The client-level ε for each id (the same for every client)."""
        ids = list(client_ids)
        return np.full(len(ids), self.epsilon(), dtype=np.float64)

    def max_epsilon(self) -> float:
        return self.epsilon()

    def mean_epsilon(self, client_ids: Iterable[int] | None = None) -> float:
        return self.epsilon()

    # ---- serialisation (the `PrivacyLedger` formats) ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot; its charges sit under ``clients`` as the population's."""
        entries = [c.to_dict() for c in self._history]
        return {
            "format_version": _FORMAT_VERSION,
            "unit": self.unit,
            "accountant": self._accountant,
            "accountant_description": describe_accountant(self._accountant),
            "delta": self._delta,
            "epsilon_budget": self._budget,
            "population": self._population,
            "clients": [{"client_id": POPULATION, "entries": entries}] if entries else [],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClientLevelLedger:
        """Rebuilds a ledger from `to_dict` output, replaying its charges unchecked (the
        record is authoritative)."""
        try:
            if d.get("unit") != cls.unit:
                raise ValueError(f"not a client-level ledger (unit {d.get('unit')!r})")
            ledger = cls(d["accountant"], d["delta"], d["epsilon_budget"], d["population"])
            for item in d["clients"]:
                if item["client_id"] != POPULATION:
                    raise ValueError(f"a client-level ledger has no client {item['client_id']!r}")
                for entry in item["entries"]:
                    ledger._history.append(ClientLevelCost.from_dict(entry))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"d is not a ClientLevelLedger.to_dict() mapping: {exc!r}") from None
        ledger._eps = None
        return ledger

    @staticmethod
    def cost_from_dict(d: Mapping[str, Any]) -> ClientLevelCost:
        """A logged charge back as a cost (used when the ledger is rebuilt from the log)."""
        return ClientLevelCost.from_dict(d)

    def sha256(self) -> str:
        """SHA-256 of the canonical JSON of the charges and the population."""
        data = {"population": self._population, "charges": [c.to_dict() for c in self._history]}
        return json_sha256(data)

    def __repr__(self) -> str:
        return self._repr(f"population={self._population}, rounds={self.rounds()}")


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
