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

Objects defined in the user's script (``__main__``, a notebook) reach Ray workers too:
Ray ships them by value. Bad arguments raise `ConfigError` naming the argument before any
data is loaded or Ray is started.
"""

from __future__ import annotations

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
from raydpfl.privacy.client_level import ClientLevelLedger
from raydpfl.privacy.ledger import PrivacyLedger
from raydpfl.simulation.outputs import check_run_dir_free, prepare_run_dir
from raydpfl.simulation.run_lock import run_dir_lock

__all__ = ["SimulationResult", "run_simulation", "to_config"]


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
