"""The `tune:` section of a sweep file: search space, objective, scheduler (no Ray here).

A sweep file is an ordinary config (``experiment:``, ``runtime:``) plus a ``tune:``
section::

    tune:
      metric: test_accuracy        # a per-round column (see METRICS)
      mode: max
      num_samples: 8               # samples of the space (x every grid combination)
      scheduler: {kind: asha, grace_period: 2, reduction_factor: 2}
      search: random               # random (Ray's default), optuna or hyperopt
      max_concurrent_trials: null  # null: as many as the cluster fits
      server_cpus: 0.25            # CPUs reserved for each trial's server
      space:
        algorithm.lr: {loguniform: [0.01, 1.0]}
        privacy.clip_norm: {grid: [0.5, 1.0]}
        algorithm.local_steps: {choice: [1, 2, 5]}
        privacy.noise_multiplier: {uniform: [0.8, 1.5]}
        algorithm.rounds: {randint: [5, 10]}   # both ends included

Keys are dotted config paths (``experiment.`` may be omitted, as in ``--set``). Every
value a trial can take is validated against the config schema before Ray starts:
all values of ``grid``/``choice``, both ends of the ranges.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from raydpfl.config import did_you_mean
from raydpfl.config.load import config_from_dict, dotted_path, set_dotted
from raydpfl.config.schema import Config, ConfigError

SPACE_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
SCHEDULERS = ("fifo", "asha")
SEARCHES = ("random", "optuna", "hyperopt")
MODES = ("max", "min")

#: Per-round metrics a sweep may optimise (columns of rounds.parquet every run has;
#: the ``fair_*`` ones need per-client evaluation: experiment.algorithm.evaluate_clients).
METRICS = (
    "test_accuracy",
    "test_loss",
    "client_accuracy_mean",
    "fair_psi",
    "fair_loss_mean",
    "fair_acc_mean",
    "fair_acc_std",
    "fair_acc_var",
    "fair_acc_worst",
    "fair_acc_worst10",
)

_TUNE_KEYS = (
    "metric",
    "mode",
    "num_samples",
    "scheduler",
    "search",
    "max_concurrent_trials",
    "server_cpus",
    "seed",
    "space",
)


@dataclass(frozen=True)
class Dimension:
    """One swept config key.

    Attributes:
        key: Full dotted config path (``experiment.algorithm.lr``).
        kind: One of SPACE_KINDS.
        values: The values of ``grid`` and ``choice``.
        low, high: The range of ``uniform``, ``loguniform`` and ``randint`` (randint
            includes both ends).
    """

    key: str
    kind: str
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None

    def probe_values(self) -> tuple[Any, ...]:
        """Values that validating this dimension must try (every value, or both ends)."""
        if self.kind in ("grid", "choice"):
            return self.values
        if self.kind == "randint":
            return (int(self.low), int(self.high))  # type: ignore[arg-type]
        return (float(self.low), float(self.high))  # type: ignore[arg-type]


@dataclass(frozen=True)
class SchedulerSpec:
    """FIFO (every trial runs all its rounds) or ASHA (early stopping at rungs).

    ASHA's time unit is the round: a trial reaches rung k after grace_period ·
    reduction_factor^k rounds; `max_t` defaults to `experiment.algorithm.rounds`.
    """

    kind: Literal["fifo", "asha"] = "fifo"
    grace_period: int = 1
    reduction_factor: float = 2.0
    max_t: int | None = None


@dataclass(frozen=True)
class TuneSpec:
    """The validated `tune:` section."""

    space: tuple[Dimension, ...]
    metric: str = "test_accuracy"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 1
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    search: Literal["random", "optuna", "hyperopt"] = "random"
    max_concurrent_trials: int | None = None
    server_cpus: float = 0.25
    seed: int | None = None  # sampling seed; null = runtime.seed

    def grid_size(self) -> int:
        """The number of grid combinations (1 without grid dimensions)."""
        return math.prod(len(d.values) for d in self.space if d.kind == "grid")

    def num_trials(self) -> int:
        """How many trials the sweep runs: num_samples x grid combinations."""
        return self.num_samples * self.grid_size()


@dataclass(frozen=True)
class Sweep:
    """A sweep file: the base config (as a plain mapping and validated) and its spec."""

    base_raw: dict[str, Any]
    base: Config
    spec: TuneSpec
    tune_raw: dict[str, Any] = field(default_factory=dict)  # the tune: section as written
    #: ``--plugin`` modules and files (absolute paths), imported in every trial first.
    plugins: tuple[str, ...] = ()
    #: Registry entries (`raydpfl.registry.Entry`) of the user's own algorithm, model or
    #: dataset the config names, registered again in each trial's process (their objects
    #: travel with the sweep: by value when defined in a script or notebook).
    entries: tuple[Any, ...] = ()
    #: A model factory given from Python (`raydpfl.run_sweep(model=...)`), used by
    #: every trial instead of ``experiment.model``.
    model: Any = None

    def trial_config(self, params: Mapping[str, Any]) -> Config:
        """The config of the trial with `params` (dotted key → value)."""
        return config_from_dict(apply_params(self.base_raw, params))

    def sampling_seed(self) -> int:
        """The seed of the search's own sampling (reproducible trial parameters)."""
        return self.spec.seed if self.spec.seed is not None else self.base.runtime.seed


def apply_params(base_raw: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `base_raw` with each dotted key in `params` set to its value."""
    data = copy.deepcopy(dict(base_raw))
    for key, value in params.items():
        set_dotted(data, key, plain_value(value))
    return data


def parse_sweep(raw: Any, overrides: tuple[str, ...] = ()) -> Sweep:
    """Splits a sweep file into its base config and its validated `tune:` section.

    Raises:
        ConfigError: No `tune:` section, an unknown or invalid tune key, a swept key
            the config does not have, or a value a trial could take that the config
            schema refuses (named with its dotted field).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "", "the sweep file must be a mapping with keys experiment, runtime, tune"
        )
    if "tune" not in raw:
        raise ConfigError("tune", "a sweep file needs a tune: section (see `raydpfl tune -h`)")
    base_raw = {k: copy.deepcopy(v) for k, v in raw.items() if k != "tune"}
    base = config_from_dict(base_raw, overrides)
    # Keep the overrides in the base mapping so every trial sees them.
    base_raw = apply_overrides_raw(base_raw, overrides)
    spec = parse_tune_section(raw["tune"], base)
    for dim in spec.space:
        for value in dim.probe_values():
            try:
                config_from_dict(apply_params(base_raw, {dim.key: value}))
            except ConfigError as e:
                raise ConfigError(
                    f"tune.space.{dim.key}", f"a trial value {value!r} is invalid: {e}"
                ) from None
    return Sweep(
        base_raw=base_raw, base=base, spec=spec, tune_raw=copy.deepcopy(dict(raw["tune"]))
    )


def apply_overrides_raw(base_raw: Mapping[str, Any], overrides: tuple[str, ...]) -> dict[str, Any]:
    """`base_raw` with the ``--set`` overrides applied (as `config_from_dict` does)."""
    from raydpfl.config.load import apply_override

    data = copy.deepcopy(dict(base_raw))
    for item in overrides:
        apply_override(data, item)
    return data


def parse_tune_section(section: Any, base: Config) -> TuneSpec:
    """Validates the `tune:` mapping against `base` (the config every trial starts from)."""
    if not isinstance(section, Mapping):
        raise ConfigError("tune", "must be a mapping")
    unknown = sorted(set(section) - set(_TUNE_KEYS))
    if unknown:
        raise ConfigError(
            f"tune.{unknown[0]}",
            f"unknown key{did_you_mean(unknown[0], _TUNE_KEYS)}; allowed: {', '.join(_TUNE_KEYS)}",
        )
    metric = section.get("metric", "test_accuracy")
    _require(
        metric in METRICS,
        "tune.metric",
        f"must be one of {', '.join(METRICS)}; got {metric!r}{did_you_mean(metric, METRICS)}",
    )
    if metric.startswith("fair_") or metric == "client_accuracy_mean":
        _require(
            base.experiment.algorithm.evaluate_clients
            and base.experiment.data.client_test_fraction > 0,
            "tune.metric",
            f"{metric} is computed from per-client evaluation: set "
            "experiment.algorithm.evaluate_clients: true and data.client_test_fraction > 0",
        )
    mode = section.get("mode", "max")
    _require(mode in MODES, "tune.mode", f"must be max or min; got {mode!r}")
    num_samples = section.get("num_samples", 1)
    _require(
        _is_int(num_samples) and num_samples >= 1, "tune.num_samples", "must be an integer >= 1"
    )
    search = section.get("search", "random")
    _require(
        search in SEARCHES, "tune.search", f"must be one of {', '.join(SEARCHES)}; got {search!r}"
    )
    concurrent = section.get("max_concurrent_trials")
    _require(
        concurrent is None or (_is_int(concurrent) and concurrent >= 1),
        "tune.max_concurrent_trials",
        "must be null or an integer >= 1",
    )
    server_cpus = section.get("server_cpus", 0.25)
    _require(
        _is_number(server_cpus) and 0 < float(server_cpus) <= 64,
        "tune.server_cpus",
        "must be a number in (0, 64]",
    )
    seed = section.get("seed")
    _require(seed is None or (_is_int(seed) and seed >= 0), "tune.seed", "must be null or >= 0")
    space = _parse_space(section.get("space"))
    if search != "random":
        grids = [d.key for d in space if d.kind == "grid"]
        _require(
            not grids,
            "tune.search",
            f"{search} samples the space itself; grid dimensions ({', '.join(grids)}) need "
            "search: random (use choice instead)",
        )
    scheduler = _parse_scheduler(section.get("scheduler"), base)
    return TuneSpec(
        space=space,
        metric=metric,
        mode=mode,
        num_samples=int(num_samples),
        scheduler=scheduler,
        search=search,
        max_concurrent_trials=None if concurrent is None else int(concurrent),
        server_cpus=float(server_cpus),
        seed=None if seed is None else int(seed),
    )


def _parse_space(space: Any) -> tuple[Dimension, ...]:
    _require(
        isinstance(space, Mapping) and len(space) > 0,
        "tune.space",
        "must map at least one dotted config key to {grid|choice|uniform|loguniform|randint: ...}",
    )
    dims = []
    seen: set[str] = set()
    for raw_key, spec in space.items():
        where = f"tune.space.{raw_key}"
        parts = dotted_path(str(raw_key))
        _require(
            len(parts) >= 2 and parts[0] in ("experiment", "runtime"),
            where,
            "must be a dotted key under experiment or runtime (e.g. algorithm.lr)",
        )
        key = ".".join(parts)
        _require(key not in seen, where, "is given twice")
        seen.add(key)
        _require(
            isinstance(spec, Mapping) and len(spec) == 1,
            where,
            f"must be a mapping with one of {', '.join(SPACE_KINDS)}",
        )
        ((kind, arg),) = spec.items()
        _require(
            kind in SPACE_KINDS,
            where,
            f"kind must be one of {', '.join(SPACE_KINDS)}; got {kind!r}"
            + did_you_mean(kind, SPACE_KINDS),
        )
        if kind in ("grid", "choice"):
            _require(
                isinstance(arg, list) and len(arg) >= 1,
                f"{where}.{kind}",
                "must be a non-empty list of values",
            )
            dims.append(Dimension(key, kind, values=tuple(arg)))
            continue
        _require(
            isinstance(arg, list) and len(arg) == 2 and all(_is_number(v) for v in arg),
            f"{where}.{kind}",
            "must be [low, high] (two numbers)",
        )
        low, high = float(arg[0]), float(arg[1])
        if kind == "randint":
            _require(all(_is_int(v) for v in arg), f"{where}.randint", "must be two integers")
            _require(low <= high, f"{where}.randint", f"needs low <= high; got {arg}")
        else:
            _require(low < high, f"{where}.{kind}", f"needs low < high; got {arg}")
        if kind == "loguniform":
            _require(low > 0, f"{where}.loguniform", f"needs low > 0; got {arg}")
        dims.append(Dimension(key, kind, low=low, high=high))
    return tuple(dims)


def _parse_scheduler(raw: Any, base: Config) -> SchedulerSpec:
    if raw is None:
        return SchedulerSpec()
    if isinstance(raw, str):
        raw = {"kind": raw}
    _require(isinstance(raw, Mapping), "tune.scheduler", "must be fifo, asha or a mapping")
    allowed = ("kind", "grace_period", "reduction_factor", "max_t")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ConfigError(
            f"tune.scheduler.{unknown[0]}",
            f"unknown key{did_you_mean(unknown[0], allowed)}; allowed: {', '.join(allowed)}",
        )
    kind = raw.get("kind", "fifo")
    _require(kind in SCHEDULERS, "tune.scheduler.kind", f"must be fifo or asha; got {kind!r}")
    grace = raw.get("grace_period", 1)
    _require(
        _is_int(grace) and grace >= 1, "tune.scheduler.grace_period", "must be an integer >= 1"
    )
    factor = raw.get("reduction_factor", 2.0)
    _require(
        _is_number(factor) and float(factor) > 1,
        "tune.scheduler.reduction_factor",
        "must be a number > 1",
    )
    max_t = raw.get("max_t")
    _require(
        max_t is None or (_is_int(max_t) and max_t >= grace),
        "tune.scheduler.max_t",
        f"must be null (experiment.algorithm.rounds) or an integer >= grace_period ({grace})",
    )
    every = base.experiment.algorithm.eval_every
    if kind == "asha":
        # A rung compares the metric as of the latest evaluation; before the first one
        # there is nothing to compare.
        _require(
            grace >= every,
            "tune.scheduler.grace_period",
            f"must be >= experiment.algorithm.eval_every ({every}) so that every trial "
            "has been evaluated when ASHA first compares trials",
        )
    return SchedulerSpec(
        kind=kind,
        grace_period=int(grace),
        reduction_factor=float(factor),
        max_t=None if max_t is None else int(max_t),
    )


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ConfigError(field_name, message)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plain_value(value: Any) -> Any:
    """Numpy scalars from samplers become plain Python values (YAML and the schema)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return value.item()
    return value
