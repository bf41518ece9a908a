"""Robust aggregators (Yin et al. 2018): the coordinate-wise median against numpy's, the
trimmed mean against scipy's `trim_mean` (the same ⌊βm⌋-per-end rule), and end to end:
one client sending a huge update moves DP-FedAvg's mean far and its median or trimmed
mean hardly at all; bad settings are one error naming the field; client-level DP and the
papers' own aggregations refuse them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from raydpfl.algorithms.aggregators import coordinate_median, robust_update, trimmed_mean
from raydpfl.algorithms.base import ClientResult
from raydpfl.config import ConfigError
from raydpfl.experiment.build import build_experiment, make_local_backend, run_experiment
from raydpfl.simulation.experiment import make_server
from tests.conftest import small_config


def _updates(values: np.ndarray) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(v, dtype=torch.float64)} for v in values]


@pytest.mark.parametrize("m", [1, 2, 5, 6, 11])
def test_median_is_numpys_coordinate_wise_median(m):
    values = np.random.default_rng(m).normal(size=(m, 7))
    got = coordinate_median(_updates(values))["w"].numpy()
    np.testing.assert_allclose(got, np.median(values, axis=0), rtol=0, atol=1e-15)


@pytest.mark.parametrize("m,beta", [(10, 0.1), (10, 0.25), (7, 0.2), (5, 0.0), (9, 0.49)])
def test_trimmed_mean_is_scipys_trim_mean(m, beta):
    values = np.random.default_rng(100 + m).standard_cauchy(size=(m, 5))
    got = trimmed_mean(_updates(values), beta)["w"].numpy()
    np.testing.assert_allclose(got, stats.trim_mean(values, beta, axis=0), rtol=1e-12)


def test_trimmed_mean_at_zero_is_the_plain_mean_and_bad_fractions_are_refused():
    values = np.arange(12.0).reshape(4, 3)
    assert np.allclose(trimmed_mean(_updates(values), 0.0)["w"].numpy(), values.mean(0))
    for beta in (-0.1, 0.5):
        with pytest.raises(ValueError, match="trim_fraction"):
            trimmed_mean(_updates(values), beta)
    with pytest.raises(ValueError, match="no updates"):
        coordinate_median([])
    with pytest.raises(ValueError, match="median or trimmed_mean"):
        robust_update("mean", _updates(values))


def _config(aggregator: str, **server):
    return small_config(
        experiment__algorithm={
            "name": "dp_fedavg",
            "rounds": 1,
            "local_steps": 2,
            "clients_per_round": 6,
            "eval_every": 1,
            "evaluate_clients": False,
            "server": {"aggregator": aggregator, **server},
        }
    )


@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean"])
def test_one_huge_update_moves_the_mean_and_not_the_robust_aggregate(aggregator):
    """The same round with one client's update replaced by 1e6: the mean moves by ~1e6/6,
    the median and the 0.2-trimmed mean (one value cut at each end of six) stay within
    the honest updates' range."""
    moved = {}
    for agg in ("mean", aggregator):
        exp = build_experiment(_config(agg, trim_fraction=0.2))
        server = make_server(exp)
        real = exp.algorithm.aggregate if agg != "mean" else None
        honest: list[dict[str, torch.Tensor]] = []

        def corrupt(results, honest=honest):
            honest.extend(r.update for r in results)
            bad = {n: torch.full_like(t, 1e6) for n, t in results[0].update.items()}
            return [ClientResult(**{**vars(results[0]), "update": bad}), *results[1:]]

        before = {n: t.clone() for n, t in server.params.items()}
        if real is None:  # the mean's linear path: corrupt inside a non-linear run instead
            exp.algorithm.linear_aggregation = False
            real = exp.algorithm.aggregate
        exp.algorithm.aggregate = lambda p, t, r, server_round=None, real=real: real(
            p, t, corrupt(r), server_round=server_round
        )
        with make_local_backend(exp) as backend:
            assert server.run_round(backend, 0)
        step = {n: server.params[n] - before[n] for n in before}
        lo = {n: torch.stack([u[n] for u in honest]).min(0).values for n in before}
        hi = {n: torch.stack([u[n] for u in honest]).max(0).values for n in before}
        inside = all(bool(((step[n] >= lo[n]) & (step[n] <= hi[n])).all()) for n in step)
        moved[agg] = (max(float(s.abs().max()) for s in step.values()), inside)
    assert moved["mean"][0] > 1e5 and not moved["mean"][1]
    assert moved[aggregator][0] < 10 and moved[aggregator][1]


def test_the_robust_run_reports_its_shift_from_the_mean_and_is_reproducible():
    a = run_experiment(build_experiment(_config("median")), None)
    b = run_experiment(build_experiment(_config("median")), None)
    mean = run_experiment(build_experiment(_config("mean")), None)
    assert a["model_sha256"] == b["model_sha256"] != mean["model_sha256"]
    assert a["ledger_sha256"] == mean["ledger_sha256"]  # post-processing: the same charges


@pytest.mark.parametrize(
    "algorithm,server,field",
    [
        ("dp_fedavg", {"aggregator": "krum"}, "experiment.algorithm.server.aggregator"),
        ("dp_fedavg", {"trim_fraction": 0.5}, "experiment.algorithm.server.trim_fraction"),
        ("fedavg", {"trim_fraction": -0.1}, "experiment.algorithm.server.trim_fraction"),
        ("dp_fedavg_client", {"aggregator": "median"}, "experiment.algorithm.server"),
        ("ali_dpfl", {"aggregator": "trimmed_mean"}, "experiment.algorithm.server"),
    ],
)
def test_bad_or_unsupported_aggregators_are_one_error_naming_the_field(algorithm, server, field):
    with pytest.raises(ConfigError) as err:
        small_config(experiment__algorithm={"name": algorithm, "server": server})
    assert err.value.field == field
    assert "\n" not in str(err.value)
