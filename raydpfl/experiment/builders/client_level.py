"""Client-level DP-FedAvg (``dp_fedavg_client``): config → algorithm, population ledger
and the privacy statement of summary.json.

`build` is the registry's target for the name (`raydpfl.config.client_level` registers
it with its options dataclass); `client_level_ledger` is what
`raydpfl.experiment.plugins.ledger_for` gives any algorithm whose ``privacy_unit`` is
``client``: one `ClientLevelLedger` for the whole population instead of per-client ledgers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raydpfl.algorithms.base import Algorithm
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.dp_ftrl_client import DPFTRLClientLevel
from raydpfl.config import as_config_error
from raydpfl.config.client_level import ClientLevelOptions, DPFTRLOptions
from raydpfl.config.schema import ConfigError, PrivacyConfig
from raydpfl.experiment.privacy_settings import PRIVACY_STATEMENT
from raydpfl.privacy.accounting.accountants import describe_accountant
from raydpfl.privacy.accounting.client_level import (
    ClientLevelCost,
    ClientLevelLedger,
    check_client_level_accountant,
    client_level_noise_multiplier,
)
from raydpfl.privacy.accounting.plan import PrivacyPlan


def build(context: Any) -> DPFedAvgClientLevel:
    """The algorithm from `context` (a `raydpfl.experiment.plugins.BuildContext`): every
    bad value is a one-line `ConfigError` naming its field, raised before any training."""
    exp, rt = context.config.experiment, context.config.runtime
    algo, privacy = exp.algorithm, exp.privacy
    opts: ClientLevelOptions = context.options or ClientLevelOptions()
    n = int(context.dataset.num_clients)
    where = "experiment.algorithm.options"
    clip = opts.update_clip_norm if opts.update_clip_norm is not None else privacy.clip_norm
    if opts.sampling == "poisson":
        q = opts.client_sampling_rate
        if q is None:
            q = algo.clients_per_round / n
            if not 0 < q <= 1:
                raise ConfigError(
                    "experiment.algorithm.clients_per_round",
                    f"the expected cohort {algo.clients_per_round} is larger than the "
                    f"population of {n} clients",
                )
        k = None
    else:
        q, k = None, algo.clients_per_round
        _check_cohort(k, n)
    _check_client_level_privacy(privacy, opts.sampling, n)
    plan = plan_client_level(context, ClientLevelCost(0.0, opts.sampling, n, q, k, 1), clip)
    try:
        algorithm = DPFedAvgClientLevel(
            num_clients=n,
            sampling=opts.sampling,
            sampling_rate=q,
            cohort_size=k,
            local_steps=algo.local_steps,
            lr=algo.lr,
            batch_size=algo.batch_size,
            clip_norm=plan.clip_norm,
            noise_multiplier=plan.noise_multiplier,
            clipping=opts.clipping,
            noise=opts.noise,
            seed=rt.seed,
            adaptive_clipping=opts.adaptive_clipping,
            target_quantile=opts.target_quantile,
            clip_lr=opts.clip_lr,
            clip_count_stddev=opts.clip_count_stddev,
            server_optimizer=opts.server_optimizer,
            server_lr=opts.server_lr,
            server_momentum=opts.server_momentum,
            server_beta2=opts.server_beta2,
            server_adam_eps=opts.server_adam_eps,
        )
    except ValueError as e:
        field = where + (".clip_count_stddev" if "clip_count_stddev" in str(e) else "")
        raise ConfigError(field, str(e)) from None
    algorithm.noise_calibrated = plan.noise_calibrated
    return algorithm


def build_ftrl(context: Any) -> DPFTRLClientLevel:
    """DP-FTRL from `context`: K = clients_per_round per round, epochs of N // K rounds,
    σ calibrated to the client-level budget over the run's trees when not given."""
    exp, rt = context.config.experiment, context.config.runtime
    algo, privacy = exp.algorithm, exp.privacy
    opts: DPFTRLOptions = context.options or DPFTRLOptions()
    n = int(context.dataset.num_clients)
    k = algo.clients_per_round
    _check_cohort(k, n)
    clip = opts.update_clip_norm if opts.update_clip_norm is not None else privacy.clip_norm
    _check_client_level_privacy(privacy, "tree", n)
    plan = plan_client_level(context, ClientLevelCost(0.0, "tree", n, None, k, 1, n // k), clip)
    with as_config_error("experiment.algorithm.options"):
        algorithm = DPFTRLClientLevel(
            num_clients=n,
            cohort_size=k,
            rounds=algo.rounds,
            local_steps=algo.local_steps,
            lr=algo.lr,
            batch_size=algo.batch_size,
            clip_norm=plan.clip_norm,
            noise_multiplier=plan.noise_multiplier,
            server_lr=opts.server_lr,
            clipping=opts.clipping,
            seed=rt.seed,
        )
    algorithm.noise_calibrated = plan.noise_calibrated
    return algorithm


def plan_client_level(context: Any, template: ClientLevelCost, clip: float) -> PrivacyPlan:
    """The client-level plan: S (`clip`), σ (given, or calibrated so that the run's rounds
    of `template`'s mechanism spend the population's ε) and the client sampling rate."""
    exp = context.config.experiment
    privacy, rounds = exp.privacy, exp.algorithm.rounds
    sigma = privacy.noise_multiplier
    if sigma is None:
        with as_config_error("experiment.privacy.noise_multiplier", "cannot calibrate: "):
            sigma = client_level_noise_multiplier(
                privacy.epsilon, privacy.delta, template, rounds, privacy.accountant
            )
    return PrivacyPlan(
        unit="client",
        accountant=privacy.accountant,
        delta=privacy.delta,
        epsilon=privacy.epsilon,
        clip_norm=clip,
        noise_multiplier=sigma,
        sampling_rate=template.sampling_rate,
        noise_calibrated=privacy.noise_multiplier is None,
        step_budget=rounds,
        step_unit="rounds",
    )


def _check_cohort(cohort: int, population: int) -> None:
    """A cohort of K clients per round must fit in the population of N."""
    if cohort > population:
        raise ConfigError(
            "experiment.algorithm.clients_per_round",
            f"the cohort K={cohort} is larger than the population of {population} clients",
        )


def _check_client_level_privacy(privacy: PrivacyConfig, sampling: str, population: int) -> None:
    """The privacy section fits a client-level run: the accountant takes this client
    sampling, and δ < 1/N (what building the algorithm and opening its ledger both check)."""
    with as_config_error("experiment.privacy.accountant"):
        check_client_level_accountant(privacy.accountant, sampling)
    check_population_delta(privacy.delta, population)


def check_population_delta(delta: float, population: int) -> None:
    """δ must be below 1/N at the client level (one client's failure probability)."""
    if delta >= 1.0 / population:
        raise ConfigError(
            "experiment.privacy.delta",
            f"must be < 1/N = {1.0 / population:.3g} at the client level ({population} "
            f"clients); got {delta}",
        )


def client_level_ledger(
    algorithm: Algorithm, privacy: PrivacyConfig, sizes: np.ndarray
) -> tuple[ClientLevelLedger, dict[str, Any]]:
    """The population ledger (the config's accountant, δ and ε budget, now about clients)
    and the privacy statement of a client-level run."""
    n = len(sizes)
    cost = algorithm.round_privacy_cost(0)
    if not isinstance(cost, ClientLevelCost):
        raise ConfigError(
            "experiment.algorithm.name",
            f"{algorithm.name!r} says its privacy unit is client but declares no "
            "ClientLevelCost per round (round_privacy_cost)",
        )
    if cost.population != n:
        raise ConfigError(
            "experiment.data.num_clients",
            f"the algorithm was built for {cost.population} clients, the data has {n}",
        )
    _check_client_level_privacy(privacy, cost.sampling, n)
    ledger = ClientLevelLedger(privacy.accountant, privacy.delta, privacy.epsilon, n)
    return ledger, client_level_metadata(algorithm, cost, privacy)


def client_level_metadata(
    algorithm: Algorithm, cost: ClientLevelCost, privacy: PrivacyConfig
) -> dict[str, Any]:
    """What a client-level ε means (summary.json's ``privacy``)."""
    clip = getattr(algorithm, "clip_norm", None)
    noise = getattr(algorithm, "noise", "central")
    n, e = cost.population, cost.expected_cohort
    if cost.sampling == "poisson":
        adjacency = f"add or remove one client, with all its records, from the population of N={n}"
        sampling = (
            f"Poisson client sampling with rate q={cost.sampling_rate:g} (expected cohort "
            f"qN={e:g}); accounted as the Poisson-subsampled Gaussian over clients"
        )
    elif cost.sampling == "tree":
        adjacency = (
            f"zero-out: one client's updates replaced by zeros (N={n} public; Kairouz et "
            "al. 2021, App. D)"
        )
        sampling = (
            f"no sampling: each epoch a public permutation of the N clients is cut into "
            f"{cost.tree_rounds} rounds of K={cost.cohort_size}, every client at most once "
            "per epoch; each epoch one tree (restarted), accounted as dp-accounting's "
            "SingleEpochTreeAggregationDpEvent(sigma, rounds of the epoch) under RDP, "
            "charged before the epoch's first round"
        )
    else:
        adjacency = (
            f"replace one client's records with another client's (N={n} public); the "
            "clipped sum's L2 sensitivity is then 2S, so the Gaussian event's noise "
            "multiplier is sigma/2"
        )
        sampling = (
            f"K={cost.cohort_size} clients uniformly without replacement from N={n}; "
            "accounted with dp-accounting's SampledWithoutReplacementDpEvent(N, K, "
            "GaussianDpEvent(sigma/2)) under RDP"
        )
    return {
        "unit": "client: all the training records of one client (client-level DP, "
        "DP-FedAvg with server-side clipping and noise)",
        "epsilon_unit": "client",
        "adjacency": adjacency,
        "mechanism": _mechanism_words(cost, noise),
        "sampling": sampling,
        "covers": (
            "every global model the server released: one charge per epoch (its whole "
            "tree), made before the epoch's first round is dispatched"
            if cost.sampling == "tree"
            else "every global model the server released: one charge per round, made "
            "before the round is sampled and dispatched (also rounds with an empty cohort)"
        ),
        "not_covered": "record-level guarantees (local SGD is not private); the server's "
        "view of each clipped update (a trusted server; with distributed noise each update "
        "carries only 1/K of the noise); the releases in unaccounted_releases; tuning",
        "noise_source": PRIVACY_STATEMENT["noise_source"],
        "tuning": PRIVACY_STATEMENT["tuning"],
        "accountant": describe_accountant(privacy.accountant),
        "epsilon_budget": privacy.epsilon,
        "delta": privacy.delta,
        "clip_norm": clip,
        "clipping": getattr(algorithm, "clipping", None),
        "noise_placement": noise,
        "adaptive_clipping": _adaptive_clipping_statement(algorithm),
        "server_optimizer": getattr(algorithm, "server_optimizer", "sgd"),
        "noise_multiplier": cost.noise_multiplier,
        "noise_calibrated": bool(getattr(algorithm, "noise_calibrated", False)),
        "client_sampling": cost.sampling,
        "client_sampling_rate": cost.sampling_rate,
        "cohort_size": cost.cohort_size,
        "expected_cohort": e,
        "population": n,
    }


def _mechanism_words(cost: ClientLevelCost, noise: str) -> str:
    """The released quantity of one round, in words."""
    e = cost.expected_cohort
    if cost.sampling == "tree":
        return (
            "each round: the prefix sum, since the epoch began, of the sums of the round's "
            "clients' model updates, each clipped to L2 norm S, through a binary tree "
            "whose every node carries N(0, sigma^2 S^2) (DP-FTRL, Kairouz et al. 2021); "
            f"the model is the epoch's start plus server_lr times that over K={e:g}"
        )
    return (
        "each round: the sum of the sampled clients' model updates, each "
        "clipped to L2 norm S, plus N(0, sigma^2 S^2) ("
        + (
            "added once by the server"
            if noise == "central"
            else "N(0, sigma^2 S^2 / K) added by each of the K clients"
        )
        + f"), divided by the expected cohort E={e:g} (public); composed over every round"
    )


def _adaptive_clipping_statement(algorithm: Algorithm) -> dict[str, Any] | None:
    """How S moves and how the noise is split, when adaptive clipping is on."""
    if not getattr(algorithm, "adaptive_clipping", False):
        return None
    return {
        "method": "Andrew et al. 2021 (geometric update S <- S exp(-clip_lr (b - gamma)), "
        "b the noisy fraction of unclipped updates); clip_norm above is S's start value",
        "target_quantile": algorithm.target_quantile,  # type: ignore[attr-defined]
        "clip_lr": algorithm.clip_lr,  # type: ignore[attr-defined]
        "clip_count_stddev": algorithm.clip_count_stddev,  # type: ignore[attr-defined]
        "update_noise_multiplier": algorithm.update_noise_multiplier,  # type: ignore[attr-defined]
        "accounting": "per round the update sum (noise multiplier z_update) and the count of "
        "unclipped updates, centred bits b_k - 1/2 (sensitivity 1/2, noise "
        "clip_count_stddev) compose to one Gaussian with noise_multiplier: "
        "z^-2 = z_update^-2 + (2 clip_count_stddev)^-2; charged as that Gaussian",
    }
