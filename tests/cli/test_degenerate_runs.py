"""Runs that used to end in a degenerate exit 0 now stop in one line (issue 53, item 8):
exploded weights (`lr: 1e30` gave weights of 1e29 and a test loss of 2e29, silently),
and a calibrated σ below the 0.01 floor that a configured σ must respect."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from raydpfl.cli.main import main
from raydpfl.simulation.finite import MAX_WEIGHT, NonFiniteModelError, check_finite_model
from tests.cli.test_resume_outputs import RAW


def _run(tmp_path, capsys, edit) -> tuple[int, list[str]]:
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["algorithm"]["rounds"] = 3
    edit(raw)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    code = main(["run", str(config), "--out", str(tmp_path / "run"), "--no-progress"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_an_exploding_lr_stops_the_run_in_one_line(tmp_path, capsys):
    # One local step: the weights reach 1e29 without overflowing (more overflow to NaN,
    # which stopped the run before).
    code, err = _run(
        tmp_path, capsys, lambda raw: raw["experiment"]["algorithm"].update(lr=1e30, local_steps=1)
    )
    assert code == 2 and len(err) == 1, err
    assert "round 1: the global model diverged:" in err[0]
    assert "past 1e+15" in err[0]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_divergence_bound_is_on_the_largest_weight():
    params = {"w": torch.full((3,), 1.0), "b": torch.zeros(2)}
    check_finite_model(params, 0, [1])
    params["w"][1] = MAX_WEIGHT  # at the bound: kept
    check_finite_model(params, 0, [1])
    params["w"][1] = -2 * MAX_WEIGHT
    with pytest.raises(NonFiniteModelError, match=r"^round 4: .*diverged: w holds .*-?2e\+15"):
        check_finite_model(params, 3, [1, 2])
    params["b"][0] = float("nan")
    with pytest.raises(NonFiniteModelError, match=r"NaN or inf \(b\)"):
        check_finite_model(params, 3, [1, 2])


def test_a_calibrated_sigma_below_the_floor_is_refused(tmp_path, capsys):
    def edit(raw):
        raw["experiment"]["algorithm"].update(rounds=1, local_steps=1)
        raw["experiment"]["privacy"] = {
            "epsilon": 1e4,
            "delta": 1e-4,
            "noise_multiplier": None,
            "sampling_rate": 1.0,
        }

    code, err = _run(tmp_path, capsys, edit)
    assert code == 2 and len(err) == 1, err
    assert "experiment.privacy.noise_multiplier: calibrated to 0.0078" in err[0]
    assert "below the floor 0.01" in err[0]
