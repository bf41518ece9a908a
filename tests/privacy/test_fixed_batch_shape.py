"""``privacy.batch_shape: fixed``: Poisson samples truncated at the run's cap B.

What is checked, each against an independent computation:
- the charge: the ledger's PLD ε is dp-accounting's PLDAccountant on
  ``TruncatedSubsampledGaussianDpEvent`` built here by hand (the larger of the removal pair
  N = |D| and the addition pair N = |D| + 1); the RDP accountants' coupling bound is the
  least ε with ε ≥ ε_M(δ − (1 + e^ε) H), H from binomial tails summed here with `math.comb`
  and ε_M from dp-accounting's RdpAccountant;
- the sampling: the platform's `sample()` never exceeds B, its sizes below B are
  Binomial(|D|, q), and every record is equally likely to be kept (chi-square tests at a
  fixed seed that a first-B truncation fails);
- the vectorised engine's fixed shapes: masked rows contribute exactly nothing (its
  update equals a per-sample ground-truth loop over the records the stream drew), and it
  equals the sequential truncated path draw for draw;
- the platform stamps the run's cap (a plug-in cannot pick one), config errors are one
  line naming the field, and a small run on the local backend states the truncated charge.
"""

from __future__ import annotations

import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld
from dp_accounting.rdp import RdpAccountant
from scipy import stats

import raydpfl
from raydpfl.algorithms import DPFedAvg
from raydpfl.algorithms.base import ClientContext, ClientData, direct_context
from raydpfl.config import ConfigError
from raydpfl.config.schema import PrivacyConfig
from raydpfl.models import build_model
from raydpfl.privacy.accounting.accountants import compute_epsilon_extended
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger
from raydpfl.privacy.mechanisms.kernel import (
    MechanismUse,
    PrivacyContractError,
    SubsampledGaussian,
)
from raydpfl.privacy.per_sample import multi_client
from raydpfl.privacy.per_sample.dpsgd import CLIP_EPS, poisson_sample, truncate_sample
from raydpfl.privacy.per_sample.engines import make_engine
from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD

DELTA = 1e-5
TRUNC = "truncated_subsampled_gaussian"


def _cost(sigma, q, steps, cap, n) -> PrivacyCost:
    return PrivacyCost(sigma, q, steps, TRUNC, max_batch_size=cap, dataset_size=n)


# ---- the charge -------------------------------------------------------------------------
def _pld_by_hand(charges, delta):
    """dp-accounting's PLD ε of (σ, q, steps, cap, n) truncated charges (cap None: a plain
    Poisson charge), the worse of the two adjacent pairs around n."""
    worst = 0.0
    for extra in (0, 1):
        acc = pld.PLDAccountant()
        for sigma, q, steps, cap, n in charges:
            if cap is None:
                event = dp_accounting.PoissonSampledDpEvent(
                    q, dp_accounting.GaussianDpEvent(sigma)
                )
            else:
                event = dp_accounting.TruncatedSubsampledGaussianDpEvent(
                    dataset_size=n + extra,
                    sampling_probability=q,
                    truncated_batch_size=cap,
                    noise_multiplier=sigma,
                )
            acc.compose(event, steps)
        worst = max(worst, acc.get_epsilon(delta))
    return worst


def test_the_pld_ledger_charges_dp_accountings_truncated_event():
    # n = 60, q = 0.2: mean batch 12, a cap of 12 truncates about half the samples
    ledger = PrivacyLedger("pld", DELTA, None)
    ledger.charge(0, PrivacyCost(1.2, 0.2, 3))
    ledger.charge(0, _cost(1.2, 0.2, 4, 12, 60))
    want = _pld_by_hand([(1.2, 0.2, 3, None, 60), (1.2, 0.2, 4, 12, 60)], DELTA)
    assert ledger.epsilon(0) == pytest.approx(want, rel=1e-9)
    # truncation is not free here: the displaced record doubles the sensitivity
    untruncated = _pld_by_hand([(1.2, 0.2, 7, None, 60)], DELTA)
    assert ledger.epsilon(0) > untruncated * 1.01
    # the event a charge maps to is dp-accounting's, at N = n (and n + 1 when added)
    event = _cost(1.2, 0.2, 4, 12, 60).dp_event(added=True)
    assert event.count == 4
    assert event.event == dp_accounting.TruncatedSubsampledGaussianDpEvent(61, 0.2, 12, 1.2)


def _tail(n: int, q: float, cap: int) -> float:
    """P[Bin(n, q) > cap] summed term by term (exact rational arithmetic on the pmf)."""
    return float(sum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(cap + 1, n + 1)))


def _rdp_by_hand(sigma: float, q: float, steps: int, delta: float) -> float:
    acc = RdpAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    return acc.get_epsilon(delta)


def test_the_rdp_ledger_charges_the_coupling_bound():
    sigma, q, steps, cap, n = 1.0, 0.1, 50, 45, 150  # mean 15: η ≈ 3e-12 per step
    mass = steps * _tail(n + 1, q, cap)
    assert 1e-11 < mass < 1e-9
    ledger = PrivacyLedger("dp_rdp", DELTA, None)
    got = ledger.charge(0, _cost(sigma, q, steps, cap, n))
    # valid: the untruncated history is (got, δ − (1 + e^got) H)-DP
    assert got >= _rdp_by_hand(sigma, q, steps, DELTA - (1 + math.exp(got)) * mass)
    # least: a hair below, the inequality fails
    below = got * (1 - 1e-6)
    assert below < _rdp_by_hand(sigma, q, steps, DELTA - (1 + math.exp(below)) * mass)
    assert got > _rdp_by_hand(sigma, q, steps, DELTA)  # the truncation is paid for
    # a cap no sample can reach is charged (and accounted) as plain Poisson
    plain = SubsampledGaussian(sigma, 1.0, q, max_batch_size=n + 1, dataset_size=n)
    assert plain.cost(steps) == PrivacyCost(sigma, q, steps)
    # a cap truncation reaches too often has no finite coupling bound
    assert compute_epsilon_extended([_cost(sigma, q, steps, 15, n).history_entry()], DELTA) == (
        math.inf
    )


def test_a_truncated_charge_round_trips_and_zcdp_refuses_it():
    cost = _cost(1.0, 0.1, 3, 8, 90)
    assert PrivacyCost.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost
    assert "max_batch_size" not in PrivacyCost(1.0, 0.1, 3).to_dict()  # old ledgers unchanged
    with pytest.raises(ValueError, match="zcdp"):
        compute_epsilon_extended([cost.history_entry()], DELTA, "zcdp")
    with pytest.raises(ValueError, match="max_batch_size"):
        PrivacyCost(1.0, 0.1, 3, TRUNC, dataset_size=90)


# ---- the sampling -----------------------------------------------------------------------
N, Q, CAP = 40, 0.3, 10  # mean 12 > cap: most samples are truncated
SHAPE, CLASSES = (1, 6, 6), 4


def _records(sizes, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = torch.randn((total, *SHAPE), generator=g, dtype=dtype)
    y = torch.randint(0, CLASSES, (total,), generator=g)
    perm = torch.randperm(total, generator=g)
    out, start = [], 0
    for s in sizes:
        out.append(perm[start : start + s].sort().values)
        start += s
    return x, y, out


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return build_model("mlp", SHAPE, CLASSES, hidden=8).to(dtype).requires_grad_(False)


def _stamped(task, cap, n):
    m = task.mechanisms[0].mechanism
    use = MechanismUse(m.with_batch_shape(cap, n), task.mechanisms[0].count)
    return dataclasses.replace(task, mechanisms=(use,))


def _draw_sizes_and_members(draws: int):
    x, y, (idx,) = _records([N])
    model = _model()
    alg = DPFedAvg(
        clients_per_round=1,
        local_steps=draws,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=Q,
    )
    task = _stamped(alg.plan(0, [0], None)[0], CAP, N)
    ctx = direct_context(model, ClientData(0, x, y, idx), task, torch.Generator().manual_seed(7))
    live = ctx.privacy.dp_sgd()
    sizes, members = [], np.zeros(N)
    for _ in range(draws):
        batch = live.sample()
        positions = batch._positions
        sizes.append(int(positions.numel()))
        members[positions.numpy()] += 1
        live.skip_empty(batch) if positions.numel() == 0 else live._complete(True, "")
    return np.array(sizes), members


def test_truncated_sizes_never_exceed_the_cap_and_are_binomial_below_it():
    sizes, _ = _draw_sizes_and_members(4000)
    assert sizes.max() == CAP
    # observed counts of each size 0..CAP-1 and of CAP (= P[Bin >= CAP]) against Bin(N, q)
    observed = np.array([(sizes == k).sum() for k in range(CAP + 1)])
    probs = np.append(stats.binom.pmf(np.arange(CAP), N, Q), stats.binom.sf(CAP - 1, N, Q))
    keep = probs * len(sizes) >= 5  # chi-square cells with enough expected mass
    expected = probs * len(sizes)
    chi2 = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    rest = (observed[~keep].sum() - expected[~keep].sum()) ** 2 / max(expected[~keep].sum(), 1e-9)
    p = stats.chi2.sf(chi2 + rest, keep.sum())
    assert p > 1e-3, (observed, expected)


def test_every_record_is_equally_likely_to_be_kept():
    draws = 4000
    _, members = _draw_sizes_and_members(draws)
    expected = members.sum() / N
    p = stats.chisquare(members, np.full(N, expected)).pvalue
    assert p > 1e-3
    # the test can fail: keeping the first CAP records of each sample is far from uniform
    g = torch.Generator().manual_seed(7)
    biased = np.zeros(N)
    for _ in range(draws):
        biased[poisson_sample(N, Q, g)[:CAP].numpy()] += 1
    assert stats.chisquare(biased, np.full(N, biased.sum() / N)).pvalue < 1e-6


def test_truncation_draws_only_when_over_the_cap():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    small = torch.arange(5)
    assert truncate_sample(small, 5, g1) is small
    assert torch.equal(g1.get_state(), g2.get_state())  # the stream is untouched
    kept = truncate_sample(torch.arange(0, 40, 2), 6, g1)
    assert kept.numel() == 6 and torch.all(kept[1:] > kept[:-1]) and torch.all(kept % 2 == 0)


# ---- fixed shapes on the vectorised engine ----------------------------------------------
SIZES = [3, 25, 40, 60, 9]  # the first never reaches the cap; the last three often do


def _ground_truth_update(model, params, x, y, rows, clip, scale):
    """−scale · Σ_i clip(∇ℓ_i) over `rows`, one record at a time with autograd."""
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for r in rows.tolist():
        p = {n: t.clone().requires_grad_(True) for n, t in params.items()}
        out = torch.func.functional_call(model, p, (x[r : r + 1],))
        loss = torch.nn.functional.cross_entropy(out, y[r : r + 1])
        grads = torch.autograd.grad(loss, list(p.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        weight = min(1.0, clip / (float(norm) + CLIP_EPS))
        for (n, _), g in zip(p.items(), grads, strict=True):
            total[n] += weight * g
    return {n: -scale * t for n, t in total.items()}


@pytest.mark.parametrize("engine", ["vmap", "bookkeeping"])
def test_masked_rows_contribute_nothing(engine):
    dtype = torch.float64
    x, y, indices = _records(SIZES, dtype=dtype)
    model = _model(dtype)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    q, cap, clip, lr = 0.3, 10, 0.5, 1.0
    gens = [torch.Generator().manual_seed(50 + k) for k in range(len(SIZES))]
    replay = [torch.Generator().manual_seed(50 + k) for k in range(len(SIZES))]
    out = MultiClientDPSGD(model, engine=engine).run(
        params, x, y, indices, gens, local_steps=1, lr=lr, sampling_rate=q,
        clip_norm=clip, noise_multiplier=0.0, max_batch_size=cap,
    )  # fmt: skip
    truncated = 0
    for k, (idx, g) in enumerate(zip(indices, replay, strict=True)):
        drawn = poisson_sample(idx.numel(), q, g)
        truncated += drawn.numel() > cap
        kept = truncate_sample(drawn, cap, g)
        assert int(out.batch_sizes[k, 0]) == kept.numel() <= cap
        want = _ground_truth_update(model, params, x, y, idx[kept], clip, lr / (q * idx.numel()))
        for name in params:
            torch.testing.assert_close(out.updates[name][k], want[name], atol=1e-12, rtol=0)
        assert torch.equal(g.get_state(), gens[k].get_state())
    assert truncated >= 1  # the seeds truncate at least one client's sample


def test_fixed_shapes_equal_the_sequential_truncated_path():
    x, y, indices = _records(SIZES)
    model = _model()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    alg = DPFedAvg(
        clients_per_round=len(SIZES),
        local_steps=3,
        lr=0.2,
        clip_norm=0.5,
        noise_multiplier=1.1,
        sampling_rate=0.3,
    )
    tasks = [
        _stamped(t, 10, len(idx))
        for t, idx in zip(alg.plan(0, list(range(len(SIZES))), None), indices, strict=True)
    ]
    g_seq = [torch.Generator().manual_seed(9 + k) for k in range(len(SIZES))]
    g_vec = [torch.Generator().manual_seed(9 + k) for k in range(len(SIZES))]
    clipping = make_engine(model, "auto")
    seq = []
    for k, task in enumerate(tasks):
        ctx = ClientContext(model, clipping, g_seq[k], torch.device("cpu"))
        start = {n: p.clone() for n, p in params.items()}
        seq.append(alg.local_update(ctx, start, ClientData(k, x, y, indices[k]), task))
    multi_client._ENGINES[model] = MultiClientDPSGD(model, engine="vmap")
    ctxs = [ClientContext(model, clipping, g, torch.device("cpu")) for g in g_vec]
    datas = [ClientData(k, x, y, idx) for k, idx in enumerate(indices)]
    vec = alg.local_update_group(ctxs, params, datas, tasks)
    for a, b in zip(seq, vec, strict=True):
        assert a.metrics == pytest.approx(b.metrics, abs=1e-12)
        for name in a.update:
            torch.testing.assert_close(b.update[name], a.update[name], atol=2e-6, rtol=0)
    for a, b in zip(g_seq, g_vec, strict=True):
        assert torch.equal(a.get_state(), b.get_state())
    assert max(r.metrics["mean_batch_size"] for r in seq) <= 10


def test_a_truncated_mechanism_samples_only_the_client_it_was_charged_for():
    x, y, (idx,) = _records([30])
    alg = DPFedAvg(
        clients_per_round=1,
        local_steps=1,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=0.2,
    )
    task = _stamped(alg.plan(0, [0], None)[0], 5, 31)  # charged for 31 records, holds 30
    ctx = direct_context(_model(), ClientData(0, x, y, idx), task, torch.Generator())
    with pytest.raises(PrivacyContractError, match="charged for 31 records"):
        ctx.privacy.dp_sgd().sample()


# ---- the platform's cap, the config ------------------------------------------------------
def _config(tmp_path=None, **privacy):
    return {
        "experiment": {
            "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
            "model": {"name": "logreg"},
            "algorithm": {"rounds": 2, "clients_per_round": 3, "local_steps": 2, "lr": 0.5},
            "privacy": {
                "epsilon": 50.0,
                "delta": 1e-3,
                "noise_multiplier": 1.0,
                "sampling_rate": 0.1,
                **privacy,
            },
        },
        "runtime": {"backend": "local", "seed": 2},
    }


@pytest.mark.parametrize(
    "privacy, field, words",
    [
        ({"batch_shape": "fixd"}, "batch_shape", "must be poisson or fixed"),
        ({"batch_shape": "fixed"}, "max_batch_size", "must be an int >= 1"),
        ({"batch_shape": "fixed", "max_batch_size": 0}, "max_batch_size", "int >= 1"),
        ({"max_batch_size": 8}, "max_batch_size", "for batch_shape fixed only"),
        (
            {"batch_shape": "fixed", "max_batch_size": 8, "noise_multiplier": None},
            "noise_multiplier",
            "must be set with batch_shape fixed",
        ),
    ],
)
def test_bad_batch_shapes_are_refused_in_one_line(privacy, field, words):
    with pytest.raises(ConfigError) as info:
        PrivacyConfig(**privacy)
    assert info.value.field == field and words in str(info.value)
    assert "\n" not in str(info.value)


def test_a_plug_in_cannot_choose_its_own_cap(tmp_path):
    class OwnCap(DPFedAvg):
        def dp_sgd_mechanism(self):  # its own cap, in a plain-Poisson run and in a fixed one
            return super().dp_sgd_mechanism().with_batch_shape(5, 192)

    alg = OwnCap(
        clients_per_round=3,
        local_steps=2,
        lr=0.5,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=0.1,
    )
    for privacy in ({}, {"batch_shape": "fixed", "max_batch_size": 45}):
        with pytest.raises(PrivacyContractError, match="the cap is the run's") as info:
            raydpfl.run_simulation(_config(**privacy), algorithm=alg)
        assert "\n" not in str(info.value)


def test_a_small_run_states_and_charges_the_truncated_event(tmp_path):
    run_dir = tmp_path / "run"
    raydpfl.run_simulation(
        _config(batch_shape="fixed", max_batch_size=45, accountant="dp_rdp"), run_dir=run_dir
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    privacy = summary["privacy"]
    assert privacy["batch_shape"] == "fixed" and privacy["max_batch_size"] == 45
    assert "truncated at max_batch_size = 45" in privacy["sampling"]
    charged = privacy["charged"]
    assert charged and all(e["mechanism"] == TRUNC and e["max_batch_size"] == 45 for e in charged)
    # the largest ε is the coupling bound of the most-charged client's history, by hand
    ledger = json.loads((run_dir / "ledger.json").read_text())
    worst = 0.0
    for client in ledger["clients"]:
        entries = client["entries"]
        steps = sum(e["steps"] for e in entries)
        mass = sum(e["steps"] * _tail(e["dataset_size"] + 1, 0.1, 45) for e in entries)
        eps = summary["epsilon_max"]
        assert eps >= _rdp_by_hand(1.0, 0.1, steps, 1e-3 - (1 + math.exp(eps)) * mass) - 1e-9
        worst = max(worst, _rdp_by_hand(1.0, 0.1, steps, 1e-3))
    assert summary["epsilon_max"] >= worst


@pytest.mark.slow
def test_a_truncating_run_is_charged_dp_accountings_event(tmp_path):
    """A cap below q·|D_i| ≈ 19 truncates most samples; PLD accounts it exactly (~30 s:
    each distinct history is two PLD compositions)."""
    run_dir = tmp_path / "run"
    config = _config(batch_shape="fixed", max_batch_size=15, accountant="pld")
    config["experiment"]["algorithm"].update(rounds=2, clients_per_round=2)
    raydpfl.run_simulation(config, run_dir=run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    ledger = json.loads((run_dir / "ledger.json").read_text())
    fields = ("noise_multiplier", "sampling_rate", "steps", "max_batch_size", "dataset_size")
    by_hand = [
        _pld_by_hand([tuple(e[f] for f in fields) for e in client["entries"]], 1e-3)
        for client in ledger["clients"]
    ]
    assert summary["epsilon_max"] == pytest.approx(max(by_hand), rel=1e-9)
    rounds = __import__("pandas").read_parquet(run_dir / "rounds.parquet")
    assert (rounds["mean_batch_size"].dropna() <= 15).all()
