"""Reading run directories (and sweeps of them) for `raydpfl report`.

A run directory is what `raydpfl run` writes (see `raydpfl.simulation.outputs`): it
holds rounds.parquet and, once the run finished, summary.json. A sweep directory holds
no summary.json itself but has run directories below it (one or two levels down). An
interrupted run (rounds.parquet without summary.json) is reported from its rounds.

Only numpy, pyarrow and yaml are used here; matplotlib is imported by `plots` alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.report.labels import param_label

__all__ = [
    "ReportError",
    "Run",
    "collect_runs",
    "fairness_by_round",
    "is_run_dir",
    "load_run",
    "swept_keys",
    "varying_config_keys",
]

SWEEP_DEPTH = 2  # how deep below a sweep directory run directories are looked for


class ReportError(ValueError):
    """A report input is not a run or sweep directory, or a run file cannot be read."""


@dataclass
class Run:
    """One run directory, loaded.

    Attributes:
        path: The run directory.
        summary: summary.json ({} for an interrupted run).
        rounds: rounds.parquet, numeric columns only, as float arrays (nulls are NaN).
        clients: clients.parquet as float arrays; None when absent or empty.
        config: config.yaml parsed (None when absent or unreadable).
        sweep: The sweep directory's name when the run was found inside one.
        name: The run's directory name (relative to its sweep, for a sweep trial).
        label: A short name, unique among the report's runs (set by `collect_runs`).
        swept: For a sweep trial, its values of the sweep's swept config keys (dotted,
            'experiment.' dropped), in the sweep's order; {} otherwise.
    """

    path: Path
    summary: dict[str, Any]
    rounds: dict[str, np.ndarray]
    clients: dict[str, np.ndarray] | None
    config: dict[str, Any] | None
    sweep: str | None = None
    name: str = ""
    label: str = ""
    swept: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ---- metadata (summary.json first, config.yaml as the fallback) ---------------
    def _config_get(self, *keys: str) -> Any:
        node: Any = self.config
        for k in keys:
            if not isinstance(node, Mapping) or k not in node:
                return None
            node = node[k]
        return node

    @property
    def experiment(self) -> str:
        value = self.summary.get("experiment") or self._config_get("experiment", "name")
        return str(value) if value else self.path.name

    @property
    def algorithm(self) -> str:
        value = self.summary.get("algorithm") or self._config_get(
            "experiment", "algorithm", "name"
        )
        return str(value) if value else "?"

    @property
    def dataset(self) -> str:
        value = self.summary.get("dataset") or self._config_get("experiment", "data", "dataset")
        return str(value) if value else "?"

    @property
    def seed(self) -> Any:
        value = self.summary.get("seed")
        return value if value is not None else self._config_get("runtime", "seed")

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    # ---- figures --------------------------------------------------------------------
    @property
    def round_index(self) -> np.ndarray:
        return self.rounds["round"]

    def evaluated(self, column: str = "test_accuracy") -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the rounds where `column` is finite."""
        if column not in self.rounds:
            return np.empty(0), np.empty(0)
        values = self.rounds[column]
        ok = np.isfinite(values)
        return self.round_index[ok], values[ok]

    @property
    def best_accuracy(self) -> float | None:
        value = self.summary.get("best_test_accuracy")
        if value is None:
            _, acc = self.evaluated()
            return float(acc.max()) if acc.size else None
        return float(value)

    @property
    def best_round(self) -> int | None:
        r, acc = self.evaluated()
        return int(r[int(np.argmax(acc))]) if acc.size else None

    @property
    def final_accuracy(self) -> float | None:
        value = self.summary.get("final_test_accuracy")
        if value is None:
            _, acc = self.evaluated()
            return float(acc[-1]) if acc.size else None
        return float(value)

    @property
    def private(self) -> bool:
        if "private" in self.summary:
            return bool(self.summary["private"])
        eps = self.rounds.get("epsilon_max")
        return eps is not None and bool(np.isfinite(eps).any())

    @property
    def epsilon_max(self) -> float | None:
        """The largest ε any client spent (None: non-private run)."""
        if not self.private:
            return None
        value = self.summary.get("epsilon_max")
        if value is not None:
            return float(value)
        _, eps = self.evaluated("epsilon_max")
        return float(eps[-1]) if eps.size else None

    @property
    def epsilon_budget(self) -> float | None:
        privacy = self.summary.get("privacy")
        value = privacy.get("epsilon_budget") if isinstance(privacy, Mapping) else None
        if value is None:
            value = self._config_get("experiment", "privacy", "epsilon")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def delta(self) -> float | None:
        value = self._privacy_setting("delta")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def accountant(self) -> str | None:
        value = self._privacy_setting("accountant")
        return str(value) if value else None

    def _privacy_setting(self, key: str) -> Any:
        """The summary's `key`, else (private runs) the config's experiment.privacy.`key`."""
        value = self.summary.get(key)
        if value is None and self.private:
            value = self._config_get("experiment", "privacy", key)
        return value

    @property
    def rounds_completed(self) -> int:
        value = self.summary.get("rounds_completed")
        return int(value) if value is not None else len(self.round_index)

    @property
    def rounds_planned(self) -> int | None:
        value = self.summary.get("rounds_planned")
        if value is None:
            value = self._config_get("experiment", "algorithm", "rounds")
        return int(value) if isinstance(value, (int, float)) else None

    @property
    def wall_seconds(self) -> float | None:
        value = self.summary.get("wall_seconds")
        if value is not None:
            return float(value)
        wall = self.rounds.get("wall_seconds")
        return float(np.nansum(wall)) if wall is not None and wall.size else None

    @property
    def stop_reason(self) -> str:
        if not self.finished:
            return "unfinished (no summary.json)"
        return str(self.summary.get("stop_reason") or "?")

    @property
    def unaccounted_releases(self) -> list[str]:
        value = self.summary.get("unaccounted_releases")
        return [str(v) for v in value] if isinstance(value, list) else []


# ---- discovery ---------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    """True for a directory holding rounds.parquet or summary.json."""
    return path.is_dir() and (
        (path / "rounds.parquet").is_file() or (path / "summary.json").is_file()
    )


def _runs_below(root: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    if depth == 0:
        return found
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return found
    for child in children:
        if is_run_dir(child):
            found.append(child)
        else:
            found.extend(_runs_below(child, depth - 1))
    return found


def collect_runs(paths: Sequence[str | Path]) -> tuple[list[Run], list[str]]:
    """Loads every run named by `paths` (run or sweep directories), with unique labels.

    Returns:
        (runs, notes): runs in argument order (a sweep's trials sorted by path), and
        notes on sweep trials that were skipped because they could not be read.

    Raises:
        ReportError: A path that does not exist, is not a run directory and holds no run
            directories, or a named run directory that cannot be read.
    """
    if not paths:
        raise ReportError("no run directory given")
    runs: list[Run] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ReportError(f"{str(path)!r} does not exist")
        if not path.is_dir():
            raise ReportError(f"{str(path)!r} is not a directory")
        if is_run_dir(path):
            if path.resolve() not in seen:
                seen.add(path.resolve())
                runs.append(load_run(path))
            continue
        trials = _runs_below(path, SWEEP_DEPTH)
        if not trials:
            raise ReportError(
                f"{str(path)!r} is not a run directory (no rounds.parquet or summary.json) "
                "and holds no run directories"
            )
        sweep = path.resolve().name or str(path)
        for trial in trials:
            if trial.resolve() in seen:
                continue
            seen.add(trial.resolve())
            try:
                run = load_run(trial)
            except ReportError as e:
                notes.append(f"skipped sweep trial {trial}: {e}")
                continue
            run.sweep = sweep
            run.name = trial.relative_to(path).as_posix()
            runs.append(run)
        trials_read = [r for r in runs if r.sweep == sweep]
        if not trials_read:
            raise ReportError(f"no readable run directory in sweep {str(path)!r}")
        _record_swept_values(trials_read, swept_keys(path, trials_read))
    _label(runs)
    return runs, notes


# ---- what a sweep varies -----------------------------------------------------------------
SWEEP_FILE = "sweep.yaml"  # the sweep file as `raydpfl tune` ran it (tune.space inside)
MAX_GUESSED_PARAMS = 3  # a hand-gathered sweep labels its trials by this many differences


def swept_keys(sweep_dir: Path, trials: Sequence[Run]) -> list[str]:
    """The config keys a sweep varies (dotted, 'experiment.' dropped), in its order.

    `raydpfl tune` records its search space in sweep.yaml (`tune.space`) before the first
    trial starts, so even an interrupted sweep names what it searched. A folder of runs
    gathered by hand has no such file: the keys whose values differ between its trials
    (from each trial's config.yaml) stand in, at most MAX_GUESSED_PARAMS of them.
    """
    space = _tune_space(sweep_dir / SWEEP_FILE)
    if space:
        return [_report_key(k) for k in space]
    return list(varying_config_keys(trials))[:MAX_GUESSED_PARAMS]


def _tune_space(path: Path) -> list[str]:
    """The keys of sweep.yaml's `tune.space`; [] when the file is absent or unreadable."""
    data = _read_config(path)
    tune = data.get("tune") if data else None
    space = tune.get("space") if isinstance(tune, Mapping) else None
    return [str(k) for k in space] if isinstance(space, Mapping) else []


def _report_key(key: str) -> str:
    """A tune.space key as `varying_config_keys` spells it: 'experiment.' dropped (tune
    takes `algorithm.lr` and `experiment.algorithm.lr` alike)."""
    return key.removeprefix("experiment.")


def _record_swept_values(trials: Sequence[Run], keys: Sequence[str]) -> None:
    """Sets each trial's `swept` from its own config.yaml: the values it actually ran."""
    for run in trials:
        flat = _flatten(run.config) if run.config else {}
        run.swept = {k: flat.get(f"experiment.{k}", flat.get(k)) for k in keys}


# ---- labels ------------------------------------------------------------------------------
def _label(runs: list[Run]) -> None:
    """Short unique labels, the names legends show.

    A sweep trial is named by its swept values (`lr=0.05, clip=1`), prefixed by its sweep
    when several sweeps or plain runs are reported together; a run by experiment ·
    algorithm · seed. Runs that would share a label get the settings that tell them
    apart, and failing that their directory name.
    """
    sweeps = {r.sweep for r in runs}
    only_one_sweep = len(sweeps) == 1 and None not in sweeps
    for run in runs:
        if run.sweep is not None:
            values = param_label(run.swept) if run.swept else run.name
            run.label = values if only_one_sweep else f"{run.sweep}: {values}"
        else:
            seed = run.seed
            run.label = f"{run.experiment} · {run.algorithm}" + (
                f" · seed {seed}" if seed is not None else ""
            )
    _add_differing_settings(runs)
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.label] = counts.get(run.label, 0) + 1
    for run in runs:
        if counts[run.label] > 1:
            run.label = f"{run.label} ({run.path.name})"
    # Still equal (same directory names under different parents): number them.
    final: dict[str, int] = {}
    for run in runs:
        n = final.get(run.label, 0) + 1
        final[run.label] = n
        if n > 1:
            run.label = f"{run.label} #{n}"


def _add_differing_settings(runs: list[Run]) -> None:
    """Appends ` · lr=0.1` (the config values that differ) to plain runs sharing a label,
    so a comparison legend says what was compared rather than which folder it was in."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.sweep is None:
            groups.setdefault(run.label, []).append(run)
    for group in groups.values():
        if len(group) < 2:
            continue
        varying = dict(list(varying_config_keys(group).items())[:MAX_GUESSED_PARAMS])
        for i, run in enumerate(group):
            if varying:
                run.label += " · " + param_label({k: v[i] for k, v in varying.items()})


# ---- loading -----------------------------------------------------------------------------
def load_run(path: str | Path) -> Run:
    """Loads one run directory.

    Raises:
        ReportError: rounds.parquet missing or unreadable, or summary.json unreadable.
    """
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{str(p)!r} is not a directory")
    rounds_path = p / "rounds.parquet"
    if not rounds_path.is_file():
        raise ReportError(
            f"{str(p)!r} is not a run directory: missing rounds.parquet "
            "(a run writes it after its first round)"
        )
    rounds = _read_table(rounds_path)
    if "round" not in rounds:
        raise ReportError(f"{rounds_path}: no 'round' column; not a rounds table of raydpfl")
    order = np.argsort(rounds["round"], kind="stable")
    rounds = {k: v[order] for k, v in rounds.items()}
    clients = None
    clients_path = p / "clients.parquet"
    if clients_path.is_file():
        clients = _read_table(clients_path)
        needed = {"round", "client_id", "test_accuracy"}
        if not needed <= set(clients) or clients["round"].size == 0:
            clients = None
    return Run(
        path=p,
        summary=_read_summary(p / "summary.json"),
        rounds=rounds,
        clients=clients,
        config=_read_config(p / "config.yaml"),
        name=p.resolve().name or str(p),
    )


def _read_table(path: Path) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    out: dict[str, np.ndarray] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        t = column.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            continue
        out[name] = np.asarray(
            pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64
        )
    return out


def _read_summary(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return data


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


# ---- derived tables ----------------------------------------------------------------------
def fairness_by_round(clients: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fairness metrics over clients at each evaluated round.

    Clients without a finite test accuracy (no held-out records) are left out. Ψ is the
    variance of the clients' test losses weighted by their training-set sizes
    (num_examples; uniform when that column is missing), +inf when a loss diverged.

    Returns:
        Arrays keyed round, clients, acc_mean, acc_std, acc_worst, acc_worst10, psi.
    """
    from raydpfl.simulation.fairness import fairness_metrics

    keys = ("round", "clients", "acc_mean", "acc_std", "acc_worst", "acc_worst10", "psi")
    out: dict[str, list[float]] = {k: [] for k in keys}
    rnd = clients["round"]
    acc = clients["test_accuracy"]
    loss = clients.get("test_loss")
    weight = clients.get("num_examples")
    for r in np.unique(rnd[np.isfinite(rnd)]):
        ok = (rnd == r) & np.isfinite(acc)
        if not ok.any():
            continue
        m = fairness_metrics(accuracies=acc[ok])
        psi = math.nan
        if loss is not None:
            lok = (rnd == r) & ~np.isnan(loss)
            w = None
            if weight is not None and np.isfinite(weight[lok]).all() and weight[lok].sum() > 0:
                w = weight[lok]
            if lok.any() and not (loss[lok] == -np.inf).any():
                psi = fairness_metrics(losses=loss[lok], weights=w)["psi"]
        out["round"].append(float(r))
        out["clients"].append(float(ok.sum()))
        for k in ("acc_mean", "acc_std", "acc_worst", "acc_worst10"):
            out[k].append(m[k])
        out["psi"].append(psi)
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def last_round_accuracies(clients: Mapping[str, np.ndarray]) -> tuple[int, np.ndarray]:
    """(round, finite per-client accuracies) at the last evaluated round."""
    rnd = clients["round"]
    last = float(np.nanmax(rnd))
    acc = clients["test_accuracy"][rnd == last]
    return int(last), acc[np.isfinite(acc)]


_IGNORED_CONFIG_KEYS = ("runtime.output", "runtime.progress")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def varying_config_keys(runs: Iterable[Run]) -> dict[str, list[Any]]:
    """Config keys (dotted, 'experiment.' dropped) whose values differ between the runs.

    Returns:
        {key: [value per run, in order]}; empty when fewer than two runs have a config.
    """
    runs = list(runs)
    flats = [_flatten(r.config) if r.config else None for r in runs]
    if sum(f is not None for f in flats) < 2:
        return {}
    keys: list[str] = []
    for f in flats:
        for k in f or {}:
            if k not in keys:
                keys.append(k)
    out: dict[str, list[Any]] = {}
    for k in keys:
        if k.startswith(_IGNORED_CONFIG_KEYS):
            continue
        values = [f.get(k) if f is not None else None for f in flats]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            short = k.removeprefix("experiment.")
            out[short] = values
    return out
