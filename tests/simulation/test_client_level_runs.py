"""Client-level DP-FedAvg end to end: the same model on the local backend and on Ray, an
interrupted run resumed to the same model and ledger, the budget stop, the stated unit,
and bad input refused in one line before any training."""

from __future__ import annotations

import json

import pytest

from raydpfl.cli.main import main
from raydpfl.config import ConfigError
from raydpfl.config.load import dump_config
from raydpfl.experiment.build import build_experiment, make_local_backend, run_experiment
from raydpfl.privacy.accounting.client_level import (
    ClientLevelCost,
    ClientLevelLedger,
    client_level_epsilon,
    client_level_max_rounds,
)
from raydpfl.simulation.experiment import make_server
from raydpfl.simulation.outputs import RunWriter
from tests.conftest import small_config

POISSON = {"sampling": "poisson", "client_sampling_rate": 0.4}
FIXED_DISTRIBUTED = {"sampling": "fixed", "noise": "distributed", "clipping": "per_layer"}
#: Adaptive clipping (S moves every round) with FedAdam on the server: state on both sides.
ADAPTIVE_ADAM = {
    **POISSON,
    "adaptive_clipping": True,
    "clip_count_stddev": 1.0,
    "server_optimizer": "adam",
    "server_lr": 0.05,
}


def _config(options=POISSON, **runtime):
    return small_config(
        experiment__algorithm={"name": "dp_fedavg_client", "options": options, "rounds": 4},
        experiment__privacy={"epsilon": 30.0, "delta": 1e-3, "noise_multiplier": 0.8},
        runtime=runtime or {},
    )


def test_a_client_level_run_states_its_unit_and_reports_the_ledger_epsilon(tmp_path):
    summary = run_experiment(build_experiment(_config()), tmp_path)
    assert summary["epsilon_unit"] == "client" and summary["privacy"]["epsilon_unit"] == "client"
    assert summary["privacy"]["unit"].startswith("client")
    assert "add or remove one client" in summary["privacy"]["adjacency"]
    assert summary["rounds_completed"] == 4
    assert summary["epsilon_max"] == pytest.approx(summary["epsilon_mean"], rel=1e-12)
    # The reported ε is exactly what the charged rounds compose to (nothing more, nothing less).
    ledger = ClientLevelLedger.from_dict(json.loads((tmp_path / "ledger.json").read_text()))
    assert ledger.rounds() == 4
    assert summary["epsilon_max"] == pytest.approx(
        client_level_epsilon(ledger.history(), 1e-3, "rdp")
    )
    log = [json.loads(line) for line in (tmp_path / "ledger_log.jsonl").read_text().splitlines()]
    assert [b["round"] for b in log] == [0, 1, 2, 3]  # one charge per round, every round
    assert all(b["charges"][0][0] == -1 for b in log)


def test_the_cli_prints_epsilon_at_the_client_level(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(_config()))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "at the client level" in out


def test_a_round_that_would_exceed_the_client_level_budget_is_not_run():
    config = small_config(
        experiment__algorithm={"name": "dp_fedavg_client", "options": POISSON, "rounds": 10},
        experiment__privacy={"epsilon": 3.0, "delta": 1e-3, "noise_multiplier": 1.5},
    )
    summary = run_experiment(build_experiment(config), None)
    one_round = ClientLevelCost(1.5, "poisson", 12, sampling_rate=0.4)
    assert summary["rounds_completed"] == client_level_max_rounds(3.0, 1e-3, one_round) == 6
    assert "client-level privacy budget exhausted" in summary["stop_reason"]
    assert summary["epsilon_max"] <= 3.0


def test_sigma_is_calibrated_to_spend_the_client_level_budget_in_all_rounds():
    config = small_config(
        experiment__algorithm={
            "name": "dp_fedavg_client",
            "options": FIXED_DISTRIBUTED,
            "rounds": 3,
        },
        experiment__privacy={"epsilon": 20.0, "delta": 1e-3, "noise_multiplier": None},
    )
    summary = run_experiment(build_experiment(config), None)
    assert summary["privacy"]["noise_calibrated"] is True
    assert summary["rounds_completed"] == 3
    assert 19.0 < summary["epsilon_max"] <= 20.0
    assert "replace one client" in summary["privacy"]["adjacency"]


@pytest.mark.ray
@pytest.mark.parametrize(
    "options",
    [POISSON, FIXED_DISTRIBUTED, ADAPTIVE_ADAM],
    ids=["poisson", "fixed", "adaptive-adam"],
)
def test_ray_gives_the_local_backends_model_bit_for_bit(options):
    ray = pytest.importorskip("ray")
    local = run_experiment(build_experiment(_config(options)), None)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        on_ray = run_experiment(
            build_experiment(_config(options, backend="ray", workers=2, progress=False)), None
        )
    finally:
        if started:
            ray.shutdown()
    assert on_ray["model_sha256"] == local["model_sha256"]
    assert on_ray["ledger_sha256"] == local["ledger_sha256"]
    assert on_ray["epsilon_max"] == local["epsilon_max"]


@pytest.mark.parametrize("options", [POISSON, ADAPTIVE_ADAM], ids=["poisson", "adaptive-adam"])
def test_an_interrupted_run_resumes_to_the_same_model_and_population_ledger(tmp_path, options):
    config = _config(options, backend="local", seed=0, progress=False, checkpoint_every=2)
    reference = run_experiment(build_experiment(config), None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exp = build_experiment(config)
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(config))
    server = make_server(exp, writer)
    server.checkpoint_start()
    with make_local_backend(exp) as backend:
        for r in range(3):  # checkpoint after round 2; round 3 charged, then the "crash"
            assert server.run_round(backend, r)
    resumed = run_experiment(build_experiment(config), run_dir, resume=True)
    assert resumed["resumed_from_round"] == 2
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]
    assert resumed["epsilon_max"] == reference["epsilon_max"]


# ---- bad input: one line naming the field, before any training ------------------------------
@pytest.mark.parametrize(
    "algorithm,privacy,field",
    [
        (
            {"options": {"update_clip_norm": 0.0}},
            {},
            "experiment.algorithm.options.update_clip_norm",
        ),
        (
            {"options": {"update_clip_norm": -1.0}},
            {},
            "experiment.algorithm.options.update_clip_norm",
        ),
        ({}, {"clip_norm": 0.0}, "experiment.privacy.clip_norm"),
        (
            {"options": {"client_sampling_rate": 0.0}},
            {},
            "experiment.algorithm.options.client_sampling_rate",
        ),
        (
            {"options": {"client_sampling_rate": 1.5}},
            {},
            "experiment.algorithm.options.client_sampling_rate",
        ),
        ({"options": {"noise": "distributed"}}, {}, "experiment.algorithm.options.noise"),
        (
            {"options": {"sampling": "fixed"}, "clients_per_round": 13},
            {},
            "experiment.algorithm.clients_per_round",
        ),
        (
            {"options": {"sampling": "fixed"}},
            {"accountant": "pld"},
            "experiment.privacy.accountant",
        ),
        ({}, {"delta": 0.1}, "experiment.privacy.delta"),
        (
            {"name": "dp_fedavg", "options": {"sampling": "poisson"}},
            {},
            "experiment.algorithm.options",
        ),
    ],
)
def test_bad_client_level_input_is_one_error_naming_the_field(algorithm, privacy, field):
    with pytest.raises(ConfigError) as err:
        build_experiment(
            small_config(
                experiment__algorithm={"name": "dp_fedavg_client", **algorithm},
                experiment__privacy={"delta": 1e-3, **privacy},
            )
        )
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_validate_refuses_client_level_options_in_one_line_before_loading_data(tmp_path, capsys):
    raw = dump_config(_config()).replace("client_sampling_rate: 0.4", "client_sampling_rate: 2")
    path = tmp_path / "bad.yaml"
    path.write_text(raw)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "experiment.algorithm.options.client_sampling_rate" in err[0]


def test_run_simulation_hands_back_the_population_ledger_also_for_an_algorithm_object():
    import raydpfl
    from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel

    result = raydpfl.run_simulation(_config())
    assert isinstance(result.ledger, ClientLevelLedger) and result.ledger.rounds() == 4
    assert result.epsilon == pytest.approx(result.ledger.epsilon())
    # A user's instance gets the same population ledger (its privacy_unit says client).
    mine = DPFedAvgClientLevel(
        num_clients=12,
        sampling="fixed",
        cohort_size=3,
        local_steps=2,
        lr=0.5,
        batch_size=16,
        clip_norm=1.0,
        noise_multiplier=2.0,
    )
    own = raydpfl.run_simulation(_config(), algorithm=mine)
    assert isinstance(own.ledger, ClientLevelLedger) and own.summary["epsilon_unit"] == "client"
    assert "replace one client" in own.summary["privacy"]["adjacency"]


def test_a_record_level_ledger_refuses_a_client_level_round_cost():
    import dataclasses

    from raydpfl.privacy.accounting.ledger import PrivacyLedger

    exp = build_experiment(_config())
    mixed = dataclasses.replace(exp, ledger=PrivacyLedger("rdp", 1e-3, 30.0))
    server = make_server(mixed, None)
    with make_local_backend(mixed) as backend, pytest.raises(ValueError, match="never mix"):
        server.run_round(backend, 0)


def test_secure_noise_mode_covers_the_client_level_aggregate_noise():
    config = small_config(
        experiment__algorithm={"name": "dp_fedavg_client", "options": POISSON, "rounds": 2},
        experiment__privacy={
            "epsilon": 30.0,
            "delta": 1e-3,
            "noise_multiplier": 0.8,
            "secure_noise": True,
        },
    )
    first = run_experiment(build_experiment(config), None)
    second = run_experiment(build_experiment(config), None)
    assert "client-level DP-FedAvg's aggregate noise" in first["privacy"]["noise_source"]
    assert first["model_sha256"] != second["model_sha256"]  # os.urandom: not reproducible
    assert first["ledger_sha256"] == second["ledger_sha256"]  # the same charges
