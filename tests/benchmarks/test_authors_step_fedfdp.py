"""benchmarks/repro/authors_step_fedfdp.py: the FedFDP authors' DP pipeline re-implemented."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.benchmarks.script_module import load_script

REPRO = Path(__file__).resolve().parents[2] / "benchmarks" / "repro"
FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def m():
    torch.set_num_threads(1)
    load_script("authors_step", REPRO / "authors_step.py")
    return load_script("authors_step_fedfdp", REPRO / "authors_step_fedfdp.py")


def _batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def _params(m, seed: int = 0):
    torch.manual_seed(seed)
    model = m.pfllib.FedAvgCNN()
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}


def _clients(m, sizes):
    out = []
    for i, n in enumerate(sizes):
        x, y = _batch(n, seed=10 + i)
        xt, yt = _batch(20, seed=100 + i)
        out.append(m.pfllib.ClientData(x, y, xt, yt))
    return out


def _client(m, data, params, **kw):
    """An AuthorsClient at the paper's settings (C = 0.1, σ_l = 5, divisor 64, plain
    DP-FedAvg, noise-free, accumulator zeroed) with `kw` changed."""
    args = dict(
        fairness=False, lam=0.0, clip=0.1, sigma=0.0, loss_sigma=5.0, divisor=64.0,
        accumulator="zero",
    )  # fmt: skip
    return m.AuthorsClient(data, params, **{**args, **kw})


def _train(m, client, model, params, seed, global_loss=0.0):
    """One round of `client` from `params` with its streams seeded `seed` (torch) and 0."""
    gen = torch.Generator().manual_seed(seed)
    return client.train(model, params, global_loss, 1.0, gen, np.random.RandomState(0))


def test_rounds_are_the_codes_bisection_spec_6_3(m):
    # spec §6.3 recomputed the code's T (gradient mechanism only, its orders, Balle
    # conversion, its bisection that may overshoot by ≤ 0.01): an exact match to 001 Fig. 4
    for eps, sigma, t in ((1, 2, 65), (2, 2, 268), (3, 2, 582), (4, 1.65, 607), (3.52, 2, 778)):
        assert m.code_rounds(eps, sigma) == t
        assert m.code_epsilon(0.05, sigma, t) <= eps + 0.01
        assert m.code_epsilon(0.05, sigma, t + 2) > eps  # the last rounds it can afford
    with pytest.raises(ValueError, match="budget is too high"):
        m.code_rounds(1e6, 2.0)


def test_code_epsilon_is_the_balle_conversion_of_the_sampled_gaussians_rdp(m):
    # independently: dp-accounting's RDP of the same Poisson-subsampled Gaussian at the same
    # integer orders, then the conversion written out by hand
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    q, sigma, steps, delta = 0.05, 2.0, 268, 1e-5
    acc = rdp.RdpAccountant(list(m.ORDERS))
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    eps = [
        r - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
        for a, r in zip(m.ORDERS, acc._rdp, strict=True)
    ]
    assert m.code_epsilon(q, sigma, steps, delta) == pytest.approx(min(eps), rel=1e-6)


@pytest.mark.parametrize("fairness", [True, False])
def test_clipped_sum_is_the_per_sample_loop_batched(m, fairness):
    # book-keeping norms and one weighted backward against the materialised per-sample
    # gradients (the authors' loop, batched by vmap)
    model, params = _params(m)
    x, y = _batch(48, seed=3)
    losses, grads, norms = m.per_sample_losses_and_grads(model, params, x, y)

    def coef(ls, ns):
        return m.fair_coefficients(ls, ns, clip=0.1, lam=0.5, global_loss=2.0, fairness=fairness)

    summed, losses2, norms2 = m.clipped_sum(params, x, y, coef)
    torch.testing.assert_close(norms2, norms, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses2, losses)
    c = coef(losses, norms)
    for k, g in grads.items():
        torch.testing.assert_close(
            summed[k], torch.einsum("b,b...->...", c, g), atol=1e-6, rtol=1e-4
        )


def test_fair_coefficients_are_the_codes_formula_and_bound_each_contribution(m):
    norms = torch.tensor([0.05, 0.5, 5.0, 5.0])
    losses = torch.tensor([2.0, 2.0, 0.0, 10.0])
    plain = m.fair_coefficients(losses, norms, clip=0.1, lam=0.0, global_loss=1.0, fairness=False)
    torch.testing.assert_close(plain, torch.clamp(0.1 / (norms + 1e-6), max=1.0))
    c = m.fair_coefficients(losses, norms, clip=0.1, lam=1.5, global_loss=1.0, fairness=True)
    s = 1 + 1.5 * (losses - 1.0)  # 2.5, 2.5, -0.5, 14.5
    torch.testing.assert_close(c, s * torch.clamp(0.1 / (s * norms + 1e-6), max=1.0))
    assert (c * norms <= 0.1 + 1e-6).all()  # every contribution's norm stays ≤ C
    # s < 0: the code's min() picks the negative ratio, so the step is a full-norm descent
    assert c[2] > 0 and c[2] * norms[2] == pytest.approx(0.1, rel=1e-4)


def test_the_accumulator_is_never_zeroed_unless_asked(m):
    # σ = 0, λ off: with "keep" the second step applies both batches' clipped sums, with
    # "zero" only the second's; the difference is the first sum · lr/64
    model, params = _params(m)
    (data,) = _clients(m, [400])
    steps = {}
    for acc in ("keep", "zero"):
        client = _client(m, data, params, accumulator=acc)
        gen = torch.Generator().manual_seed(1)
        rs = np.random.RandomState(1)
        first, _, _ = client.train(model, params, 0.0, 1.0, gen, rs)
        first_sum = {k: v.clone() for k, v in client.accum.items()}
        second, _, _ = client.train(model, params, 0.0, 1.0, gen, rs)
        steps[acc] = (first, second, first_sum, client)
    k_first, k_second, first_sum, keep = steps["keep"]
    z_first, z_second, _, _ = steps["zero"]
    for k in params:
        torch.testing.assert_close(k_first[k], z_first[k])  # same first step
        torch.testing.assert_close(k_second[k], z_second[k] - first_sum[k] / 64, atol=1e-7, rtol=0)
    assert keep.stats["steps"] == 2 and keep.stats["samples"] > 0
    with pytest.raises(ValueError, match="accumulator must be one of"):
        _client(m, data, params, accumulator="reset")


def test_the_gradient_noise_has_std_c_sigma_over_64(m):
    # a client too small to draw a batch never steps; one that does: noise C·σ·N(0, 1) on
    # the sum, times lr/64
    model, params = _params(m)
    (tiny,) = _clients(m, [15])  # ⌊15·0.05⌋ = 0: every draw is empty
    c = _client(m, tiny, params, fairness=True, lam=0.1, sigma=2.0, accumulator="keep")
    out, upload, _ = _train(m, c, model, params, 0)
    assert all(torch.equal(out[k], params[k]) for k in params)  # no step, no noise
    assert c.stats["empty"] == 1 and c.stats["empty_loss_batches"] == 1
    assert abs(upload) > 1e6  # bug (c) replicated: the loss noise divided by 1e-10
    (data,) = _clients(m, [400])
    a, _, _ = _train(m, _client(m, data, params, sigma=2.0), model, params, 4)
    b, _, _ = _train(m, _client(m, data, params), model, params, 4)
    noise = torch.cat([(b[k] - a[k]).flatten() for k in params]) * 64  # lr = 1
    assert noise.numel() == 582_026
    assert noise.std().item() == pytest.approx(0.1 * 2.0, rel=0.01)
    assert abs(noise.mean().item()) < 0.002


def test_at_c_0_1_every_gradient_is_clipped_and_the_fair_weight_cancels(m):
    # s·min(C/(s‖g‖ + 1e-6), 1) = C/‖g‖ whenever s‖g‖ > C: at the paper's C = 0.1 λ acts on
    # no sample; with a clip above the norms it acts on every one (s ≠ 1)
    model, params = _params(m)
    (data,) = _clients(m, [600])
    counts = {}
    for clip in (0.1, 1e4):
        c = _client(m, data, params, fairness=True, lam=0.5, clip=clip)
        _train(m, c, model, params, 2, global_loss=1.0)
        counts[clip] = c.stats
    n = counts[0.1]["samples"]
    assert n > 0 and counts[0.1]["clipped_samples"] == n
    assert counts[0.1]["fair_active_samples"] == 0
    assert counts[1e4]["clipped_samples"] == 0
    assert counts[1e4]["fair_active_samples"] == counts[1e4]["samples"]


def test_loss_upload_and_psi_are_the_codes(m):
    rs = np.random.RandomState(3)
    expect_noise = np.random.RandomState(3).normal(0, 2.5 * 5.0)
    got = m.dp_loss_upload([1.0, 4.0, 2.0], 2.5, 5.0, rs)
    assert got == pytest.approx((1.0 + 2.5 + 2.0 + expect_noise) / (3 + 1e-10))
    assert m.weighted_variance([1.0, 3.0], [0.25, 0.75]) == pytest.approx(0.75)


def test_a_run_on_synthetic_clients_and_its_row(m):
    cell = m.fedfdp.BY_KEY["T6_eps2"]
    clients = _clients(m, [200, 300])
    rec = m.run(cell, "fedfdp", 0, rounds_cap=2, clients=clients, log=lambda s: 0)
    assert rec["rounds"] == 2 and rec["rounds_schedule"] == 269 and rec["budget_rounds"] == 268
    assert rec["lambda"] == 0.1 and rec["accumulator"] == "keep" and rec["steps_taken"] >= 3
    assert rec["clipped_fraction"] == 1.0  # synthetic images: every norm is far above 0.1
    assert rec["fair_active_fraction"] == 0.0
    assert m.record_row(rec)["extra"]["clipped_fraction"] == rec["clipped_fraction"]
    row = m.record_row(rec)
    assert row["source"] == "authors' code" and row["paper"] == "fedfdp"
    assert (row["table"], row["setting"], row["method"], row["epsilon"]) == (
        "6", "Dir(0.1), N=10", "fedfdp", 2.0,
    )  # fmt: skip
    assert row["dp"] is False and row["variant"] == "" and "NOT DP" in row["note"]
    assert row["paper_value"] == 83.15 and row["schedule"] == "reduced"
    again = m.run(cell, "fedfdp", 0, rounds_cap=2, clients=clients, log=lambda s: 0)
    assert again["curve"] == rec["curve"]  # one seed fixes the run
    zero = m.run(
        cell, "fedavg", 0, rounds_cap=1, clients=clients, accumulator="zero",
        divisor="expected", log=lambda s: 0,
    )  # fmt: skip
    zrow = m.record_row(zero)
    assert zrow["dp"] is True and zrow["paper_value"] == 82.69 and zero["lambda"] == 0.0
    assert zrow["variant"] == (
        "accumulator zeroed every step (bug (a) fixed; DP), divisor=expected (q·n_i, raydpfl's)"
    )
    with pytest.raises(ValueError, match="is not private"):
        m.run(m.fedfdp.BY_KEY["T4_fashion_mnist_dir1"], "fedavg", 0, clients=clients)
    with pytest.raises(ValueError, match="method must be one of"):
        m.run(cell, "fedprox", 0, clients=clients)


def test_differences_notes_are_the_generated_table(m, capsys):
    assert m.main(["--differences"]) == 0
    out = capsys.readouterr().out
    assert out == m.NOTES.read_text(encoding="utf-8")
    assert "| Gradient accumulator |" in out


def test_bad_cells_are_refused_before_any_work(m, capsys):
    with pytest.raises(SystemExit):
        m.main(["--cells", "T4_fashion_mnist_dir1", "--no-record"])
    assert "non-private" in capsys.readouterr().err


@pytest.mark.skipif(not FMNIST.exists(), reason="no FMNIST")
def test_smoke_two_rounds_on_real_fmnist_write_an_authors_code_row(m, tmp_path, monkeypatch):
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RAYDPFL_REPRO_RESULTS", str(results))
    monkeypatch.setattr(m, "RESULTS", tmp_path / "authors_step_fedfdp.json")
    argv = ["--cells", "T6_eps2", "--rounds-cap", "2", "--subset", "0.03", "--allow-dirty"]
    assert m.main(argv) == 0
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["source"] == "authors' code" and row["method"] == "fedavg"
    assert 0.0 <= row["ours"] <= 100.0 and row["dp"] is False
    assert row["rounds_run"] == 2 and row["rounds_paper"] == 269
    dump = json.loads((tmp_path / "authors_step_fedfdp.json").read_text())
    # the authors' seed-1 Dir(0.1) partition of the pooled 70,000 images
    assert dump[0]["train_sizes"] == [
        int(0.03 * n) for n in (6345, 135, 4137, 600, 6109, 7389, 8968, 5734, 6665, 6413)
    ]
