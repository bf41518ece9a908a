"""The privacy kernel: mechanisms that own their noise and their charge, and receipts.

Every randomised release about a client's records goes through a *mechanism* object of
this module (record level, drawn on the workers) or of
`raydpfl.privacy.mechanisms.client_level_mechanisms` (client level, drawn by the server
half through the round's `PopulationSession`). A mechanism is a small frozen value (its σ,
its bound, its sampling rate) with two faces that cannot drift apart, because both read the
same fields:

- `Mechanism.cost` — the ledger's event for ``n`` invocations (a `PrivacyCost`, the
  vocabulary of `raydpfl.privacy.accounting.ledger`, like dp-accounting's DpEvents);
- the *live* mechanism a worker hands the client half (`PrivacySession.get`), which draws
  the noise at exactly those parameters and counts each invocation.

The server half of an algorithm declares which mechanisms a task uses and how often
(`ClientTask.mechanisms`, a tuple of `MechanismUse`); the server charges exactly those
events before dispatch. The worker builds a `PrivacySession` from that declaration, the
client half draws every noisy release through it, and the result carries the session's
`Receipt` (which mechanism, how many invocations). The server refuses a result whose
receipt differs from what was charged (`check_receipt`), so σ, C and q cannot be stated
in one place and used in another, and a release cannot be made more often than it was
paid for. What this cannot see is code that releases data without any mechanism at all
(e.g. a plug-in returning raw records in its metrics); see README "What the platform
guarantees".

Mechanisms (unit: one record of one client, add/remove adjacency, unless said):
- `SubsampledGaussian(σ, C, q)` — one invocation = one Poisson(q) sample of the client's
  records and one Gaussian release of a sum bounded by C, noise std σ·C: a DP-SGD step
  or a noisy loss query. Charged ``PrivacyCost(σ, q, n)``. Under ``privacy.batch_shape:
  fixed`` the platform stamps the run's cap B and the client's |D| on it
  (`SubsampledGaussian.with_batch_shape`): the sample is truncated to B records by a
  uniformly random subset and the charge is the truncated event
  (`raydpfl.privacy.accounting.truncation`), or plain when B ≥ |D| + 1.
- `GaussianRelease(σ, Δ)` — one release of a vector of L2 sensitivity Δ (no
  subsampling), noise std σ·Δ. Charged ``PrivacyCost(σ, 1, n)``.
- `CertifiedGaussianRelease(σ, Δ, ε, δ)` — a Gaussian release whose σ certifies (ε, δ)
  per invocation (checked against the analytic Gaussian mechanism at construction),
  charged as that (ε, δ) (``approx_dp``).
- `ExponentialSelection(ε)` — one private choice (exponential mechanism, Gumbel noise),
  ε-DP; charged as RC-DPFL accounts it, ``PrivacyCost(2/ε, 1, n)``.
- `LaplaceRelease(b, Δ₁)` — i.i.d. Laplace noise of scale b·Δ₁ on a vector of L1
  sensitivity Δ₁, pure (1/b)-DP per invocation. Charged ``PrivacyCost(b, 1, n, "laplace")``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl.privacy.accounting._checks import _non_negative, _positive
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.accounting.single_release import gaussian_sigma_analytic
from raydpfl.privacy.mechanisms import full_batch
from raydpfl.privacy.mechanisms.loss_query import LossPrecision, private_mean_loss
from raydpfl.privacy.noise import secure_noise
from raydpfl.privacy.per_sample.dpsgd import (
    StepStats,
    WeightRule,
    add_gaussian_noise,
    dp_sgd_gradient,
    dp_sgd_step_,
    poisson_sample,
    standard_normal_like,
    truncate_sample,
)

Params = dict[str, torch.Tensor]

__all__ = [
    "CertifiedGaussianRelease",
    "ClientRecords",
    "ExponentialSelection",
    "GaussianRelease",
    "LaplaceRelease",
    "Mechanism",
    "MechanismTypeError",
    "MechanismUse",
    "PrivacyContractError",
    "PrivacySession",
    "Receipt",
    "ReleasedMean",
    "ReleasedStepStats",
    "SampledBatch",
    "SubsampledGaussian",
    "check_receipt",
    "costs_of",
    "dp_event",
    "kernel_cost",
    "laplace_noise",
    "per_sample_losses",
    "uses",
]


class PrivacyContractError(ValueError):
    """A task released something other than what was charged, or used a mechanism it
    did not declare. The run stops: what was released is not what the ledger says."""


def _set_reals(mechanism: Mechanism, *names: str, strict: bool = False) -> None:
    """Checks each named field of a frozen mechanism and stores it as a float."""
    check = _positive if strict else _non_negative  # `raydpfl.privacy.accounting._checks`
    for name in names:
        object.__setattr__(mechanism, name, check(getattr(mechanism, name), name))


# --------------------------------------------------------------------------------------- #
# Mechanisms: parameters + the event they cost
# --------------------------------------------------------------------------------------- #
#: The modules whose classes may subclass `Mechanism`: the kernel's own. Each seals itself
#: when its definitions are done (`_seal`), so a class defined later, in a plug-in or in a
#: class body that claims one of these module names, is refused.
_KERNEL_MODULES = (
    "raydpfl.privacy.mechanisms.kernel",
    "raydpfl.privacy.mechanisms.client_level_mechanisms",
)
_SEALED_MODULES: set[str] = set()
#: The kernel's mechanism types, by exact type: the only ones a declaration may hold.
_KERNEL_TYPES: set[type] = set()


def _seal(module: str) -> None:
    """Ends the definitions of kernel module `module`: no further mechanism type may claim it."""
    _SEALED_MODULES.add(module)


class MechanismTypeError(PrivacyContractError):
    """A mechanism type that is not the kernel's own (a subclass, or a look-alike)."""


@dataclass(frozen=True)
class Mechanism:
    """A randomised release with its parameters. The kernel's mechanisms are final types:
    frozen dataclasses whose fields are all the parameters both the noise and the charge
    read. A subclass made outside the kernel is refused when it is defined (it could state
    its own cost), and the ledger reads a cost from the kernel type's own code
    (`kernel_cost`), never from an attribute of the instance."""

    kind: ClassVar[str] = "mechanism"
    #: True for a client-level mechanism (`raydpfl.privacy.mechanisms.client_level_mechanisms`):
    #: charged to the run's population ledger once per round, never to a client's ledger
    #: (`costs_of` leaves it out of a task's charge).
    population_level: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        module = cls.__module__
        if module not in _KERNEL_MODULES or module in _SEALED_MODULES:
            base = next((b.__name__ for b in cls.__mro__[1:] if b in _KERNEL_TYPES), "Mechanism")
            raise MechanismTypeError(
                f"mechanism {cls.__qualname__} subclasses the kernel's {base}: mechanisms are "
                "the kernel's own final types (their cost is computed by the kernel); build "
                f"{base}(...) with your parameters instead"
            )
        _KERNEL_TYPES.add(cls)

    def cost(self, invocations: int) -> PrivacyCost:
        """The ledger event of `invocations` uses of this mechanism (a view of
        `kernel_cost`, which is what the ledger reads)."""
        raise NotImplementedError

    def live(self, generator: torch.Generator, device: torch.device) -> LiveMechanism:
        """The worker-side object that draws this mechanism's noise and counts its uses."""
        raise NotImplementedError

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v:g}" for k, v in self.__dict__.items() if v is not None)
        return f"{self.kind}({fields})"

    def _answers(self, requested: Mechanism) -> bool:
        """Whether this declared (and platform-stamped) mechanism is the one a client half
        asks for by value (`PrivacySession.get`)."""
        return self == requested


@dataclass(frozen=True)
class SubsampledGaussian(Mechanism):
    """Poisson(q) subsampling, a sum of contributions each bounded by C in L2, plus
    N(0, σ²C²): a DP-SGD step (Abadi et al. 2016) or a noisy loss query (FedFDP Eq. 14).
    ``clip_norm`` 0 releases pure noise scaled by 0 (a clipped loss bound of 0)."""

    kind: ClassVar[str] = "subsampled_gaussian"
    noise_multiplier: float
    clip_norm: float
    sampling_rate: float
    #: The run's cap B on a sample (``privacy.batch_shape: fixed``), stamped by the
    #: platform before the charge with the client's |D| (`with_batch_shape`): the sample
    #: is then truncated to B records (`dpsgd.truncate_sample`) and the charge is the
    #: truncated event. None: plain Poisson (the default).
    max_batch_size: int | None = None
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier", "clip_norm", "sampling_rate")
        if self.sampling_rate > 1:
            raise ValueError(f"sampling_rate must be in [0, 1], got {self.sampling_rate}")
        cap, n = self.max_batch_size, self.dataset_size
        if (cap is None) != (n is None):
            raise ValueError("max_batch_size and dataset_size are set together (or neither)")
        for name, v in (("max_batch_size", cap), ("dataset_size", n)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")

    @property
    def noise_std(self) -> float:
        """σ·C, the std of the Gaussian added to the clipped sum."""
        return self.noise_multiplier * self.clip_norm

    @property
    def truncates(self) -> bool:
        """Whether a sample can be truncated: a cap below |D| + 1 (either dataset of an
        adjacent pair around the client's |D| can then be sampled over the cap)."""
        cap, n = self.max_batch_size, self.dataset_size
        return cap is not None and n is not None and cap < n + 1

    def cost(self, invocations: int) -> PrivacyCost:
        if not self.truncates:  # no cap, or one no sample can reach: the Poisson event
            return PrivacyCost(self.noise_multiplier, self.sampling_rate, invocations)
        return PrivacyCost(
            self.noise_multiplier,
            self.sampling_rate,
            invocations,
            "truncated_subsampled_gaussian",
            max_batch_size=self.max_batch_size,
            dataset_size=self.dataset_size,
        )

    def with_batch_shape(self, max_batch_size: int, dataset_size: int) -> SubsampledGaussian:
        """This mechanism at the run's cap for a client of `dataset_size` records (the
        platform's stamp, before the charge)."""
        return dataclasses.replace(self, max_batch_size=max_batch_size, dataset_size=dataset_size)

    def _answers(self, requested: Mechanism) -> bool:
        # A client half asks for the mechanism it declared, before the platform stamped
        # the run's batch shape on it.
        if self == requested:
            return True
        return (
            type(requested) is SubsampledGaussian
            and requested.max_batch_size is None
            and self.max_batch_size is not None
            and requested.with_batch_shape(self.max_batch_size, self.dataset_size) == self  # type: ignore[arg-type]
        )

    def live(self, generator: torch.Generator, device: torch.device) -> LiveSubsampledGaussian:
        return LiveSubsampledGaussian(self, generator, device)


@dataclass(frozen=True)
class GaussianRelease(Mechanism):
    """N(0, (σΔ)²) on every coordinate of one vector of L2 sensitivity Δ (full batch,
    no amplification): PE-DPFL's output perturbation (Δ = 2C), DPFL-BCS's full-batch
    step and its stage-1 loss reports."""

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float
    sensitivity: float

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier", "sensitivity")

    @property
    def noise_std(self) -> float:
        """σ·Δ."""
        return self.noise_multiplier * self.sensitivity

    def cost(self, invocations: int) -> PrivacyCost:
        return PrivacyCost(self.noise_multiplier, 1.0, invocations)

    def live(self, generator: torch.Generator, device: torch.device) -> LiveRelease:
        return LiveRelease(self, generator, device)


@dataclass(frozen=True)
class CertifiedGaussianRelease(GaussianRelease):
    """A `GaussianRelease` charged as the (ε, δ) its σ certifies per invocation (DPFL-BCS
    ``paper_alg2``). σ must be at least the analytic Gaussian mechanism's σ for (ε, δ)
    (Balle & Wang 2018), checked here, so the charge cannot claim more than the noise
    delivers."""

    kind: ClassVar[str] = "certified_gaussian"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _set_reals(self, "epsilon", "delta", strict=True)
        eps, delta = self.epsilon, self.delta
        if delta >= 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        needed = gaussian_sigma_analytic(1.0, eps, delta)
        if self.noise_multiplier < needed * (1 - 1e-9):
            raise ValueError(
                f"noise_multiplier {self.noise_multiplier:.6g} does not certify "
                f"({eps:g}, {delta:g})-DP: the analytic Gaussian mechanism needs >= {needed:.6g}"
            )

    def cost(self, invocations: int) -> PrivacyCost:
        return PrivacyCost(
            self.noise_multiplier,
            1.0,
            invocations,
            "approx_dp",
            epsilon=self.epsilon,
            delta=self.delta,
        )


@dataclass(frozen=True)
class LaplaceRelease(Mechanism):
    """Laplace(0, b·Δ₁) on every coordinate of one vector of L1 sensitivity Δ₁: pure
    (1/b)-DP per invocation (Dwork & Roth, Thm 3.6). ``scale_multiplier`` is b."""

    kind: ClassVar[str] = "laplace"
    scale_multiplier: float
    sensitivity: float

    def __post_init__(self) -> None:
        _set_reals(self, "scale_multiplier", strict=True)
        _set_reals(self, "sensitivity")

    @property
    def noise_scale(self) -> float:
        """b·Δ₁."""
        return self.scale_multiplier * self.sensitivity

    def cost(self, invocations: int) -> PrivacyCost:
        return PrivacyCost(self.scale_multiplier, 1.0, invocations, "laplace")

    def live(self, generator: torch.Generator, device: torch.device) -> LiveRelease:
        return LiveRelease(self, generator, device)


@dataclass(frozen=True)
class ExponentialSelection(Mechanism):
    """One private choice among candidates by the exponential mechanism with Gumbel
    noise of scale 2Δ/ε on scores of sensitivity Δ (RC-DPFL §5.4: a client reports the
    cluster whose model is most accurate on its records). ε-DP per invocation; charged
    as RC-DPFL's accounting does, ``PrivacyCost(2/ε, 1, n)``: the Gaussian mechanism of
    multiplier 2/ε has the same RDP curve α·ε²/8 as the exponential mechanism (valid for
    RDP accounting only)."""

    kind: ClassVar[str] = "exponential_selection"
    epsilon: float

    def __post_init__(self) -> None:
        _set_reals(self, "epsilon", strict=True)

    def cost(self, invocations: int) -> PrivacyCost:
        return PrivacyCost(2.0 / self.epsilon, 1.0, invocations)

    def live(self, generator: torch.Generator, device: torch.device) -> LiveSelection:
        return LiveSelection(self, generator, device)


# --------------------------------------------------------------------------------------- #
# Declarations and receipts
# --------------------------------------------------------------------------------------- #
@dataclass(frozen=True)
class MechanismUse:
    """`count` invocations of `mechanism`, in a task's declaration or in its receipt."""

    mechanism: Mechanism
    count: int

    def __post_init__(self) -> None:
        if type(self.mechanism) not in _KERNEL_TYPES:
            raise MechanismTypeError(
                "a mechanism use needs one of the kernel's mechanism types "
                f"({', '.join(sorted(t.__name__ for t in _KERNEL_TYPES))}), got "
                f"{type(self.mechanism).__qualname__}"
            )
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"a mechanism's count must be an int >= 0, got {self.count!r}")

    @property
    def cost(self) -> PrivacyCost:
        """The ledger event this use costs (`kernel_cost`)."""
        return kernel_cost(self.mechanism, self.count)

    def describe(self) -> str:
        return f"{self.count} x {self.mechanism.describe()}"


def kernel_cost(mechanism: Mechanism, invocations: int) -> Any:
    """The ledger event of `invocations` uses of `mechanism`, computed by the kernel type's
    own code from its fields: ``type(m).cost``, never an attribute set on the instance, and
    only for the kernel's own types (a subclass cannot exist; a look-alike is refused)."""
    kind = type(mechanism)
    if kind not in _KERNEL_TYPES:
        raise MechanismTypeError(
            f"{kind.__qualname__} is not one of the kernel's mechanism types; its cost "
            "cannot be computed by the kernel"
        )
    return kind.cost(mechanism, invocations)


def dp_event(use: MechanismUse) -> Any:
    """The dp-accounting ``DpEvent`` a declared use costs (`kernel_cost`'s event, typed):
    what a reviewer composes with dp-accounting's own accountants to check a ledger.
    None for a population-level share (charged with its round)."""
    cost = use.cost
    return None if cost is None else cost.dp_event()


def uses(mechanism: Mechanism, count: int = 1) -> MechanismUse:
    """`count` invocations of `mechanism` (what a task declares)."""
    return MechanismUse(mechanism, count)


def costs_of(declared: Sequence[MechanismUse]) -> tuple[PrivacyCost, ...]:
    """The per-client ledger events of a declaration, in order. A population-level
    mechanism (a client's share of a client-level sum) is charged with its round, to the
    population ledger, so it is not among them."""
    return tuple(u.cost for u in declared if not u.mechanism.population_level)


@dataclass(frozen=True)
class Receipt:
    """What a client half actually invoked: one entry per declared mechanism, in the
    declaration's order, with its count (0 if never used)."""

    uses: tuple[MechanismUse, ...]
    #: What the platform handed the client half un-noised (the run lists each in its
    #: ``unaccounted_releases``).
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(u.describe() for u in self.uses) or "no mechanism"


def _describe(declared: Sequence[MechanismUse]) -> str:
    return "; ".join(u.describe() for u in declared) or "no mechanism"


def _totals(entries: Sequence[MechanismUse]) -> dict[Mechanism, int]:
    """Invocations per distinct mechanism (a mechanism declared in two entries is one)."""
    out: dict[Mechanism, int] = {}
    for u in entries:
        out[u.mechanism] = out.get(u.mechanism, 0) + u.count
    return out


def check_receipt(
    client_id: int,
    round_idx: int,
    kind: str,
    declared: Sequence[MechanismUse],
    receipt: Receipt | None,
) -> None:
    """Raises `PrivacyContractError` unless `receipt` shows exactly the declared uses.

    A task that declares nothing must come back with an empty receipt (or none, from an
    algorithm that never opened a session); one that declares something must come back
    with a receipt, since every charged release is drawn through the session.
    """
    got = () if receipt is None else tuple(u for u in receipt.uses if u.count)
    want = tuple(u for u in declared if u.count)
    if _totals(got) != _totals(want):
        raise PrivacyContractError(
            f"client {client_id}, round {round_idx + 1} ({kind} task): charged "
            f"{_describe(want)} but the client half used {_describe(got)}; "
            "the run stops because what was released is not what the ledger charged"
        )


# --------------------------------------------------------------------------------------- #
# The worker side: the client's records, live mechanisms and the session
# --------------------------------------------------------------------------------------- #
#: What the platform lists in a run's ``unaccounted_releases`` when it hands the client
#: half something un-noised (`PrivacySession._note`; the receipt carries the notes).
RAW_RECORDS_NOTE = (
    "raw_record_access (the client half read its training records directly through "
    "ClientData.batch/records; what it derives from them and returns outside a mechanism "
    "is released unchecked)"
)
BATCH_SIZE_NOTE = (
    "realised_poisson_batch_size (the client half read the size of a Poisson sample: "
    "data-dependent, not covered by the sampled Gaussian accounting)"
)
STEP_STATS_NOTE = (
    "dp_sgd_step_statistics (each step's realised batch size, clipped fraction and mean "
    "per-sample gradient norm, un-noised, read by the client half)"
)
BATCH_LOSS_NOTE = (
    "sampled_batch_loss (the un-noised mean loss of a Poisson batch, "
    "LiveSubsampledGaussian.batch_loss)"
)
RESULT_WEIGHT_NOTE = (
    "client_result_weight (an aggregation weight other than 0, 1 or the client's record "
    "count, returned by the client half outside a mechanism)"
)
AFTER_STEP_LOSS_NOTE = (
    "full_batch_loss_after_clean_step (a loss report evaluated at the local model after the "
    "un-noised step: a data-dependent point, so its Theta/n sensitivity is assumed, not proven)"
)
RAW_LOSSES_NOTE = "loss_query_raw_losses (the un-noised per-sample losses of a loss-query batch)"
UNBOUNDED_NOTE = (
    "unbounded_weight_rule (a run-level setting turned the per-sample bound check off: "
    "contributions above C were possible, so the run is NOT DIFFERENTIALLY PRIVATE)"
)


#: The attribute the experiment builder sets on an algorithm for the run-level opt-out of
#: the per-sample bound check (FedFDP's ``clip_mode: paper`` with ``allow_not_dp``). Workers
#: and the server read it once, when they are built, and the server lists `UNBOUNDED_NOTE`.
UNBOUNDED_WEIGHT_RULES = "_run_allows_unbounded_weight_rules"


def _weight_rule_note(rule: object) -> str:
    name = getattr(rule, "__qualname__", type(rule).__qualname__)
    return (
        f"per_sample_weight_rule {name} (algorithm code that saw every sampled record's "
        "un-noised gradient norm, and loss if it asked for it)"
    )


def _probe_note(fn: object) -> str:
    fn = getattr(fn, "func", fn)  # a functools.partial names its function
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"raw_batch_probe {name} (algorithm code that read a sampled batch's records)"


class ClientRecords:
    """A client's training records as the platform holds them: the worker's resident pool
    and the client's rows in it. Only the platform gathers them (`_gather`); the client
    half sees `num_examples`, and records only through the private step, the noisy loss
    query, evaluation, or `ClientData`'s raw accessors (which the platform lists)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor) -> None:
        self._x, self._y, self._indices = x, y, indices

    @property
    def num_examples(self) -> int:
        """|D_i| (public: the run lists the clients' dataset sizes)."""
        return int(self._indices.numel())

    @property
    def device(self) -> torch.device:
        """Where the records live."""
        return self._indices.device

    def _gather(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._indices[positions]
        return self._x[rows], self._y[rows]

    def _gather_all(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every record of the client, in order (the platform's full-batch releases)."""
        return self._gather(torch.arange(self.num_examples, device=self.device))


class LiveMechanism:
    """A declared mechanism on a worker: it draws the noise and counts invocations. Its
    stream and session are the platform's (underscored: not the public API)."""

    def __init__(self, mechanism: Mechanism, generator: torch.Generator, device: torch.device):
        self.mechanism = mechanism
        self._generator = generator
        self.device = device
        self.count = 0
        self._session: PrivacySession | None = None

    def _note(self, what: str) -> None:
        if self._session is not None:
            self._session._note(what)

    def _bound(self) -> PrivacySession:
        """The session, bound by the worker to the client's records, model and engine."""
        session = self._session
        if session is None or session._records is None:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: this session is not bound to a client's "
                "records (client halves run on a ClientWorker, or through "
                "raydpfl.algorithms.base.direct_context in tests)"
            )
        return session


class OpenInvocation:
    """A live mechanism whose invocation is opened by one call and completed by another:
    `_complete` closes the open invocation and counts it, or refuses."""

    mechanism: Any
    count: int
    _open: bool

    def _complete(self, allowed: bool, refusal: str) -> None:
        """Closes and counts the open invocation; PrivacyContractError(`refusal`) if not
        `allowed` (no invocation open, or one that may not be closed this way)."""
        if not allowed:
            raise PrivacyContractError(f"{self.mechanism.describe()}: {refusal}")
        self._open = False
        self.count += 1


class SampledBatch:
    """One invocation's Poisson sample, held by the platform. The client half passes it
    back to the mechanism's release (`LiveSubsampledGaussian.step_`, `gradient`); its size
    is data-dependent, so reading it (`size`, `is_empty`) is listed as unaccounted."""

    __slots__ = ("_live", "_positions")

    def __init__(self, live: LiveSubsampledGaussian, positions: torch.Tensor) -> None:
        self._live, self._positions = live, positions

    @property
    def size(self) -> int:
        """|B| (listed: `BATCH_SIZE_NOTE`)."""
        self._live._note(BATCH_SIZE_NOTE)
        return int(self._positions.numel())

    @property
    def is_empty(self) -> bool:
        """|B| = 0 (listed like `size`)."""
        return self.size == 0


class ReleasedStepStats:
    """A private step's diagnostics (batch size, clipped fraction, mean norm): un-noised,
    so the first read is listed (`STEP_STATS_NOTE`)."""

    __slots__ = ("_live", "_stats")

    def __init__(self, live: LiveMechanism, stats: StepStats) -> None:
        self._live, self._stats = live, stats

    def _read(self) -> StepStats:
        self._live._note(STEP_STATS_NOTE)
        return self._stats

    @property
    def batch_size(self) -> int:
        return self._read().batch_size

    @property
    def clipped_fraction(self) -> float:
        return self._read().clipped_fraction

    @property
    def mean_norm(self) -> float:
        return self._read().mean_norm


def per_sample_losses(
    model: torch.nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Per-sample cross-entropy losses (no gradient); an empty float32 tensor for an
    empty batch."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float32, device=x.device)
    with torch.no_grad():
        return F.cross_entropy(functional_call(model, params, (x,)), y, reduction="none")


class LiveSubsampledGaussian(OpenInvocation, LiveMechanism):
    """A task's `SubsampledGaussian`, bound by the worker to the client's records, model
    and clipping engine: the platform's private step.

    `sample` opens one invocation: the platform draws the Poisson(q) sample from this
    client's own records at the declared q. The one release that follows completes it: a
    DP-SGD step (`step_`, in place, or `gradient`: the platform gathers the batch,
    computes per-sample gradients with the worker's engine, clips at C, or applies a
    weight rule whose every contribution it checks against C, adds N(0, σ²C²) and only
    then hands the result back) or a noisy loss query (`mean_loss`, which samples its
    own batch). Only completed invocations count in the receipt. An empty batch may be
    completed unreleased (`skip_empty`, still charged); a new sample before the last one
    was released is refused, and a release takes only the batch this mechanism drew."""

    mechanism: SubsampledGaussian

    def __init__(self, mechanism: SubsampledGaussian, generator: torch.Generator, device):
        super().__init__(mechanism, generator, device)
        self._open = False
        self._batch: SampledBatch | None = None

    @property
    def noise_multiplier(self) -> float:
        return self.mechanism.noise_multiplier

    @property
    def clip_norm(self) -> float:
        return self.mechanism.clip_norm

    @property
    def sampling_rate(self) -> float:
        return self.mechanism.sampling_rate

    def sample(self) -> SampledBatch:
        """Opens one invocation: a Poisson(q) sample of the client's records, drawn by the
        platform, truncated to the run's cap B by a uniformly random subset when the
        mechanism carries one (``privacy.batch_shape: fixed``; the charge is then the
        truncated event). The previous invocation must be complete (released, or skipped
        when empty)."""
        if self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a new Poisson sample before the previous "
                "one was released through the mechanism (or skipped, if it was empty)"
            )
        records = self._bound()._records
        assert records is not None
        m = self.mechanism
        check_batch_shape(m, records.num_examples)
        positions = poisson_sample(records.num_examples, m.sampling_rate, self._generator)
        if m.max_batch_size is not None:
            positions = truncate_sample(positions, m.max_batch_size, self._generator)
        self._open = True
        self._batch = SampledBatch(self, positions)
        return self._batch

    def _positions(self, batch: SampledBatch, *, open_only: bool) -> torch.Tensor:
        if not isinstance(batch, SampledBatch) or batch is not self._batch:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a release takes the batch this mechanism's "
                "last sample() drew, nothing else"
            )
        if open_only and not self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a release without its own Poisson sample "
                "(call sample() once per invocation)"
            )
        return batch._positions

    def skip_empty(self, batch: SampledBatch) -> None:
        """Completes an invocation whose Poisson batch was empty without a release
        (``normalizer="actual"`` skips such a step; it is charged all the same)."""
        positions = self._positions(batch, open_only=False)
        self._complete(
            self._open and positions.numel() == 0,
            "only an open invocation with an empty batch may be skipped; a non-empty batch "
            "must be released through the mechanism",
        )

    def _count_vectorised(self, steps: int) -> None:
        """The client-vectorised engine
        (`raydpfl.privacy.per_sample.multi_client.run_sessions`), which draws each client's
        Poisson batches and noise from this mechanism's stream and parameters, records its
        `steps` completed invocations (platform code only)."""
        if self._open:
            raise PrivacyContractError(f"{self.mechanism.describe()}: an invocation is open")
        self.count += int(steps)

    def _rule(self, weight_rule: WeightRule | None) -> tuple[WeightRule | None, bool]:
        session = self._bound()
        if weight_rule is None:
            return None, True
        self._note(_weight_rule_note(weight_rule))
        if session._unbounded_ok:
            self._note(UNBOUNDED_NOTE)
            return weight_rule, False
        return weight_rule, True

    def _release_args(
        self, batch: SampledBatch, weight_rule: WeightRule | None, divisor: float
    ) -> tuple[Any, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Completes the open invocation of `batch` and returns what the step's arithmetic
        takes: the worker's engine, the gathered records, and the keyword arguments at
        this mechanism's C and σ (the noise from its stream)."""
        session = self._bound()
        positions = self._positions(batch, open_only=True)
        rule, check = self._rule(weight_rule)
        x, y = session._records._gather(positions)  # type: ignore[union-attr]
        self._complete(True, "")
        m = self.mechanism
        kwargs = dict(
            clip_norm=m.clip_norm,
            noise_multiplier=m.noise_multiplier,
            expected_batch_size=divisor,
            generator=self._generator,
            weight_rule=rule,
            check_bound=check,
        )
        return session._engine, x, y, kwargs

    def step_(
        self,
        params: Params,
        batch: SampledBatch,
        *,
        lr: float,
        divisor: float,
        weight_rule: WeightRule | None = None,
    ) -> ReleasedStepStats:
        """The in-place DP-SGD step on `batch` at this mechanism's C and σ (the platform's
        `dpsgd.dp_sgd_step_`): w ← w − (lr/divisor)·(Σ_i a_i g_i + N(0, σ²C²))."""
        engine, x, y, kwargs = self._release_args(batch, weight_rule, divisor)
        return ReleasedStepStats(self, dp_sgd_step_(engine, params, x, y, lr=lr, **kwargs))

    def gradient(
        self,
        params: Params,
        batch: SampledBatch,
        *,
        divisor: float,
        weight_rule: WeightRule | None = None,
    ) -> tuple[Params, ReleasedStepStats]:
        """The privatised gradient of `batch`, (Σ_i a_i g_i + N(0, σ²C²)) / divisor
        (`dpsgd.dp_sgd_gradient`), for an update rule of the algorithm's own."""
        engine, x, y, kwargs = self._release_args(batch, weight_rule, divisor)
        grad, stats = dp_sgd_gradient(engine, params, x, y, **kwargs)
        return grad, ReleasedStepStats(self, stats)

    def batch_loss(self, params: Params, batch: SampledBatch) -> float:
        """The un-noised mean cross-entropy of `params` on `batch` (listed:
        `BATCH_LOSS_NOTE`; ALI-DPFL's Γ estimate)."""
        session = self._bound()
        x, y = session._records._gather(self._positions(batch, open_only=False))  # type: ignore[union-attr]
        self._note(BATCH_LOSS_NOTE)
        with torch.no_grad():
            return float(F.cross_entropy(functional_call(session._model, params, (x,)), y))

    def probe(self, batch: SampledBatch, fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> Any:
        """`fn(x, y)` on `batch`'s records: algorithm code reading raw records, so listed
        by name (`raw_batch_probe`). Its result is the client half's, un-noised."""
        session = self._bound()
        x, y = session._records._gather(self._positions(batch, open_only=False))  # type: ignore[union-attr]
        self._note(_probe_note(fn))
        return fn(x, y)

    def mean_loss(
        self, params: Params, *, precision: LossPrecision = "float64", raw_losses: bool = False
    ) -> Any:
        """One invocation of a noisy loss query: the platform draws a fresh Poisson(q)
        sample, computes each record's cross-entropy under `params`, clips to [0, C] and
        releases (Σ clip(ℓ_j) + N(0, σ²C²)) / (q·|D|)
        (`raydpfl.privacy.mechanisms.loss_query.private_mean_loss`). With `raw_losses`, also
        the raw per-sample losses (listed: `RAW_LOSSES_NOTE`)."""
        session = self._bound()
        batch = self.sample()
        x, y = session._records._gather(batch._positions)  # type: ignore[union-attr]
        losses = per_sample_losses(session._model, params, x, y)
        self._complete(True, "")
        m = self.mechanism
        n = session._records.num_examples  # type: ignore[union-attr]
        noisy = private_mean_loss(
            losses,
            clip_bound=m.clip_norm,
            noise_multiplier=m.noise_multiplier,
            denominator=m.sampling_rate * n,
            generator=self._generator,
            precision=precision,
        )
        if raw_losses:
            self._note(RAW_LOSSES_NOTE)
            return noisy, losses
        return noisy


def check_batch_shape(mechanism: SubsampledGaussian, num_examples: int) -> None:
    """A truncated mechanism was charged for a client of ``dataset_size`` records: it
    samples only that client's records (the charge depends on |D|)."""
    if mechanism.max_batch_size is not None and mechanism.dataset_size != num_examples:
        raise PrivacyContractError(
            f"{mechanism.describe()}: charged for {mechanism.dataset_size} records, but the "
            f"client holds {num_examples}"
        )


def laplace_noise(shape: torch.Size, scale: float, generator: torch.Generator, device) -> Any:
    """i.i.d. Laplace(0, b) as b·(E₁ − E₂) with E ~ Exp(1) (exact; from the client's
    stream, or from os.urandom for a secure-noise stream)."""
    if secure_noise.is_secure(generator):
        return secure_noise.laplace(shape, scale, torch.get_default_dtype(), device)
    e1 = torch.empty(shape, device=device).exponential_(generator=generator)
    e2 = torch.empty(shape, device=device).exponential_(generator=generator)
    return (e1 - e2) * scale


class ReleasedMean:
    """What one `LiveRelease.mean_clipped_gradient` invocation released: the noised
    `update` (scale·mean clipped gradient + noise, per tensor) and the noised loss reports
    (scale·mean clamped loss + noise, one per point asked for), in that order."""

    __slots__ = ("losses", "update")

    def __init__(self, update: Params, losses: tuple[float, ...]) -> None:
        self.update, self.losses = update, losses


class LiveRelease(LiveMechanism):
    """A task's `GaussianRelease`, `CertifiedGaussianRelease` or `LaplaceRelease`. The
    client half invokes it through the platform's releases, which compute the released
    vector from the client's records themselves and check the declared sensitivity
    against the bound of what they computed:

    - `mean_clipped_gradient`: a full-batch step (DPFL-BCS), optionally with loss
      reports as further coordinates of the same vector;
    - `perturb_update`: output perturbation of an update the client half computed
      (PE-DPFL): the platform clips it to Δ/2 before the noise, and the worker checks that
      the result uploads exactly what it returned.

    Gaussian noise for a `GaussianRelease` (L2 clipping), Laplace for a `LaplaceRelease`
    (L1 clipping). There is no way to noise an arbitrary tensor through it.
    """

    mechanism: GaussianRelease | LaplaceRelease

    def __init__(self, mechanism: Mechanism, generator: torch.Generator, device):
        super().__init__(mechanism, generator, device)
        self._released: Params | None = None  # perturb_update's output (the worker's check)

    @property
    def scale(self) -> float:
        """The noise's std (Gaussian: σ·Δ) or scale (Laplace: b·Δ₁)."""
        m = self.mechanism
        return m.noise_scale if isinstance(m, LaplaceRelease) else m.noise_std

    @property
    def _order(self) -> int:
        """The norm the sensitivity is in: L1 for Laplace noise, L2 for Gaussian."""
        return 1 if isinstance(self.mechanism, LaplaceRelease) else 2

    def _noise(self, shape: torch.Size, dtype: torch.dtype | None = None) -> torch.Tensor:
        """This invocation's noise for one part of the released vector (the platform's)."""
        if isinstance(self.mechanism, LaplaceRelease):
            return laplace_noise(shape, self.scale, self._generator, self.device)
        # The same draws as torch.randn(shape, generator) in research mode.
        out = torch.empty(shape, device=self.device, dtype=dtype or torch.get_default_dtype())
        return standard_normal_like(out, self._generator) * self.scale

    def _add(self, tensors: Params) -> Params:
        """Adds this invocation's noise to every tensor, in place, in order."""
        if isinstance(self.mechanism, LaplaceRelease):
            for t in tensors.values():
                t.add_(self._noise(t.shape, t.dtype))
            return tensors
        return add_gaussian_noise(tensors, self.scale, self._generator)

    def _check_sensitivity(self, needed: float, what: str) -> None:
        declared = float(self.mechanism.sensitivity)
        if not declared >= needed * (1.0 - 1e-9):
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: {what} has sensitivity {needed:.6g} "
                f"(L{self._order} over neighbouring datasets), above the declared "
                f"{declared:.6g}; declare the release "
                "with the sensitivity of what it releases"
            )

    def mean_clipped_gradient(
        self,
        params: Params,
        loss: full_batch.RecordLoss,
        *,
        clip_norm: float,
        scale: float = 1.0,
        const: Params | None = None,
        norm: int | None = None,
        loss_bound: float | None = None,
        loss_reports: Sequence[str] = (),
    ) -> ReleasedMean:
        """One invocation: scale·(1/n)·Σ_i clip_C(∇ℓ(params; z_i)) over all n of the
        client's records, plus noise, and optionally the loss reports scale·(1/n)·Σ_i
        clamp(ℓ_i, 0, Θ) as further coordinates of the same release.

        The platform gathers the records, takes each record's gradient on its own
        (``vmap(grad(loss))`` on batches of one, so a loss that mixes records cannot), clips
        it at C in the mechanism's norm, and refuses unless the declared sensitivity covers
        scale·(2C + k·Θ)/n (replace-one adjacency; k loss reports, DPFL-BCS Eq. 13).

        Args:
            params: The point w the gradient is taken at (and its variables).
            loss: ℓ(params, const, x, y) on a batch (called on batches of one record).
            clip_norm: C.
            scale: A public factor on every released coordinate (η_t).
            const: Tensors the loss reads as constants (no gradient).
            norm: The norm each record's gradient is clipped in: 1 (L1; valid for either
                noise, as ‖g‖₂ ≤ ‖g‖₁) or 2 (L2; Gaussian noise only). Default: the
                mechanism's (L1 for Laplace, L2 for Gaussian).
            loss_bound: Θ, the clamp of every per-record loss (needed with loss reports).
            loss_reports: Points to report the mean clamped loss at: ``"start"`` (w) and
                ``"after_step"`` (w minus the un-noised step: a data-dependent point, so
                its Θ/n sensitivity is assumed, not proven, and the platform lists it).

        Returns:
            The released values (`ReleasedMean`): noise is drawn for the loss reports
            first, then for each tensor in order.
        """
        records = self._bound()._records
        assert records is not None
        unknown = [p for p in loss_reports if p not in ("start", "after_step")]
        if unknown:
            raise ValueError(
                f"loss_reports: unknown point(s) {unknown}; use 'start', 'after_step'"
            )
        clip, factor = _positive(clip_norm, "clip_norm"), _non_negative(scale, "scale")
        order = self._order if norm is None else norm
        if order not in (1, 2) or (order == 2 and self._order == 1):
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: clipping in norm {norm!r}; the allowed norms "
                f"are {'1' if self._order == 1 else '1, 2'} (Laplace noise needs an L1 bound)"
            )
        bound = 0.0
        if loss_reports:
            if loss_bound is None:
                raise ValueError("loss_reports need loss_bound (the clamp Θ of each loss)")
            bound = _positive(loss_bound, "loss_bound")
        x, y = records._gather_all()
        n = int(x.shape[0])
        if n == 0:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a full-batch release of a client without records"
            )
        self._check_sensitivity(
            factor * (2.0 * clip + len(loss_reports) * bound) / n, "the full-batch mean"
        )
        fixed = {} if const is None else dict(const)
        mean = full_batch.clipped_mean_gradient(loss, params, fixed, x, y, clip, order)
        step = {name: g * factor for name, g in mean.items()}
        losses: list[float] = []
        for point in loss_reports:
            at = dict(params)
            if point == "after_step":
                self._note(AFTER_STEP_LOSS_NOTE)
                at = {k: t.detach() - step[k] if k in step else t for k, t in params.items()}
            losses.append(factor * full_batch.clamped_mean_loss(loss, at, fixed, x, y, bound))
        self.count += 1
        if self.scale > 0:
            if losses:
                noise = self._noise(torch.Size([len(losses)]))
                losses = [v + float(noise[i]) for i, v in enumerate(losses)]
            step = {name: g + self._noise(g.shape) for name, g in step.items()}
        return ReleasedMean(step, tuple(losses))

    def perturb_update(self, update: Params) -> Params:
        """One invocation of output perturbation: `update` (any function of the client's
        records) clipped in place into the ball of radius Δ/2 in the mechanism's norm, so
        that two neighbouring datasets' outputs differ by at most Δ, then noised in place.
        Returns `update`; the task's result must upload exactly these tensors (checked on
        the worker)."""
        full_batch.clip_in_place(update, float(self.mechanism.sensitivity) / 2.0, self._order)
        self.count += 1
        self._add(update)
        self._released = update
        return update


class LiveSelection(LiveMechanism):
    """A task's `ExponentialSelection`: `most_accurate` is one invocation."""

    mechanism: ExponentialSelection

    @property
    def epsilon(self) -> float:
        return self.mechanism.epsilon

    def most_accurate(self, candidates: Sequence[Params]) -> int:
        """One invocation: the index of the candidate model chosen by the exponential
        mechanism on its accuracy in % on the client's records (RC-DPFL §5.4): the platform
        scores every candidate with the worker's model, adds Gumbel(0, 2Δ/ε) noise with
        Δ = 100/(n − 1) (add/remove adjacency) and returns only the arg-max."""
        import numpy as np

        session = self._bound()
        records, model = session._records, session._model
        assert records is not None and model is not None  # bound together (`_bind`)
        n = records.num_examples
        if n < 2 or not candidates:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a selection needs >= 2 records and >= 1 "
                f"candidate (got {n} records, {len(candidates)} candidates)"
            )
        x, y = records._gather_all()
        scores = np.asarray(
            [[full_batch.accuracy_percent(model, params, x, y) for params in candidates]]
        )
        self.count += 1
        gen = self._generator
        draw = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device))
        rng = np.random.default_rng(draw)
        scale = 2.0 * (100.0 / (n - 1.0)) / self.mechanism.epsilon
        return int(np.argmax(scores + rng.gumbel(size=scores.shape) * scale, axis=1)[0])


class PrivacySession:
    """The mechanisms one task declared, live on the worker that runs it.

    Built by the worker from `ClientTask.mechanisms` (each mechanism copied, and
    re-validated, so the session draws at the charged parameters whatever happens to the
    task object later), bound by the worker to the client's records, model and clipping
    engine (`_bind`), and handed to the client half as `ClientContext.privacy`. The worker
    reads the receipt of what was invoked, and of what the platform handed out un-noised
    (its notes), from this object.
    """

    def __init__(
        self,
        declared: Sequence[MechanismUse],
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> None:
        self.declared = tuple(declared)
        self._records: ClientRecords | None = None
        self._model: torch.nn.Module | None = None
        self._engine: Any = None
        self._unbounded_ok = False
        self._notes: dict[str, None] = {}  # an ordered set
        dev = torch.device(device)
        self._live: list[Any] = []
        for u in self.declared:
            kind = type(u.mechanism)
            if kind not in _KERNEL_TYPES:
                raise MechanismTypeError(f"{kind.__qualname__} is not a kernel mechanism")
            live = kind.live(dataclasses.replace(u.mechanism), generator, dev)
            live._session = self
            self._live.append(live)

    def _bind(
        self,
        records: ClientRecords,
        model: torch.nn.Module,
        engine: Any,
        *,
        unbounded_weight_rules: bool = False,
    ) -> PrivacySession:
        """Binds the session to the client's records and the worker's model and engine
        (the worker's call; `unbounded_weight_rules` is the run-level setting)."""
        self._records, self._model, self._engine = records, model, engine
        self._unbounded_ok = bool(unbounded_weight_rules)
        return self

    def _note(self, what: str) -> None:
        """Records that the platform handed the client half `what` un-noised."""
        self._notes.setdefault(what, None)

    def get(self, mechanism: Mechanism | type[Mechanism] | None = None) -> Any:
        """The live form of a declared mechanism: the one equal to `mechanism`, the only
        one of that type, or (None) the only one declared.

        Raises:
            PrivacyContractError: If the task declared no such mechanism (or several
                that match a type).
        """
        if isinstance(mechanism, Mechanism):
            for live in self._live:
                if live.mechanism._answers(mechanism):
                    return live
            raise PrivacyContractError(
                f"the task did not declare {mechanism.describe()} (it declared "
                f"{_describe(self.declared)}): a mechanism must be declared, and charged, "
                "before the client half uses it"
            )
        matches = [
            live for live in self._live if mechanism is None or type(live.mechanism) is mechanism
        ]
        if len(matches) != 1:
            what = "a mechanism" if mechanism is None else mechanism.__name__
            raise PrivacyContractError(
                f"the task declared {_describe(self.declared)}; the client half asked for "
                f"{what}, which needs exactly one match, found {len(matches)}"
            )
        return matches[0]

    def dp_sgd(self) -> LiveSubsampledGaussian:
        """The task's one `SubsampledGaussian` (its DP-SGD steps)."""
        return self.get(SubsampledGaussian)

    def receipt(self) -> Receipt:
        """What was invoked so far, per declared mechanism, and the platform's notes."""
        return Receipt(
            tuple(MechanismUse(live.mechanism, live.count) for live in self._live),
            notes=tuple(self._notes),
        )

    def __iter__(self) -> Iterator[LiveMechanism]:
        return iter(self._live)


_seal(__name__)
