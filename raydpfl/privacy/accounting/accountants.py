"""Privacy accountants for the Poisson-subsampled Gaussian mechanism.

Mechanism. One DP-SGD step on a dataset ``D`` draws a Poisson sample (each
record independently with probability ``q``), clips every per-record gradient
to L2 norm ``C`` and releases ``sum_i clip(g_i) + N(0, (sigma * C)^2 I)``.
Under the add/remove-one-record neighbouring relation the clipped sum has L2
sensitivity ``C``, so one step is the Poisson-subsampled Gaussian mechanism
``M_{q, sigma}`` with noise multiplier ``sigma`` (noise std / sensitivity).

History. A *history* is a sequence of ``(noise_multiplier, sampling_rate,
steps)`` triples; it denotes the adaptive composition
``M_{q_1, sigma_1}^{(T_1)} o M_{q_2, sigma_2}^{(T_2)} o ...``.
:func:`compute_epsilon` returns an ``epsilon`` such that the composition is
``(epsilon, delta)``-DP for the requested ``delta``.

Accountants (all with add/remove-one adjacency):

* ``"rdp"``: opacus' Renyi-DP analysis (Mironov et al. 2019) at opacus' default
  orders ``alpha in {1.1, 1.2, ..., 10.9, 12, ..., 63}``; RDP adds under
  composition and is converted with Balle et al. 2020, Thm. 21. Upper bound.
* ``"prv"``: opacus' PRV accountant (Gopi et al. 2021), numerical composition
  of privacy-loss random variables via FFT, ``eps_error = 0.01``,
  ``delta_error = delta / 1000``; returns the certified upper end. Falls back
  to ``"rdp"`` when PRV is unreliable (see :func:`compute_epsilon`).
* ``"dp_rdp"``: dp_accounting's ``RdpAccountant`` (default orders up to 1024)
  composing ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``.
* ``"pld"``: dp_accounting's ``PLDAccountant`` (privacy-loss distributions,
  pessimistic discretisation with interval 1e-4) on the same events.

Truncated Poisson samples (``("truncated", sigma, q, B, n, steps)`` entries,
``privacy.batch_shape: fixed``) are accounted in
:mod:`raydpfl.privacy.accounting.truncation`: exactly by ``"pld"``, by a coupling bound
on the untruncated history by the others.

Results are memoised per (normalised history, delta, accountant) so that many
privacy units (clients) sharing a history cost one computation.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import math
import numbers
import types
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from raydpfl.privacy.accounting import truncation

__all__ = [
    "ACCOUNTANTS",
    "LEDGER_ACCOUNTANTS",
    "OPACUS_DEFAULT_ALPHAS",
    "PRV_MAX_DOMAIN_POINTS",
    "PRV_MAX_LOSS",
    "ExtendedEntry",
    "HistoryEntry",
    "cache_info",
    "clear_cache",
    "compute_epsilon",
    "compute_epsilon_extended",
    "describe_accountant",
    "laplace_rdp",
    "merge_history",
    "normalize_extended_history",
    "normalize_history",
    "validate_accountant",
    "validate_delta",
    "validate_ledger_accountant",
]

ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv", "dp_rdp", "pld")

HistoryEntry = tuple[float, float, int]
"""``(noise_multiplier, sampling_rate, steps)``."""

#: PRV settings (opacus defaults for ``PRVAccountant.get_epsilon``).
PRV_EPS_ERROR: float = 0.01
PRV_DELTA_ERROR_FRACTION: float = 1e-3

#: PRV is skipped (RDP bound returned) when the privacy-loss domain half-width
#: ``L`` that opacus would discretise exceeds this: the PRV formulas evaluate
#: ``exp(t)`` on ``[-L, L]`` and overflow/NaN near ``t ~ 709`` (opacus #601).
PRV_MAX_LOSS: float = 300.0
#: PRV is skipped when its FFT grid would exceed this many points (time/memory).
PRV_MAX_DOMAIN_POINTS: int = 2**22

_CACHE_SIZE = 2**16


# --------------------------------------------------------------------------- #
# Validation / normalisation
# --------------------------------------------------------------------------- #
def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def validate_accountant(accountant: str) -> str:
    """Returns ``accountant`` if it is one of :data:`ACCOUNTANTS`.

    Raises:
        ValueError: If ``accountant`` is unknown.
    """
    return _one_of(accountant, ACCOUNTANTS)


def _one_of(accountant: str, names: tuple[str, ...]) -> str:
    if not isinstance(accountant, str) or accountant not in names:
        raise ValueError(f"accountant must be one of {names}, got {accountant!r}")
    return accountant


def validate_delta(delta: float) -> float:
    """Returns ``delta`` as a float if ``0 < delta < 1``.

    Raises:
        ValueError: If ``delta`` is not a real number in the open interval (0, 1).
    """
    if not _is_real(delta) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a real number in (0, 1), got {delta!r}")
    return float(delta)


def _validate_entry(entry: object, where: str) -> HistoryEntry:
    try:
        sigma, q, steps = entry  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(
            f"{where} must be a (noise_multiplier, sampling_rate, steps) triple, got {entry!r}"
        ) from None
    if not _is_real(sigma) or not math.isfinite(float(sigma)) or float(sigma) < 0.0:
        raise ValueError(f"{where}: noise_multiplier must be a finite real >= 0, got {sigma!r}")
    if not _is_real(q) or not 0.0 <= float(q) <= 1.0:
        raise ValueError(f"{where}: sampling_rate must be a real in [0, 1], got {q!r}")
    if not _is_int(steps) or int(steps) < 0:
        raise ValueError(f"{where}: steps must be an int >= 0, got {steps!r}")
    return float(sigma), float(q), int(steps)


def merge_history(history: Iterable[HistoryEntry]) -> tuple[HistoryEntry, ...]:
    """Merges consecutive entries with identical ``(sigma, q)`` by summing steps.

    ``M^{(a)} o M^{(b)} = M^{(a+b)}`` for the same mechanism ``M``, and every
    accountant here composes per-entry quantities additively (RDP vectors,
    PLD/PRV self-convolutions), so merging does not change the result (up to
    floating-point rounding); it only makes the computation and the cache key
    smaller. Entries with ``steps == 0`` or ``q == 0`` are dropped beforehand:
    they are the identity mechanism (no record is ever touched).

    Args:
        history: Already-validated ``(sigma, q, steps)`` triples.

    Returns:
        The merged history as a tuple of triples.
    """
    merged: list[HistoryEntry] = []
    for sigma, q, steps in history:
        if steps == 0 or q == 0.0:
            continue
        if merged and merged[-1][0] == sigma and merged[-1][1] == q:
            merged[-1] = (sigma, q, merged[-1][2] + steps)
        else:
            merged.append((sigma, q, steps))
    return tuple(merged)


def normalize_history(history: Iterable[Sequence[float]]) -> tuple[HistoryEntry, ...]:
    """Validates a history and returns its merged, hashable normal form.

    Args:
        history: Iterable of ``(noise_multiplier, sampling_rate, steps)`` with
            ``noise_multiplier >= 0`` (finite), ``sampling_rate in [0, 1]`` and
            integer ``steps >= 0``.

    Returns:
        Tuple of ``(float, float, int)`` triples, see :func:`merge_history`.

    Raises:
        ValueError: If ``history`` or any entry is malformed.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise ValueError(f"history must be an iterable of triples, got {type(history).__name__}")
    entries = [_validate_entry(e, f"history[{i}]") for i, e in enumerate(history)]
    return merge_history(entries)


# --------------------------------------------------------------------------- #
# Descriptions
# --------------------------------------------------------------------------- #
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


def describe_accountant(name: str) -> str:
    """Human-readable, versioned description of an accountant (for run metadata).

    Args:
        name: One of :data:`ACCOUNTANTS`.

    Returns:
        E.g. ``"opacus 1.6.0 RDP (alphas 1.1..63)"``.

    Raises:
        ValueError: If ``name`` is unknown.
    """
    if name == "zcdp":
        return ZCDP_DESCRIPTION
    validate_accountant(name)
    if name == "rdp":
        a = _opacus_alphas()
        return f"opacus {_version('opacus')} RDP (alphas {min(a):g}..{max(a):g})"
    if name == "prv":
        return (
            f"opacus {_version('opacus')} PRV (eps_error {PRV_EPS_ERROR:g}, "
            f"delta_error delta*{PRV_DELTA_ERROR_FRACTION:g}; RDP fallback)"
        )
    if name == "dp_rdp":
        o = _dp_rdp_orders()
        return f"dp-accounting {_version('dp-accounting')} RDP (orders {min(o):g}..{max(o):g})"
    return f"dp-accounting {_version('dp-accounting')} PLD (interval 1e-4, pessimistic)"


# --------------------------------------------------------------------------- #
# opacus RDP
# --------------------------------------------------------------------------- #
#: opacus' ``RDPAccountant.DEFAULT_ALPHAS`` (pinned by a test).
OPACUS_DEFAULT_ALPHAS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
)


def _opacus_alphas() -> tuple[float, ...]:
    return OPACUS_DEFAULT_ALPHAS


def _opacus_rdp_analysis() -> types.ModuleType:
    """opacus' RDP analysis module (imported lazily: importing opacus imports torch)."""
    from opacus.accountants.analysis import rdp

    return rdp


@functools.lru_cache(maxsize=4096)
def _opacus_rdp_per_step(sigma: float, q: float) -> np.ndarray:
    vec = np.asarray(
        _opacus_rdp_analysis().compute_rdp(
            q=q, noise_multiplier=sigma, steps=1, orders=list(_opacus_alphas())
        ),
        dtype=np.float64,
    )
    vec.setflags(write=False)
    return vec


def _opacus_rdp_total(history: tuple[HistoryEntry, ...]) -> np.ndarray:
    # Same arithmetic as opacus' RDPAccountant: sum_i steps_i * rdp_1(sigma_i, q_i).
    return sum(_opacus_rdp_per_step(s, q) * n for s, q, n in history)  # type: ignore[return-value]


#: opacus warns when the best order is the grid's largest (ε is then a valid but possibly
#: loose upper bound): once per evaluation, so a run printed it hundreds of times. It goes
#: to this module's logger (INFO) instead of the terminal; other warnings pass through.
_LARGEST_ALPHA = "Optimal order is the largest alpha"
_log = logging.getLogger(__name__)


def _opacus_eps_from_rdp(rdp: np.ndarray, delta: float) -> float:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eps, _ = _opacus_rdp_analysis().get_privacy_spent(
            orders=list(_opacus_alphas()), rdp=rdp, delta=delta
        )
    for w in caught:
        if _LARGEST_ALPHA in str(w.message):
            _log.info("opacus RDP: %s (epsilon %.4g is an upper bound)", w.message, eps)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return float(eps)


def _eps_rdp(history: tuple[HistoryEntry, ...], delta: float) -> float:
    return _opacus_eps_from_rdp(_opacus_rdp_total(history), delta)


# --------------------------------------------------------------------------- #
# opacus PRV (with RDP fallback)
# --------------------------------------------------------------------------- #
def _prv_domain(history: tuple[HistoryEntry, ...], delta: float) -> tuple[float, float]:
    """Half-width ``L`` and point count of the grid opacus' PRVAccountant would use.

    Mirrors ``opacus.accountants.analysis.prv.compute_safe_domain_size`` and
    ``PRVAccountant._get_domain`` using the cached per-step RDP vectors.
    """
    delta_error = delta * PRV_DELTA_ERROR_FRACTION
    total = sum(n for _, _, n in history)
    l_max = _opacus_eps_from_rdp(_opacus_rdp_total(history), delta_error / 4)
    for sigma, q, _ in history:
        l_max = max(
            l_max,
            _opacus_eps_from_rdp(_opacus_rdp_per_step(sigma, q), delta_error / (8 * total)),
        )
    half_width = max(l_max, PRV_EPS_ERROR) + 3
    mesh = PRV_EPS_ERROR / math.sqrt(total * math.log(12 / delta_error) / 2)
    return half_width, 2 * half_width / mesh


def _eps_prv(history: tuple[HistoryEntry, ...], delta: float) -> float:
    eps_rdp = _eps_rdp(history, delta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half_width, points = _prv_domain(history, delta)
    if not (half_width <= PRV_MAX_LOSS and points <= PRV_MAX_DOMAIN_POINTS):
        warnings.warn(
            "PRV accountant unreliable for this (very weak) composed mechanism; "
            "returning the RDP upper bound instead",
            RuntimeWarning,
            stacklevel=4,
        )
        return eps_rdp
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [tuple(e) for e in history]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            eps_prv = float(
                accountant.get_epsilon(
                    delta,
                    eps_error=PRV_EPS_ERROR,
                    delta_error=delta * PRV_DELTA_ERROR_FRACTION,
                )
            )
    except Exception:  # any numerical failure (#601) -> conservative RDP fallback
        eps_prv = math.nan
    if not math.isfinite(eps_prv):
        warnings.warn(
            "PRV accountant failed numerically; returning the RDP upper bound instead",
            RuntimeWarning,
            stacklevel=4,
        )
        return eps_rdp
    # Both are valid upper bounds on the true epsilon, hence so is their minimum.
    return min(eps_prv, eps_rdp)


# --------------------------------------------------------------------------- #
# dp_accounting RDP and PLD
# --------------------------------------------------------------------------- #
def _event(sigma: float, q: float) -> Any:
    """``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``."""
    import dp_accounting

    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


@functools.cache
def _dp_rdp_orders() -> tuple[float, ...]:
    from dp_accounting.rdp import rdp_privacy_accountant

    return tuple(float(o) for o in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


@functools.lru_cache(maxsize=4096)
def _dp_rdp_per_step(sigma: float, q: float) -> np.ndarray:
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(_event(sigma, q), 1)
    vec = accountant.rdp
    vec.setflags(write=False)
    return vec


def _eps_dp_rdp(history: tuple[HistoryEntry, ...], delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant

    # Same arithmetic as RdpAccountant.compose(event, steps) for every entry.
    rdp = np.zeros(len(_dp_rdp_orders()), dtype=np.float64)
    for sigma, q, n in history:
        rdp += n * _dp_rdp_per_step(sigma, q)
    eps, _ = rdp_privacy_accountant.compute_epsilon(np.array(_dp_rdp_orders()), rdp, delta)
    return float(eps)


def _eps_pld(history: tuple[HistoryEntry, ...], delta: float) -> float:
    from dp_accounting import pld

    accountant = pld.PLDAccountant()
    for sigma, q, n in history:
        accountant.compose(_event(sigma, q), n)
    return float(accountant.get_epsilon(delta))


_BACKENDS = {"rdp": _eps_rdp, "prv": _eps_prv, "dp_rdp": _eps_dp_rdp, "pld": _eps_pld}


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compute_epsilon_cached(
    history: tuple[HistoryEntry, ...], delta: float, accountant: str
) -> float:
    if not history:
        return 0.0
    if any(sigma == 0.0 for sigma, _, _ in history):
        return math.inf
    eps = _BACKENDS[accountant](history, delta)
    if math.isnan(eps):
        return math.inf
    return max(0.0, eps)  # opacus #585: conversions can return tiny negatives.


def compute_epsilon(
    history: Iterable[Sequence[float]], delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon of a composition of Poisson-subsampled Gaussian mechanisms.

    Each entry ``(sigma, q, T)`` is ``T`` steps of the mechanism
    ``D -> sum_{x in S} f(x) + N(0, sigma^2 C^2 I)`` with ``S`` a Poisson(q)
    subsample of ``D`` and ``||f(x)||_2 <= C`` (L2 sensitivity ``C`` under the
    add/remove-one-record relation). The returned ``epsilon`` makes the whole
    (adaptive) composition ``(epsilon, delta)``-DP w.r.t. that relation.

    Conventions: entries with ``T == 0`` or ``q == 0`` contribute nothing; an
    empty history gives ``0.0``; any entry with ``sigma == 0`` (and ``q > 0``,
    ``T > 0``) gives ``math.inf``. Negative library outputs are clamped to 0.
    Consecutive entries with equal ``(sigma, q)`` are merged first (this does
    not change the result, see :func:`merge_history`).

    ``"prv"`` caveat: opacus' PRV accountant can overflow, return ``inf``/NaN,
    raise, or take very long for weak mechanisms (huge epsilon; opacus #601).
    If the discretisation domain it would need has half-width
    > :data:`PRV_MAX_LOSS` or more than :data:`PRV_MAX_DOMAIN_POINTS` points, or
    if PRV fails, the opacus RDP value (a valid upper bound) is returned
    instead with a ``RuntimeWarning``. Otherwise ``min(PRV upper bound, RDP)``
    is returned; both are upper bounds, so the result never under-reports.

    Args:
        history: Iterable of ``(noise_multiplier, sampling_rate, steps)``.
        delta: Target delta in (0, 1).
        accountant: One of :data:`ACCOUNTANTS`.

    Returns:
        Epsilon >= 0 (possibly ``math.inf``). Memoised on the normalised inputs.

    Raises:
        ValueError: On malformed history, delta or accountant.
    """
    validate_accountant(accountant)
    delta = validate_delta(delta)
    return _compute_epsilon_cached(normalize_history(history), delta, accountant)


def cache_info() -> functools._CacheInfo:
    """Statistics of the memoisation cache of :func:`compute_epsilon`."""
    return _compute_epsilon_cached.cache_info()


def clear_cache() -> None:
    """Clears all memoisation caches of this module."""
    _compute_epsilon_cached.cache_clear()
    _extended_cached.cache_clear()
    _opacus_rdp_per_step.cache_clear()
    _dp_rdp_per_step.cache_clear()


# --------------------------------------------------------------------------- #
# Beyond the subsampled Gaussian (DPFL-BCS, issue 6): Laplace releases, releases
# declared (epsilon, delta)-DP, and a zCDP accountant. Gaussian histories keep the
# exact code path above, so existing results are unchanged.
# --------------------------------------------------------------------------- #
#: Accountants a ledger accepts: the four above plus ``"zcdp"``.
LEDGER_ACCOUNTANTS: tuple[str, ...] = (*ACCOUNTANTS, "zcdp")

ZCDP_DESCRIPTION = (
    "zCDP (Bun & Steinke 2016): full-batch Gaussian rho = 1/(2 sigma^2) per step, Laplace "
    "rho = eps^2/2 per release; rho adds; eps = rho + 2 sqrt(rho ln(1/delta))"
)

ExtendedEntry = tuple[Any, ...]
"""A history entry: ``(sigma, q, steps)`` (subsampled Gaussian, as above),
``("laplace", scale_over_l1_sensitivity, steps)`` (pure ``1/scale``-DP per step) or
``("approx_dp", epsilon, delta, steps)`` (a release declared ``(epsilon, delta)``-DP per step,
e.g. a Gaussian calibrated by a closed form; composed by basic composition)."""


def validate_ledger_accountant(accountant: str) -> str:
    """Returns ``accountant`` if it is one of :data:`LEDGER_ACCOUNTANTS`.

    Raises:
        ValueError: If ``accountant`` is unknown.
    """
    return _one_of(accountant, LEDGER_ACCOUNTANTS)


def _validate_extended_entry(entry: object, where: str) -> ExtendedEntry:
    if isinstance(entry, tuple | list) and entry and isinstance(entry[0], str):
        kind = entry[0]
        if kind == "laplace" and len(entry) == 3:
            _, scale, steps = entry
            if not _is_real(scale) or not math.isfinite(float(scale)) or float(scale) < 0.0:
                raise ValueError(f"{where}: Laplace scale must be a finite real >= 0")
            if not _is_int(steps) or int(steps) < 0:
                raise ValueError(f"{where}: steps must be an int >= 0, got {steps!r}")
            return ("laplace", float(scale), int(steps))
        if kind == "approx_dp" and len(entry) == 4:
            _, eps, delta, steps = entry
            if not _is_real(eps) or not math.isfinite(float(eps)) or float(eps) < 0.0:
                raise ValueError(f"{where}: epsilon must be a finite real >= 0")
            if not _is_real(delta) or not 0.0 <= float(delta) < 1.0:
                raise ValueError(f"{where}: delta must be a real in [0, 1)")
            if not _is_int(steps) or int(steps) < 0:
                raise ValueError(f"{where}: steps must be an int >= 0, got {steps!r}")
            return ("approx_dp", float(eps), float(delta), int(steps))
        if kind == "truncated" and len(entry) == 6:
            _, sigma, q, cap, n, steps = entry
            sigma, q, steps = _validate_entry((sigma, q, steps), where)
            for name, v in (("max_batch_size", cap), ("dataset_size", n)):
                if not _is_int(v) or int(v) < 1:
                    raise ValueError(f"{where}: {name} must be an int >= 1, got {v!r}")
            return ("truncated", sigma, q, int(cap), int(n), steps)
        raise ValueError(f"{where}: unknown history entry {entry!r}")
    return _validate_entry(entry, where)


def normalize_extended_history(history: Iterable[Sequence[Any]]) -> tuple[ExtendedEntry, ...]:
    """Validates an extended history; merges consecutive equal entries (summing steps) and
    drops entries that touch no record (``steps == 0``, or ``q == 0`` for the Gaussian)."""
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise ValueError(f"history must be an iterable of entries, got {type(history).__name__}")
    merged: list[ExtendedEntry] = []
    for i, e in enumerate(history):
        entry = _validate_extended_entry(e, f"history[{i}]")
        no_records = (not isinstance(entry[0], str) and entry[1] == 0.0) or (
            entry[0] == "truncated" and entry[2] == 0.0
        )
        if entry[-1] == 0 or no_records:
            continue
        if merged and merged[-1][:-1] == entry[:-1]:
            merged[-1] = (*entry[:-1], merged[-1][-1] + entry[-1])
        else:
            merged.append(entry)
    return tuple(merged)


def laplace_rdp(scale: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of one Laplace release with scale ``b`` (L1 sensitivity 1) at orders ``alpha > 1``.

    Mironov (2017), Prop. 6: ``eps(alpha) = log(alpha/(2alpha-1) e^{(alpha-1)/b} +
    (alpha-1)/(2alpha-1) e^{-alpha/b}) / (alpha-1)``, evaluated in log space.
    """
    a = np.asarray(orders, dtype=np.float64)
    if np.any(a <= 1):
        raise ValueError("orders must be > 1")
    if scale <= 0:
        return np.full(a.shape, np.inf)
    terms = np.stack(
        [np.log(a / (2 * a - 1)) + (a - 1) / scale, np.log((a - 1) / (2 * a - 1)) - a / scale]
    )
    return np.logaddexp(terms[0], terms[1]) / (a - 1)


def _zcdp_rho(gauss: Sequence[HistoryEntry], lap: Sequence[tuple[float, int]]) -> float:
    rho = 0.0
    for sigma, q, n in gauss:
        if q != 1.0:
            raise ValueError(
                "the zcdp accountant has no subsampling amplification: it accounts only "
                f"full-batch Gaussian steps (sampling_rate 1), got sampling_rate {q}"
            )
        rho += n / (2.0 * sigma**2)
    for scale, n in lap:
        rho += n * 0.5 / scale**2  # pure eps-DP implies eps^2/2-zCDP (Bun & Steinke, Prop 1.4)
    return rho


def _mixed_epsilon(
    gauss: tuple[HistoryEntry, ...], lap: tuple[tuple[float, int], ...], delta: float, acc: str
) -> float:
    """Epsilon at ``delta > 0`` of Gaussian steps composed with Laplace releases."""
    if acc == "zcdp":
        rho = _zcdp_rho(gauss, lap)
        return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    if not lap:
        return _compute_epsilon_cached(gauss, delta, acc)
    if acc == "rdp":
        alphas = _opacus_alphas()
        vec = np.zeros(len(alphas), dtype=np.float64)
        if gauss:
            vec = vec + _opacus_rdp_total(gauss)
        for scale, n in lap:
            vec = vec + n * laplace_rdp(scale, alphas)
        return _opacus_eps_from_rdp(vec, delta)
    if acc in ("dp_rdp", "pld"):
        import dp_accounting
        from dp_accounting import pld
        from dp_accounting.rdp import RdpAccountant

        accountant = RdpAccountant() if acc == "dp_rdp" else pld.PLDAccountant()
        for sigma, q, n in gauss:
            accountant.compose(_event(sigma, q), n)
        for scale, n in lap:
            accountant.compose(dp_accounting.LaplaceDpEvent(scale), n)
        return float(accountant.get_epsilon(delta))
    raise ValueError(
        f"the {acc!r} accountant cannot account the Laplace mechanism; use rdp, dp_rdp, pld "
        "or zcdp"
    )


def _with_truncated(history: tuple[ExtendedEntry, ...], delta: float, accountant: str) -> float:
    """ε of a history with truncated Poisson steps (`truncation`'s module docstring): the
    PLD accountant composes dp-accounting's truncated events; the others bound the
    untruncated history's ε by the coupling argument."""
    if accountant == "zcdp":
        raise ValueError(
            "the zcdp accountant has no subsampling amplification, truncated or not; use "
            "rdp, dp_rdp, prv or pld with privacy.batch_shape: fixed"
        )
    if any(e[0] == "approx_dp" for e in history):
        # basic composition with the declared releases, as for every other history
        rest = tuple(e for e in history if e[0] != "approx_dp")
        eps_declared = sum(e[1] * e[3] for e in history if e[0] == "approx_dp")
        delta_declared = sum(e[2] * e[3] for e in history if e[0] == "approx_dp")
        if delta_declared >= delta:
            return math.inf
        return _with_truncated(rest, delta - delta_declared, accountant) + eps_declared
    truncated = tuple(e[1:] for e in history if e[0] == "truncated")
    gauss = tuple(e for e in history if not isinstance(e[0], str))
    lap = tuple((e[1], e[2]) for e in history if e[0] == "laplace")
    if any(s == 0.0 for s, _, _ in gauss) or any(t[0] == 0.0 for t in truncated):
        return math.inf
    if any(b == 0.0 for b, _ in lap):
        return math.inf
    if accountant == "pld":
        return max(0.0, truncation.pld_epsilon(gauss, lap, truncated, delta))
    # The untruncated history, in charge order: each truncated step as its Poisson step.
    plain = tuple(
        (e[1], e[2], e[5]) if e[0] == "truncated" else e for e in history if e[0] != "approx_dp"
    )
    mass = sum(
        steps * truncation.truncation_probability(n, q, cap) for _, q, cap, n, steps in truncated
    )
    return truncation.coupling_epsilon(
        lambda d: _extended_cached(normalize_extended_history(plain), d, accountant), mass, delta
    )


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _extended_cached(history: tuple[ExtendedEntry, ...], delta: float, accountant: str) -> float:
    if any(e[0] == "truncated" for e in history):
        return _with_truncated(history, delta, accountant)
    gauss = tuple(e for e in history if not isinstance(e[0], str))
    lap = tuple((e[1], e[2]) for e in history if e[0] == "laplace")
    eps_declared = sum(e[1] * e[3] for e in history if e[0] == "approx_dp")
    delta_declared = sum(e[2] * e[3] for e in history if e[0] == "approx_dp")
    if not history:
        return 0.0
    if accountant == "prv" and lap:
        _mixed_epsilon(gauss, lap, 0.5, accountant)  # raises the clear error
    if any(s == 0.0 for s, _, _ in gauss) or any(b == 0.0 for b, _ in lap):
        return math.inf
    if delta_declared > delta:
        return math.inf  # basic composition cannot certify this delta
    rest = delta - delta_declared
    # Pure epsilon of the Laplace releases by basic composition (delta 0): always valid.
    pure = sum(n / b for b, n in lap) if not gauss else math.inf
    if not gauss and not lap:
        composed = 0.0
    elif rest <= 0.0:
        composed = pure
    else:
        acc = _mixed_epsilon(gauss, lap, rest, accountant)
        composed = min(math.inf if math.isnan(acc) else max(0.0, acc), pure)
    return composed + eps_declared


def compute_epsilon_extended(
    history: Iterable[Sequence[Any]], delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` of a composition that may mix Gaussian, Laplace and declared
    ``(epsilon, delta)`` releases (entries: see :data:`ExtendedEntry`).

    The declared releases are composed by basic composition (their epsilons and deltas add)
    and then with the rest by basic composition again: the Gaussian and Laplace steps are
    accounted by ``accountant`` at the remaining ``delta - sum(declared deltas)``. A Laplace-
    only history returns ``min(accountant, sum of 1/scale)`` (both valid; the second is the
    pure-DP basic composition, also the answer at ``delta == 0``). A purely Gaussian history
    gives exactly :func:`compute_epsilon`. Unlike it, ``delta`` may be 0 (pure-DP clients).

    Raises:
        ValueError: On a malformed history, a ``delta`` outside [0, 1), an unknown
            accountant, a Laplace entry for ``"prv"`` (opacus' PRV has no Laplace), or a
            subsampled Gaussian for ``"zcdp"`` (no amplification there).
    """
    validate_ledger_accountant(accountant)
    if not _is_real(delta) or not 0.0 <= float(delta) < 1.0:
        raise ValueError(f"delta must be a real number in [0, 1), got {delta!r}")
    return _extended_cached(normalize_extended_history(history), float(delta), accountant)
