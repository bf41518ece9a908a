"""`audit(config, ...)`: one run with canaries, and the empirical ε lower bound beside the
accountant's ε (Steinke, Nasr & Jagielski 2023; `raydpfl.audit.bound`).

Modes and their threat models (README "Audit the privacy claim"):

================  ==========================================================================
record, white-box The adversary is the server: it sees every participating client's released
(dp_fedavg)       update in every round (what a record-level DP-FedAvg client sends, and what
                  its ledger's ε covers), and it chose the canaries' gradients: canary j is a
                  training record whose per-sample gradient is a Dirac G·e_j (G = 100C) on a
                  probe coordinate no real record touches. Score: the likelihood ratio of
                  its coordinate's releases over the rounds its client took part in.
record, white-box The algorithms of the shared DP-SGD loop (`loop_auditable()`: ALI-DPFL,
(loop)            Adap DP-FL, FedFDP and its dp_ baselines, the RC-DPFL family, ...). The
                  adversary sees every DP-SGD step's noisy sum Σ a_i g_i + N(0, σ²C²) of
                  every participating client (the releases each task's ledger charge
                  covers, before any divisor, correction or server step), and it chose
                  the canaries: canary j is a record of its client in or out, whose
                  gradient is G·e_j (G = 100C) when in and 0 when out (a null record,
                  so |D_i|, q, σ, the batches and all losses do not depend on which are
                  in). Score: Σ over its client's steps of the step's likelihood ratio
                  (Bernoulli(q)·1 + N(0, σ²) vs N(0, σ²), z in units of C), or Σ z.
                  The claim it is set beside: the accountant's ε of those steps alone
                  (`AuditResult.epsilon_audited`); where the algorithm also releases a
                  separately charged mechanism (FedFDP's and Adap DP-FL's noisy loss,
                  DP q-FFL's F_k, RC-DPFL's private cluster choice) that is below the
                  run's ε, and the view does not contain that release.
record, black-box The adversary sees only the final model and queries its loss. Canary j is
                  a mislabelled, out-of-distribution record (a random Gaussian input with a
                  random label), in its client's data only when in. Score: the decrease
                  of its loss from the initial to the final model (for multi-model runs,
                  the model that scores its client). Compared with the run's ε.
client, white-box The adversary sees every round's released model (each noisy aggregate) and
                  controls canary clients: canary client j's update is G·e_j (G = 100S) on the
                  probe, 0 when it is "out". Score: the likelihood ratio over every round's
                  noisy sum on its coordinate (whether it was sampled stays secret).
client, black-box The same canary clients; the adversary sees only the final model: score =
                  the final model's probe coordinate j (the sum of all rounds' releases).
================  ==========================================================================

Assumptions common to all modes: canaries are drawn in/out independently with probability
1/2 from the run seed's "audit" stream; k₊ and k₋ are fixed before the scores are seen
(default m/10 each); dataset sizes |D_i| and cohort sizes are public, as the algorithms
say (the white-box scores normalise by a size that does not depend on which canaries
are in). The bound holds for the mechanism as run; a lower bound well below the
accountant's ε is expected (one run, m canaries) and is no proof of tightness, while a
lower bound above it is a proof (at the stated confidence) that the claim is wrong.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raydpfl import registry
from raydpfl.algorithms.base import AUDIT_TAGS
from raydpfl.algorithms.dp_fedavg import DPFedAvg
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.multi_model import model_params
from raydpfl.audit import canaries as cn
from raydpfl.audit.bound import correct_guesses, epsilon_lower_bound
from raydpfl.config.load import config_from_any, override_list
from raydpfl.config.schema import Config, ConfigError
from raydpfl.experiment.build import (
    build_experiment,
    check_callbacks_keep_files,
    run_experiment,
)
from raydpfl.privacy.accounting.accountants import compute_epsilon_extended
from raydpfl.simulation.experiment import Experiment
from raydpfl.simulation.outputs import check_run_dir_free, prepare_run_dir
from raydpfl.simulation.seeding import NO_ROUND, SERVER, numpy_rng

__all__ = [
    "MODES",
    "SCORES",
    "AuditResult",
    "audit",
    "auditable",
    "loop_auditable",
    "not_auditable",
]

MODES = ("white-box", "black-box")
SCORES = ("lr", "sum")


def auditable() -> dict[str, str]:
    """The algorithms the audit puts canaries into, and their privacy unit: those whose
    registration declares an `raydpfl.algorithms.base.AUDIT_TAGS` tag (DP-FedAvg, client-level
    DP-FedAvg, and every algorithm of the shared DP-SGD loop), a user's included."""
    import raydpfl.experiment.builders  # noqa: F401  (registers the core's names)

    out = {}
    for entry in registry.entries("algorithm"):
        units = [AUDIT_TAGS[t] for t in sorted(entry.tags) if t in AUDIT_TAGS]
        if units:
            out[entry.name] = units[0]
    return out


def loop_auditable() -> tuple[str, ...]:
    """Record-level algorithms whose client half is the shared DP-SGD loop
    (`raydpfl.algorithms.local_dp_sgd.dp_sgd_local_loop`, each step through
    `dpsgd.dp_sgd_step_`): audited with null-record gradient canaries (`canaries.LoopAudit`)."""
    return registry.tagged("algorithm", "audit:dp_sgd_loop")


def not_auditable() -> dict[str, str]:
    """Private algorithms the audit refuses, and why (their ``notes["audit"]``)."""
    return {e.name: e.notes["audit"] for e in registry.entries("algorithm") if "audit" in e.notes}


@dataclass(frozen=True)
class AuditResult:
    """One audit: the guesses, the bound, and the claim it is set beside.

    Attributes:
        unit: ``record`` or ``client`` (the algorithm's privacy unit).
        mode: ``white-box`` or ``black-box`` (threat models: `raydpfl.audit.run`).
        canaries: m. included: how many were drawn "in".
        k_plus, k_minus: The guesses "in" (highest scores) and "out" (lowest).
        correct: W, the correct guesses out of k_plus + k_minus.
        confidence: The bound holds with this probability (over the run's randomness).
        delta: The δ at which the bound (and the accountant's ε) is stated.
        epsilon_lower_bound: Empirical: the mechanism is not (ε, δ)-DP for any smaller ε.
        epsilon_claimed: The accountant's ε of the audited run (``epsilon_max``).
        accountant: The run's accountant.
        score: How canaries were scored (``lr``, ``sum``; black-box: ``loss`` or ``final``).
        summary: The audited run's summary.json.
        scores, inclusion: Per canary (for re-analysis).
        epsilon_audited: The accountant's ε of exactly the releases the adversary's view
            is made of, at δ (max over the canaries' clients): below `epsilon_claimed`
            where the white-box view leaves out a separately charged mechanism (FedFDP's
            and Adap DP-FL's noisy loss, RC-DPFL's private cluster choice); else equal.
            A lower bound above it is a bug.
    """

    unit: str
    mode: str
    canaries: int
    included: int
    k_plus: int
    k_minus: int
    correct: int
    confidence: float
    delta: float
    epsilon_lower_bound: float
    epsilon_claimed: float
    accountant: str
    score: str
    summary: dict[str, Any] = field(repr=False)
    scores: np.ndarray = field(repr=False)
    inclusion: np.ndarray = field(repr=False)
    epsilon_audited: float | None = None

    @property
    def guesses(self) -> int:
        """r = k₊ + k₋."""
        return self.k_plus + self.k_minus

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (audit.json): every field, arrays as lists."""
        out = asdict(self)
        out["scores"] = [float(s) for s in self.scores]
        out["inclusion"] = [bool(b) for b in self.inclusion]
        out["guesses"] = self.guesses
        return out

    def line(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.unit}-level {self.mode} audit: {self.canaries} canaries ({self.included} in), "
            f"{self.correct}/{self.guesses} guesses correct -> epsilon >= "
            f"{self.epsilon_lower_bound:.3f} at {self.confidence:.0%} confidence "
            f"(delta={self.delta:g}); accountant ({self.accountant}): epsilon = "
            f"{self.epsilon_claimed:.3f}"
            + (
                f" (the audited DP-SGD releases alone: {self.epsilon_audited:.3f})"
                if self.epsilon_audited is not None
                and not math.isclose(self.epsilon_audited, self.epsilon_claimed)
                else ""
            )
        )


def audit(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    canaries: int = 1000,
    mode: str = "white-box",
    confidence: float = 0.95,
    k_plus: int | None = None,
    k_minus: int | None = None,
    score: str = "lr",
    run_dir: str | Path | None = None,
) -> AuditResult:
    """Runs `config`'s experiment once with `canaries` canaries and audits it.

    The run is in-process (``runtime.backend=local``: the same mechanism, bit for bit, as
    on Ray) without checkpoints; everything else is the config's. A dp_fedavg run is
    audited at the record level, a dp_fedavg_client run at the client level (canary
    clients are added to its population, so its accountant's ε is the audited run's own),
    and a run of any algorithm in `loop_auditable()` at the record level through its DP-SGD
    steps (this module's docstring). Other algorithms are refused (`not_auditable()` says
    why for the private ones).

    Args:
        config: As for `raydpfl.run_simulation` (a Config, a mapping, a YAML path, None).
        overrides: Dotted ``key=value`` strings.
        canaries: m ≥ 1; at most the run's training records (record level) or its
            clients (client level).
        mode: ``white-box`` or ``black-box`` (see this module's docstring).
        confidence: In (0, 1).
        k_plus: Guesses "in"; default m/10 (at least 1).
        k_minus: Guesses "out"; default m/10.
        score: White-box scoring, ``lr`` (likelihood ratio) or ``sum``.
        run_dir: Keep the audited run's outputs and audit.json there (new or empty).

    Raises:
        ConfigError: A bad argument or config (named), a non-private run, or an
            algorithm the audit cannot put canaries into; before any training.
    """
    _check_args(canaries, mode, confidence, k_plus, k_minus, score)
    m = int(canaries)
    k_plus, k_minus = _guesses(m, k_plus, k_minus)
    overrides = [
        *override_list(overrides),
        "runtime.backend=local",
        "runtime.checkpoint_every=null",
    ]
    cfg = config_from_any(config, overrides)
    if run_dir is not None:
        check_run_dir_free(run_dir)
    check_callbacks_keep_files(cfg, (), run_dir_kept=run_dir is not None)
    if cfg.experiment.algorithm.name in not_auditable():  # refused before loading any data
        _refuse(cfg.experiment.algorithm.name)
    base = build_experiment(cfg)
    unit = _unit_of(cfg, base)
    # One "audit" stream, drawn in this order: the canaries' in/out, then the record-level
    # canaries (their owners, black-box records), then the guesses' tie-breaking.
    rng = numpy_rng(cfg.runtime.seed, NO_ROUND, SERVER, "audit")
    included = rng.random(m) < 0.5
    exp, finish = _with_canaries(cfg, base, unit, m, included, mode, rng)
    summary, scores, score_name, audited = _run_and_score(exp, finish, run_dir, mode, score)
    correct = correct_guesses(scores, included, k_plus, k_minus, rng)
    delta = float(summary["delta"])
    result = AuditResult(
        unit=unit,
        mode=mode,
        canaries=m,
        included=int(included.sum()),
        k_plus=k_plus,
        k_minus=k_minus,
        correct=correct,
        confidence=float(confidence),
        delta=delta,
        epsilon_lower_bound=epsilon_lower_bound(
            m, k_plus + k_minus, correct, delta=delta, confidence=confidence
        ),
        epsilon_claimed=float(summary["epsilon_max"]),
        accountant=str(summary.get("accountant", cfg.experiment.privacy.accountant)),
        score=score_name,
        summary=summary,
        scores=scores,
        inclusion=included,
        epsilon_audited=float(summary["epsilon_max"]) if audited is None else audited,
    )
    if run_dir is not None:
        path = Path(run_dir) / "audit.json"
        path.write_text(json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    return result


def _guesses(m: int, k_plus: int | None, k_minus: int | None) -> tuple[int, int]:
    """(k_plus, k_minus), m/10 each by default (at least one guess "in")."""
    k_plus = max(1, round(m / 10)) if k_plus is None else int(k_plus)
    k_minus = round(m / 10) if k_minus is None else int(k_minus)
    if k_plus + k_minus > m:
        raise ConfigError(
            "k_plus", f"k_plus + k_minus = {k_plus + k_minus} guesses exceed the {m} canaries"
        )
    return k_plus, k_minus


def _with_canaries(
    cfg: Config,
    base: Experiment,
    unit: str,
    m: int,
    included: np.ndarray,
    mode: str,
    rng: np.random.Generator,
):
    """(experiment with the canaries in, finish): `_record_level`'s or `_client_level`'s,
    once `m` is known to fit the run's training records or clients."""
    if unit == "record":
        total = int(base.dataset.train_sizes().sum())
        if m > total:
            raise ConfigError(
                "canaries",
                f"{m} canaries but the run has only {total} training "
                "records; use at most that many",
            )
        return _record_level(cfg, base, m, included, mode, rng)
    if m > base.dataset.num_clients:
        raise ConfigError(
            "canaries",
            f"{m} canary clients but the run has only "
            f"{base.dataset.num_clients} clients; use at most that many",
        )
    return _client_level(cfg, base, m, included)


def _run_and_score(
    exp: Experiment, finish: Any, run_dir: str | Path | None, mode: str, score: str
) -> tuple[dict[str, Any], np.ndarray, str, float | None]:
    """Runs the audited experiment, in `run_dir` or a temporary directory removed after
    scoring; returns (summary, scores, score name, audited epsilon or None)."""
    if run_dir is not None:
        out = prepare_run_dir(run_dir)
        summary = run_experiment(exp, out)
        return (summary, *finish(exp, out, mode, score))
    with tempfile.TemporaryDirectory(prefix="raydpfl-audit-") as tmp:
        summary = run_experiment(exp, Path(tmp), temporary=True)
        scores, score_name, audited = finish(exp, Path(tmp), mode, score)
        summary.pop("run_dir", None)
    return summary, scores, score_name, audited


# ---- checks ------------------------------------------------------------------------------------
def _check_args(
    canaries: Any, mode: Any, confidence: Any, k_plus: Any, k_minus: Any, score: Any
) -> None:
    if isinstance(canaries, bool) or not isinstance(canaries, (int, np.integer)) or canaries < 1:
        raise ConfigError("canaries", f"must be an integer >= 1, got {canaries!r}")
    if mode not in MODES:
        raise ConfigError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if score not in SCORES:
        raise ConfigError("score", f"must be one of {', '.join(SCORES)}, got {score!r}")
    ok = isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
    if not ok or not math.isfinite(confidence) or not 0 < confidence < 1:
        raise ConfigError("confidence", f"must be in (0, 1), got {confidence!r}")
    for name, k in (("k_plus", k_plus), ("k_minus", k_minus)):
        if k is not None and (
            isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0
        ):
            raise ConfigError(name, f"must be an integer >= 0, got {k!r}")


def _unit_of(cfg: Config, exp: Experiment) -> str:
    name = cfg.experiment.algorithm.name
    if not exp.algorithm.is_private:
        raise ConfigError(
            "experiment.algorithm.name",
            f"{name!r} is not private: there is no epsilon to audit (auditable: "
            f"{', '.join(auditable())})",
        )
    kinds = {"dp_fedavg": DPFedAvg, "dp_fedavg_client": DPFedAvgClientLevel}
    unit = auditable().get(name)
    exact = kinds.get(name)
    if unit is None or (exact is not None and type(exp.algorithm) is not exact):
        _refuse(name)
    if not _least_noise(exp.algorithm) > 0:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            "is 0: the run adds no noise and is not private; there is no epsilon to audit",
        )
    return unit


def _refuse(name: str) -> None:
    refused = not_auditable()
    why = f" ({refused[name]})" if name in refused else ""
    raise ConfigError(
        "experiment.algorithm.name",
        f"the audit puts canaries into {', '.join(auditable())} runs, not {name!r}{why}",
    )


def _least_noise(algo: Any) -> float:
    """σ of the run (the smallest of the per-client σ_i where there are several)."""
    several = getattr(algo, "noise_multipliers", None)
    if several is not None:
        return float(min(several)) if len(several) else 0.0
    return float(getattr(algo, "noise_multiplier", 0.0))


# ---- record level ------------------------------------------------------------------------------
def _record_level(
    cfg: Config,
    base: Experiment,
    m: int,
    included: np.ndarray,
    mode: str,
    rng: np.random.Generator,
):
    ds = base.dataset
    owners = rng.permutation(np.arange(m) % ds.num_clients)
    if cfg.experiment.algorithm.name != "dp_fedavg":
        return _record_level_loop(cfg, base, owners, included, mode, rng)
    if mode == "white-box":
        x_rows = np.zeros((m, *ds.input_shape), dtype=ds.x.dtype)
        y_rows = -1 - np.arange(m)  # gradient canary j (GradientCanaryEngine)
    else:  # mislabelled, out-of-distribution records
        scale = float(np.std(ds.x)) or 1.0
        x_rows = (rng.standard_normal((m, *ds.input_shape)) * 2.0 * scale).astype(ds.x.dtype)
        y_rows = rng.integers(0, ds.num_classes, m)
    augmented = cn.add_canary_records(ds, x_rows, y_rows, owners, included)
    exp = build_experiment(cfg, dataset=augmented)
    algo = exp.algorithm
    assert isinstance(algo, DPFedAvg)
    if mode == "white-box":
        exp.algorithm = cn.AuditedDPFedAvg(algo, owners, cn.CANARY_NORM_FACTOR * algo.clip_norm)
        exp.model_spec = cn.probed_spec(exp.model_spec, m)
        exp.init_params = cn.probed_params(exp.init_params, m)
    # n̄_k: client k's size with half its canaries (fixed, whichever canaries are in).
    assigned = np.bincount(owners, minlength=ds.num_clients)
    normalisers = ds.train_sizes() + assigned / 2.0
    init = {n: t.clone() for n, t in exp.init_params.items()}

    def finish(exp: Experiment, out: Path, mode: str, score: str):
        if mode == "white-box":
            assert isinstance(exp.algorithm, cn.AuditedDPFedAvg)
            scores = cn.record_white_box_scores(exp.algorithm, owners, normalisers, score)
            return scores, score, None
        final = _final_params(out)
        model = exp.model_spec.build()
        x = torch.as_tensor(x_rows)
        y = torch.as_tensor(y_rows, dtype=torch.int64)
        with torch.no_grad():
            before = F.cross_entropy(functional_call(model, init, (x,)), y, reduction="none")
            after = F.cross_entropy(functional_call(model, final, (x,)), y, reduction="none")
        return (before - after).double().numpy(), "loss", None

    return exp, finish


def _record_level_loop(
    cfg: Config,
    base: Experiment,
    owners: np.ndarray,
    included: np.ndarray,
    mode: str,
    rng: np.random.Generator,
):
    """Record level for the algorithms of the shared DP-SGD loop (`loop_auditable()`).

    White-box: null-record gradient canaries (`canaries.LoopAudit`): every canary row is
    in its owner's data, in or out; the view is each DP-SGD step's noisy sum on the
    probe, the claim to beat the ε of those steps alone. Black-box: as for dp_fedavg
    (mislabelled out-of-distribution records, in the data only when in), scored on the
    final model that evaluates the canary's client (its cluster's, for multi-model runs).
    """
    ds = base.dataset
    m = len(owners)
    if mode == "white-box":
        x_rows = np.zeros((m, *ds.input_shape), dtype=ds.x.dtype)
        y_rows = np.arange(m) % ds.num_classes
        present = np.ones(m, dtype=bool)  # out = a record whose gradient is 0
    else:
        scale = float(np.std(ds.x)) or 1.0
        x_rows = (rng.standard_normal((m, *ds.input_shape)) * 2.0 * scale).astype(ds.x.dtype)
        y_rows = rng.integers(0, ds.num_classes, m)
        present = included
    augmented = cn.add_canary_records(ds, x_rows, y_rows, owners, present)
    exp = build_experiment(cfg, dataset=augmented)
    if mode == "white-box":
        exp.algorithm = cn.audited_loop_algorithm(exp.algorithm, owners, included, len(ds.x))
        exp.model_spec = cn.probed_spec(exp.model_spec, m)
        exp.init_params = cn.probed_params(exp.init_params, m)
    init = {n: t.clone() for n, t in exp.init_params.items()}

    def finish(exp: Experiment, out: Path, mode: str, score: str):
        if mode == "white-box":
            algo = exp.algorithm
            assert isinstance(algo, cn.LoopAudit)
            if not algo.audit_steps.any():
                raise RuntimeError(
                    "the audited run recorded no DP-SGD step of any canary's client"
                )
            scores = algo.audit_sum if score == "sum" else algo.audit_llr
            return scores.copy(), score, _audited_epsilon(exp, algo, owners)
        final = _final_params(out)
        keys = exp.algorithm.evaluation_model_keys(ds.num_clients)
        model = exp.model_spec.build()
        x = torch.as_tensor(x_rows)
        y = torch.as_tensor(y_rows, dtype=torch.int64)
        with torch.no_grad():
            before = F.cross_entropy(functional_call(model, init, (x,)), y, reduction="none")
            if keys is None:
                logits = functional_call(model, final, (x,))
            else:  # each canary scored by the model of its client's cluster
                logits = torch.empty_like(functional_call(model, init, (x,)))
                for key in set(keys[int(c)] for c in owners):
                    rows = torch.as_tensor(np.flatnonzero([keys[int(c)] == key for c in owners]))
                    logits[rows] = functional_call(model, model_params(final, key), (x[rows],))
            after = F.cross_entropy(logits, y, reduction="none")
        return (before - after).double().numpy(), "loss", None

    return exp, finish


def _audited_epsilon(exp: Experiment, algo: cn.LoopAudit, owners: np.ndarray) -> float:
    """The accountant's ε of the tasks whose DP-SGD steps the white-box view read, per
    canary-owning client at its δ; the largest."""
    ledger = exp.ledger
    assert ledger is not None
    eps = 0.0
    for c in np.unique(owners):
        costs = algo.audit_costs.get(int(c), [])
        history = [cost.history_entry() for cost in costs]
        eps = max(
            eps, compute_epsilon_extended(history, ledger.delta_of(int(c)), ledger.accountant)
        )
    return float(eps)


# ---- client level ------------------------------------------------------------------------------
def _client_level(cfg: Config, base: Experiment, m: int, included: np.ndarray):
    n = base.dataset.num_clients
    augmented = cn.add_canary_clients(base.dataset, m)
    exp = build_experiment(cfg, dataset=augmented)
    algo = exp.algorithm
    assert isinstance(algo, DPFedAvgClientLevel)
    spec = cn.probed_spec(exp.model_spec, m)
    exp.init_params = cn.probed_params(exp.init_params, m)
    exp.model_spec = spec
    exp.algorithm = cn.AuditedDPFedAvgClient(
        algo, n, included, cn.CANARY_NORM_FACTOR * algo.clip_norm, len(exp.init_params)
    )
    init_probe = exp.init_params[cn.PROBE][0].double().numpy().copy()

    def finish(exp: Experiment, out: Path, mode: str, score: str):
        algo = exp.algorithm
        assert isinstance(algo, cn.AuditedDPFedAvgClient)
        if mode == "white-box":
            return cn.client_white_box_scores(algo, score), score, None
        final = _final_params(out)
        return final[cn.PROBE][0].double().numpy() - init_probe, "final", None

    return exp, finish


def _final_params(out: Path) -> dict[str, torch.Tensor]:
    """The final model, read back from the run directory's model.pt."""
    return torch.load(Path(out) / "model.pt", map_location="cpu", weights_only=True)
