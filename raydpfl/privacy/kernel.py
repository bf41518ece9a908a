"""The privacy kernel: mechanisms that own their noise and their charge, and receipts.

Every randomised release about a client's records goes through a *mechanism* object of
this module (record level, drawn on the workers) or of
`raydpfl.privacy.client_level_mechanisms` (client level, drawn by the server half through
the round's `PopulationSession`). A mechanism is a small frozen value (its σ, its bound,
its sampling rate) with two faces that cannot drift apart, because both read the same
fields:

- `Mechanism.cost` — the ledger's event for ``n`` invocations (a `PrivacyCost`, the
  vocabulary of `raydpfl.privacy.ledger`, like dp-accounting's DpEvents);
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
  or a noisy loss query. Charged ``PrivacyCost(σ, q, n)``.
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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from raydpfl.privacy import secure_noise
from raydpfl.privacy._checks import _non_negative, _positive
from raydpfl.privacy.dpsgd import (
    StepStats,
    WeightRule,
    add_gaussian_noise,
    dp_sgd_gradient,
    dp_sgd_step_,
    poisson_sample,
    standard_normal_like,
)
from raydpfl.privacy.ledger import PrivacyCost
from raydpfl.privacy.loss_query import LossPrecision, private_mean_loss
from raydpfl.privacy.mechanisms import gaussian_sigma_analytic

Params = dict[str, torch.Tensor]

__all__ = [
    "CertifiedGaussianRelease",
    "ExponentialSelection",
    "GaussianRelease",
    "LaplaceRelease",
    "Mechanism",
    "MechanismUse",
    "PrivacyContractError",
    "PrivacySession",
    "Receipt",
    "SubsampledGaussian",
    "check_receipt",
    "costs_of",
    "laplace_noise",
    "uses",
]


class PrivacyContractError(ValueError):
    """A task released something other than what was charged, or used a mechanism it
    did not declare. The run stops: what was released is not what the ledger says."""


def _set_reals(mechanism: Mechanism, *names: str, strict: bool = False) -> None:
    """Checks each named field of a frozen mechanism and stores it as a float."""
    check = _positive if strict else _non_negative  # `raydpfl.privacy._checks`
    for name in names:
        object.__setattr__(mechanism, name, check(getattr(mechanism, name), name))


# --------------------------------------------------------------------------------------- #
# Mechanisms: parameters + the event they cost
# --------------------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Mechanism:
    """A randomised release with its parameters. Subclasses are frozen dataclasses whose
    fields are all the parameters both the noise and the charge read."""

    kind: ClassVar[str] = "mechanism"
    #: True for a client-level mechanism (`raydpfl.privacy.client_level_mechanisms`):
    #: charged to the run's population ledger once per round, never to a client's ledger
    #: (`costs_of` leaves it out of a task's charge).
    population_level: ClassVar[bool] = False

    def cost(self, invocations: int) -> PrivacyCost:
        """The ledger event of `invocations` uses of this mechanism."""
        raise NotImplementedError

    def live(self, generator: torch.Generator, device: torch.device) -> LiveMechanism:
        """The worker-side object that draws this mechanism's noise and counts its uses."""
        raise NotImplementedError

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v:g}" for k, v in self.__dict__.items())
        return f"{self.kind}({fields})"


@dataclass(frozen=True)
class SubsampledGaussian(Mechanism):
    """Poisson(q) subsampling, a sum of contributions each bounded by C in L2, plus
    N(0, σ²C²): a DP-SGD step (Abadi et al. 2016) or a noisy loss query (FedFDP Eq. 14).
    ``clip_norm`` 0 releases pure noise scaled by 0 (a clipped loss bound of 0)."""

    kind: ClassVar[str] = "subsampled_gaussian"
    noise_multiplier: float
    clip_norm: float
    sampling_rate: float

    def __post_init__(self) -> None:
        _set_reals(self, "noise_multiplier", "clip_norm", "sampling_rate")
        if self.sampling_rate > 1:
            raise ValueError(f"sampling_rate must be in [0, 1], got {self.sampling_rate}")

    @property
    def noise_std(self) -> float:
        """σ·C, the std of the Gaussian added to the clipped sum."""
        return self.noise_multiplier * self.clip_norm

    def cost(self, invocations: int) -> PrivacyCost:
        return PrivacyCost(self.noise_multiplier, self.sampling_rate, invocations)

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
        if not isinstance(self.mechanism, Mechanism):
            raise ValueError(
                f"a mechanism use needs a raydpfl.privacy.kernel.Mechanism, got "
                f"{type(self.mechanism).__name__}"
            )
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"a mechanism's count must be an int >= 0, got {self.count!r}")

    @property
    def cost(self) -> PrivacyCost:
        """The ledger event this use costs."""
        return self.mechanism.cost(self.count)

    def describe(self) -> str:
        return f"{self.count} x {self.mechanism.describe()}"


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
# The worker side: live mechanisms and the session
# --------------------------------------------------------------------------------------- #
class LiveMechanism:
    """A declared mechanism on a worker: it draws the noise and counts invocations."""

    def __init__(self, mechanism: Mechanism, generator: torch.Generator, device: torch.device):
        self.mechanism = mechanism
        self.generator = generator
        self.device = device
        self.count = 0


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


class LiveSubsampledGaussian(OpenInvocation, LiveMechanism):
    """A task's `SubsampledGaussian`: `sample` opens one invocation (a Poisson draw of
    the client's records); the one noisy release that follows it (`step_`, `gradient`,
    `noisy_sum`, `mean_loss`) completes it, and only completed invocations count in the
    receipt. An invocation whose batch is empty may be completed unreleased by
    `skip_empty` (it is still charged: ALI-DPFL's skipped step); a non-empty batch cannot
    be skipped, so a client half that samples through the mechanism and noises elsewhere
    comes back one invocation short. A release without its own sample is refused."""

    mechanism: SubsampledGaussian

    def __init__(self, mechanism: SubsampledGaussian, generator: torch.Generator, device):
        super().__init__(mechanism, generator, device)
        self._open = False
        self._open_size = 0

    @property
    def noise_multiplier(self) -> float:
        return self.mechanism.noise_multiplier

    @property
    def clip_norm(self) -> float:
        return self.mechanism.clip_norm

    @property
    def sampling_rate(self) -> float:
        return self.mechanism.sampling_rate

    def sample(self, num_examples: int) -> torch.Tensor:
        """One invocation's Poisson(q) batch: positions within the client's records. The
        previous invocation must be complete (released, or skipped when empty)."""
        if self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: a new Poisson sample before the previous "
                "one was released through the mechanism (or skipped, if it was empty)"
            )
        positions = poisson_sample(num_examples, self.mechanism.sampling_rate, self.generator)
        self._open, self._open_size = True, int(positions.numel())
        return positions

    def skip_empty(self) -> None:
        """Completes an invocation whose Poisson batch was empty without a release
        (``normalizer="actual"`` skips such a step; it is charged all the same)."""
        self._complete(
            self._open and self._open_size == 0,
            "only an open invocation with an empty batch may be skipped; a non-empty batch "
            "must be released through the mechanism",
        )

    def count_vectorised_steps(self, steps: int) -> None:
        """For the client-vectorised DP-SGD engine (`raydpfl.privacy.multi_client`), which
        draws each client's Poisson batch and noise itself from this mechanism's
        parameters: records `steps` complete invocations."""
        self.count += int(steps)

    def _release(self) -> None:
        self._complete(
            self._open,
            "a release without its own Poisson sample (call sample() once per invocation)",
        )

    def step_(
        self,
        engine: Any,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        lr: float,
        expected_batch_size: float,
        weight_rule: WeightRule | None = None,
    ) -> StepStats:
        """The in-place DP-SGD step on the sampled batch (`dpsgd.dp_sgd_step_`) at this
        mechanism's C and σ."""
        self._release()
        m = self.mechanism
        return dp_sgd_step_(
            engine,
            params,
            x,
            y,
            lr=lr,
            clip_norm=m.clip_norm,
            noise_multiplier=m.noise_multiplier,
            expected_batch_size=expected_batch_size,
            generator=self.generator,
            weight_rule=weight_rule,
        )

    def gradient(
        self,
        engine: Any,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        expected_batch_size: float,
        weight_rule: WeightRule | None = None,
    ) -> tuple[Params, StepStats]:
        """The privatised gradient of the sampled batch (`dpsgd.dp_sgd_gradient`)."""
        self._release()
        m = self.mechanism
        return dp_sgd_gradient(
            engine,
            params,
            x,
            y,
            clip_norm=m.clip_norm,
            noise_multiplier=m.noise_multiplier,
            expected_batch_size=expected_batch_size,
            generator=self.generator,
            weight_rule=weight_rule,
        )

    def noisy_sum(self, clipped_sum: Params) -> Params:
        """Adds N(0, σ²C²) to a sum the caller clipped per sample at C (in place)."""
        self._release()
        return add_gaussian_noise(clipped_sum, self.mechanism.noise_std, self.generator)

    def mean_loss(
        self, losses: torch.Tensor, *, denominator: float, precision: LossPrecision
    ) -> float:
        """The noisy mean of the sampled batch's losses clipped to [0, C]
        (`raydpfl.privacy.loss_query.private_mean_loss`)."""
        self._release()
        m = self.mechanism
        return private_mean_loss(
            losses,
            clip_bound=m.clip_norm,
            noise_multiplier=m.noise_multiplier,
            denominator=denominator,
            generator=self.generator,
            precision=precision,
        )


def laplace_noise(shape: torch.Size, scale: float, generator: torch.Generator, device) -> Any:
    """i.i.d. Laplace(0, b) as b·(E₁ − E₂) with E ~ Exp(1) (exact; from the client's
    stream, or from os.urandom for a secure-noise stream)."""
    if secure_noise.is_secure(generator):
        return secure_noise.laplace(shape, scale, torch.get_default_dtype(), device)
    e1 = torch.empty(shape, device=device).exponential_(generator=generator)
    e2 = torch.empty(shape, device=device).exponential_(generator=generator)
    return (e1 - e2) * scale


class LiveRelease(LiveMechanism):
    """A task's `GaussianRelease`, `CertifiedGaussianRelease` or `LaplaceRelease`:
    `open` starts one invocation (one released vector, which may be drawn in several
    parts: one `noise` call per tensor of it)."""

    mechanism: GaussianRelease | LaplaceRelease

    def __init__(self, mechanism: Mechanism, generator: torch.Generator, device):
        super().__init__(mechanism, generator, device)
        self._open = False

    @property
    def scale(self) -> float:
        """The noise's std (Gaussian: σ·Δ) or scale (Laplace: b·Δ₁)."""
        m = self.mechanism
        return m.noise_scale if isinstance(m, LaplaceRelease) else m.noise_std

    def open(self) -> LiveRelease:
        """Starts one invocation; the noise of its parts follows (`noise`, `add_`)."""
        self.count += 1
        self._open = True
        return self

    def _check_open(self) -> None:
        if not self._open:
            raise PrivacyContractError(
                f"{self.mechanism.describe()}: noise drawn outside an invocation (call open())"
            )

    def noise(self, shape: torch.Size, dtype: torch.dtype | None = None) -> torch.Tensor:
        """This invocation's noise for one part of the released vector."""
        self._check_open()
        if isinstance(self.mechanism, LaplaceRelease):
            return laplace_noise(shape, self.scale, self.generator, self.device)
        # The same draws as torch.randn(shape, generator) in research mode.
        out = torch.empty(shape, device=self.device, dtype=dtype or torch.get_default_dtype())
        return standard_normal_like(out, self.generator) * self.scale

    def add_(self, tensors: Params) -> Params:
        """Adds this invocation's Gaussian noise to every tensor, in place, in order."""
        self._check_open()
        if isinstance(self.mechanism, LaplaceRelease):
            raise PrivacyContractError("add_ draws Gaussian noise; use noise() for Laplace")
        return add_gaussian_noise(tensors, self.scale, self.generator)


class LiveSelection(LiveMechanism):
    """A task's `ExponentialSelection`: `rng` opens one invocation and returns the numpy
    generator its Gumbel noise is drawn from (seeded by one draw of the client's stream)."""

    mechanism: ExponentialSelection

    @property
    def epsilon(self) -> float:
        return self.mechanism.epsilon

    def rng(self) -> Any:
        import numpy as np

        self.count += 1
        draw = int(
            torch.randint(0, 2**62, (1,), generator=self.generator, device=self.generator.device)
        )
        return np.random.default_rng(draw)


class PrivacySession:
    """The mechanisms one task declared, live on the worker that runs it.

    Built by the worker from `ClientTask.mechanisms` and handed to the client half as
    `ClientContext.privacy`; the receipt of what was invoked goes back with the result.
    """

    def __init__(
        self,
        declared: Sequence[MechanismUse],
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> None:
        self.declared = tuple(declared)
        self._live = [u.mechanism.live(generator, torch.device(device)) for u in self.declared]

    def get(self, mechanism: Mechanism | type[Mechanism] | None = None) -> Any:
        """The live form of a declared mechanism: the one equal to `mechanism`, the only
        one of that type, or (None) the only one declared.

        Raises:
            PrivacyContractError: If the task declared no such mechanism (or several
                that match a type).
        """
        if isinstance(mechanism, Mechanism):
            for live in self._live:
                if live.mechanism == mechanism:
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
        """What was invoked so far, per declared mechanism."""
        return Receipt(tuple(MechanismUse(live.mechanism, live.count) for live in self._live))

    def __iter__(self) -> Iterator[LiveMechanism]:
        return iter(self._live)
