"""Builds the dpfl_bcs algorithms from `experiment.algorithm.dpfl_bcs` (issue 6).

Every client gets its own budget (ε_n, δ_n): drawn ε_n ~ U[ε_min, ε_max], δ_n ~ U[δ_min, δ_max]
on a stream derived from the run seed (or `budget_seed`) that does not depend on the
algorithm, so every compared algorithm sees the same budgets (§11.3); or given per client in
`budgets`. Under Laplace δ_n = 0. The ledger holds each client's own (ε_n, δ_n) and charges
every release before dispatch.

PRIVATEFL (``bcs_privatefl``, uniform) and PRIVATEFL-BCS (``bcs_privatefl_bcs``, biased
selection) are `raydpfl.papers.dpfl_bcs.privatefl.PrivateFl`: each client's model is the shared
model composed with its own input transformation, scored on the client's own test split, so
they need ``data.client_test_fraction > 0``.

Regression (the paper's convex case): a dataset with float targets (``diabetes``, the
offline stand-in for Lending Club) with the ``bcs_linreg`` model; the client step uses the
squared error, Θ defaults to `REGRESSION_LOSS_BOUND`, and the run reports test MSE as
``test_loss`` (``test_accuracy`` stays NaN; the summary's accuracy fields are null and its
``task`` entry says so); PRIVATEFL's pooled per-client figures are test MSE as well.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.papers.dpfl_bcs import estimation as th
from raydpfl.papers.dpfl_bcs.algorithm import BcsFedSgd, DpflBcs
from raydpfl.papers.dpfl_bcs.options import REGRESSION_LOSS_BOUND
from raydpfl.papers.dpfl_bcs.privatefl import PrivateFl
from raydpfl.privacy.accountants import describe_accountant
from raydpfl.privacy.ledger import PrivacyLedger
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


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    exp = config.experiment
    algo, cfg, privacy = exp.algorithm, exp.algorithm.typed_options(), exp.privacy
    name = algo.name
    mechanism = _PINNED.get(name, cfg.mechanism)
    if mechanism in ("gaussian", "laplace") and cfg.mechanism != mechanism:
        raise ConfigError(f"{_FIELD}.mechanism", f"{name} uses the {mechanism} mechanism only")
    biased = name in ("dpfl_bcs", "bcs_privatefl_bcs")  # DPFL-BCS's two-stage selection
    if biased and cfg.stage1_rounds >= algo.rounds:
        raise ConfigError(
            f"{_FIELD}.stage1_rounds",
            f"must be < experiment.algorithm.rounds ({algo.rounds}), got {cfg.stage1_rounds}",
        )
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
    regression = bool(np.issubdtype(dataset.y.dtype, np.floating))
    privatefl = name in ("bcs_privatefl", "bcs_privatefl_bcs")
    if privatefl and exp.data.client_test_fraction <= 0:
        raise ConfigError(
            "experiment.data.client_test_fraction",
            f"{name} scores each client's personalised model on the client's own test "
            "split; must be > 0",
        )
    if cfg.loss_bound is not None:
        loss_bound = cfg.loss_bound
    else:
        loss_bound = REGRESSION_LOSS_BOUND if regression else math.log(dataset.num_classes)
    fixed = None
    if cfg.constants == "table3":
        key = (cfg.table3_dataset or exp.data.dataset, mechanism)
        if key not in th.TABLE_III:
            raise ConfigError(
                f"{_FIELD}.table3_dataset",
                f"Table III has no row {key}; rows: {sorted(th.TABLE_III)}",
            )
        fixed = th.TABLE_III[key]
    elif cfg.constants == "fixed":
        fixed = th.Table3Row(
            1.0, cfg.fixed_lr_offset, cfg.fixed_smoothness, cfg.fixed_strong_convexity
        )
    accountant = cfg.accountant or privacy.accountant
    if mechanism == "laplace" and accountant == "prv":
        raise ConfigError(
            f"{_FIELD}.accountant", "prv cannot account the Laplace mechanism; use zcdp/rdp/pld"
        )
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    common: dict[str, Any] = dict(
        clients_per_round=algo.clients_per_round,
        rounds=algo.rounds,
        lr=algo.lr,
        lr_decay_tau=cfg.lr_decay_tau,
        clip_norm=privacy.clip_norm,
        mechanism=mechanism,
        epsilons=eps,
        deltas=deltas,
        train_sizes=sizes,
        num_params=num_params,
        calibration=cfg.gm_calibration,
        c2=cfg.c2,
        loss_bound=loss_bound,
        constants=cfg.constants,
        fixed_constants=fixed,
        z_override=cfg.z_override,
        sampler=cfg.sampler,
        weight_decay=cfg.weight_decay,
        server_momentum=cfg.server_momentum,
        pfa_public_fraction=cfg.pfa_public_fraction,
        pfa_rank=cfg.pfa_rank,
        regression=regression,
    )
    aggregation = {"bcs_weiavg": "weiavg", "bcs_pfa": "pfa"}.get(name, "mean")
    try:
        if name == "bcs_fedsgd":
            algorithm: DpflBcs = BcsFedSgd(**common, selection="uniform")
        elif privatefl:
            algorithm = PrivateFl(
                **common,
                input_shape=dataset.input_shape,
                train_transform=cfg.privatefl_train_transform,
                selection="bcs" if biased else "uniform",
                stage1_rounds=cfg.stage1_rounds,
            )
        else:
            algorithm = DpflBcs(
                **common,
                selection="bcs" if name == "dpfl_bcs" else "uniform",
                stage1_rounds=cfg.stage1_rounds,
                aggregation=aggregation,
            )
    except ValueError as e:
        raise ConfigError(_FIELD, str(e)) from None
    algorithm.name = name  # type: ignore[misc]  (one class serves every baseline)
    meta: dict[str, Any] = {
        "dpfl_bcs": {
            "mechanism": mechanism,
            "gm_calibration": cfg.gm_calibration if mechanism == "gaussian" else None,
            "loss_bound_theta": loss_bound,
            "num_params_d": num_params,
            "epsilons": [float(e) for e in eps],
            "deltas": [float(d) for d in deltas],
            "train_sizes": [int(s) for s in sizes],
            "plan_stage1" if biased else "plan": [int(t) for t in algorithm.tplan],
        }
    }
    if privatefl:
        meta["dpfl_bcs"]["privatefl_train_transform"] = cfg.privatefl_train_transform
    if regression:
        meta["task"] = (
            "regression: test_loss is the test MSE (standardised target units, lower is "
            "better); accuracy is not defined (test_accuracy NaN, final_test_accuracy null)"
        )
    if mechanism == "none":
        meta["unit"] = "none: non-private run (epsilon is infinite)"
        return algorithm, None, meta
    ledger = PrivacyLedger(
        accountant,
        privacy.delta,
        None,
        client_budgets={c: (float(eps[c]), float(deltas[c])) for c in range(n)},
    )
    meta.update(
        PRIVACY_STATEMENT,
        accountant=describe_accountant(accountant),
        epsilon_budget="per client: see dpfl_bcs.epsilons / dpfl_bcs.deltas",
        clip_norm=privacy.clip_norm,
    )
    return algorithm, ledger, meta
