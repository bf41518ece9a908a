"""benchmarks/repro/ali_dpfl.py: the clip-norm and noise-free options of issue 37 item 2."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raydpfl.privacy.mechanisms import kernel
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian
from raydpfl.privacy.per_sample.engines import make_engine
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
    session = kernel.PrivacySession(
        (kernel.uses(SubsampledGaussian(sigma, 0.1, 1.0), 1),), torch.Generator().manual_seed(seed)
    )._bind(kernel.ClientRecords(x, y, torch.arange(8)), model, make_engine(model))
    live = session.dp_sgd()
    live.step_(params, live.sample(), lr=0.5, divisor=8.0)
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


def _dp_accounting_epsilon(steps: int) -> float:
    """ε of `steps` Poisson-subsampled Gaussian steps (q = 0.015, σ = 1.1, δ = 1e-5) by
    Google's dp-accounting RDP accountant: an independent check of the R_c we run."""
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(0.015, dp_accounting.GaussianDpEvent(1.1))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(1e-5)


def _fashion_mnist_found() -> bool:
    from raydpfl.data.datasets import DatasetNotFoundError, find_dataset_files

    try:
        find_dataset_files("fashion_mnist")
    except DatasetNotFoundError:
        return False
    return True


# run_cell builds the cell's experiment, which reads Fashion-MNIST (README-literal installs
# have no copy: `raydpfl data download fashion_mnist` or Debian's dataset-fashion-mnist)
@pytest.mark.skipif(not _fashion_mnist_found(), reason="Fashion-MNIST files not found")
def test_rc_by_a_tight_accountant_runs_the_iterations_that_fit_epsilon(ali, monkeypatch):
    # spec §6.5: at ε = 1.55 the paper's classic conversion allows 79 iterations, the
    # improved RDP conversion (the authors' code's) 281: the run's plan and ledger use it
    cell = next(c for c in ali.CELLS if c.key == "II:2Rc")
    assert cell.budgets() == (79, 158) and cell.budgets("rdp") == (281, 562)
    assert _dp_accounting_epsilon(281) <= 1.55 < _dp_accounting_epsilon(320)
    import raydpfl.experiment.build as build

    seen = {}

    def no_training(exp, *_, **__):
        seen["exp"] = exp
        summary = dict(best_test_accuracy=0.5, final_test_accuracy=0.5, epsilon_max=0.0)
        return summary | {"rounds_completed": 0, "stop_reason": "test"}

    monkeypatch.setattr(build, "run_experiment", no_training)
    rec = ali.run_cell(cell, "tau1", 0, 10, None, rc_accountant="rdp")
    plan = seen["exp"].metadata["privacy"]
    assert plan["iteration_budget_R_c"] == 281 and plan["rounds_budget_R_s"] == 562
    assert plan["rc_mode"] == "exact" and plan["ledger_epsilon_at_R_c"] <= 1.55
    assert seen["exp"].config.experiment.privacy.accountant == "rdp"
    assert (rec["R_c"], rec["R_s"], rec["rc_accountant"]) == (281, 562, "rdp")
    row = _record_of(ali, monkeypatch, rc_accountant="rdp")
    assert row["dp"] is True and row["variant"] == "R_c by rdp (79)"  # _record_of's R_c


def test_rc_accountant_is_refused_for_pe(ali, capsys):
    with pytest.raises(SystemExit):
        ali.main(["--cells", "II:2Rc", "--methods", "pe", "--rc-accountant", "rdp", "--no-record"])
    assert "does not apply to pe" in capsys.readouterr().err
