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


class _Step:
    """DPFL-BCS's client step on a 4 -> 3 linear model and six records, under a Laplace
    release declared for them (the platform's full-batch release clips and noises)."""

    def __init__(self, clip: float, x: torch.Tensor, y: torch.Tensor):
        from raydpfl.papers.dpfl_bcs.client import BcsClientStep

        self.step = type("Step", (BcsClientStep,), {})()
        self.step.clip, self.step.mechanism, self.step.private = clip, "laplace", True
        self.step.regression, self.step.loss_bound = False, 1.0
        self.model = torch.nn.Linear(4, 3)
        self.params = {n: p.detach() for n, p in self.model.named_parameters()}
        self.x, self.y, self.clip = x, y, clip

    def clipped_mean(self, bcs):
        """The released step at lr 1 with its noise removed (`--noise-free`'s patch)."""
        from raydpfl.algorithms.base import ClientData, ClientTask, direct_context
        from raydpfl.privacy.mechanisms.kernel import LaplaceRelease, uses

        n = self.x.shape[0]
        release = LaplaceRelease(1.0, 2 * self.clip / n)  # Δ₁ = 2B/n at lr 1
        task = ClientTask(0, 0, 1, 1.0, mechanisms=(uses(release, 1),), extras={"stage1": 0.0})
        data = ClientData(0, self.x, self.y, torch.arange(n))
        ctx = direct_context(self.model, data, task, torch.Generator().manual_seed(0))
        with bcs._without_noise(True):
            step, _ = self.step._noisy_step(ctx, dict(self.params), {}, task, data)
        return step

    def by_hand(self, order: int):
        """The mean of the per-sample gradients, each clipped to `clip` in L`order`."""
        x, y = self.x, self.y
        total = {n: torch.zeros_like(p) for n, p in self.params.items()}
        for i in range(x.shape[0]):
            model = torch.nn.Linear(4, 3)
            model.load_state_dict(self.model.state_dict())
            loss = torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
            grads = torch.autograd.grad(loss, list(model.parameters()))
            grads = dict(zip(self.params, grads, strict=True))
            flat = torch.cat([g.reshape(-1) for g in grads.values()])
            factor = min(1.0, self.clip / float(flat.norm(p=order)))
            for n, g in grads.items():
                total[n] += factor * g
        return {n: t / x.shape[0] for n, t in total.items()}


def test_laplace_clip_l2_clips_the_laplace_step_in_l2_and_restores_it(bcs):
    torch.manual_seed(0)
    x, y = torch.randn(6, 4) * 5, torch.tensor([0, 1, 2, 0, 1, 2])
    s = _Step(0.3, x, y)  # binds in both norms: every per-sample gradient is longer
    l1, l2 = s.by_hand(1), s.by_hand(2)
    assert not torch.allclose(l1["weight"], l2["weight"])  # the two clips differ here
    for name, t in s.clipped_mean(bcs).items():  # the spec's: L1 under Laplace
        torch.testing.assert_close(t, l1[name])
    with bcs._laplace_clip("l2") as clipped:
        for name, t in s.clipped_mean(bcs).items():
            torch.testing.assert_close(t, l2[name])
        assert s.step.mechanism == "laplace"  # the release is still the Laplace one
    assert clipped == [1]
    for name, t in s.clipped_mean(bcs).items():  # restored
        torch.testing.assert_close(t, l1[name])
    with bcs._laplace_clip("l1") as clipped:
        torch.testing.assert_close(s.clipped_mean(bcs)["weight"], l1["weight"])
    assert clipped == [0]


def test_a_laplace_l2_clip_run_is_recorded_not_dp_in_its_own_variant(bcs, tmp_path):
    base = ["--dataset", "diabetes", "--runs", "bcs_lm", "--rounds", "4",
            "--stage1-rounds", "2", "--eval-every", "1", "--allow-dirty"]  # fmt: skip
    assert bcs.main([*base, "--laplace-clip", "l2"]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["dp"] is False and row["variant"] == bcs.LAPLACE_L2_VARIANT
    assert row["note"].startswith("NOT DP: per-sample gradients clipped in L2 to B")
    assert "sqrt(d) = 3" in row["note"]  # bcs_linreg: d = 11


def test_laplace_clip_l2_refuses_gaussian_runs_before_any_work(bcs, capsys):
    with pytest.raises(SystemExit) as exit_:
        bcs.main(["--runs", "bcs_gm", "--laplace-clip", "l2", "--no-record"])
    assert exit_.value.code == 2
    assert "apply to Laplace runs only" in capsys.readouterr().err


def test_laplace_scale_scales_laplace_draws_only_and_restores_them(bcs):
    from raydpfl.privacy.mechanisms.kernel import LaplaceRelease

    def laplace():
        return LaplaceRelease(2.0, 1.0).live(torch.Generator().manual_seed(0), "cpu")

    def zeros():  # output perturbation of zeros (clipped to nothing): the noise alone
        return {"z": torch.zeros(1000)}

    plain = laplace().perturb_update(zeros())["z"]
    gauss = _release().perturb_update(zeros())["z"]
    with bcs._laplace_scaled(0.5) as scaled:
        torch.testing.assert_close(laplace().perturb_update(zeros())["z"], 0.5 * plain)
        torch.testing.assert_close(_release().perturb_update(zeros())["z"], gauss)
    assert scaled == [1]
    torch.testing.assert_close(laplace().perturb_update(zeros())["z"], plain)


def test_a_scaled_laplace_run_is_recorded_not_dp(bcs, tmp_path):
    base = ["--dataset", "diabetes", "--runs", "bcs_lm", "--rounds", "4",
            "--stage1-rounds", "2", "--eval-every", "1", "--allow-dirty"]  # fmt: skip
    assert bcs.main([*base, "--laplace-scale", "0.5"]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["dp"] is False and row["variant"] == "laplace scale x0.5"
    assert "delivered epsilon is 2 times it" in row["note"]
