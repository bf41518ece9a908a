"""benchmarks/repro/ali_dpfl.py: the clip-norm and noise-free options of issue 37 item 2."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raydpfl.privacy import kernel
from raydpfl.privacy.engines import make_engine
from raydpfl.privacy.kernel import SubsampledGaussian
from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ali():
    return load_script("ali_dpfl", ROOT / "benchmarks" / "repro" / "ali_dpfl.py")


def _kernel_step(sigma: float, seed: int = 3) -> dict[str, torch.Tensor]:
    """One DP-SGD step through the privacy kernel's live mechanism, from fixed params."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    live = kernel.LiveSubsampledGaussian(
        SubsampledGaussian(sigma, 0.1, 1.0), torch.Generator().manual_seed(seed), "cpu"
    )
    live.sample(8)
    live.step_(make_engine(model), params, x, y, lr=0.5, expected_batch_size=8.0)
    return params


def test_noise_free_removes_exactly_the_noise_and_restores_the_step(ali):
    noisy = _kernel_step(1.1)
    clipped_only = _kernel_step(0.0)
    with ali._without_noise(True):
        ablated = _kernel_step(1.1)
    for name in noisy:
        assert torch.equal(ablated[name], clipped_only[name])  # σ = 0, same clipping
        assert not torch.allclose(noisy[name], clipped_only[name])
    # the kernel's real step is back: the same seed gives the noisy step again
    restored = _kernel_step(1.1)
    assert all(torch.equal(restored[n], noisy[n]) for n in noisy)
    with ali._without_noise(False):  # inactive: nothing patched
        assert all(torch.equal(_kernel_step(1.1)[n], noisy[n]) for n in noisy)


def _record_of(ali, monkeypatch, **flags) -> dict:
    rows: list[dict] = []
    monkeypatch.setattr(ali._record, "record", lambda **row: rows.append(row))
    rec = {
        "cell": "II:2Rc",
        "method": "tau1",
        "seed": 0,
        "best_accuracy": 61.0,
        "final_accuracy": 60.0,
        "rounds": 79,
        "iterations": 79,
        "R_c": 79,
        "R_s": 158,
        "epsilon_ledger": 1.55,
        "eval_every": 10,
        "clip_norm": flags.get("clip_norm") or 0.1,
        "paper": 79.98,
        "wall_seconds": 1.0,
        "stop_reason": "rounds",
        "taus": [],
    }
    args = SimpleNamespace(normalizer="expected", mu_probe_size=None, mu_estimator="paper")
    args.__dict__.update({"clip_norm": None, "noise_free": False} | flags)
    ali.record_row(rec, args)
    return rows[0]


def test_record_marks_the_noise_free_ablation_not_dp(ali, monkeypatch):
    row = _record_of(ali, monkeypatch, noise_free=True)
    assert row["dp"] is False
    assert row["variant"] == "noise-free (sigma = 0)"
    assert row["note"].startswith("NOT DP")


def test_record_names_the_clip_norm_and_stays_dp(ali, monkeypatch):
    row = _record_of(ali, monkeypatch, clip_norm=1.0)
    assert row["dp"] is True and row["variant"] == "clip_norm = 1"
    assert row["extra"]["clip_norm"] == 1.0
    plain = _record_of(ali, monkeypatch)
    assert plain["dp"] is True and plain["variant"] == ""


def test_bad_options_are_refused_before_any_run(ali, capsys):
    with pytest.raises(SystemExit):
        ali.main(["--cells", "II:2Rc", "--methods", "tau1", "--clip-norm", "0", "--no-record"])
    assert "--clip-norm must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ali.main(["--cells", "II:2Rc", "--methods", "ali", "--noise-free", "--no-record"])
    assert "fixed-tau baselines only" in capsys.readouterr().err
