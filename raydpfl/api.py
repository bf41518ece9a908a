"""Run a simulation from Python: `run_simulation(...)` → `SimulationResult`.

The CLI's `raydpfl run` is this function with a YAML file. Everything a YAML config says
can be given as a `Config` (or a plain mapping, or a path), and the parts a researcher
writes themselves can be given as objects:

    import raydpfl
    result = raydpfl.run_simulation(
        "configs/quickstart.yaml",
        overrides=["runtime.backend=local"],
        model=MyNet,                   # a class or function with no arguments → nn.Module
        algorithm=MyAlgorithm(...),    # any raydpfl.algorithms.Algorithm instance
        dataset=my_federated_dataset,  # a raydpfl.data.FederatedDataset
    )
    result.history.to_pandas(); result.summary["epsilon_max"]; result.params

A sweep of it (`raydpfl tune` from Python) is `run_sweep(config, space, ...)` →
`SweepResult` (the results table, the summary, the best trial's config).

Objects defined in the user's script (``__main__``, a notebook) reach Ray workers too:
Ray ships them by value. Bad arguments raise `ConfigError` naming the argument before any
data is loaded or Ray is started.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from raydpfl.algorithms.base import Algorithm
from raydpfl.callbacks import Callback
from raydpfl.cli.ray_logs import quiet_ray
from raydpfl.config.load import config_from_any, override_list
from raydpfl.config.schema import Config
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.build import (
    build_experiment,
    check_callbacks_keep_files,
    run_experiment,
)
from raydpfl.privacy.accounting.client_level import ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.simulation.outputs import check_run_dir_free, prepare_run_dir
from raydpfl.simulation.run_lock import run_dir_lock

__all__ = [
    "SimulationResult",
    "SweepFailedError",
    "SweepResult",
    "resume_sweep",
    "run_simulation",
    "run_sweep",
    "to_config",
]


@dataclass(frozen=True)
class SimulationResult:
    """What a finished simulation hands back (the same whatever the backend).

    Attributes:
        summary: summary.json: final accuracy, ε (with its δ and unit), hashes, ...
        history: One row per round (rounds.parquet) as a pyarrow Table; ``.to_pandas()``.
        params: The final global parameters (CPU tensors).
        ledger: Every client's privacy charges (None for a non-private run); a
            client-level run's population ledger (`ClientLevelLedger`).
        run_dir: Where the outputs are, or None when none was asked for (they were
            written to a temporary directory, read back and removed).
    """

    summary: dict[str, Any]
    history: pa.Table
    params: dict[str, torch.Tensor]
    ledger: PrivacyLedger | ClientLevelLedger | None
    run_dir: Path | None

    @property
    def model_sha256(self) -> str:
        """The final model's hash (equal across backends for the same seed)."""
        return str(self.summary["model_sha256"])

    @property
    def epsilon(self) -> float | None:
        """The largest ε of any client (None: non-private), at `summary["delta"]`."""
        return self.summary.get("epsilon_max")


def to_config(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    overrides: Iterable[str] = (),
) -> Config:
    """The validated config tree from a `Config`, a plain mapping, a YAML path or None
    (all defaults), with dotted ``key=value`` overrides applied (as ``--set`` does)."""
    overrides = override_list(overrides)
    if isinstance(config, Config) and not overrides:
        return config  # already validated; nothing to apply
    return config_from_any(config, overrides)


def run_simulation(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    algorithm: Algorithm | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    dataset: FederatedDataset | None = None,
    run_dir: str | Path | None = None,
    on_round: Callable[[Mapping[str, Any]], None] | None = None,
    callbacks: Sequence[Callback] = (),
) -> SimulationResult:
    """Runs one simulation and returns its result.

    Args:
        config: The experiment and runtime (see `to_config`); ``runtime.backend``
            chooses in-process (``local``) or Ray (``ray``, with ``runtime.workers`` and
            CPU/GPU shares).
        overrides: Dotted ``key=value`` strings applied to `config`.
        algorithm: An `Algorithm` instance replacing ``experiment.algorithm.name``'s.
        model: A callable with no arguments returning a fresh `torch.nn.Module` (e.g. a
            Module class), replacing ``experiment.model``.
        dataset: A `FederatedDataset` replacing ``experiment.data``'s.
        run_dir: Where outputs go (new or empty); None keeps them only in the result
            (written to a temporary directory, read back and removed), so a tracker that
            writes into the run directory (``runtime.callbacks: tensorboard``, a
            `TensorBoardCallback` without ``log_dir``) is refused: give a run_dir or a
            log_dir.
        on_round: Called with each round's row as the run goes.
        callbacks: `raydpfl.callbacks.Callback` objects (trackers, or your own), told
            the run's start, each round's row and the summary; added to those named in
            ``runtime.callbacks``.

    Raises:
        ConfigError: A bad config value or argument (named), before any work starts.
        FileExistsError: `run_dir` exists and is not empty.
        ConfigError: also a tensorboard tracker with nowhere to keep its files (see
            `run_dir`), before any data is loaded.
        RunDirBusyError: Another process is running in `run_dir` (its pid is named).
    """
    quiet_ray()  # Ray's per-run notices stay in its log files, as under `raydpfl run`
    cfg = to_config(config, overrides)
    if run_dir is not None:
        check_run_dir_free(run_dir)
    check_callbacks_keep_files(cfg, callbacks, run_dir_kept=run_dir is not None)
    exp = build_experiment(cfg, dataset=dataset, model=model, algorithm=algorithm)
    if run_dir is not None:
        with run_dir_lock(run_dir):  # one process per run directory, for the run's life
            out = prepare_run_dir(run_dir)
            return _result(
                run_experiment(exp, out, on_round=on_round, callbacks=callbacks), out, keep=True
            )
    with tempfile.TemporaryDirectory(prefix="raydpfl-") as tmp:
        summary = run_experiment(
            exp, Path(tmp), on_round=on_round, callbacks=callbacks, temporary=True
        )
        return _result(summary, Path(tmp), keep=False)


def _result(summary: dict[str, Any], run_dir: Path, keep: bool) -> SimulationResult:
    """Reads the run's outputs back into memory."""
    ledger_path = run_dir / "ledger.json"
    ledger = None
    if ledger_path.exists():
        import json

        data = json.loads(ledger_path.read_text(encoding="utf-8"))
        kind = ClientLevelLedger if data.get("unit") == ClientLevelLedger.unit else PrivacyLedger
        ledger = kind.from_dict(data)
    rounds = run_dir / "rounds.parquet"
    history = pq.read_table(rounds) if rounds.exists() else pa.table({})
    params = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    summary = dict(summary)
    if not keep:
        summary.pop("run_dir", None)
    return SimulationResult(summary, history, params, ledger, run_dir if keep else None)


# ---- sweeps ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepResult:
    """What a finished sweep hands back (`run_sweep`).

    Attributes:
        table: One row per trial (results.parquet) as a pyarrow Table: the swept keys,
            ``status`` (completed, stopped_early, error, interrupted, not_started),
            ``metric_last``, ``metric_best``, ``final_test_accuracy``, ``epsilon_max``,
            ``model_sha256``, ``run_dir`` and ``error``; ``.to_pandas()``.
        summary: sweep_summary.json: the objective, the best trial and its parameters,
            counts by status and the privacy of selecting the best trial.
        best_config: The best trial's full config (None when no trial was scored).
        sweep_dir: Where the outputs are, or None when none was asked for.
    """

    table: pa.Table
    summary: dict[str, Any]
    best_config: Config | None
    sweep_dir: Path | None


class SweepFailedError(RuntimeError):
    """Every trial of the sweep failed; `result` holds the table (each trial's error)."""

    def __init__(self, message: str, result: SweepResult) -> None:
        super().__init__(message)
        self.result = result


def run_sweep(
    config: Config | Mapping[str, Any] | str | Path | None,
    space: Mapping[str, Mapping[str, Any]],
    *,
    metric: str = "test_accuracy",
    mode: str = "max",
    num_samples: int = 1,
    scheduler: str | Mapping[str, Any] | None = None,
    search: str = "random",
    max_concurrent_trials: int | None = None,
    server_cpus: float = 0.25,
    seed: int | None = None,
    overrides: Iterable[str] = (),
    algorithm: type[Algorithm] | Callable[..., Algorithm] | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    plugins: Sequence[str] = (),
    sweep_dir: str | Path | None = None,
    verbose: int = 0,
    on_progress: Callable[[Mapping[str, Any]], None] | None = None,
) -> SweepResult:
    """Runs a Ray Tune sweep whose trials are whole simulations: `raydpfl tune` from Python.

    The arguments after `space` are the keys of a sweep file's ``tune:`` section (see
    `raydpfl.tune.spec`, configs/sweeps/); every value a trial can take is validated,
    and everything ``raydpfl run`` checks before training is checked for every trial,
    before Ray Tune starts.

    Example::

        result = raydpfl.run_sweep(
            "configs/quickstart.yaml",
            {"algorithm.lr": {"grid": [0.1, 0.5]}, "privacy.clip_norm": {"uniform": [0.5, 2]}},
            num_samples=2, scheduler={"kind": "asha", "grace_period": 2},
            algorithm=MyAlgorithm,          # a class; registered under its name if needed
            overrides=["runtime.backend=local"],
        )
        result.table.to_pandas(); result.summary["best_params"]; result.best_config

    Args:
        config: The base config every trial starts from (see `to_config`).
        space: Dotted config key → ``{grid|choice: [...]}``, ``{uniform|loguniform: [lo,
            hi]}`` or ``{randint: [lo, hi]}`` (both ends included).
        metric, mode: The per-round column each trial is scored by, ``max`` or ``min``.
        num_samples: Samples of the space (× every grid combination).
        scheduler: ``fifo`` (default), ``asha`` or a mapping (kind, grace_period,
            reduction_factor, max_t).
        search: ``random`` (planned up front from `seed`), ``optuna`` or ``hyperopt``.
        max_concurrent_trials: None: as many as the cluster fits.
        server_cpus: CPUs reserved for each trial's server.
        seed: The search's sampling seed (None: ``runtime.seed``).
        overrides: Dotted ``key=value`` strings applied to `config`.
        algorithm: Your `Algorithm` subclass (or builder function), used by every trial
            (each builds its own from its config, so swept keys reach it): it is
            registered under its ``__name__`` unless it is registered already, and
            ``experiment.algorithm.name`` is set to that name. An instance is refused:
            one object cannot take each trial's values.
        model: A callable with no arguments returning a fresh `torch.nn.Module`, used by
            every trial instead of ``experiment.model``.
        plugins: Modules or ``.py`` files to import first (``--plugin``); imported again
            in every trial.
        sweep_dir: Where the outputs go (new or empty); None keeps only the result
            (written to a temporary directory, read back and removed).
        verbose: Ray Tune's own verbosity (0: its tables stay off the terminal).
        on_progress: Told ``{"done", "total", "running", "failed", "best", "metric"}``
            as trials progress.

    Raises:
        ConfigError: A bad config, space or argument, or a trial that would be refused
            (named), before Ray Tune starts.
        DatasetNotFoundError: A trial's dataset files are missing.
        FileExistsError: `sweep_dir` exists and is not empty.
        SweepFailedError: Every trial failed (its ``result`` holds each trial's error).
    """
    from raydpfl.config.load import read_yaml
    from raydpfl.config.schema import ConfigError
    from raydpfl.experiment.plugins import import_plugins
    from raydpfl.tune.spec import parse_sweep
    from raydpfl.tune.sweep import execute_sweep, plugin_specs, user_entries

    quiet_ray()
    import_plugins(list(plugins))
    raw = _raw_config(config, read_yaml)
    if algorithm is not None:
        raw.setdefault("experiment", {}).setdefault("algorithm", {})["name"] = _registered_name(
            algorithm
        )
    if model is not None and not callable(model):
        raise ConfigError(
            "model", f"must be a callable returning a torch.nn.Module, got {model!r}"
        )
    tune: dict[str, Any] = {
        "metric": metric,
        "mode": mode,
        "num_samples": num_samples,
        "search": search,
        "max_concurrent_trials": max_concurrent_trials,
        "server_cpus": server_cpus,
        "space": {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in space.items()},
    }
    if scheduler is not None:
        tune["scheduler"] = dict(scheduler) if isinstance(scheduler, Mapping) else scheduler
    if seed is not None:
        tune["seed"] = seed
    sweep = parse_sweep({**raw, "tune": tune}, tuple(override_list(overrides)))
    sweep = dataclasses.replace(
        sweep, plugins=plugin_specs(list(plugins)), entries=user_entries(sweep.base), model=model
    )
    if sweep_dir is not None:
        return _sweep_result(
            execute_sweep(sweep, Path(sweep_dir), verbose=verbose, on_progress=on_progress),
            keep=True,
        )
    with tempfile.TemporaryDirectory(prefix="raydpfl-sweep-") as tmp:
        out = Path(tmp) / "sweep"
        return _sweep_result(
            execute_sweep(sweep, out, verbose=verbose, on_progress=on_progress), keep=False
        )


def resume_sweep(
    sweep_dir: str | Path,
    *,
    algorithm: type[Algorithm] | Callable[..., Algorithm] | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    plugins: Sequence[str] = (),
    verbose: int = 0,
    on_progress: Callable[[Mapping[str, Any]], None] | None = None,
) -> SweepResult:
    """Continues an interrupted sweep (`raydpfl tune --resume` from Python): the same
    trials, from the directory's own sweep.yaml and sweep_state.json (no pickle is ever
    loaded); finished trials replay, unfinished ones continue from their checkpoints.

    Args:
        sweep_dir: The directory `run_sweep` (or `raydpfl tune`) wrote.
        algorithm, model: The Python objects the sweep ran with, again (a sweep that used
            them is refused without them, or with others).
        plugins: Modules or files to import besides those the sweep recorded.
        verbose, on_progress: As in `run_sweep`.

    Raises:
        ConfigError: Not a resumable sweep directory, or its Python objects are missing
            or differ.
        SweepFailedError: Every trial failed.
    """
    from raydpfl.experiment.plugins import import_plugins
    from raydpfl.tune.sweep import resume_sweep as resume

    quiet_ray()
    import_plugins(list(plugins))
    if algorithm is not None:
        _registered_name(algorithm)
    summary = resume(
        Path(sweep_dir), verbose, tuple(plugins), on_progress=on_progress, model=model
    )
    return _sweep_result(summary, keep=True)


def _raw_config(config: Any, read_yaml: Callable[[Path], Any]) -> dict[str, Any]:
    """The base config as the plain mapping a sweep file holds."""
    import copy

    import yaml

    from raydpfl.config.load import dump_config
    from raydpfl.config.schema import ConfigError

    if config is None:
        return {}
    if isinstance(config, Config):
        return yaml.safe_load(dump_config(config))
    raw = read_yaml(Path(config)) if isinstance(config, (str, Path)) else config
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"must be a mapping, a Config or a YAML path, got {raw!r}")
    return copy.deepcopy(dict(raw))


def _registered_name(algorithm: Any) -> str:
    """The registry name of the user's algorithm class or builder (registered if new)."""
    from raydpfl import registry
    from raydpfl.config.schema import ConfigError

    if isinstance(algorithm, Algorithm):
        raise ConfigError(
            "algorithm",
            f"a sweep builds each trial's algorithm from the trial's config: pass the class "
            f"{type(algorithm).__name__}, not an instance",
        )
    if not callable(algorithm):
        raise ConfigError("algorithm", f"must be an Algorithm subclass, got {algorithm!r}")
    for entry in registry.entries("algorithm"):
        if entry.target is algorithm:
            return entry.name
    name = getattr(algorithm, "__name__", None)
    if not isinstance(name, str):
        raise ConfigError("algorithm", "has no __name__ to register it by; register it first")
    registry.register("algorithm", name, algorithm)
    return name


def _sweep_result(summary: dict[str, Any], keep: bool) -> SweepResult:
    """Reads a finished sweep's outputs back into memory."""
    from raydpfl.config.load import load_config
    from raydpfl.tune.sweep import BEST_CONFIG, RESULTS_FILE

    sweep_dir = Path(summary["sweep_dir"])
    table = pq.read_table(sweep_dir / RESULTS_FILE)
    best = sweep_dir / BEST_CONFIG
    best_config = load_config(best) if best.exists() else None
    rows = summary.pop("rows", [])
    if not keep:
        summary.pop("sweep_dir", None)
    result = SweepResult(table, summary, best_config, sweep_dir if keep else None)
    failed = [r for r in rows if r["status"] == "error"]
    if rows and len(failed) == len(rows):
        raise SweepFailedError(
            f"all {len(rows)} trials failed; first error ({failed[0]['trial_id']}): "
            f"{failed[0].get('error')}",
            result,
        )
    return result
