"""DPFL-BCS's privacy plan: each client's own budget (ε_n, δ_n), the mechanism, the
accountant and the statement of the run (shared/specs/dpfl-bcs.md §11.3).

Every client gets its own budget: drawn ε_n ~ U[ε_min, ε_max], δ_n ~ U[δ_min, δ_max] on a
stream derived from the run seed (or `budget_seed`) that does not depend on the algorithm,
so every compared algorithm sees the same budgets; or given per client in `budgets`. Under
Laplace δ_n = 0. Each client's noise scale is calibrated from its (ε_n, δ_n) and its
participation plan by the algorithm (`calibration.py`); the ledger holds each client's own
budget and charges every release before dispatch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.accounting.accountants import describe_accountant
from raydpfl.privacy.accounting.plan import PlannedMechanism, PrivacyPlan
from raydpfl.privacy.mechanisms.kernel import (
    CertifiedGaussianRelease,
    GaussianRelease,
    LaplaceRelease,
)
from raydpfl.simulation.seeding import NO_ROUND, SERVER, numpy_rng

_FIELD = "experiment.algorithm.dpfl_bcs"

#: The mechanism each algorithm name pins (None: the config's `mechanism`).
_PINNED = {"bcs_dpsgd": "gaussian", "bcs_dmldp": "laplace", "bcs_fedsgd": "none"}

PRIVACY_STATEMENT = {
    "unit": "record: one training example of one client (per-client record-level DP, each "
    "client with its own (epsilon_n, delta_n); delta_n = 0 under Laplace)",
    "adjacency": "replace one training record of the client (sensitivity 2*lr*B/D_n)",
    "mechanism": "one full-batch clipped gradient step per participation (L2 clip + Gaussian "
    "or L1 clip + Laplace); stage-1 uploads add two loss values (clipped at Theta) to the "
    "same release, with sensitivity 2*lr*(B+Theta)/D_n",
    "sampling": "no amplification: the server knows who is selected; each client's budget "
    "is split over its integer participation plan, and it is charged only when it trains",
    "covers": "every upload of every participation, including the stage-1 loss values "
    "(charged before dispatch)",
    "noise_source": "research mode: seeded PyTorch PRNG (reproducible; not floating-point secure)",
    "tuning": "not included: epsilon is per run, excluding any hyperparameter search",
}


def parse_budgets(text: str, num_clients: int, mechanism: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-client (ε_n, δ_n) from ``"eps:delta,eps:delta,..."`` or a file of ``eps [delta]``
    lines (δ may be omitted under Laplace). Raises ConfigError naming `budgets`."""
    field = f"{_FIELD}.budgets"
    path = Path(text.strip())
    if not path.exists() and path.suffix in (".txt", ".csv", ".tsv", ".dat"):
        raise ConfigError(field, f"no budget file at {path}")
    if path.is_file():
        items = [
            line.replace(",", " ").split()
            for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    else:
        items = [part.strip().split(":") for part in text.split(",") if part.strip()]
    if len(items) != num_clients:
        raise ConfigError(field, f"needs one budget per client ({num_clients}), got {len(items)}")
    eps, deltas = np.empty(num_clients), np.zeros(num_clients)
    for i, item in enumerate(items):
        try:
            eps[i] = float(item[0])
            if len(item) > 1:
                deltas[i] = float(item[1])
            elif mechanism == "gaussian":
                raise ConfigError(field, f"client {i}: the Gaussian mechanism needs a delta")
        except (ValueError, IndexError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(field, f"client {i}: cannot read {item!r}") from None
        if len(item) > 2 or not (math.isfinite(eps[i]) and eps[i] > 0):
            raise ConfigError(field, f"client {i}: epsilon must be finite and > 0")
        if mechanism == "gaussian" and not 0 < deltas[i] < 1:
            raise ConfigError(field, f"client {i}: delta must be in (0, 1)")
    return eps, deltas


def client_budgets(config: Config, num_clients: int, mechanism: str) -> tuple[np.ndarray, ...]:
    """(ε_n, δ_n) of every client: given, or drawn as the paper does (§11.3)."""
    cfg = config.experiment.algorithm.typed_options()
    if cfg.budgets is not None:
        eps, deltas = parse_budgets(cfg.budgets, num_clients, mechanism)
    else:
        seed = config.runtime.seed if cfg.budget_seed is None else cfg.budget_seed
        rng = numpy_rng(seed, NO_ROUND, SERVER, "dpfl_bcs_budgets")
        eps = rng.uniform(cfg.epsilon_min, cfg.epsilon_max, num_clients)
        deltas = rng.uniform(cfg.delta_min, cfg.delta_max, num_clients)
    if mechanism != "gaussian":
        deltas = np.zeros(num_clients)
    return eps, deltas


def plan_privacy(config: Config, dataset: FederatedDataset) -> PrivacyPlan:
    """The run's plan: mechanism (``extra["mechanism"]``: gaussian, laplace or none), the
    per-client budgets (``extra["epsilons"]``, ``extra["deltas"]``, `client_budgets`), C,
    the accountant and the privacy statement. Raises ConfigError on a budget the
    mechanism or the data cannot honour."""
    exp = config.experiment
    name, cfg, privacy = exp.algorithm.name, exp.algorithm.typed_options(), exp.privacy
    mechanism = _PINNED.get(name, cfg.mechanism)
    if mechanism in ("gaussian", "laplace") and cfg.mechanism != mechanism:
        raise ConfigError(f"{_FIELD}.mechanism", f"{name} uses the {mechanism} mechanism only")
    sizes = dataset.train_sizes()
    n = dataset.num_clients
    eps, deltas = client_budgets(config, n, mechanism)
    if mechanism == "gaussian":
        bad = np.flatnonzero(deltas >= 1.0 / sizes)
        if bad.size:
            raise ConfigError(
                f"{_FIELD}.delta_max",
                f"delta_n must be < 1/D_n; client {int(bad[0])} has D_n = {int(sizes[bad[0]])}",
            )
    accountant = cfg.accountant or privacy.accountant
    if mechanism == "laplace" and accountant == "prv":
        raise ConfigError(
            f"{_FIELD}.accountant", "prv cannot account the Laplace mechanism; use zcdp/rdp/pld"
        )
    metadata: dict[str, Any] = dict(
        PRIVACY_STATEMENT,
        accountant=describe_accountant(accountant),
        epsilon_budget="per client: see dpfl_bcs.epsilons / dpfl_bcs.deltas",
        clip_norm=privacy.clip_norm,
    )
    return PrivacyPlan(
        unit="record",
        accountant=accountant,
        delta=privacy.delta,
        epsilon=None,
        clip_norm=privacy.clip_norm,
        client_budgets={c: (float(eps[c]), float(deltas[c])) for c in range(n)},
        extra={"mechanism": mechanism, "epsilons": eps, "deltas": deltas},
        metadata=metadata,
        mechanisms=_planned(mechanism, cfg.gm_calibration),
    )


def _planned(mechanism: str, calibration: str | None) -> tuple[PlannedMechanism, ...]:
    """The one full-batch release per participation: Laplace, or Gaussian (certified as
    (ε/T_n, δ/T_n) under ``paper_alg2``); none for the non-private baseline."""
    free = (
        "noise multiplier calibrated per client from its (epsilon_n, delta_n) and "
        "participation plan; sensitivity 2*eta_t*B/D_n (+ the loss reports'), checked by the "
        "platform against the release it computes"
    )
    if mechanism == "laplace":
        return (PlannedMechanism(LaplaceRelease, {}, free),)
    if mechanism == "gaussian":
        kind = CertifiedGaussianRelease if calibration == "paper_alg2" else GaussianRelease
        return (PlannedMechanism(kind, {}, free),)
    return ()
