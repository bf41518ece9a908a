"""Restores that cannot lie: each way a resumed run could report a wrong model or an
under-counted ε is reproduced on a real run directory and must be refused with one line.

The run: ALI-DPFL on digits, 5 rounds, checkpoints every 2 rounds, finished and then
"interrupted" by removing its summary, so the checkpoint holds rounds 1-4 and round 5 is
replayed against the charges logged for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from raydpfl.cli.main import main
from raydpfl.config import config_from_dict
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.simulation.integrity import (
    GENESIS,
    ResumeError,
    charge_log_line,
    file_sha256,
    read_chained_log,
)
from raydpfl.simulation.outputs import CHARGE_LOG, RunWriter

RAW = {
    "experiment": {
        "name": "integrity",
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "hidden": 16},
        "algorithm": {
            "name": "ali_dpfl",
            "rounds": 5,
            "clients_per_round": 6,
            "lr": 0.5,
            "eval_every": 5,
            "ali_dpfl": {"mu_probe_size": 16},
        },
        "privacy": {
            "epsilon": 6.0,
            "delta": 1e-4,
            "noise_multiplier": 1.1,
            "sampling_rate": 0.1,
        },
    },
    "runtime": {"backend": "local", "seed": 3, "progress": False, "checkpoint_every": 2},
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run directory and its summary (copied per test by `interrupted`)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_dir.mkdir()
    summary = run_experiment(build_experiment(config_from_dict(RAW)), run_dir)
    return run_dir, summary


@pytest.fixture
def interrupted(finished, tmp_path):
    """A copy of the finished run without its summary: to a resume, cut after round 5."""
    import shutil

    src, summary = finished
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    (run_dir / "summary.json").unlink()
    return run_dir, summary


def _resume_cli(run_dir: Path, *extra: str) -> int:
    return main(["run", "--resume", str(run_dir), "--no-progress", *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raydpfl: error: "), err
    return err[0]


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "checkpoint" / "manifest.json").read_text())


def _state_path(run_dir: Path) -> Path:
    return run_dir / "checkpoint" / _manifest(run_dir)["state_file"]


def _rehash(run_dir: Path, rel: str) -> None:
    """Updates the manifest after an edit, as a careless tool would: only the ledger's
    own cross-check can then notice."""
    manifest = _manifest(run_dir)
    manifest["files"][rel] = file_sha256(run_dir / rel)
    (run_dir / "checkpoint" / "manifest.json").write_text(json.dumps(manifest))


# ---- 1. checkpoint files are hashed ----------------------------------------------------
def test_an_untouched_interrupted_run_resumes_to_the_same_model_and_ledger(interrupted):
    run_dir, reference = interrupted
    exp = build_experiment(config_from_dict(RAW))
    resumed = run_experiment(exp, run_dir, resume=True)
    assert resumed["resumed_from_round"] == 4
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]


def test_four_changed_bytes_in_the_parameters_refuse_the_resume(interrupted, capsys):
    run_dir, _ = interrupted
    params = next((run_dir / "checkpoint").glob("params-*.pt"))
    data = bytearray(params.read_bytes())
    data[-200:-196] = bytes(b ^ 0xFF for b in data[-200:-196])  # inside the tensor bytes
    params.write_bytes(bytes(data))
    assert _resume_cli(run_dir) == 2
    line = _one_line_error(capsys)
    assert params.name in line and "sha256" in line
    assert not (run_dir / "summary.json").exists()


def test_a_truncated_parameter_file_is_one_line_not_a_traceback(interrupted, capsys):
    run_dir, _ = interrupted
    params = next((run_dir / "checkpoint").glob("params-*.pt"))
    params.write_bytes(params.read_bytes()[:100])
    assert _resume_cli(run_dir) == 2
    assert params.name in _one_line_error(capsys)
    # Even with the manifest updated to match, the damaged file is refused in one line.
    _rehash(run_dir, f"checkpoint/{params.name}")
    assert _resume_cli(run_dir) == 2
    assert "cannot be read" in _one_line_error(capsys)


@pytest.mark.parametrize("name", ["config.yaml", "state"])
def test_an_edited_config_or_state_file_is_refused(interrupted, capsys, name):
    run_dir, _ = interrupted
    path = run_dir / "config.yaml" if name == "config.yaml" else _state_path(run_dir)
    path.write_text(path.read_text().replace("3", "4", 1))
    assert _resume_cli(run_dir) == 2
    assert path.name in _one_line_error(capsys)


def test_a_checkpoint_written_before_manifests_is_refused_plainly(interrupted, capsys):
    run_dir, _ = interrupted
    state = _state_path(run_dir)
    state.rename(state.with_name("state.json"))
    (run_dir / "checkpoint" / "manifest.json").unlink()
    assert _resume_cli(run_dir) == 2
    assert "older raydpfl, without checksums" in _one_line_error(capsys)


# ---- 2. the ledger is rebuilt from its log ------------------------------------------------
def test_cutting_a_clients_recorded_charges_in_the_checkpoint_is_refused(interrupted):
    run_dir, _ = interrupted
    state_path = _state_path(run_dir)
    state = json.loads(state_path.read_text())
    entries = state["ledger"]["clients"][0]["entries"]
    assert len(entries) == 4  # one charge per round
    del entries[1:]  # fewer charges: a smaller epsilon if it were believed
    state_path.write_text(json.dumps(state))
    _rehash(run_dir, f"checkpoint/{state_path.name}")
    with pytest.raises(ResumeError, match=r"disagrees with ledger_log.jsonl \(client 0: "):
        run_experiment(build_experiment(config_from_dict(RAW)), run_dir, resume=True)


@pytest.mark.parametrize(("column", "row"), [("epsilon_max", 0), ("epsilon_mean", 3)])
def test_an_edited_epsilon_in_the_checkpointed_rows_is_refused(interrupted, capsys, column, row):
    # Issue 35: the rows rounds.parquet is rebuilt from, edited and the manifest re-hashed;
    # the ledger is untouched, so only a check of the rows against the log can see it.
    run_dir, _ = interrupted
    state_path = _state_path(run_dir)
    state = json.loads(state_path.read_text())
    assert [r["round"] for r in state["rows"]] == [1, 2, 3, 4]
    state["rows"][row][column] = 0.01
    state_path.write_text(json.dumps(state))
    _rehash(run_dir, f"checkpoint/{state_path.name}")

    assert _resume_cli(run_dir) == 2
    line = _one_line_error(capsys)
    assert f"row of round {row + 1} reports {column}=0.01, but ledger_log.jsonl" in line
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize(
    "damage",
    ["emptied", "truncated", "edited", "reordered", "deleted"],
)
def test_a_damaged_charge_log_is_refused(interrupted, damage):
    run_dir, _ = interrupted
    log = run_dir / CHARGE_LOG
    lines = log.read_text().splitlines(keepends=True)
    assert len(lines) >= 5  # rounds 1-4 settled by the checkpoint, round 5 to replay
    if damage == "emptied":
        log.write_text("")
    elif damage == "truncated":
        log.write_text("".join(lines[:2]))
    elif damage == "edited":
        entry = json.loads(lines[1])
        entry["charges"][0][1]["noise_multiplier"] = 2.0  # more noise: less epsilon
        lines[1] = json.dumps(entry) + "\n"
        log.write_text("".join(lines))
    elif damage == "reordered":
        lines[0], lines[1] = lines[1], lines[0]
        log.write_text("".join(lines))
    else:
        log.unlink()
    with pytest.raises(ResumeError, match=r"ledger_log\.jsonl|hash chain|charge record"):
        run_experiment(build_experiment(config_from_dict(RAW)), run_dir, resume=True)


def test_a_log_line_cut_short_by_a_crash_is_dropped_and_the_run_resumes(interrupted):
    run_dir, reference = interrupted
    log = run_dir / CHARGE_LOG
    lines = log.read_text().splitlines(keepends=True)
    # The crash hit while writing round 5's line: half of it, no newline, never synced.
    log.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    resumed = run_experiment(build_experiment(config_from_dict(RAW)), run_dir, resume=True)
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]
    assert log.read_text() == "".join(lines)  # round 5 charged again, on a line of its own
    assert len(read_chained_log(log)[0]) == len(lines)


def test_the_log_is_a_hash_chain_over_its_lines(tmp_path):
    writer = RunWriter(tmp_path)
    cost = {"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 3}
    writer.log_charges(0, [(0, cost), (1, cost)])
    writer.log_charges(1, [(1, cost)])
    lines = (tmp_path / CHARGE_LOG).read_text().splitlines()
    first = charge_log_line(GENESIS, 0, [[0, cost], [1, cost]])
    assert lines[0] == first
    assert lines[1] == charge_log_line(json.loads(first)["chain"], 1, [[1, cost]])
    # A second writer (a resumed process) continues the same chain.
    RunWriter(tmp_path).log_charges(2, [(0, cost)])
    assert len(read_chained_log(tmp_path / CHARGE_LOG)[0]) == 3


def test_a_tampered_and_rechained_log_is_a_one_line_refusal_not_a_traceback(interrupted, capsys):
    # Issue 35: round 5's logged charges (after the checkpoint) are edited and every hash
    # after them recomputed, so the chain verifies; the replay then charges differently.
    run_dir, _ = interrupted
    log = run_dir / CHARGE_LOG
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries[-1]["round"] == 4  # round 5 replays against this line
    entries[-1]["charges"][0][1]["noise_multiplier"] = 2.0
    chain, lines = GENESIS, []
    for entry in entries:
        line = charge_log_line(chain, entry["round"], entry["charges"])
        chain = json.loads(line)["chain"]
        lines.append(line + "\n")
    log.write_text("".join(lines))
    read_chained_log(log)  # the chain holds

    assert _resume_cli(run_dir) == 2
    line = _one_line_error(capsys)
    assert "resume diverged from the interrupted run in round 5" in line
    assert not (run_dir / "summary.json").exists()


# ---- 3. no result-changing override on resume ---------------------------------------------
def test_resume_refuses_a_seed_override_and_takes_a_runtime_only_one(interrupted, capsys):
    run_dir, reference = interrupted
    assert _resume_cli(run_dir, "--set", "runtime.seed=4") == 2
    assert _one_line_error(capsys).startswith("raydpfl: error: runtime.seed: is 3 in the run")
    assert _resume_cli(run_dir, "--set", "runtime.aggregation_groups=3") == 2
    assert "runtime.aggregation_groups" in _one_line_error(capsys)
    safe = ["--set", "runtime.workers=3", "--set", "runtime.progress=false"]
    assert _resume_cli(run_dir, *safe) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model_sha256"] == reference["model_sha256"]


def test_run_config_with_resume_is_accepted_when_it_is_the_runs_config(interrupted, capsys):
    run_dir, reference = interrupted
    other = run_dir.parent / "other.yaml"
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["privacy"]["epsilon"] = 5.0
    other.write_text(yaml.safe_dump(raw))
    assert main(["run", str(other), "--resume", str(run_dir), "--no-progress"]) == 2
    assert "experiment.privacy.epsilon: is 6.0 in the run's config.yaml, 5.0 here" in (
        _one_line_error(capsys)
    )
    same = run_dir.parent / "same.yaml"
    same.write_text(yaml.safe_dump(RAW))
    assert main(["run", str(same), "--resume", str(run_dir), "--no-progress"]) == 0
    assert (
        json.loads((run_dir / "summary.json").read_text())["model_sha256"]
        == (reference["model_sha256"])
    )


# ---- 5. nothing is lost before the first periodic checkpoint -------------------------------
def test_a_run_killed_in_its_first_round_resumes_from_its_start_checkpoint(tmp_path):
    from raydpfl.config import dump_config
    from raydpfl.experiment.build import make_local_backend, make_server

    raw = json.loads(json.dumps(RAW))
    raw["runtime"]["checkpoint_every"] = 4
    config = config_from_dict(raw)
    reference = run_experiment(build_experiment(config), None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(config))
    exp = build_experiment(config)
    server = make_server(exp, writer)
    server.checkpoint_start()
    with make_local_backend(exp) as backend:
        assert server.run_round(backend, 0)  # then the process dies: no periodic checkpoint
    assert _manifest(run_dir)["rounds_completed"] == 0
    resumed = run_experiment(build_experiment(config), run_dir, resume=True)
    assert resumed["resumed_from_round"] == 0
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]


# ---- 4. heterogeneous budgets: a pair some client has -------------------------------------
def test_heterogeneous_budgets_report_the_max_epsilon_with_that_clients_delta(capsys):
    from raydpfl.cli.main import _print_summary
    from tests.papers.dpfl_bcs.dpfl_bcs_helpers import bcs_config

    raw = bcs_config(
        "dpfl_bcs", experiment__algorithm__dpfl_bcs={"delta_min": 1e-6, "delta_max": 1e-4}
    )
    raw["experiment"]["algorithm"]["rounds"] = 4
    exp = build_experiment(config_from_dict(raw))
    summary = run_experiment(exp, None)
    ledger = exp.ledger
    deltas = [ledger.delta_of(c) for c in range(exp.dataset.num_clients)]
    assert len(set(deltas)) > 1  # really heterogeneous
    eps = ledger.epsilons(range(exp.dataset.num_clients))
    top = int(eps.argmax())
    assert summary["epsilon_max_client"] == top
    assert summary["epsilon_max"] == pytest.approx(eps[top])
    assert summary["delta"] == deltas[top] != ledger.delta  # not the default delta
    assert summary["delta_max"] == max(deltas)
    assert summary["epsilon_unit"] == "record"
    _print_summary(summary)
    out = capsys.readouterr().out
    assert f"at delta {deltas[top]:g} (client {top};" in out
    assert "at the record level" in out


def test_a_non_private_runs_rows_must_report_an_infinite_epsilon():
    from raydpfl.simulation.integrity import check_row_epsilons

    inf = float("inf")
    check_row_epsilons(None, [], [{"round": 1, "epsilon_max": inf, "epsilon_mean": inf}], 3)
    with pytest.raises(ResumeError, match=r"round 1 reports epsilon_max=0\.5, but the run is not"):
        check_row_epsilons(None, [], [{"round": 1, "epsilon_max": 0.5, "epsilon_mean": inf}], 3)
