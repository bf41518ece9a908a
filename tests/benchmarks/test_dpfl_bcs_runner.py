"""benchmarks/repro/dpfl_bcs.py: the noise-free ablation removes every release's noise and
is recorded as NOT DP, in its own variant; a non-default calibration is a variant too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.script_module import load_script

REPRO = Path(__file__).resolve().parents[2] / "benchmarks" / "repro"


@pytest.fixture()
def bcs(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYDPFL_REPRO_RESULTS", str(tmp_path / "results.jsonl"))
    module = load_script("dpfl_bcs", REPRO / "dpfl_bcs.py")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "dpfl_bcs_repro.json")
    return module


def _release(scale: float = 2.0):
    from raydpfl.privacy.mechanisms.kernel import GaussianRelease

    mech = GaussianRelease(noise_multiplier=scale, sensitivity=1.0)
    return mech.live(torch.Generator().manual_seed(0), torch.device("cpu"))


def test_without_noise_zeroes_every_draw_and_restores_it(bcs):
    with bcs._without_noise(True) as zeroed:
        live = _release()
        assert torch.equal(live._noise(torch.Size([5])), torch.zeros(5))
        t = {"w": torch.ones(3)}
        out = live.perturb_update(t)["w"]  # clipped into the L2 ball of radius Δ/2, no noise
        torch.testing.assert_close(out, torch.full((3,), 0.5 / 3**0.5))
    assert zeroed == [2]
    live = _release()
    assert live._noise(torch.Size([1000])).std() > 1.0  # the real mechanism again
    with bcs._without_noise(False) as zeroed:
        assert _release()._noise(torch.Size([1000])).std() > 1.0
    assert zeroed == [0]


def test_variant_names_what_the_invocation_changes(bcs):
    ns = argparse.Namespace
    assert bcs.variant_of(ns(noise_free=False, calibration="zcdp", server_momentum=0.0)) == ""
    assert (
        bcs.variant_of(ns(noise_free=True, calibration="paper_alg2", server_momentum=0.9))
        == "noise-free, calibration=paper_alg2, server_momentum=0.9"
    )


def test_a_noise_free_run_is_recorded_not_dp_and_differs_from_the_dp_run(bcs, tmp_path):
    base = ["--dataset", "diabetes", "--runs", "bcs_gm", "--rounds", "4",
            "--stage1-rounds", "2", "--eval-every", "1", "--allow-dirty"]  # fmt: skip
    assert bcs.main(base) == 0
    assert bcs.main([*base, "--noise-free"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    dp, free = rows
    assert dp["dp"] is True and dp["variant"] == ""
    assert free["dp"] is False and free["variant"] == "noise-free"
    assert free["note"].startswith("NOT DP: every release's noise removed")
    # the noise is gone, not merely relabelled: far lower test MSE at the same plan
    assert free["ours"] < dp["ours"]
    dump = json.loads((tmp_path / "dpfl_bcs_repro.json").read_text())
    assert [d["noise_free"] for d in dump] == [False, True]
