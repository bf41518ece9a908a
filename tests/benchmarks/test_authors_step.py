"""benchmarks/repro/authors_step.py: the ALI-DPFL authors' fixed-τ pipeline re-implemented."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "benchmarks" / "repro"


def _load(name: str):
    """The runner module `name` under its own name (the runners `import _record`)."""
    return load_script(name, REPRO / f"{name}.py")


@pytest.fixture(scope="module")
def a():
    torch.set_num_threads(1)
    return _load("authors_step")


def _batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def _params(a, seed: int = 0):
    torch.manual_seed(seed)
    model = a.FedAvgCNN()
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}


def test_partition_follows_pfllibs_dirichlet_rule_and_split(a):
    labels = np.repeat(np.arange(10), 60)  # 600 samples, 10 classes
    rs = np.random.RandomState(1)
    shares = a.dirichlet_partition(labels, 5, 0.1, rs, min_size=40)
    sizes = [len(s) for s in shares]
    assert sum(sizes) == 600 and min(sizes) >= 40
    assert sorted(i for s in shares for i in s) == list(range(600))  # each sample once
    for s in shares:
        # The cap: a client gets a class's chunk only while it holds < |D|/N = 120 (a
        # capped client may still get one stray sample when the cumulative shares round
        # below 1, as in PFLlib).
        classes = labels[s]
        assert np.all(np.diff(classes) >= 0)  # appended class by class
        for k in np.unique(classes):
            if np.sum(classes == k) > 1:
                assert np.sum(classes < k) < 600 / 5
    parts = a.authors_partition(labels, 0.1, num_clients=5, min_size=40)
    for (train, test), s in zip(parts, a.dirichlet_partition(
            labels, 5, 0.1, np.random.RandomState(1), min_size=40), strict=True):  # fmt: skip
        assert len(train) == math.floor(0.75 * len(s)) and len(train) + len(test) == len(s)
        assert sorted([*train, *test]) == sorted(s)
    again = a.authors_partition(labels, 0.1, num_clients=5, min_size=40)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(parts, again, strict=True))


def test_split_is_sklearns_train_test_split_on_the_same_stream(a):
    sk = pytest.importorskip("sklearn.model_selection")
    labels = np.repeat(np.arange(10), 50)
    rs = np.random.RandomState(1)
    shares = a.dirichlet_partition(labels, 4, 0.5, rs)
    expected = [
        sk.train_test_split(np.asarray(s), train_size=0.75, shuffle=True, random_state=rs)
        for s in shares
    ]
    got = a.authors_partition(labels, 0.5, num_clients=4)
    for (tr, te), (etr, ete) in zip(got, expected, strict=True):
        assert np.array_equal(tr, etr) and np.array_equal(te, ete)


def test_model_is_fedavg_cnn_with_raydpfls_parameter_count(a):
    from raydpfl.models.zoo import FedAvgCNN

    ours = sum(p.numel() for p in a.FedAvgCNN().parameters())
    assert ours == 582_026 == sum(p.numel() for p in FedAvgCNN((1, 28, 28), 10).parameters())


def test_clipping_bounds_every_sample_and_matches_the_authors_loop(a):
    model, params = _params(a)
    x, y = _batch(6)
    clip = 0.1
    summed, norms = a.per_sample_clipped_sum(model, params, x, y, clip)
    assert bool((norms > clip).all())  # every sample is clipped at C = 0.1
    for i in range(6):
        one, _ = a.per_sample_clipped_sum(model, params, x[i : i + 1], y[i : i + 1], clip)
        assert math.sqrt(sum(float(t.pow(2).sum()) for t in one.values())) <= clip
    # The authors' loop: batch-size-1 backward, flat norm in doubles, min(C/(n+1e-6), 1).
    ref = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(6):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        loss.backward()
        total = sum(p.grad.norm(2).item() ** 2 for p in model.parameters()) ** 0.5
        coef = min(clip / (total + 1e-6), 1.0)
        for (k, _), p in zip(params.items(), model.parameters(), strict=True):
            ref[k] += p.grad * coef
    for k in params:
        torch.testing.assert_close(summed[k], ref[k], rtol=1e-4, atol=1e-7)


def test_noise_on_the_sum_has_std_c_sigma_and_sigma0_is_deterministic(a):
    model, params = _params(a)
    x, y = _batch(4)
    lr, clip, sigma = 0.5, 0.1, 1.1

    def step(s: float, seed: int):
        p = {k: v.clone() for k, v in params.items()}
        gen = torch.Generator().manual_seed(seed)
        a.dp_step_(model, p, x, y, lr=lr, clip=clip, sigma=s, generator=gen)
        return p

    clean, clean2, noisy = step(0.0, 0), step(0.0, 99), step(sigma, 0)
    assert all(torch.equal(clean[k], clean2[k]) for k in params)  # σ = 0: no randomness
    # p_noisy − p_clean = −lr · z / 64 with z the noise on the sum.
    z = torch.cat([((clean[k] - noisy[k]) * 64 / lr).flatten() for k in params]).double()
    assert abs(float(z.std()) / (clip * sigma) - 1) < 0.01  # 582,026 draws
    assert abs(float(z.mean())) < 0.01 * clip * sigma


@pytest.mark.parametrize("n", [1, 5])
def test_divisor_is_64_whatever_the_realised_batch(a, n):
    model, params = _params(a)
    model.double()  # float64: p − p' is exact enough to compare
    params = {k: v.double() for k, v in params.items()}
    x, y = _batch(n, seed=n)
    x = x.double()
    summed, _ = a.per_sample_clipped_sum(model, params, x, y, 0.1)
    p = {k: v.clone() for k, v in params.items()}
    a.dp_step_(model, p, x, y, lr=0.5, clip=0.1, sigma=0.0, generator=torch.Generator())
    for k in params:
        torch.testing.assert_close(params[k] - p[k], 0.5 * summed[k] / 64, rtol=1e-8, atol=1e-15)


def test_poisson_rate_is_floor_nq_over_n(a):
    gen = torch.Generator().manual_seed(0)
    assert all(a.poisson_batch(60, 0.015, gen).numel() == 0 for _ in range(50))  # ⌊0.9⌋ = 0
    sizes = [a.poisson_batch(1000, 0.015, gen).numel() for _ in range(400)]
    assert abs(np.mean(sizes) - 15) < 1.0  # rate ⌊15⌋/1000


def _synthetic_clients(a, sizes, normalisation="authors"):
    out = []
    for i, n in enumerate(sizes):
        x, y = _batch(n, seed=10 + i)
        xt, yt = _batch(20, seed=100 + i)
        out.append(a.ClientData(x, y, xt, yt, normalisation))
    return out


def test_empty_batches_are_skipped_but_count_toward_rc(a):
    model, params = _params(a)
    small = _synthetic_clients(a, [30])[0]  # n·q < 1: m = 0, every draw is empty
    gen = torch.Generator().manual_seed(0)
    new, stats = a.client_update(
        model, params, small, 3, q=0.015, lr=0.5, clip=0.1, sigma=1.1, generator=gen
    )
    assert stats == {"steps": 0, "empty": 3, "samples": 0}
    assert all(torch.equal(new[k], params[k]) for k in params)  # no update, no noise
    cell = next(c for c in _load("ali_dpfl").CELLS if c.key == "II:2Rc")
    rec = a.run(
        cell, 2, 0, rounds_cap=2, clients=_synthetic_clients(a, [30, 200]), log=lambda s: 0
    )
    assert rec["iterations"] == 4  # 2 rounds of τ = 2, empty draws included
    assert rec["empty_batches"] >= 4 and rec["steps_taken"] + rec["empty_batches"] == 8
    assert rec["rounds"] == 2 and rec["rounds_schedule"] == 79 // 2


def test_the_expected_divisor_scales_the_step_by_64_over_q_n(a):
    # --divisor expected: raydpfl's 1/(q·n_i) instead of the authors' 1/64; the same noisy
    # sum (same generator state), so the two steps differ by exactly that factor
    model, params = _params(a)
    x, y = _batch(40, seed=3)
    steps = {}
    for divisor in (64.0, 0.015 * 1000):
        p = {k: v.clone() for k, v in params.items()}
        gen = torch.Generator().manual_seed(7)
        a.dp_step_(model, p, x, y, lr=0.5, clip=0.1, sigma=1.1, generator=gen, divisor=divisor)
        steps[divisor] = {k: p[k] - params[k] for k in p}
    for k in params:
        torch.testing.assert_close(steps[15.0][k], steps[64.0][k] * (64 / 15.0))
    cell = next(c for c in _load("ali_dpfl").CELLS if c.key == "II:2Rc")
    with pytest.raises(ValueError, match="divisor must be one of"):
        a.run(cell, 1, 0, rounds_cap=1, clients=_synthetic_clients(a, [200]), divisor="32")
    # the record names the normalisation the clients' inputs went through, never another
    with pytest.raises(ValueError, match=r"clients were built with \['authors'\]"):
        a.run(
            cell, 1, 0, rounds_cap=1, clients=_synthetic_clients(a, [200]),
            normalisation="raydpfl", log=lambda s: 0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="normalisation must be one of"):
        a.run(cell, 1, 0, rounds_cap=1, clients=_synthetic_clients(a, [200]), normalisation="z")
    rec = a.run(
        cell, 1, 0, rounds_cap=1, clients=_synthetic_clients(a, [200], "raydpfl"),
        divisor="expected", normalisation="raydpfl", log=lambda s: 0,
    )  # fmt: skip
    row = a.record_row(rec)
    assert row["variant"] == "divisor=expected (q·n_i, raydpfl's), normalisation=raydpfl"
    assert row["dp"] and row["extra"]["divisor"] == "expected"


def test_the_normalisations_are_the_authors_and_raydpfls():
    from raydpfl.data.datasets import _NORMALISATION

    a_mod = _load("authors_step")
    assert a_mod.NORMALISATIONS["authors"] == (0.5, 0.5)
    mean, std = a_mod.NORMALISATIONS["raydpfl"]
    assert ((mean,), (std,)) == _NORMALISATION["fashion_mnist"]
    assert (mean, std) == (0.2860, 0.3530)


def test_aggregate_weights_by_train_size(a):
    p1 = {"w": torch.ones(3)}
    p2 = {"w": torch.zeros(3)}
    torch.testing.assert_close(a.aggregate([p1, p2], [30, 10])["w"], torch.full((3,), 0.75))


def test_differences_notes_are_the_generated_table(a, capsys):
    assert a.main(["--differences"]) == 0
    out = capsys.readouterr().out
    assert out == a.NOTES.read_text(encoding="utf-8")
    assert "| difference | authors' code | raydpfl | DP-valid? | measured effect |" in out


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="no FMNIST")
def test_smoke_two_rounds_on_real_fmnist_write_an_authors_code_row(a, tmp_path, monkeypatch):
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RAYDPFL_REPRO_RESULTS", str(results))
    monkeypatch.setattr(a, "RESULTS", tmp_path / "authors_step.json")
    argv = ["--cells", "II:2Rc", "--rounds-cap", "2", "--subset", "0.03", "--allow-dirty"]
    assert a.main(argv) == 0
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["source"] == "authors' code" and row["paper"] == "ali_dpfl"
    assert (row["table"], row["setting"], row["method"]) == ("II", "2Rc", "tau1")
    assert 0.0 <= row["ours"] <= 100.0 and row["dp"] is True and row["variant"] == ""
    assert row["schedule"] == "reduced" and row["rounds_run"] == 2 and row["rounds_paper"] == 79
    assert row["commit"] and row["command"].startswith("python ")
    # The full partition is the authors' seed-1 Dir(0.05) one (spec §6.1's train sizes).
    assert row["extra"]["R_c"] == 79 and row["paper_value"] == 79.98
    dump = json.loads((tmp_path / "authors_step.json").read_text())
    assert dump[0]["train_sizes"] == [
        int(0.03 * n) for n in (5360, 661, 3109, 204, 484, 9558, 9227, 9923, 5558, 8412)
    ]


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="no FMNIST")
def test_raydpfl_normalisation_gives_raydpfl_inputs_bit_for_bit(a):
    # --normalisation raydpfl measures the statistics alone: the pooled images must be the
    # very tensors raydpfl trains on (train split first, then test), not a near copy
    from raydpfl.data.datasets import load_dataset

    x, labels = a.load_pooled_fmnist(normalisation="raydpfl")
    ours = load_dataset("fashion_mnist")
    n = len(ours.y_train)
    assert x.dtype == torch.float32 and tuple(x.shape) == (n + len(ours.y_test), 1, 28, 28)
    pooled = np.concatenate([ours.x_train, ours.x_test]).reshape(x.shape)
    assert np.array_equal(x.numpy(), pooled)
    assert np.array_equal(labels, np.concatenate([ours.y_train, ours.y_test]))
    authors, _ = a.load_pooled_fmnist()
    mean, std = a.NORMALISATIONS["raydpfl"]
    torch.testing.assert_close(authors[:5] * 0.5 + 0.5, x[:5] * std + mean)  # same pixels
    with pytest.raises(ValueError, match="normalisation must be one of"):
        a.load_pooled_fmnist(normalisation="imagenet")


def test_the_codes_own_rc_runs_the_iterations_its_accountant_allows(a):
    # the authors' code takes R_c from its improved RDP conversion: 281 at ε = 1.55, not
    # the paper's 79; --rc-accountant rdp runs that schedule and the row names it
    cell = next(c for c in _load("ali_dpfl").CELLS if c.key == "II:2Rc")
    assert a.schedule(cell, 1) == (79, 158, 79)
    assert a.schedule(cell, 1, "rdp") == (281, 562, 281)
    assert a.schedule(cell, 2, "rdp") == (281, 562, 140)
    rec = a.run(
        cell, 1, 0, rounds_cap=1, clients=_synthetic_clients(a, [200]), rc_accountant="rdp",
        log=lambda s: 0,
    )  # fmt: skip
    row = a.record_row(rec)
    assert row["variant"] == "R_c by rdp (281)" and row["dp"] is True
    assert row["rounds_paper"] == 281 and row["extra"]["rc_accountant"] == "rdp"
