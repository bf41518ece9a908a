"""Issue 35, "Nothing silent": what used to end with exit 0 (or a traceback) although
nothing worthwhile happened is refused in one line, exit 2."""

from __future__ import annotations

import re
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
        clients_per_round=2,
        local_steps=1,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=50.0,
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


# ---- 3. tracker files that would be deleted silently -----------------------------------
def test_tensorboard_without_a_run_dir_is_refused_naming_the_option(monkeypatch):
    from raydpfl.callbacks import TensorBoardCallback
    from raydpfl.experiment import build

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded")

    monkeypatch.setattr(build, "load_federated", no_data)
    cfg = small_config(experiment__algorithm={"rounds": 1})
    with pytest.raises(ConfigError, match=r"^runtime\.callbacks: tensorboard writes its "):
        raydpfl.run_simulation(cfg, overrides=["runtime.callbacks=tensorboard"])
    with pytest.raises(ConfigError, match=r"^callbacks: TensorBoardCallback\(\) without log_dir"):
        raydpfl.run_simulation(cfg, callbacks=[TensorBoardCallback()])


def test_tensorboard_files_stay_where_the_user_said(tmp_path):
    from raydpfl.callbacks import Callback, TensorBoardCallback

    seen = []

    class Where(Callback):
        def on_run_start(self, info):
            seen.append(info.run_dir)

    cfg = small_config(experiment__algorithm={"rounds": 1})
    raydpfl.run_simulation(cfg, callbacks=[TensorBoardCallback(log_dir=tmp_path / "tb"), Where()])
    assert any((tmp_path / "tb").iterdir())  # kept after the call returned
    assert seen == [None]  # a temporary run directory is no place for a tracker's files
    raydpfl.run_simulation(
        cfg, overrides=["runtime.callbacks=tensorboard"], run_dir=tmp_path / "r"
    )
    assert any((tmp_path / "r" / "tensorboard").iterdir())


def test_an_audit_without_run_dir_refuses_tensorboard():
    from raydpfl.audit import audit

    with pytest.raises(ConfigError, match=r"^runtime\.callbacks: tensorboard"):
        audit(small_config(runtime={"callbacks": "tensorboard"}), canaries=10)


# ---- 5. a non-finite model; inputs the arithmetic cannot take ----------------------------
def test_a_model_that_turns_non_finite_stops_the_run_with_one_line(tmp_path, capsys):
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    # The noise std overflows float32 (a config value may be at most float32's 3.4e38).
    raw["experiment"]["privacy"] = {"clip_norm": 3e38}
    out = tmp_path / "run"

    code = main(["run", str(_write(tmp_path, raw)), "--out", str(out), "--no-progress"])

    assert code == 2
    line = _one_line(capsys)
    assert "round 1: the global model holds NaN or inf" in line and "client(s) " in line
    assert not (out / "model.pt").exists() and not (out / "summary.json").exists()


def test_the_api_raises_on_a_non_finite_model_and_names_the_round_and_clients():
    from raydpfl.simulation.finite import NonFiniteModelError

    cfg = small_config(experiment__algorithm={"lr": 1e38, "rounds": 3})  # no DP overflow
    with pytest.raises(NonFiniteModelError, match=r"^round \d+: .* client\(s\) \d"):
        raydpfl.run_simulation(cfg, overrides=["experiment.algorithm.name=fedavg"])


def test_check_finite_model_names_the_tensor_and_lists_few_clients():
    import torch

    from raydpfl.simulation.finite import NonFiniteModelError, check_finite_model

    good = {"w": torch.ones(3), "steps": torch.tensor([2**62])}  # integers are not checked
    check_finite_model(good, 0, [1, 2])
    bad = {"a": torch.ones(2), "b": torch.tensor([1.0, float("nan")])}
    with pytest.raises(NonFiniteModelError, match=r"^round 4: .*\(b\) .* 0, 1, .*, 9, \.\.\. "):
        check_finite_model(bad, 3, range(30))


@pytest.mark.parametrize("accountant", ["rdp", "prv", "dp_rdp", "pld"])
def test_the_calculator_refuses_a_vanishing_sigma_in_one_line(accountant, capsys):
    for question in (["epsilon", "--steps", "3"], ["steps", "--epsilon", "1"]):
        argv = ["privacy", *question, "--sigma", "1e-300", "--q", "0.1"]
        with pytest.raises(SystemExit) as info:
            main([*argv, "--accountant", accountant])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--sigma/--noise-multiplier: must be in [0.01, 1e+06]" in err[0]


def test_the_client_level_calculator_refuses_a_delta_runs_refuse(capsys):
    common = ["--population", "100", "--q", "0.1"]
    for question in (
        ["client-epsilon", "--sigma", "1", "--rounds", "3"],
        ["client-noise", "--epsilon", "2", "--rounds", "3"],
        ["client-rounds", "--epsilon", "2", "--sigma", "1"],
    ):
        assert main(["privacy", *question, *common, "--delta", "0.01"]) == 2
        assert "--delta: must be < 1/N = 0.01 at the client level" in _one_line(capsys)
    assert main(["privacy", "client-epsilon", "--sigma", "1", "--rounds", "3", *common]) == 0


def test_the_bounds_in_the_messages_are_the_constants():
    from raydpfl.config.schema import (
        MAX_NOISE_MULTIPLIER,
        MIN_NOISE_MULTIPLIER,
        MIN_SAMPLING_RATE,
        PrivacyConfig,
    )

    PrivacyConfig(noise_multiplier=MIN_NOISE_MULTIPLIER, sampling_rate=MIN_SAMPLING_RATE)
    PrivacyConfig(noise_multiplier=MAX_NOISE_MULTIPLIER)
    bounds = re.escape(f"in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}] or null")
    with pytest.raises(ConfigError, match=bounds):
        PrivacyConfig(noise_multiplier=MIN_NOISE_MULTIPLIER * 0.99)
    with pytest.raises(ConfigError, match=bounds):
        PrivacyConfig(noise_multiplier=MAX_NOISE_MULTIPLIER * 1.01)
    with pytest.raises(ConfigError, match=rf"in \[{MIN_SAMPLING_RATE:g}, 1\]"):
        PrivacyConfig(sampling_rate=MIN_SAMPLING_RATE * 0.99)


# ---- 6. one short line for a lost worker ---------------------------------------------------
# What Ray's error for a worker on a killed raylet looks like inside WorkerLostError: the
# whole remote traceback, coloured.
RAY_TEXT = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: ClientWorker\n\tactor_id: 4f1c...\n\x1b[36m(ClientWorker pid=123)\x1b[0m "
    + "Traceback (most recent call last):\n"
    + "".join(f'  File "/ray/_private/worker.py", line {i}, in get\n' for i in range(60))
)


def test_a_lost_worker_is_one_short_line_with_the_details_in_the_run_log(
    tmp_path, capsys, monkeypatch
):
    from raydpfl.experiment import build
    from raydpfl.simulation.backend import WorkerLostError

    def lost(exp, run_dir, **kwargs):
        (run_dir / "config.yaml").write_text("x")
        raise WorkerLostError(
            "a client worker died during a round and could not be restarted "
            f"(runtime.max_restarts=3): {RAY_TEXT}"
        )

    monkeypatch.setattr(build, "run_experiment", lost)
    out = tmp_path / "run"

    code = main(["run", str(_write(tmp_path, SMALL)), "--out", str(out), "--no-progress"])

    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("raydpfl: run failed: a client worker died during a round")
    assert len(err[0]) < 400 and "\x1b" not in err[0] and "Traceback" not in err[0]
    assert err[0].endswith(f"(details in {out / 'error.log'})")
    assert len(err) == 2 and "finished rounds are kept in" in err[1]
    details = (out / "error.log").read_text()
    assert 'File "/ray/_private/worker.py", line 59' in details and "\x1b" not in details


def test_an_error_from_inside_a_ray_actor_prints_its_own_message():
    from raydpfl.cli.main import _one_line
    from raydpfl.simulation.integrity import ResumeError

    class RayTaskError(Exception):  # Ray's wrapper: its text is the remote traceback
        pass

    class Wrapped(RayTaskError, ResumeError):
        def __init__(self, cause):
            super().__init__("\x1b[36mray::ServerHost.run_round()\x1b[39m Traceback ...\n" * 30)
            self.cause = cause

    assert _one_line(Wrapped(ResumeError("resume diverged in round 3"))) == (
        "resume diverged in round 3"
    )


# ---- 4. validate opens the data as run does ------------------------------------------------
def _leaf(x: list, y: list) -> str:
    import json

    return json.dumps(
        {"users": ["u"], "num_samples": [len(y)], "user_data": {"u": {"x": x, "y": y}}}
    )


def _femnist_root(tmp_path: Path, train: str) -> Path:
    root = tmp_path / "leaf"
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
    good = [[0.5] * 784] * 4
    (root / "test" / "t.json").write_text(_leaf(good, [1, 2, 3, 4]))
    (root / "train" / "t.json").write_text(train)
    return root


def _bad_data(case: str, tmp_path: Path) -> dict:
    data: dict = {"num_clients": 1, "partition": {"kind": "iid"}}
    if case == "femnist root missing":
        return {**data, "dataset": "femnist", "root": str(tmp_path / "nowhere")}
    if case == "hf client_column missing":
        datasets = pytest.importorskip("datasets")
        split = {"features": [[0.1, 0.2]] * 6, "label": [0, 1] * 3, "user": ["a"] * 6}
        datasets.DatasetDict(
            {"train": datasets.Dataset.from_dict(split), "test": datasets.Dataset.from_dict(split)}
        ).save_to_disk(str(tmp_path / "hf"))
        options = {"path": "hf", "feature_column": "features", "client_column": "writer"}
        return {
            "dataset": "hf_dataset",
            "root": str(tmp_path),
            "num_clients": 1,
            "partition": {"kind": "natural"},
            "options": options,
        }
    train = {
        "LEAF JSON without user_data": '{"users": ["u"], "num_samples": [1]}',
        "image row of 783 floats": _leaf([[0.5] * 783], [1]),
        "label 99": _leaf([[0.5] * 784], [99]),
    }[case]
    return {**data, "dataset": "femnist", "root": str(_femnist_root(tmp_path, train))}


@pytest.mark.parametrize(
    "case",
    [
        "femnist root missing",
        "LEAF JSON without user_data",
        "image row of 783 floats",
        "label 99",
        "hf client_column missing",
    ],
)
def test_validate_refuses_the_data_that_data_stats_and_run_refuse(case, tmp_path, capsys):
    raw = {
        "experiment": {
            "data": _bad_data(case, tmp_path),
            "model": {"name": "logreg"},
            "algorithm": {"clients_per_round": 1},
        },
        "runtime": {"backend": "local", "progress": False},
    }
    config = str(_write(tmp_path, raw))
    capsys.readouterr()  # the fixtures' own output (datasets' progress bars)

    assert main(["data", "stats", config]) == 2
    stats_line = _one_line(capsys)
    assert main(["validate", config]) == 2
    assert _one_line(capsys) == stats_line
    assert main(["run", config, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert _one_line(capsys) == stats_line

    # --no-data: for a config meant for another machine; it says what it did not check.
    assert main(["validate", config, "--no-data"]) == 0
    ok = capsys.readouterr().err.strip().splitlines()[-1]
    assert ok.startswith("# ok: ") and "not checked: the dataset's files and contents" in ok
    assert "present" not in ok


def test_validate_says_what_it_checked(capsys):
    assert main(["validate", str(_ROOT / "configs" / "quickstart.yaml")]) == 0
    ok = capsys.readouterr().err.strip().splitlines()[-1]
    assert "its data was opened and partitioned as run does: 30 clients" in ok


_ROOT = Path(__file__).resolve().parents[2]
