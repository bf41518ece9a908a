"""White-box checks of every noise path the package releases through (issue 24, items 2, 4).

Each mechanism is driven through its real public function (an algorithm's client or
server half, run by a real `ClientWorker` with the real per-(seed, round, client, kind)
stream derivation) with a *known input*, so that the released value minus the known
clean value is exactly the noise. The known input is the "null" model: a bias-free
linear layer on all-zero records. Its per-sample gradients are exactly 0
(∂ℓ/∂W = (softmax(Wx) − e_y)·xᵀ = 0 at x = 0) and every record's cross-entropy is
exactly ln 10 whatever W, so the batches stay real (Poisson samples, the clipping
engines run on them) while the clean part of every release is known in closed form.

The noise is then compared with what the code *claims*: the σ (or Laplace scale) of the
`PrivacyCost` it charges the ledger, times the sensitivity the accountant assumes (C,
C_l, 2ηB/D_n, σ·S, ...), divided by the public denominator. The same checking functions
(top of this file) run on every path, and on deliberately broken mechanisms built only
here (negative controls, bottom of this file) to prove that each check can fail.

Paths (mechanism: function driven; claimed std or scale):

- DP-SGD step, torch.func and book-keeping engines: `DPFedAvg.local_update` run by a
  worker (engine vmap / bookkeeping); claimed ησC/(q·|D|) per step.
- DP-SGD step with a weight rule: `FedFDP.local_update` (fair clipping); the same.
- DP-SGD for many clients at once: `MultiClientDPSGD.run` (vmap, bookkeeping) and
  `ClientWorker.run_groups` (vectorise on); the same per client, √(K·τ)·|D|× in the sum.
- DP-SGD gradient (MR-MTL's fused step): `dpsgd.dp_sgd_gradient`; σC/(q·|D|).
- RC-DPFL's GMM stage (round 1, full batch, the GMM's input): `RcDpfl.local_update`;
  ηzc/|D| per step.
- FedFDP's loss upload and Adap DP-FL's loss query: `FedFDP.local_update` (``loss``
  task), `AdapDpFl.local_update` (``dp_loss`` task); σ_l·C_l/(q_l·|D|).
- DPFL-BCS Gaussian (zCDP) and Laplace, stage 1 (the (d+2)-vector with the two loss
  reports the selection uses) and stage 2: `DpflBcs.local_update`; multiplier × Δ with
  Δ = 2η(B + Θ)/D or 2ηB/D (Laplace: b = Δ₁/ε^l), loss reports that over η.
- RC-DPFL's private selection (Gumbel noise, exponential mechanism): `RcDpfl.local_update`
  (``assign`` task); P(m) ∝ exp(ε·acc_m/(2Δ)), Δ = 100/(N − 1).
- PE-DPFL's upload: `PeDpfl.local_update`; z·2S.
- Client-level DP-FedAvg, central noise (Poisson and fixed sampling):
  `DPFedAvgClientLevel.aggregate_sum` after the worker's group sum; σS/E. Distributed
  noise: each client's share from `local_update` (σS/√K) and the released sum (σS/E).

Every statistical bound has a false-failure probability ≤ `ALPHA` = 1e-6 for a correct
mechanism (stated at each helper), and every draw comes from fixed seeds, so the tests
are deterministic. Secure-noise mode (os.urandom draws) is covered by
`tests/privacy/test_secure_noise.py`; the generic samplers' own moments by
`tests/privacy/test_dpsgd.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.stats as st
import torch
from torch import nn

from raydpfl.algorithms.base import ClientTask, WeightedUpdateSum
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.mechanisms.kernel import (
    ExponentialSelection,
    LaplaceRelease,
    uses,
)
from raydpfl.simulation.seeding import torch_generator
from raydpfl.simulation.worker import ClientWorker, ModelSpec
from tests.conftest import with_release_scale

# --------------------------------------------------------------------------------------- #
# The checking functions
# --------------------------------------------------------------------------------------- #
#: False-failure probability of each statistical assertion for a correct mechanism.
ALPHA = 1e-6
#: Two-sided standard-normal quantile at ALPHA: P(|Z| > Z_ALPHA) = 1e-6 (Z_ALPHA ≈ 4.89).
Z_ALPHA = float(st.norm.isf(ALPHA / 2))
#: Fewest draws a distribution check accepts (its bounds must be tight enough to matter).
MIN_DRAWS = 1000


def ks_bound(n: int) -> float:
    """Dvoretzky-Kiefer-Wolfowitz with Massart's constant: P(sup|F_n − F| > ε) ≤
    2·exp(−2nε²), so ε = sqrt(ln(2/α)/(2n)) bounds the KS distance with probability 1 − α."""
    return math.sqrt(math.log(2 / ALPHA) / (2 * n))


def assert_gaussian(samples, std: float, what: str = "noise") -> None:
    """`samples` are i.i.d. N(0, std²).

    - mean: x̄ ~ N(0, std²/n): |x̄| ≤ Z_ALPHA·std/√n;
    - scale: with the mean known to be 0, Σx²/std² ~ χ²_n exactly: it must lie between the
      χ²_n quantiles α/2 and 1 − α/2 (for n = 20,000 that is std within about ±2.5%);
    - shape: KS distance to N(0, std²) at most `ks_bound(n)` (DKW).
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    assert n >= MIN_DRAWS, f"{what}: only {n} draws"
    assert np.all(np.isfinite(x)), f"{what}: non-finite noise"
    mean_bound = Z_ALPHA * std / math.sqrt(n)
    assert abs(x.mean()) <= mean_bound, f"{what}: mean {x.mean():.4g} (bound {mean_bound:.3g})"
    chi = float(np.sum(x * x)) / std**2
    lo, hi = st.chi2.ppf(ALPHA / 2, n), st.chi2.isf(ALPHA / 2, n)
    assert lo <= chi <= hi, (
        f"{what}: empirical std {math.sqrt(chi / n) * std:.5g} vs claimed {std:.5g} "
        f"(chi-square {chi:.1f} outside [{lo:.1f}, {hi:.1f}] for n = {n})"
    )
    d = st.kstest(x, st.norm(scale=std).cdf).statistic
    assert d <= ks_bound(n), f"{what}: KS distance {d:.4f} > {ks_bound(n):.4f} (n = {n})"


def assert_laplace(samples, scale: float, what: str = "noise") -> None:
    """`samples` are i.i.d. Laplace(0, scale).

    - mean: variance 2b², so |x̄| ≤ Z_ALPHA·√2·b/√n (normal approximation, n ≥ 1000);
    - scale: |x|/b ~ Exp(1), so Σ|x|/b ~ Gamma(n, 1) exactly: between its α/2 and 1 − α/2
      quantiles;
    - shape: KS distance to Laplace(0, b) at most `ks_bound(n)` (DKW).
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    assert n >= MIN_DRAWS, f"{what}: only {n} draws"
    assert np.all(np.isfinite(x)), f"{what}: non-finite noise"
    mean_bound = Z_ALPHA * math.sqrt(2) * scale / math.sqrt(n)
    assert abs(x.mean()) <= mean_bound, f"{what}: mean {x.mean():.4g} (bound {mean_bound:.3g})"
    total = float(np.abs(x).sum()) / scale
    lo, hi = st.gamma.ppf(ALPHA / 2, n), st.gamma.isf(ALPHA / 2, n)
    assert lo <= total <= hi, (
        f"{what}: empirical scale {total / n * scale:.5g} vs claimed {scale:.5g} "
        f"(sum |x|/b = {total:.1f} outside [{lo:.1f}, {hi:.1f}])"
    )
    d = st.kstest(x, st.laplace(scale=scale).cdf).statistic
    assert d <= ks_bound(n), f"{what}: KS distance {d:.4f} > {ks_bound(n):.4f} (n = {n})"


def assert_clipped(norms, bound: float, raw_norms, what: str = "contribution") -> None:
    """Every contribution's norm is at most the bound the accountant assumes (relative
    float slack 1e-5, as `dpsgd.BoundedWeightRule`), and the check is not vacuous: some
    contribution had a raw norm well above the bound before clipping."""
    norms, raw = np.asarray(norms, dtype=np.float64), np.asarray(raw_norms, dtype=np.float64)
    assert raw.max() > 2 * bound, f"{what}: vacuous (raw norms never exceed 2·bound)"
    worst = float(norms.max())
    assert worst <= bound * (1 + 1e-5), f"{what}: norm {worst:.6g} above the bound {bound:.6g}"


def fresh_bound(m: int, tests: int) -> float:
    """Threshold on |Σ_i a_i b_{i+k}| / m for independent rows a, b of m N(0, 1) draws.

    A product ab of independent standard normals has E exp(λab) = (1 − λ²)^(−1/2) ≤
    exp(λ²) for λ² ≤ ½, so Chernoff gives P(|Σ_{i≤n} a_i b_i| ≥ t) ≤ 2·exp(−t²/(4n)) for
    t ≤ √2·n; with n ≤ m terms per lag and a union bound over `tests` (pairs × lags),
    t/m = sqrt(4·ln(2·tests/α)/m) is exceeded with probability ≤ α.
    """
    return math.sqrt(4 * math.log(2 * tests / ALPHA) / m)


def assert_fresh(rows, what: str = "noise") -> None:
    """Rows of standard-normal draws from different streams (clients, rounds, steps) share
    no draws: no two rows are equal, and for every pair the cross-correlation at every lag
    |k| ≤ m/2 (a draw reused as is, negated, or shifted by k positions gives ≥ ½) stays
    below `fresh_bound` (false failure ≤ α over all pairs and lags)."""
    a = np.asarray(rows, dtype=np.float64)
    r, m = a.shape
    assert r >= 2 and m >= 500, f"{what}: need ≥ 2 rows of ≥ 500 draws, got {a.shape}"
    lags = m // 2
    pairs = r * (r - 1) // 2
    bound = fresh_bound(m, pairs * (2 * lags + 1))
    size = 1 << (2 * m - 1).bit_length()
    spectra = np.fft.rfft(a, size, axis=1)
    worst, where = 0.0, None
    for i in range(r):
        for j in range(i + 1, r):
            assert not np.array_equal(a[i], a[j]), f"{what}: rows {i} and {j} are equal"
            xc = np.fft.irfft(spectra[i].conj() * spectra[j], size)  # xc[k] = Σ a_t b_{t+k}
            window = np.concatenate([xc[: lags + 1], xc[size - lags :]]) / m
            peak = float(np.abs(window).max())
            if peak > worst:
                worst, where = peak, (i, j)
    assert worst <= bound, (
        f"{what}: rows {where} share draws (cross-correlation {worst:.3f} > {bound:.3f})"
    )


def assert_fresh_scalars(values, what: str = "noise", tol: float = 1e-9) -> None:
    """Scalar standard-normal draws from different streams (one per client and round) are
    not reused: no two lie within `tol` of each other beyond chance. For independent
    N(0, 1) draws X − Y ~ N(0, 2) has density ≤ 1/(2√π), so P(|X − Y| ≤ t) ≤ t/√π; the
    count of close pairs among n values is then dominated by Poisson(λ = n²/2 · t/√π)
    (pairs are nearly independent for such rare events), and we allow its 1 − α
    quantile. `tol` must exceed the float error of extracting the noise."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = x.size
    assert n >= MIN_DRAWS, f"{what}: only {n} draws"
    gaps = np.diff(x)
    # pairs within tol (sorted, so a close pair is at most a few places apart)
    close = sum(int(np.sum(x[k:] - x[:-k] <= tol)) for k in range(1, 4))
    lam = n * (n - 1) / 2 * (tol / math.sqrt(math.pi))
    allowed = int(st.poisson.isf(ALPHA, lam)) + 1
    assert close <= allowed, (
        f"{what}: {close} pairs of releases within {tol:g} of each other "
        f"(chance allows {allowed}); smallest gap {gaps.min():.3g}"
    )


def to_standard_normal(x, *, kind: str, scale):
    """The draws mapped to N(0, 1) under the claimed law (x/σ, or Φ⁻¹(F_Laplace(x/b)))."""
    z = np.asarray(x, dtype=np.float64) / np.asarray(scale, dtype=np.float64)
    if kind == "gaussian":
        return z
    return st.norm.ppf(np.clip(st.laplace.cdf(z), 1e-300, 1 - 1e-16))


@dataclass
class Release:
    """Noise extracted from one mechanism: rows (one per client × round × step), the
    claimed std (Gaussian) or scale (Laplace) per row, and the law."""

    rows: np.ndarray
    scale: np.ndarray
    kind: str = "gaussian"


def check_release(release: Release, what: str, fresh_rows: int = 24) -> None:
    """The one check every path runs: the claimed law with the claimed std/scale, and no
    draw shared between two rows (at most `fresh_rows` rows are compared pairwise)."""
    rows = np.asarray(release.rows, dtype=np.float64)
    scale = np.asarray(release.scale, dtype=np.float64).reshape(-1, 1)
    standard = rows / scale
    if release.kind == "gaussian":
        assert_gaussian(standard, 1.0, what)
    else:
        assert_laplace(standard, 1.0, what)
    idx = np.linspace(0, rows.shape[0] - 1, min(fresh_rows, rows.shape[0])).astype(int)
    assert_fresh(to_standard_normal(rows[idx], kind=release.kind, scale=scale[idx]), what)


# --------------------------------------------------------------------------------------- #
# The known input: the null model on all-zero records
# --------------------------------------------------------------------------------------- #
@pytest.fixture(autouse=True)
def _one_thread():
    """These runs are thousands of tiny kernels: with 2 intra-op threads on a shared
    2-core machine they spend most of their time in thread hand-offs (measured 30x
    slower). The draws and every bound are independent of the thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


SEED = 20240
FEATURES, CLASSES = 200, 10
D = FEATURES * CLASSES  # 2,000 parameters, one noise draw each per release
LN10 = math.log(CLASSES)  # every record's loss under the null model


def null_model() -> nn.Module:
    """Bias-free linear layer: on x = 0 every per-sample gradient is exactly 0."""
    return nn.Linear(FEATURES, CLASSES, bias=False)


def dataset(
    sizes: Sequence[int], *, scale: float = 0.0, features: int = FEATURES, x=None, y=None
) -> FederatedDataset:
    """Clients with `sizes` records; x = 0 (null input) unless `scale` > 0 (random x·scale,
    for the clipping checks) or `x`, `y` are given."""
    rng = np.random.default_rng(0)
    total = int(sum(sizes))
    if x is None:
        x = (rng.standard_normal((total, features)) * scale).astype(np.float32)
    if y is None:
        y = rng.integers(0, CLASSES, total).astype(np.int64)
    bounds = np.cumsum([0, *sizes])
    train = tuple(np.arange(bounds[i], bounds[i + 1], dtype=np.int64) for i in range(len(sizes)))
    empty = tuple(np.zeros(0, dtype=np.int64) for _ in sizes)
    return FederatedDataset(
        "null", CLASSES, (x.shape[1],), x, y, train, empty, x[:1].copy(), y[:1].copy()
    )


def worker(
    algorithm,
    sizes,
    *,
    engine="vmap",
    vectorise="off",
    factory=null_model,
    worker_cls=ClientWorker,
    **data,
) -> ClientWorker:
    """A real `ClientWorker` over `dataset(sizes, **data)`, run seed `SEED`."""
    pool = dataset(sizes, **data)
    spec = ModelSpec("null", pool.input_shape, CLASSES, {}, factory=factory)
    return worker_cls(algorithm, spec, pool, SEED, engine=engine, vectorise=vectorise)


def zeros(features: int = FEATURES) -> dict[str, torch.Tensor]:
    return {"weight": torch.zeros(CLASSES, features)}


def flat(update: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([t.detach().reshape(-1).double() for t in update.values()]).numpy()


def prefix_task(task, tau: int):
    """`task` cut to its first `tau` DP-SGD steps, declaring (and so charged for) `tau`
    invocations of its `SubsampledGaussian`: the worker refuses a receipt that differs."""
    from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses

    mechanisms = tuple(
        uses(u.mechanism, tau) if isinstance(u.mechanism, SubsampledGaussian) else u
        for u in task.mechanisms
    )
    return dataclasses.replace(task, local_steps=tau, mechanisms=mechanisms)


def per_step_noise(run: Callable[[int], np.ndarray], steps: int) -> list[np.ndarray]:
    """Each step's noise from prefix runs of the same task: with the null model a run of τ
    steps releases exactly the sum of its τ steps' noise (scaled), and a run of τ − 1
    steps consumes the stream identically, so their difference is step τ's noise."""
    out, previous = [], 0.0
    for tau in range(1, steps + 1):
        current = run(tau)
        out.append(current - previous)
        previous = current
    return out


# --------------------------------------------------------------------------------------- #
# DP-SGD: the step in each engine, through the algorithms' client halves
# --------------------------------------------------------------------------------------- #
SIGMA, CLIP, LR, Q = 1.3, 0.7, 0.5, 0.1
N_RECORDS = 50  # q·|D| = 5 expected records per Poisson batch
DPSGD_CLIENTS, DPSGD_ROUNDS, DPSGD_STEPS = (0, 1, 2, 3), (0, 3), 2


def dp_fedavg(**kw):
    from raydpfl.algorithms.dp_fedavg import DPFedAvg

    args = dict(
        clients_per_round=4,
        local_steps=DPSGD_STEPS,
        lr=LR,
        clip_norm=CLIP,
        noise_multiplier=SIGMA,
        sampling_rate=Q,
    )
    return DPFedAvg(**{**args, **kw})


def fedfdp(**kw):
    from raydpfl.papers.fedfdp.algorithm import FedFDP
    from raydpfl.papers.fedfdp.loss_upload import LossUpload

    upload = LossUpload(
        noise_multiplier=2.5,
        sampling_rate=0.2,
        clip_init=1.5,
        clip_floor=1e-3,
        clip_multiplier=1.0,
    )
    args = dict(
        lam=0.5,
        loss_upload=upload,
        clients_per_round=4,
        lr=LR,
        local_steps=DPSGD_STEPS,
        sampling_rate=Q,
        clip_norm=CLIP,
        noise_multiplier=SIGMA,
        initial_global_loss=1.0,
    )
    return FedFDP(**{**args, **kw})


def dpsgd_claim(task: ClientTask, num_records: int) -> float:
    """η·σ·C/(q·|D|): the per-step noise std in parameter space that the task's charged
    `PrivacyCost(σ, q, τ)` and its sensitivity C (`task.clip_norm`) imply."""
    cost = task.privacy_cost
    assert cost is not None and cost.steps == task.local_steps
    return task.lr * cost.noise_multiplier * task.clip_norm / (cost.sampling_rate * num_records)


def dpsgd_release(algorithm, *, engine="vmap", worker_cls=ClientWorker) -> Release:
    """Per-step noise of `algorithm`'s training tasks for every (client, round, step),
    run one task at a time by a real worker (`ClientWorker.run_task`)."""
    sizes = [N_RECORDS] * len(DPSGD_CLIENTS)
    w = worker(algorithm, sizes, engine=engine, worker_cls=worker_cls)
    rows, scales = [], []
    for r in DPSGD_ROUNDS:
        for task in algorithm.plan(r, list(DPSGD_CLIENTS), np.array(sizes)):

            def run(tau: int, task=task) -> np.ndarray:
                return flat(w.run_task(zeros(), prefix_task(task, tau)).update)

            rows += per_step_noise(run, task.local_steps)
            scales += [dpsgd_claim(task, N_RECORDS)] * task.local_steps
    return Release(np.stack(rows), np.array(scales))


@pytest.mark.parametrize(
    "make, engine",
    [(dp_fedavg, "vmap"), (dp_fedavg, "bookkeeping"), (fedfdp, "vmap"), (fedfdp, "bookkeeping")],
    ids=[
        "dp_fedavg-vmap",
        "dp_fedavg-bookkeeping",
        "fedfdp_fair_clip-vmap",
        "fedfdp_fair_clip-bookkeeping",
    ],
)
def test_dp_sgd_step_noise_in_each_engine(make, engine):
    # 4 clients × 2 rounds × 2 steps = 16 rows of 2,000 draws (32,000)
    check_release(dpsgd_release(make(), engine=engine), f"DP-SGD step ({engine})")


def multi_client_release(engine: str, algorithm=None) -> Release:
    """Per-step noise of DP-FedAvg's tasks trained all at once (`MultiClientDPSGD.run`),
    each client on its own stream derived as the worker derives it
    (`seeding.torch_generator(seed, round, client, "train")`)."""
    from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD

    algorithm = algorithm or dp_fedavg()
    sizes = [N_RECORDS] * len(DPSGD_CLIENTS)
    data = dataset(sizes)
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y)
    indices = [torch.as_tensor(i) for i in data.client_train]
    model = null_model().requires_grad_(False)
    trainer = MultiClientDPSGD(model, engine=engine)
    rows, scales = [], []
    for r in DPSGD_ROUNDS:
        tasks = algorithm.plan(r, list(DPSGD_CLIENTS), np.array(sizes))
        t = tasks[0]

        def run(tau: int, r=r, tasks=tasks, t=t) -> np.ndarray:
            gens = [torch_generator(SEED, r, k.client_id, k.kind) for k in tasks]
            out = trainer.run(
                zeros(),
                x,
                y,
                indices,
                gens,
                local_steps=tau,
                lr=t.lr,
                sampling_rate=t.sampling_rate,
                clip_norm=t.clip_norm,
                noise_multiplier=t.noise_multiplier,
            )
            return out.updates["weight"].reshape(len(tasks), -1).double().numpy()

        steps = per_step_noise(run, t.local_steps)  # (steps, clients, D)
        for k, task in enumerate(tasks):
            rows += [s[k] for s in steps]
            scales += [dpsgd_claim(task, N_RECORDS)] * len(steps)
    return Release(np.stack(rows), np.array(scales))


@pytest.mark.parametrize("engine", ["vmap", "bookkeeping"])
def test_vectorised_clients_noise(engine):
    # 4 clients × 2 rounds × 2 steps = 16 rows of 2,000 draws (32,000)
    check_release(multi_client_release(engine), f"vectorised DP-SGD ({engine})")


def test_vectorised_group_sum_through_the_worker_carries_every_clients_noise():
    """`ClientWorker.run_groups` (vectorise on) releases Σ_k |D_k|·Δ_k; with the null
    model that is −(η/q)·Σ_k Σ_steps z, std (η·σ·C/q)·√(K·τ)."""
    algorithm = dp_fedavg()
    sizes = [N_RECORDS] * len(DPSGD_CLIENTS)
    w = worker(algorithm, sizes, vectorise="on")
    rows, scales = [], []
    for r in range(6):
        tasks = algorithm.plan(r, list(DPSGD_CLIENTS), np.array(sizes))
        (acc,) = w.run_groups(zeros(), [tasks])
        rows.append(flat(acc.total))
        per_client = dpsgd_claim(tasks[0], N_RECORDS) * N_RECORDS  # |D_k|·std of Δ_k per step
        scales.append(per_client * math.sqrt(len(tasks) * tasks[0].local_steps))
    check_release(Release(np.stack(rows), np.array(scales)), "vectorised group sum")


def test_dp_sgd_gradient_noise():
    """`dpsgd.dp_sgd_gradient` (the privatised gradient MR-MTL applies with its correction):
    (Σ clip + N(0, σ²C²))/(q·|D|), from the client's derived stream, fresh per step."""
    from raydpfl.privacy.per_sample.dpsgd import (
        PerSampleGradients,
        dp_sgd_gradient,
        poisson_sample,
    )

    data = dataset([N_RECORDS])
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y)
    engine = PerSampleGradients(null_model().requires_grad_(False))
    rows = []
    for r in range(4):
        for client in range(3):
            gen = torch_generator(SEED, r, client, "train")
            for _ in range(2):  # two steps on one stream
                batch = poisson_sample(N_RECORDS, Q, gen)
                g, _ = dp_sgd_gradient(
                    engine,
                    zeros(),
                    x[batch],
                    y[batch],
                    clip_norm=CLIP,
                    noise_multiplier=SIGMA,
                    expected_batch_size=Q * N_RECORDS,
                    generator=gen,
                )
                rows.append(flat(g))
    check_release(
        Release(np.stack(rows), np.full(len(rows), SIGMA * CLIP / (Q * N_RECORDS))),
        "dp_sgd_gradient",
    )


# --------------------------------------------------------------------------------------- #
# RC-DPFL's GMM stage: round 1's full-batch DP-SGD updates, the GMM's only input
# --------------------------------------------------------------------------------------- #
def rc_dpfl(cls=None, **kw):
    from raydpfl.papers.rc_dpfl.algorithm import RcDpfl

    n = kw.pop("num_clients", 6)
    args = dict(
        num_models=3,
        rounds=10,
        num_clients=n,
        lr=LR,
        clip_norm=CLIP,
        noise_multipliers=[1.7] * n,
        batch_size=8,
        local_epochs=2,
        seed=SEED,
    )
    return (cls or RcDpfl)(**{**args, **kw})


def test_rc_dpfl_gmm_stage_update_noise():
    # round 1: q = 1, K = 2 full-batch steps; 6 clients × 2 steps = 12 rows (24,000 draws)
    algorithm = rc_dpfl()
    sizes = [N_RECORDS] * 6
    w = worker(algorithm, sizes)
    rows, scales = [], []
    for task in algorithm.plan(0, list(range(6)), np.array(sizes)):
        assert task.sampling_rate == 1.0 and task.local_steps == 2

        def run(tau: int, task=task) -> np.ndarray:
            return flat(w.run_task(zeros(), prefix_task(task, tau)).update)

        rows += per_step_noise(run, task.local_steps)
        scales += [dpsgd_claim(task, N_RECORDS)] * task.local_steps
    check_release(Release(np.stack(rows), np.array(scales)), "RC-DPFL round-1 update")


# --------------------------------------------------------------------------------------- #
# Loss releases: FedFDP's loss upload, Adap DP-FL's loss query
# --------------------------------------------------------------------------------------- #
LOSS_CLIENTS, LOSS_ROUNDS = 40, 25  # 1,000 releases
LOSS_CLIP = 1.5  # < ln 10: every null-model loss is clipped to exactly C_l


def loss_release(algorithm, make_task, key: str, worker_cls=ClientWorker):
    """Standardised noise of one scalar loss release per (client, round): the released
    value minus the known clean value m·min(C_l, ln 10)/(q_l·|D|) (m = the Poisson batch
    size the release reports, or recomputed from the task's own stream), over the claimed
    std σ_l·C_l/(q_l·|D|) of its `PrivacyCost(σ_l, q_l, 1)`."""
    sizes = [N_RECORDS] * LOSS_CLIENTS
    w = worker(algorithm, sizes, worker_cls=worker_cls)
    out = []
    for r in range(LOSS_ROUNDS):
        for c in range(LOSS_CLIENTS):
            task = make_task(c, r)
            cost = task.privacy_cost
            assert cost is not None and cost.steps == 1
            clip = task.extras.get("loss_clip", task.clip_norm)
            result = w.run_task(zeros(), task)
            if "loss_batch_size" in result.metrics:
                m = result.metrics["loss_batch_size"]
            else:  # the batch is the first draw of the task's stream: redraw it
                from raydpfl.privacy.per_sample.dpsgd import poisson_sample

                m = poisson_sample(N_RECORDS, cost.sampling_rate, w._stream(task)).numel()
            denominator = cost.sampling_rate * N_RECORDS
            clean = m * min(clip, LN10) / denominator
            std = cost.noise_multiplier * clip / denominator
            out.append((result.metrics[key] - clean) / std)
    return np.array(out)


def fedfdp_loss_task(algorithm):
    return lambda c, r: algorithm.loss_upload.task(c, r, None)


def adap_dp_fl(**kw):
    from raydpfl.papers.ali_dpfl.adap_dp_fl import AdapDpFl

    args = dict(
        clients_per_round=LOSS_CLIENTS,
        rounds_budget=1000,
        local_steps=1,
        lr=0.5,
        sampling_rate=0.2,
        clip_norm=1.0,
        noise_multiplier=1.5,
        noise_decay=0.8,
        epsilon=1e6,
        delta=1e-5,
        num_params=D,
        loss_source="dp_followup",
        loss_sampling_rate=0.2,
        loss_noise_multiplier=2.5,
        loss_clip=LOSS_CLIP,
    )
    return AdapDpFl(**{**args, **kw})


def adap_loss_task(algorithm):
    """The follow-up task `AdapDpFl.followup_tasks` plans for client c in round r (one
    call per round for every client, as the server makes it)."""
    from raydpfl.algorithms.base import ClientResult

    planned: dict[int, list[ClientTask]] = {}

    def make(c: int, r: int) -> ClientTask:
        if r not in planned:
            done = [ClientResult(k, {}, 1.0, N_RECORDS) for k in range(LOSS_CLIENTS)]
            planned[r] = algorithm.followup_tasks(r, [], done, {})
        task = planned[r][c]
        assert task.client_id == c
        return task

    return make


@pytest.mark.parametrize("which", ["fedfdp_loss_upload", "adap_dp_fl_loss_query"])
def test_loss_release_noise(which):
    if which == "fedfdp_loss_upload":
        algorithm = fedfdp()
        z = loss_release(algorithm, fedfdp_loss_task(algorithm), "noisy_loss")
        tol = 1e-9  # float64 release: extraction error ~1e-15
    else:
        algorithm = adap_dp_fl()
        z = loss_release(algorithm, adap_loss_task(algorithm), "dp_loss")
        tol = 1e-5  # the noisy sum is float32: extraction error ~1e-7 of the clean sum
    assert_gaussian(z, 1.0, which)
    assert_fresh_scalars(z, which, tol=tol)


# --------------------------------------------------------------------------------------- #
# DPFL-BCS: the noisy full-batch step (Gaussian, Laplace) and the stage-1 loss reports
# --------------------------------------------------------------------------------------- #
BCS_RECORDS, BCS_CLIP, THETA = 20, 0.6, 1.0  # Θ < ln 10: clipped null-model losses are 1


def dpfl_bcs(mechanism: str, *, selection: str = "bcs", n: int = 12, cls=None, **kw):
    from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs

    rng = np.random.default_rng(1)
    args = dict(
        clients_per_round=4,
        rounds=8,
        lr=0.4,
        lr_decay_tau=5.0,
        clip_norm=BCS_CLIP,
        mechanism=mechanism,
        epsilons=rng.uniform(1.0, 4.0, n),
        deltas=np.full(n, 1e-5),
        train_sizes=np.full(n, BCS_RECORDS),
        num_params=D,
        selection=selection,
        stage1_rounds=4,
        loss_bound=THETA,
    )
    return (cls or DpflBcs)(**{**args, **kw})


def bcs_claim(task: ClientTask, stage1: bool) -> float:
    """The noise scale the charged cost implies: its multiplier (σ/Δ₂, or b/Δ₁ for Laplace,
    = 1/ε^l) times the paper's sensitivity, Δ = 2η(B + Θ)/D in stage 1 (Eq. 13: the
    (d+2)-vector with the two loss reports) and 2ηB/D in stage 2 (Lemmas 1-2)."""
    cost = task.privacy_cost
    assert cost is not None and cost.sampling_rate == 1.0 and cost.steps == 1
    lr = task.lr
    sensitivity = 2 * lr * (BCS_CLIP + (THETA if stage1 else 0.0)) / BCS_RECORDS
    return cost.noise_multiplier * sensitivity


def bcs_tasks(algorithm, rounds, n):
    sizes = np.full(n, BCS_RECORDS)
    for r in rounds:
        cohort = [int(c) for c in np.flatnonzero(algorithm.tplan > 0)][:n]
        yield r, algorithm.plan(r, cohort, sizes)


def bcs_update_release(mechanism: str, stage: int, cls=None, worker_cls=ClientWorker) -> Release:
    """−update of each task is exactly the noise (the clean step η·mean clip(∇) is 0)."""
    selection = "bcs" if stage == 1 else "uniform"
    algorithm = dpfl_bcs(mechanism, selection=selection, cls=cls)
    w = worker(algorithm, [BCS_RECORDS] * 12, worker_cls=worker_cls)
    rows, scales = [], []
    for _, tasks in bcs_tasks(algorithm, (0, 2), 12):
        for task in tasks[:6]:
            assert bool(task.extras["stage1"]) == (stage == 1)
            rows.append(-flat(w.run_task(zeros(), task).update))
            scales.append(bcs_claim(task, stage == 1))
    return Release(np.stack(rows), np.array(scales), mechanism)


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_dpfl_bcs_update_noise(mechanism, stage):
    # 6 clients × 2 rounds = 12 rows of 2,000 draws (24,000)
    check_release(bcs_update_release(mechanism, stage), f"DPFL-BCS {mechanism} stage {stage}")


SMALL = 4  # features of the loss-report runs: 40 parameters, so 1,000 tasks stay cheap


def bcs_loss_reports(mechanism: str, cls=None, worker_cls=ClientWorker) -> np.ndarray:
    """Standardised noise of the two stage-1 loss reports F̂ = (η·F + z)/η of every task:
    F = Θ exactly (clipped null-model loss), claimed scale = coordinate scale/η (§4.5)."""
    n = 125
    algorithm = dpfl_bcs(
        mechanism, n=n, num_params=SMALL * CLASSES, cls=cls, clients_per_round=n
    )  # every client in every round's plan
    w = worker(
        algorithm,
        [BCS_RECORDS] * n,
        features=SMALL,
        worker_cls=worker_cls,
        factory=lambda: nn.Linear(SMALL, CLASSES, bias=False),
    )
    out = []
    for _, tasks in bcs_tasks(algorithm, range(4), n):  # 4 stage-1 rounds × 125 = 500 tasks
        for task in tasks:
            metrics = w.run_task(zeros(SMALL), task).metrics
            scale = bcs_claim(task, True) / task.lr
            out.append(
                [(metrics["loss_before"] - THETA) / scale, (metrics["loss_after"] - THETA) / scale]
            )
    return np.array(out)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_dpfl_bcs_stage1_loss_report_noise(mechanism):
    z = bcs_loss_reports(mechanism)  # 500 tasks × 2 reports = 1,000 draws
    check = assert_gaussian if mechanism == "gaussian" else assert_laplace
    check(z, 1.0, f"DPFL-BCS {mechanism} loss reports")
    assert_fresh_scalars(
        to_standard_normal(z, kind=mechanism, scale=1.0),
        f"DPFL-BCS {mechanism} loss reports",
        tol=1e-7,
    )


# --------------------------------------------------------------------------------------- #
# RC-DPFL's private selection: Gumbel noise on accuracies, the exponential mechanism
# --------------------------------------------------------------------------------------- #
SEL_CLIENTS, SEL_ROUNDS, SEL_RECORDS, SEL_EPS = 60, 24, 21, 0.2


def assert_categorical(counts, probs, what: str = "choice") -> None:
    """Counts of a categorical draw match `probs`: each count within the exact binomial
    quantiles α/(2M) and 1 − α/(2M) (Bonferroni over the M categories)."""
    counts, probs = np.asarray(counts), np.asarray(probs, dtype=np.float64)
    n, a = int(counts.sum()), ALPHA / (2 * len(probs))
    assert n >= MIN_DRAWS, f"{what}: only {n} draws"
    for m, (k, p) in enumerate(zip(counts, probs, strict=True)):
        lo, hi = st.binom.ppf(a, n, p), st.binom.isf(a, n, p)
        assert lo <= k <= hi, f"{what}: category {m} drawn {k}/{n}, claimed p = {p:.4f}"


def assert_independent_choices(agree: int, pairs: int, probs, what: str = "choice") -> None:
    """Choices of disjoint pairs of independent draws agree Binomial(pairs, Σp²) times; a
    draw reused within a pair makes them always agree. Upper 1 − α binomial quantile."""
    same = float(np.sum(np.square(probs)))
    limit = st.binom.isf(ALPHA, pairs, same)
    assert agree <= limit, f"{what}: {agree}/{pairs} pairs agree (independent: ≤ {limit:.0f})"


def selection_claim(task: ClientTask, num_records: int, accuracies) -> np.ndarray:
    """The exponential mechanism the charge describes: P(m) ∝ exp(ε·acc_m/(2Δ)) with
    Δ = 100/(N − 1), the sensitivity of a train accuracy in % (§5.4)."""
    eps = float(task.mechanisms[0].mechanism.epsilon)
    logits = eps * np.asarray(accuracies) / (2 * 100.0 / (num_records - 1))
    p = np.exp(logits - logits.max())
    return p / p.sum()


def selections(cls=None, worker_cls=ClientWorker):
    """Every client's private choice in every round: cluster model 0 predicts every record
    right (train accuracy 100%), models 1 and 2 every record wrong (0%)."""
    from raydpfl.papers.rc_dpfl.algorithm import assign_task

    algorithm = rc_dpfl(
        cls, num_clients=SEL_CLIENTS, selection_epsilon=SEL_EPS, selection_rounds=99
    )
    total = SEL_CLIENTS * SEL_RECORDS
    x = np.zeros((total, FEATURES), dtype=np.float32)
    x[:, 0] = 1.0
    w = worker(
        algorithm,
        [SEL_RECORDS] * SEL_CLIENTS,
        x=x,
        y=np.zeros(total, dtype=np.int64),
        worker_cls=worker_cls,
    )
    models = {}
    for m in range(3):
        weight = torch.zeros(CLASSES, FEATURES)
        weight[m, 0] = 1.0  # logits = e_m: predicts class m; every label is 0
        models[f"m{m}/weight"] = weight
    choices = np.zeros((SEL_ROUNDS, SEL_CLIENTS), dtype=int)
    probs = None
    for r in range(SEL_ROUNDS):
        for c in range(SEL_CLIENTS):
            task = assign_task(c, r, SEL_EPS)
            assert task.privacy_cost is not None
            assert task.privacy_cost.as_triple() == (2.0 / SEL_EPS, 1.0, 1)
            choices[r, c] = int(w.run_task(models, task).metrics["cluster"])
            probs = selection_claim(task, SEL_RECORDS, [100.0, 0.0, 0.0])
    return choices, probs


def check_selections(choices, probs, what="RC-DPFL private selection"):
    assert_categorical(np.bincount(choices.ravel(), minlength=3), probs, what)
    across_clients = int(np.sum(choices[:, 0::2] == choices[:, 1::2]))
    assert_independent_choices(across_clients, choices[:, 0::2].size, probs, what + " (clients)")
    across_rounds = int(np.sum(choices[0::2] == choices[1::2]))
    assert_independent_choices(across_rounds, choices[0::2].size, probs, what + " (rounds)")


def test_rc_dpfl_private_selection_is_the_exponential_mechanism():
    # 60 clients × 24 rounds = 1,440 selections; claimed P = (0.787, 0.107, 0.107)
    check_selections(*selections())


# --------------------------------------------------------------------------------------- #
# PE-DPFL: output perturbation of the clipped update
# --------------------------------------------------------------------------------------- #
def pe_dpfl(**kw):
    from raydpfl.papers.ali_dpfl.pe_dpfl import PeDpfl

    args = dict(
        clients_per_round=4,
        rounds_budget=100,
        local_steps=2,
        lr=0.3,
        sampling_rate=0.2,
        update_clip_norm=0.9,
        noise_multiplier=1.2,
        epsilon=5.0,
        delta=1e-5,
    )
    return PeDpfl(**{**args, **kw})


def test_pe_dpfl_upload_noise():
    """Δ̃ = clip_S(Δ) + N(0, (z·2S)²): the charged `PrivacyCost(z, 1, 1)` at the sensitivity
    2S of a clipped update (one record can move it anywhere in the S-ball)."""
    algorithm = pe_dpfl()
    sizes = [N_RECORDS] * 4
    w = worker(algorithm, sizes)
    rows, scales = [], []
    for r in range(3):  # 4 clients × 3 rounds = 12 rows (24,000 draws)
        for task in algorithm.plan(r, list(range(4)), np.array(sizes)):
            rows.append(flat(w.run_task(zeros(), task).update))
            scales.append(
                task.privacy_cost.noise_multiplier * task.mechanisms[0].mechanism.sensitivity
            )
    check_release(Release(np.stack(rows), np.array(scales)), "PE-DPFL upload")


# --------------------------------------------------------------------------------------- #
# Client-level DP-FedAvg: the server's noise (central) or the clients' shares (distributed)
# --------------------------------------------------------------------------------------- #
CL_CLIENTS, CL_ROUNDS = 24, 8


def client_level(cls=None, **kw):
    from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel

    args = dict(
        num_clients=CL_CLIENTS,
        sampling="poisson",
        sampling_rate=0.25,
        local_steps=1,
        lr=0.5,
        batch_size=5,
        clip_norm=0.8,
        noise_multiplier=1.1,
        seed=SEED,
    )
    return (cls or DPFedAvgClientLevel)(**{**args, **kw})


def client_level_rounds(algorithm, worker_cls=ClientWorker):
    """Runs CL_ROUNDS real rounds' halves: select (the server's select stream), plan, the
    worker's group sum of the clipped updates, `aggregate_sum` (from θ = 0)."""
    from raydpfl.simulation.seeding import SERVER, numpy_rng

    sizes = [N_RECORDS] * CL_CLIENTS
    w = worker(algorithm, sizes, worker_cls=worker_cls)
    for r in range(CL_ROUNDS):
        cohort = algorithm.select(r, CL_CLIENTS, numpy_rng(SEED, r, SERVER, "select"))
        tasks = algorithm.plan(r, cohort, np.array(sizes))
        (total,) = w.run_groups(zeros(), [tasks]) if tasks else (WeightedUpdateSum(),)
        yield r, w, tasks, algorithm.aggregate_sum(zeros(), tasks, total)


def client_level_claim(algorithm, r: int) -> float:
    """σ·S/E: the round's charged `ClientLevelCost(σ)` at sensitivity S on the sum, over the
    public denominator E (q·N or K)."""
    cost = algorithm.round_privacy_cost(r)
    return cost.noise_multiplier * algorithm.clip_norm / cost.expected_cohort


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_client_level_central_noise(sampling):
    kw = {"sampling": sampling}
    if sampling == "fixed":
        kw.update(sampling_rate=None, cohort_size=6)
    algorithm = client_level(**kw)
    rows, scales = [], []
    for r, _, _, new in client_level_rounds(algorithm):  # 8 rounds × 2,000 draws
        rows.append(flat(new))
        scales.append(client_level_claim(algorithm, r))
    check_release(Release(np.stack(rows), np.array(scales)), f"client-level central ({sampling})")


def test_client_level_distributed_noise():
    """Each client's share N(0, σ²S²/K) (fresh per client and round), and the released
    θ + Σ/K carries exactly the central N(0, σ²S²)/K."""
    k = 6
    algorithm = client_level(
        sampling="fixed", sampling_rate=None, cohort_size=k, noise="distributed"
    )
    shares, share_scales, rows, scales = [], [], [], []
    for r, w, tasks, new in client_level_rounds(algorithm):
        rows.append(flat(new))
        scales.append(client_level_claim(algorithm, r))
        for task in tasks[:3]:
            shares.append(flat(w.run_task(zeros(), task).update))  # clip(0) + share
            share_scales.append(client_level_claim(algorithm, r) * k / math.sqrt(k))
    check_release(Release(np.stack(rows), np.array(scales)), "client-level distributed sum")
    check_release(Release(np.stack(shares), np.array(share_scales)), "distributed shares")


# --------------------------------------------------------------------------------------- #
# Clipping bounds each contribution (no noise, one record per client, so the release is
# that one record's clipped contribution; raw norms from the same run with a huge bound)
# --------------------------------------------------------------------------------------- #
CLIP_CLIENTS = 12
HUGE = 1e9


def linear_with_bias() -> nn.Module:
    return nn.Linear(FEATURES, CLASSES)


def random_params() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return {n: p.detach().clone() for n, p in linear_with_bias().named_parameters()}


def one_record_releases(
    algorithm, make_tasks, read, *, engine="vmap", worker_cls=ClientWorker, clipping_wrapper=None
) -> np.ndarray:
    """`read(result, task)` of every client's task; clients hold one record each (x·30)."""
    w = worker(
        algorithm,
        [1] * CLIP_CLIENTS,
        engine=engine,
        factory=linear_with_bias,
        scale=30.0,
        worker_cls=worker_cls,
    )
    if clipping_wrapper is not None:
        w.clipping = clipping_wrapper(w.clipping)
    params = random_params()
    return np.array([read(w.run_task(params, t), t) for t in make_tasks(algorithm)])


def norm_of(update, order=2) -> float:
    return float(np.linalg.norm(flat(update), ord=order))


def dp_sgd_contributions(make, engine="vmap", clipping_wrapper=None):
    """‖released step‖/η of a one-record, q = 1, σ = 0 client: its clipped gradient."""

    def run(clip):
        algorithm = make(
            clip_norm=clip, noise_multiplier=0.0, sampling_rate=1.0, local_steps=1, lr=1.0
        )
        return one_record_releases(
            algorithm,
            lambda a: a.plan(0, list(range(CLIP_CLIENTS)), np.ones(CLIP_CLIENTS, dtype=int)),
            lambda res, t: norm_of(res.update) / t.lr,
            engine=engine,
            clipping_wrapper=clipping_wrapper,
        )

    return run(CLIP), run(HUGE)


@pytest.mark.parametrize(
    "make, engine",
    [(dp_fedavg, "vmap"), (dp_fedavg, "bookkeeping"), (fedfdp, "vmap"), (fedfdp, "bookkeeping")],
    ids=[
        "dp_fedavg-vmap",
        "dp_fedavg-bookkeeping",
        "fedfdp_fair_clip-vmap",
        "fedfdp_fair_clip-bookkeeping",
    ],
)
def test_dp_sgd_clipping_bounds_each_contribution(make, engine):
    clipped, raw = dp_sgd_contributions(make, engine)
    assert_clipped(clipped, CLIP, raw, f"DP-SGD per-sample gradient ({engine})")


@pytest.mark.parametrize("engine", ["vmap", "bookkeeping"])
def test_vectorised_clipping_bounds_each_contribution(engine):
    from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD

    data = dataset([1] * CLIP_CLIENTS, scale=30.0)
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y)
    indices = [torch.as_tensor(i) for i in data.client_train]
    trainer = MultiClientDPSGD(linear_with_bias().requires_grad_(False), engine=engine)

    def run(clip):
        gens = [torch_generator(SEED, 0, c, "train") for c in range(CLIP_CLIENTS)]
        out = trainer.run(
            random_params(),
            x,
            y,
            indices,
            gens,
            local_steps=1,
            lr=1.0,
            sampling_rate=1.0,
            clip_norm=clip,
            noise_multiplier=0.0,
        )
        return [norm_of(out.update(k)) for k in range(CLIP_CLIENTS)]

    assert_clipped(run(CLIP), CLIP, run(HUGE), f"vectorised per-sample gradient ({engine})")


@pytest.mark.parametrize("mechanism, order", [("gaussian", 2), ("laplace", 1)])
def test_dpfl_bcs_clipping_bounds_each_contribution(mechanism, order):
    """L2 (Gaussian) or L1 (Laplace) clipping at B of a one-record client's gradient."""

    def run(clip):
        algorithm = dpfl_bcs(
            mechanism,
            selection="uniform",
            n=CLIP_CLIENTS,
            clip_norm=clip,
            num_params=D + CLASSES,
            train_sizes=np.ones(CLIP_CLIENTS),
        )

        def tasks(a):
            return [
                with_release_scale(t, 0.0)
                for t in a.plan(0, list(range(CLIP_CLIENTS)), np.ones(CLIP_CLIENTS))
            ]

        return one_record_releases(
            algorithm, tasks, lambda res, t: norm_of(res.update, order) / t.lr
        )

    assert_clipped(run(BCS_CLIP), BCS_CLIP, run(HUGE), f"DPFL-BCS L{order} clipping")


def test_fedfdp_loss_clipping_bounds_each_contribution():
    """A one-record, q_l = 1, σ_l = 0 loss release is that record's clip(ℓ) ≤ C_l."""
    from raydpfl.papers.fedfdp.loss_upload import LossUpload

    upload = LossUpload(
        noise_multiplier=0.0,
        sampling_rate=1.0,
        clip_init=LOSS_CLIP,
        clip_floor=1e-3,
        clip_multiplier=1.0,
    )
    algorithm = fedfdp(loss_upload=upload)
    out = one_record_releases(
        algorithm,
        lambda a: [a.loss_upload.task(c, 0, None) for c in range(CLIP_CLIENTS)],
        lambda res, t: (res.metrics["noisy_loss"], res.metrics["raw_loss"]),
    )
    assert_clipped(out[:, 0], LOSS_CLIP, out[:, 1], "FedFDP loss clipping")


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_client_level_clipping_bounds_each_update(clipping):
    algorithm = client_level(
        sampling="fixed",
        sampling_rate=None,
        cohort_size=CLIP_CLIENTS,
        clipping=clipping,
        lr=50.0,
        batch_size=1,
    )
    bound = algorithm.clip_norm
    out = one_record_releases(
        algorithm,
        lambda a: a.plan(0, list(range(CLIP_CLIENTS)), np.ones(CLIP_CLIENTS, dtype=int)),
        lambda res, t: (
            norm_of(res.update),
            res.metrics["update_norm"],
            max(norm_of({n: v}) for n, v in res.update.items()),
        ),
    )
    assert_clipped(out[:, 0], bound, out[:, 1], f"client-level update ({clipping})")
    if clipping == "per_layer":  # S/√L per tensor (weight and bias: L = 2)
        assert out[:, 2].max() <= bound / math.sqrt(2) * (1 + 1e-5)


def test_pe_dpfl_clipping_bounds_each_update():
    def run(clip):
        algorithm = pe_dpfl(update_clip_norm=clip, lr=50.0, sampling_rate=1.0)
        return one_record_releases(
            algorithm,
            lambda a: [
                with_release_scale(t, 0.0)
                for t in a.plan(0, list(range(CLIP_CLIENTS)), np.ones(CLIP_CLIENTS))
            ],
            lambda res, t: norm_of(res.update),
        )

    assert_clipped(run(0.9), 0.9, run(HUGE), "PE-DPFL update")


# --------------------------------------------------------------------------------------- #
# Negative controls: deliberately broken mechanisms, built only here, run through the
# same drivers and the same checks, must be caught (proof that each check can fail)
# --------------------------------------------------------------------------------------- #
class SharedStreamWorker(ClientWorker):
    """Broken: every task gets the stream of (seed, round 0, client 0), so clients and
    rounds reuse one another's draws."""

    def _stream(self, task: ClientTask) -> torch.Generator:
        return torch_generator(self.run_seed, 0, 0, task.kind, device=self.device)


class NoClipping:
    """Broken: the engine ignores the weight rule (every weight 1: no clipping)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def clipped_sum(self, params, x, y, weight_rule, *, into=None):
        return self.engine.clipped_sum(
            params, x, y, lambda norms, *_: torch.ones_like(norms), into=into
        )


def weakened(task: ClientTask, factor: float) -> ClientTask:
    """`task` declaring its mechanisms with their noise scaled by `factor` (an exponential
    selection's ε divided by it)."""

    def weaken(m):
        if isinstance(m, LaplaceRelease):
            return dataclasses.replace(m, scale_multiplier=m.scale_multiplier * factor)
        if isinstance(m, ExponentialSelection):
            return dataclasses.replace(m, epsilon=m.epsilon / factor)
        return dataclasses.replace(m, noise_multiplier=m.noise_multiplier * factor)

    return dataclasses.replace(
        task, mechanisms=tuple(uses(weaken(u.mechanism), u.count) for u in task.mechanisms)
    )


class WeakenedWorker(ClientWorker):
    """Broken platform (a negative control for the noise checks, not a plug-in): the
    session draws every mechanism at a tenth of its declared noise (an exponential
    selection at ten times its ε), and the worker's receipt check is off. A plug-in cannot
    do this: its client half always gets the worker's session of the declared task
    (`tests/privacy/adversarial/`)."""

    def _client(self, task: ClientTask):
        return super()._client(weakened(task, 0.1))

    def _check_result(self, task, result, session, receipt, data) -> None:
        return None


class ReplayingWorker(ClientWorker):
    """Broken platform: each task's mechanisms rewind the client's stream to where it was
    before every Poisson sample, so all of a task's steps reuse the first step's draws."""

    def _client(self, task: ClientTask):
        data, ctx, session = super()._client(task)
        for live in session:
            if hasattr(live, "sample"):
                gen = live._generator
                state = gen.get_state()
                original = live.sample

                def sample(original=original, gen=gen, state=state):
                    gen.set_state(state)
                    return original()

                live.sample = sample
        return data, ctx, session


def test_negative_noise_scaled_by_a_tenth_is_caught():

    with pytest.raises(AssertionError, match="empirical std"):
        check_release(dpsgd_release(dp_fedavg(), worker_cls=WeakenedWorker), "broken DP-SGD")


def test_negative_laplace_scaled_by_a_tenth_is_caught():
    from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs

    with pytest.raises(AssertionError, match="empirical scale"):
        check_release(
            bcs_update_release("laplace", 2, cls=DpflBcs, worker_cls=WeakenedWorker),
            "broken Laplace",
        )
    z = bcs_loss_reports("laplace", cls=DpflBcs, worker_cls=WeakenedWorker)
    with pytest.raises(AssertionError, match="empirical scale"):
        assert_laplace(z, 1.0, "broken Laplace loss reports")


def test_negative_client_level_noise_scaled_by_a_tenth_is_caught():
    from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel

    class QuietServer(DPFedAvgClientLevel):
        def aggregate_sum(self, global_params, tasks, total):
            sigma = self.noise_multiplier
            self.noise_multiplier = sigma / 10
            if hasattr(self, "update_noise_multiplier"):
                previous, self.update_noise_multiplier = self.update_noise_multiplier, sigma / 10
            try:
                return super().aggregate_sum(global_params, tasks, total)
            finally:
                self.noise_multiplier = sigma
                if hasattr(self, "update_noise_multiplier"):
                    self.update_noise_multiplier = previous

    algorithm = client_level(cls=QuietServer)
    rows = [flat(new) for _, _, _, new in client_level_rounds(algorithm)]
    scales = [client_level_claim(algorithm, r) for r in range(CL_ROUNDS)]
    with pytest.raises(AssertionError, match="empirical std"):
        check_release(Release(np.stack(rows), np.array(scales)), "broken client-level")


def test_negative_a_greedier_selection_is_caught():
    from raydpfl.papers.rc_dpfl.algorithm import RcDpfl

    # Gumbel scale / 10 (ε × 10) under the declared charge
    choices, probs = selections(cls=RcDpfl, worker_cls=WeakenedWorker)
    with pytest.raises(AssertionError, match="category"):
        check_selections(choices, probs)


def test_negative_missing_clipping_is_caught():
    clipped, raw = dp_sgd_contributions(dp_fedavg, "vmap", clipping_wrapper=NoClipping)
    with pytest.raises(AssertionError, match="above the bound"):
        assert_clipped(clipped, CLIP, raw, "unclipped DP-SGD")


def test_negative_draws_reused_across_clients_and_rounds_are_caught():
    release = dpsgd_release(dp_fedavg(), worker_cls=SharedStreamWorker)
    assert_gaussian(release.rows / release.scale[:, None], 1.0)  # each draw alone looks fine
    with pytest.raises(AssertionError, match=r"are equal|share draws"):
        check_release(release, "shared stream")
    with pytest.raises(AssertionError, match="pairs of releases"):
        algorithm = fedfdp()
        z = loss_release(
            algorithm, fedfdp_loss_task(algorithm), "noisy_loss", worker_cls=SharedStreamWorker
        )
        assert_fresh_scalars(z, "shared stream loss upload")
    choices, probs = selections(worker_cls=SharedStreamWorker)
    with pytest.raises(AssertionError, match="pairs agree"):
        agree = int(np.sum(choices[:, 0::2] == choices[:, 1::2]))
        assert_independent_choices(agree, choices[:, 0::2].size, probs, "shared stream")


def test_negative_draws_reused_across_steps_are_caught():

    with pytest.raises(AssertionError, match=r"are equal|share draws"):
        check_release(dpsgd_release(dp_fedavg(), worker_cls=ReplayingWorker), "replayed steps")


def test_negative_a_shifted_stream_is_caught():
    """A subtler reuse: row j is row i's draws shifted by 7 positions (two streams that
    overlap with an offset); the lagged cross-correlation finds it."""
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((6, D))
    rows[4, 7:] = rows[1, :-7]
    with pytest.raises(AssertionError, match="share draws"):
        assert_fresh(rows, "shifted stream")
    assert_fresh(rng.standard_normal((6, D)), "independent rows")
