"""Issue 35, "Nothing silent": what used to end with exit 0 (or a traceback) although
nothing worthwhile happened is refused in one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import raydpfl
from raydpfl.cli.main import main
from raydpfl.config.schema import ConfigError
from tests.conftest import small_config


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raydpfl: error: "), err
    return err[0]


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


SMALL = {
    "experiment": {
        "data": {"dataset": "synthetic", "num_clients": 8},
        "model": {"name": "logreg"},
        "algorithm": {"rounds": 2, "clients_per_round": 3},
    },
    "runtime": {"backend": "local", "progress": False},
}


# ---- 2. an unaffordable budget -----------------------------------------------------------
def test_an_unaffordable_fixed_sigma_budget_is_refused_before_any_data(monkeypatch):
    from raydpfl.experiment import build

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded")

    monkeypatch.setattr(build, "load_federated", no_data)
    for accountant in ("rdp", "prv", "dp_rdp", "pld"):
        with pytest.raises(ConfigError, match=r"^experiment\.privacy\.epsilon: 0\.001 cannot "):
            raydpfl.run_simulation(
                small_config(experiment__privacy={"epsilon": 0.001, "accountant": accountant})
            )


def test_the_first_round_check_leaves_calibrated_sigma_and_own_algorithms_alone():
    # sigma null: calibrated to spend epsilon over all rounds, so any epsilon is payable.
    one_round = {"rounds": 1}
    with pytest.raises(ConfigError, match="cannot pay for one round"):  # sigma = 1 fixed
        raydpfl.run_simulation(small_config(experiment__privacy={"epsilon": 0.5}))
    cfg = small_config(
        experiment__privacy={"epsilon": 0.5, "noise_multiplier": None},
        experiment__algorithm=one_round,
    )
    assert raydpfl.run_simulation(cfg).summary["rounds_completed"] == 1
    # The user's algorithm object: the config's dp_fedavg is not what runs.
    from raydpfl.algorithms import DPFedAvg

    mine = DPFedAvg(
        clients_per_round=2, local_steps=1, lr=0.1, clip_norm=1.0, noise_multiplier=50.0,
        sampling_rate=0.01,
    )
    cfg = small_config(experiment__privacy={"epsilon": 0.5}, experiment__algorithm=one_round)
    assert raydpfl.run_simulation(cfg, algorithm=mine).summary["rounds_completed"] == 1


@pytest.mark.parametrize(
    ("algorithm", "words"),
    [
        ("dp_fedavg_client", "client-level privacy budget exhausted: round 1"),
        ("pe_dpfl", "privacy budget: 0 rounds"),
        ("adap_dp_fl", "privacy budget: the next round"),
    ],
)
def test_a_run_that_trains_no_round_exits_2_with_one_line(tmp_path, capsys, algorithm, words):
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["experiment"]["algorithm"]["name"] = algorithm
    raw["experiment"]["privacy"] = {"epsilon": 0.001}
    out = tmp_path / "run"

    code = main(["run", str(_write(tmp_path, raw)), "--out", str(out), "--no-progress"])

    assert code == 2
    line = _one_line(capsys)
    assert f"no round was trained ({words}" in line and str(out) in line


def test_every_clients_budget_spent_before_round_one_exits_2(tmp_path, capsys, monkeypatch):
    # The record-level path behind the pre-flight check (e.g. a budget the check cannot see):
    # the server refuses every task and stops at once.
    from raydpfl.experiment import build

    monkeypatch.setattr(build, "check_first_round_affordable", lambda config: None)
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["experiment"]["privacy"] = {"epsilon": 0.001}
    out = tmp_path / "run"

    code = main(["run", str(_write(tmp_path, raw)), "--out", str(out), "--no-progress"])

    assert code == 2
    assert "no round was trained (privacy budget exhausted for every client)" in _one_line(capsys)
