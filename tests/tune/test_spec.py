"""The tune: section: parsing, validation before any Ray work, trial configs, reporting."""

from __future__ import annotations

import copy
import math

import pytest

from raydpfl.config.schema import ConfigError
from raydpfl.privacy.accounting.accountants import compute_epsilon
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.tune.selection import composed_ledger
from raydpfl.tune.spec import parse_sweep
from raydpfl.tune.sweep import TrialReporter, param_space, trial_bundles

BASE = {
    "experiment": {
        "name": "t",
        "data": {"dataset": "digits", "num_clients": 8, "partition": {"kind": "iid"}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "dp_fedavg", "rounds": 6, "clients_per_round": 4, "eval_every": 2},
        "privacy": {"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 1.0},
    },
    "runtime": {"backend": "ray", "workers": 2, "cpus_per_worker": 0.5},
}


def sweep_file(**tune):
    raw = copy.deepcopy(BASE)
    raw["tune"] = {"space": {"algorithm.lr": {"grid": [0.1, 0.5]}}, **tune}
    return raw


def test_a_full_section_parses_with_every_space_kind():
    sweep = parse_sweep(
        sweep_file(
            num_samples=3,
            metric="fair_acc_worst",
            mode="max",
            scheduler={"kind": "asha", "grace_period": 2, "reduction_factor": 3},
            space={
                "algorithm.lr": {"loguniform": [0.01, 1.0]},
                "experiment.privacy.clip_norm": {"grid": [0.5, 1.0]},
                "algorithm.local_steps": {"choice": [1, 2, 5]},
                "privacy.noise_multiplier": {"uniform": [0.8, 1.5]},
                "algorithm.rounds": {"randint": [4, 8]},
            },
        )
    )

    spec = sweep.spec
    assert [d.key for d in spec.space] == [
        "experiment.algorithm.lr",
        "experiment.privacy.clip_norm",
        "experiment.algorithm.local_steps",
        "experiment.privacy.noise_multiplier",
        "experiment.algorithm.rounds",
    ]
    assert spec.num_trials() == 6  # 3 samples x 2 grid values
    assert spec.scheduler.kind == "asha" and spec.scheduler.reduction_factor == 3.0
    assert sweep.tune_raw["metric"] == "fair_acc_worst"


def test_trial_config_applies_the_sampled_values_and_keeps_the_rest():
    sweep = parse_sweep(sweep_file())

    config = sweep.trial_config({"experiment.algorithm.lr": 0.5})

    assert config.experiment.algorithm.lr == 0.5
    assert config.experiment.algorithm.rounds == 6
    assert sweep.base_raw["experiment"]["algorithm"].get("lr") is None


def test_set_overrides_reach_every_trial():
    sweep = parse_sweep(sweep_file(), overrides=("algorithm.rounds=3",))

    assert sweep.trial_config({"experiment.algorithm.lr": 0.1}).experiment.algorithm.rounds == 3


@pytest.mark.parametrize(
    ("tune", "field", "words"),
    [
        ({"metric": "accuracy"}, "tune.metric", "must be one of"),
        ({"mode": "up"}, "tune.mode", "max or min"),
        ({"num_samples": 0}, "tune.num_samples", ">= 1"),
        ({"search": "bayes"}, "tune.search", "random"),
        ({"scheduler": "hyperband"}, "tune.scheduler.kind", "fifo or asha"),
        (
            {"scheduler": {"kind": "asha", "reduction_factor": 1}},
            "tune.scheduler.reduction_factor",
            "> 1",
        ),
        (
            {"scheduler": {"kind": "asha", "grace_period": 1}},
            "tune.scheduler.grace_period",
            "eval_every",
        ),
        ({"colour": 1}, "tune.colour", "unknown key"),
        ({"space": {}}, "tune.space", "at least one"),
        (
            {"space": {"algorithm.nope": {"grid": [1]}}},
            "tune.space.experiment.algorithm.nope",
            "unknown key",
        ),
        (
            {"space": {"algorithm.lr": {"grid": [0.1, -1.0]}}},
            "tune.space.experiment.algorithm.lr",
            "must be > 0",
        ),
        (
            {"space": {"algorithm.lr": {"uniform": [1.0, 0.1]}}},
            "tune.space.algorithm.lr.uniform",
            "low < high",
        ),
        (
            {"space": {"algorithm.lr": {"loguniform": [0.0, 1.0]}}},
            "tune.space.algorithm.lr.loguniform",
            "low > 0",
        ),
        (
            {"space": {"algorithm.rounds": {"randint": [2.5, 4]}}},
            "tune.space.algorithm.rounds.randint",
            "integers",
        ),
        (
            {"space": {"algorithm.lr": {"normal": [0, 1]}}},
            "tune.space.algorithm.lr",
            "kind must be",
        ),
        ({"space": {"lr": {"grid": [0.1]}}}, "tune.space.lr", "dotted key"),
        ({"search": "optuna"}, "tune.search", "grid dimensions"),
        (
            {"metric": "fair_psi", "space": {"algorithm.evaluate_clients": {"grid": [False]}}},
            None,
            None,
        ),
    ],
)
def test_bad_sections_are_refused_naming_the_field(tune, field, words):
    raw = sweep_file(**tune)
    if field is None:  # a valid section: swept evaluate_clients is checked per trial value
        parse_sweep(raw)
        return
    with pytest.raises(ConfigError) as e:
        parse_sweep(raw)

    assert e.value.field == field
    assert words in str(e.value)


def test_a_file_without_tune_section_is_refused():
    with pytest.raises(ConfigError, match="needs a tune: section"):
        parse_sweep(copy.deepcopy(BASE))


def test_fair_metrics_need_per_client_evaluation():
    raw = sweep_file(metric="fair_psi")
    raw["experiment"]["algorithm"]["evaluate_clients"] = False

    with pytest.raises(ConfigError, match="evaluate_clients"):
        parse_sweep(raw)


def test_each_trial_reserves_its_server_and_workers_together():
    sweep = parse_sweep(sweep_file(server_cpus=0.5))
    ray_trial = sweep.trial_config({"runtime.gpus_per_worker": 0.25})
    local_trial = sweep.trial_config({"runtime.backend": "local"})

    assert trial_bundles(ray_trial, 0.5) == [
        {"CPU": 0.5},
        {"CPU": 0.5, "GPU": 0.25},
        {"CPU": 0.5, "GPU": 0.25},
    ]
    assert trial_bundles(local_trial, 0.25) == [{"CPU": 0.5}]


def test_param_space_maps_kinds_to_tune_domains_and_randint_includes_high():
    from ray import tune

    sweep = parse_sweep(
        sweep_file(
            space={
                "algorithm.lr": {"grid": [0.1, 0.5]},
                "algorithm.rounds": {"randint": [4, 8]},
                "privacy.clip_norm": {"loguniform": [0.1, 10.0]},
            }
        )
    )

    space = param_space(sweep.spec)

    assert space["experiment.algorithm.lr"] == tune.grid_search([0.1, 0.5])
    rounds = space["experiment.algorithm.rounds"]
    assert (rounds.lower, rounds.upper) == (4, 9)
    draws = {rounds.sample() for _ in range(300)}
    assert draws == {4, 5, 6, 7, 8}
    clip = space["experiment.privacy.clip_norm"]
    assert (clip.lower, clip.upper) == (0.1, 10.0)


def test_reporter_carries_the_metric_forward_and_holds_back_the_last_round():
    sent = []
    reporter = TrialReporter("test_accuracy", sent.append, last_round=3)

    reporter({"round": 1, "test_accuracy": math.nan, "epsilon_max": 1.0})
    reporter({"round": 2, "test_accuracy": 0.5, "epsilon_max": 2.0, "note": "x"})
    reporter({"round": 3, "test_accuracy": math.nan, "epsilon_max": 3.0})

    assert [r["round"] for r in sent] == [1, 2]
    assert math.isnan(sent[0]["test_accuracy"]) and sent[0]["evaluated"] is False
    assert sent[1]["test_accuracy"] == 0.5 and "note" not in sent[1]
    reporter.flush({"final_test_accuracy": 0.7})
    assert sent[2]["round"] == 3 and sent[2]["test_accuracy"] == 0.7


def test_sweep_epsilon_composes_every_trials_charges_per_client(tmp_path):
    import json

    from raydpfl.simulation.integrity import GENESIS, charge_log_line

    runs = []
    histories = {0: [], 1: []}
    for t, (sigma, steps) in enumerate([(1.0, 4), (1.3, 6), (0.9, 2)]):
        run = tmp_path / "trials" / f"t{t}"
        run.mkdir(parents=True)
        lines, chain = [], GENESIS
        for r in range(2):
            charges = [[c, PrivacyCost(sigma, 0.1, steps).to_dict()] for c in (0, 1) if c or t]
            for c, _ in charges:
                histories[c].append((sigma, 0.1, steps))
            lines.append(charge_log_line(chain, r, charges))
            chain = json.loads(lines[-1])["chain"]
        (run / "ledger_log.jsonl").write_text("\n".join(lines) + "\n")
        runs.append(run)

    ledger = composed_ledger(runs, "rdp", 1e-5)

    for c in (0, 1):
        assert ledger.epsilon(c) == pytest.approx(compute_epsilon(histories[c], 1e-5, "rdp"))
    assert ledger.max_epsilon() == pytest.approx(ledger.epsilon(1))
    assert ledger.epsilon(1) > ledger.epsilon(0)


def _write_log(run, rounds):
    import json

    from raydpfl.simulation.integrity import GENESIS, charge_log_line

    run.mkdir(parents=True)
    lines, chain = [], GENESIS
    for r, charges in enumerate(rounds):
        lines.append(charge_log_line(chain, r, charges))
        chain = json.loads(lines[-1])["chain"]
    (run / "ledger_log.jsonl").write_text("\n".join(lines) + "\n")


def test_a_client_level_sweep_composes_the_population_charges(tmp_path):
    from raydpfl.privacy.accounting.client_level import (
        POPULATION,
        ClientLevelCost,
        client_level_epsilon,
    )

    costs = [
        ClientLevelCost(1.0, "poisson", 200, sampling_rate=0.1),
        ClientLevelCost(1.4, "poisson", 200, sampling_rate=0.1),
    ]
    for t, cost in enumerate(costs):
        _write_log(tmp_path / f"t{t}", [[[POPULATION, cost.to_dict()]]] * 3)

    ledger = composed_ledger([tmp_path / "t0", tmp_path / "t1"], "rdp", 1e-5)

    expected = client_level_epsilon([costs[0]] * 3 + [costs[1]] * 3, 1e-5, "rdp")
    assert ledger.unit == "client"
    assert ledger.max_epsilon() == pytest.approx(expected)


def test_a_sweep_mixing_privacy_units_is_refused(tmp_path):
    from raydpfl.privacy.accounting.client_level import POPULATION, ClientLevelCost

    _write_log(
        tmp_path / "a",
        [[[POPULATION, ClientLevelCost(1.0, "poisson", 200, sampling_rate=0.1).to_dict()]]],
    )
    _write_log(tmp_path / "b", [[[0, PrivacyCost(1.0, 0.1, 3).to_dict()]]])
    with pytest.raises(ValueError, match="units never mix"):
        composed_ledger([tmp_path / "a", tmp_path / "b"], "rdp", 1e-5)
