"""Human names for what the report shows: rounds.parquet columns and swept config keys.

Figures are read by people who did not write the run, so an axis says "ε (max over
clients)" rather than `epsilon_max`, and a sweep's legend says `lr=0.05, clip=1` rather
than a trial id. Pure Python: no matplotlib, so `runs` can label runs without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "COLUMN_LABELS",
    "PARAM_NAMES",
    "column_label",
    "format_value",
    "param_label",
    "param_names",
    "param_title",
]

#: rounds.parquet (and clients.parquet fairness) columns → axis labels, units in brackets.
COLUMN_LABELS: dict[str, str] = {
    "round": "round",
    "test_accuracy": "test accuracy",
    "test_loss": "test loss",
    "epsilon_max": "ε (max over clients)",
    "epsilon_mean": "ε (mean over clients)",
    "wall_seconds": "wall time per round (s)",
    "updates_received": "updates received",
    "clients_trained": "clients trained",
    "clients_refused": "clients refused (budget exhausted)",
    "client_accuracy_mean": "mean client accuracy",
    "client_accuracy_std": "std of client accuracy",
    "local_steps": "local DP-SGD steps",
    "clipped_fraction": "fraction of per-example gradients clipped",
    "mean_batch_size": "mean Poisson batch size (examples)",
    "train_loss": "training loss (client mean)",
    "schedule_loss": "loss used by the schedule",
    "noise_multiplier": "noise multiplier σ",
    "noise_multiplier_next": "noise multiplier σ (next round)",
    "clip_norm": "clip norm C",
    "clip_norm_mean": "clip norm C (client mean)",
    "tau": "τ (local steps)",
    "tau_raw": "τ* (unrounded)",
    "tau_next": "τ planned for the next round",
    "tau_T": "total DP-SGD iterations T",
    "iterations_done": "DP-SGD iterations done",
    "mu": "smoothness estimate μ",
    "gamma": "γ",
    "lambda": "fairness weight λ",
    "lam": "fairness weight λ",
    "lambda_star": "λ*",
    "lambda_next": "λ for the next round",
    "psi": "Ψ recorded by the algorithm",
    "num_clusters": "number of clusters",
    "fedfair_lambda": "FedFair λ",
    "fedfair_global_loss": "FedFair global loss",
    "fedfair_psi_uploaded": "Ψ of the uploaded losses (FedFair)",
    "qffl_loss_mean": "q-FFL mean loss",
    "bcs_stage": "BCS stage",
    "bcs_available": "clients available to BCS",
    "fair_psi": "Ψ (weighted variance of client test losses)",
    "fair_loss_mean": "mean client test loss",
    "fair_acc_mean": "mean client accuracy",
    "fair_acc_std": "std of client accuracy",
    "fair_acc_var": "variance of client accuracy",
    "fair_acc_mean_weighted": "mean client accuracy (size-weighted)",
    "fair_acc_std_weighted": "std of client accuracy (size-weighted)",
    "fair_acc_var_weighted": "variance of client accuracy (size-weighted)",
    "fair_acc_worst": "worst client's accuracy",
    "fair_acc_worst10": "mean accuracy of the worst 10% of clients",
}

#: Swept config keys ('experiment.' dropped) → (short name for legends, long name for axes).
PARAM_NAMES: dict[str, tuple[str, str]] = {
    "algorithm.lr": ("lr", "learning rate"),
    "algorithm.local_steps": ("τ", "local steps τ"),
    "algorithm.rounds": ("rounds", "rounds"),
    "algorithm.clients_per_round": ("clients/round", "clients per round"),
    "algorithm.fedfdp.lam": ("λ", "fairness weight λ"),
    "privacy.clip_norm": ("clip", "clip norm C"),
    "privacy.noise_multiplier": ("σ", "noise multiplier σ"),
    "privacy.epsilon": ("ε", "ε budget"),
    "privacy.sampling_rate": ("q", "sampling rate q"),
    "data.partition.alpha": ("α", "Dirichlet α"),
    "runtime.seed": ("seed", "seed"),
}


def column_label(column: str) -> str:
    """The axis label of a rounds.parquet column; an unknown one is spelled out in words
    (underscores to spaces) so no raw identifier reaches a figure."""
    return COLUMN_LABELS.get(column) or column.replace("_", " ")


def _short_key(key: str) -> str:
    return key.removeprefix("experiment.")


def param_names(keys: Iterable[str]) -> dict[str, str]:
    """Short legend names of swept config keys: the known ones' symbols, else the last
    dotted part, else (when two keys share it) the whole key, so names stay distinct."""
    keys = list(keys)
    names = {}
    for key in keys:
        known = PARAM_NAMES.get(_short_key(key))
        names[key] = known[0] if known else _short_key(key).rsplit(".", 1)[-1]
    taken = list(names.values())
    for key, name in names.items():
        if taken.count(name) > 1:
            names[key] = _short_key(key)
    return names


def param_title(key: str) -> str:
    """An axis title for a swept config key: its long name beside the key itself (the key
    is what `--set` and `tune.space` take)."""
    known = PARAM_NAMES.get(_short_key(key))
    return f"{known[1]} ({_short_key(key)})" if known else _short_key(key)


def format_value(value: Any) -> str:
    """A config value as a legend shows it: 0.05, 1 (not 1.0), null, or compact JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def param_label(params: Mapping[str, Any]) -> str:
    """`lr=0.05, clip=1`: the values a trial (or run) was given, by their short names."""
    names = param_names(params)
    return ", ".join(f"{names[k]}={format_value(v)}" for k, v in params.items())
