"""The command line as a user meets it: exit codes, one-line errors, outputs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raydpfl.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
FAST = [
    "--set",
    "algorithm.rounds=2",
    "--set",
    "data.num_clients=8",
    "--set",
    "algorithm.clients_per_round=3",
]


@pytest.mark.slow  # quickstart's backend is Ray: ~30 s of Ray start-up on 2 cores
@pytest.mark.ray
def test_run_writes_a_run_directory_and_reports_spent_epsilon(tmp_path, capsys):
    out = tmp_path / "run"

    code = main(["run", str(QUICKSTART), *FAST, "--out", str(out), "--no-progress"])

    summary = json.loads((out / "summary.json").read_text())
    assert code == 0
    assert summary["rounds_completed"] == 2
    assert 0 < summary["epsilon_max"] <= 8.0
    assert f"epsilon_max {summary['epsilon_max']:.4f}" in capsys.readouterr().out
    assert "rounds: 2" in (out / "config.yaml").read_text()


def test_run_refuses_a_non_empty_output_directory_and_keeps_its_files(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("precious")

    code = main(["run", str(QUICKSTART), "--out", str(tmp_path), "--no-progress"])

    assert code == 2
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("privacy.epsilon=0", "experiment.privacy.epsilon: must be > 0"),
        ("privacy.delta=2", "experiment.privacy.delta: must be in (0, 1)"),
        ("data.nope=1", "experiment.data.nope: unknown key"),
        ("algorithm.clients_per_round=500", "experiment.algorithm.clients_per_round"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path, override, words):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydpfl",
            "run",
            str(QUICKSTART),
            "--set",
            override,
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_validate_prints_the_resolved_config(capsys):
    code = main(["validate", str(QUICKSTART), "--set", "privacy.epsilon=3"])

    assert code == 0
    assert "epsilon: 3.0" in capsys.readouterr().out


def test_missing_dataset_files_are_a_clear_error(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"experiment:\n  data:\n    dataset: mnist\n    root: {tmp_path}\n")

    code = main(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"])

    err = capsys.readouterr().err
    assert code == 2
    assert "mnist" in err and "raydpfl data download mnist" in err
    assert not (tmp_path / "r").exists()


def test_privacy_calculator_answers_the_usual_questions(capsys):
    assert main(["privacy", "epsilon", "--sigma", "1.5", "--q", "0.04", "--steps", "2250"]) == 0
    eps_line = capsys.readouterr().out
    assert main(["privacy", "noise", "--epsilon", "8", "--q", "0.04", "--steps", "2000"]) == 0
    noise_line = capsys.readouterr().out
    assert main(["privacy", "steps", "--epsilon", "2", "--sigma", "1.1", "--q", "0.015"]) == 0
    steps_line = capsys.readouterr().out

    assert eps_line.startswith("epsilon = 7.32911")  # opacus' published RDP vector
    sigma = float(noise_line.split()[2])
    assert 1.3562 <= sigma <= 1.3575
    assert int(steps_line.split()[2]) > 0


def test_privacy_calculator_rejects_bad_numbers_in_one_line():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydpfl",
            "privacy",
            "epsilon",
            "--sigma",
            "1",
            "--q",
            "2",
            "--steps",
            "10",
        ],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 2
    assert "--q" in result.stderr and "(0, 1]" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_data_download_without_network_fails_clearly(tmp_path, monkeypatch, capsys):
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)

    code = main(["data", "download", "mnist", "--root", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 2
    assert "network" in err.lower()
    assert err.strip().count("\n") == 0


def test_data_stats_prints_partition_statistics(capsys):
    assert main(["data", "stats", str(QUICKSTART)]) == 0

    out = capsys.readouterr().out
    assert "30 clients" in out


def test_privacy_steps_reproduces_ali_dpfls_iteration_budget(capsys):
    args = ["privacy", "steps", "--epsilon", "2", "--sigma", "1.1", "--q", "0.015"]

    assert main([*args, "--mode", "paper_compat"]) == 0
    paper = capsys.readouterr().out
    assert main(args) == 0
    exact = capsys.readouterr().out

    assert paper.startswith("steps = 317 ")  # the paper's R_c for epsilon = 2
    assert "paper_compat" in paper
    assert int(exact.split()[2]) > 0 and "accountant=rdp" in exact


def test_resume_continues_an_interrupted_run_from_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*FAST, "--set", "runtime.backend=local", "--set", "runtime.checkpoint_every=1"]
    assert main(["run", str(QUICKSTART), *args, "--out", str(out), "--no-progress"]) == 0
    finished = json.loads((out / "summary.json").read_text())
    # A finished run cannot be resumed; an interrupted one (no summary yet) can.
    assert main(["run", "--resume", str(out), "--no-progress"]) == 2
    assert "finished run" in capsys.readouterr().err
    (out / "summary.json").unlink()
    assert main(["run", "--resume", str(out), "--set", "privacy.epsilon=1"]) == 2
    assert "only runtime" in capsys.readouterr().err

    assert main(["run", "--resume", str(out), "--no-progress"]) == 0

    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["resumed_from_round"] == 2
    assert resumed["model_sha256"] == finished["model_sha256"]
    assert main(["run", "--resume", str(tmp_path), "--no-progress"]) == 2
    assert "not a run directory" in capsys.readouterr().err
