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
from typing import Any

import numpy as np
from torch import nn

from raydpfl.algorithms.base import Algorithm
from raydpfl.config import as_config_error
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset
from raydpfl.papers.dpfl_bcs import estimation as th
from raydpfl.papers.dpfl_bcs.algorithm import BcsFedSgd, DpflBcs
from raydpfl.papers.dpfl_bcs.options import REGRESSION_LOSS_BOUND
from raydpfl.papers.dpfl_bcs.privacy_plan import _FIELD, plan_privacy
from raydpfl.papers.dpfl_bcs.privatefl import PrivateFl
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.privacy.accounting.plan import PrivacyPlan


def build(
    config: Config, dataset: FederatedDataset, model: nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm named by `config`, its ledger (None if non-private) and metadata."""
    exp = config.experiment
    name, cfg = exp.algorithm.name, exp.algorithm.typed_options()
    biased = name in ("dpfl_bcs", "bcs_privatefl_bcs")  # DPFL-BCS's two-stage selection
    if biased and cfg.stage1_rounds >= exp.algorithm.rounds:
        raise ConfigError(
            f"{_FIELD}.stage1_rounds",
            f"must be < experiment.algorithm.rounds ({exp.algorithm.rounds}), "
            f"got {cfg.stage1_rounds}",
        )
    plan = plan_privacy(config, dataset)
    regression = bool(np.issubdtype(dataset.y.dtype, np.floating))
    privatefl = name in ("bcs_privatefl", "bcs_privatefl_bcs")
    if privatefl and exp.data.client_test_fraction <= 0:
        raise ConfigError(
            "experiment.data.client_test_fraction",
            f"{name} scores each client's personalised model on the client's own test "
            "split; must be > 0",
        )
    common = _common_arguments(config, dataset, model, plan, regression)
    algorithm = _algorithm(name, cfg, common, dataset, biased, privatefl)
    meta = _metadata(plan, common, algorithm, biased)
    if privatefl:
        meta["dpfl_bcs"]["privatefl_train_transform"] = cfg.privatefl_train_transform
    if regression:
        meta["task"] = (
            "regression: test_loss is the test MSE (standardised target units, lower is "
            "better); accuracy is not defined (test_accuracy NaN, final_test_accuracy null)"
        )
    if plan.extra["mechanism"] == "none":
        meta["unit"] = "none: non-private run (epsilon is infinite)"
        return algorithm, None, meta
    meta.update(plan.summary())
    return algorithm, plan.ledger(), meta


def _loss_bound(cfg: Any, dataset: FederatedDataset, regression: bool) -> float:
    """Θ: given, or ln(number of classes), or `REGRESSION_LOSS_BOUND` for regression."""
    if cfg.loss_bound is not None:
        return cfg.loss_bound
    return REGRESSION_LOSS_BOUND if regression else math.log(dataset.num_classes)


def _fixed_constants(cfg: Any, dataset_name: str, mechanism: str) -> th.Table3Row | None:
    """The bound's constants when not estimated: Table III's row, or the fixed ones."""
    if cfg.constants == "table3":
        key = (cfg.table3_dataset or dataset_name, mechanism)
        if key not in th.TABLE_III:
            raise ConfigError(
                f"{_FIELD}.table3_dataset",
                f"Table III has no row {key}; rows: {sorted(th.TABLE_III)}",
            )
        return th.TABLE_III[key]
    if cfg.constants == "fixed":
        return th.Table3Row(
            1.0, cfg.fixed_lr_offset, cfg.fixed_smoothness, cfg.fixed_strong_convexity
        )
    return None


def _common_arguments(
    config: Config,
    dataset: FederatedDataset,
    model: nn.Module,
    plan: PrivacyPlan,
    regression: bool,
) -> dict[str, Any]:
    """The keyword arguments every DPFL-BCS class takes, the privacy ones from `plan`."""
    exp = config.experiment
    algo, cfg = exp.algorithm, exp.algorithm.typed_options()
    mechanism = plan.extra["mechanism"]
    return dict(
        clients_per_round=algo.clients_per_round,
        rounds=algo.rounds,
        lr=algo.lr,
        lr_decay_tau=cfg.lr_decay_tau,
        clip_norm=plan.clip_norm,
        mechanism=mechanism,
        epsilons=plan.extra["epsilons"],
        deltas=plan.extra["deltas"],
        train_sizes=dataset.train_sizes(),
        num_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        calibration=cfg.gm_calibration,
        c2=cfg.c2,
        loss_bound=_loss_bound(cfg, dataset, regression),
        constants=cfg.constants,
        fixed_constants=_fixed_constants(cfg, exp.data.dataset, mechanism),
        z_override=cfg.z_override,
        sampler=cfg.sampler,
        weight_decay=cfg.weight_decay,
        server_momentum=cfg.server_momentum,
        pfa_public_fraction=cfg.pfa_public_fraction,
        pfa_rank=cfg.pfa_rank,
        regression=regression,
    )


def _algorithm(
    name: str,
    cfg: Any,
    common: dict[str, Any],
    dataset: FederatedDataset,
    biased: bool,
    privatefl: bool,
) -> DpflBcs:
    """The class serving `name`, built from `common`."""
    aggregation = {"bcs_weiavg": "weiavg", "bcs_pfa": "pfa"}.get(name, "mean")
    with as_config_error(_FIELD):
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
    algorithm.name = name  # type: ignore[misc]  (one class serves every baseline)
    return algorithm


def _metadata(
    plan: PrivacyPlan, common: dict[str, Any], algorithm: DpflBcs, biased: bool
) -> dict[str, Any]:
    """The run's ``dpfl_bcs`` metadata: mechanism, Θ, d, budgets, sizes, the plan T_n."""
    mechanism = plan.extra["mechanism"]
    return {
        "dpfl_bcs": {
            "mechanism": mechanism,
            "gm_calibration": common["calibration"] if mechanism == "gaussian" else None,
            "loss_bound_theta": common["loss_bound"],
            "num_params_d": common["num_params"],
            "epsilons": [float(e) for e in common["epsilons"]],
            "deltas": [float(d) for d in common["deltas"]],
            "train_sizes": [int(s) for s in common["train_sizes"]],
            "plan_stage1" if biased else "plan": [int(t) for t in algorithm.tplan],
        }
    }
