"""benchmarks/rc_loss_stage.py: the batched pass over M models computes the loss stage's
M separate passes (so its timing compares the same work)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from raydpfl.papers.rc_dpfl.models import RcCNN
from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # for its `_results` import
    return load_script("rc_loss_stage", ROOT / "benchmarks" / "rc_loss_stage.py")


def test_batched_pass_gives_every_models_logits():
    bench = _bench()
    model = RcCNN((1, 28, 28), 10).eval()
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        fresh = RcCNN((1, 28, 28), 10)
        models.append({k: v.detach().clone() for k, v in fresh.named_parameters()})
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        separate = bench.separate(model, models, x)
        batched = bench.batched(models, x)
    assert len(batched) == 3
    for a, b in zip(separate, batched, strict=True):
        assert a.shape == (5, 10)
        torch.testing.assert_close(b, a)
    # the models differ, so a mix-up between them would show
    assert not torch.allclose(separate[0], separate[1])


def test_the_benchmark_runs_and_reports(tmp_path, monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    bench.main(["--models", "2", "--records", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "2 models x 8 records, 1 thread" in out and "bit-identical:" in out
    assert len(list((tmp_path / "benchmarks" / "results").glob("rc_loss_stage-*.json"))) == 1
