"""`raydpfl tune`: a Ray Tune sweep whose trials are whole simulations.

    SWEEP_DIR/
      sweep.yaml             the sweep file as run (base config, --set applied, tune:)
      trials/<trial_id>/     one ordinary run directory per trial (`raydpfl report` reads it)
      trials/.attempts/      earlier attempts of trials restarted before their first checkpoint
      tune/sweep/            Ray Tune's experiment state (what `--resume` restores)
      results.parquet        one row per trial: parameters, status, metric, ε
      best_config.yaml       the best trial's full config (runs with `raydpfl run`)
      sweep_summary.json     objective, best trial, and the privacy of selecting it

Each trial reserves its server and its workers together in one placement group
(`PlacementGroupFactory`: one bundle for the server, one per worker), so trials never
wait on each other's workers. The trial process is the server: it hosts the round
loop, and its worker actors are created inside the trial's placement group. Every
round's row is reported to Tune (the metric as of the latest evaluation), so ASHA can
stop weak trials at its rungs; round numbers are Tune's time unit.

An interrupted sweep resumes with `raydpfl tune --resume SWEEP_DIR`: finished trials
are kept, unfinished ones restart, and a trial with a checkpoint continues from it
(the run directory's own checkpoint/resume, so it ends with the same model). Ctrl-C or
SIGTERM stops a sweep through Tune's own graceful stop (`interrupt`): its state is saved,
the table is written with each trial's status (`status.sweep_status`), and
sweep_summary.json records the signal under "interrupted".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from raydpfl.config.load import dump_config, read_yaml
from raydpfl.config.schema import Config, ConfigError
from raydpfl.simulation.integrity import has_checkpoint
from raydpfl.simulation.outputs import check_run_dir_free, prepare_run_dir
from raydpfl.simulation.run_lock import LOCK_FILE, run_dir_lock
from raydpfl.tune.selection import selection_privacy
from raydpfl.tune.spec import Sweep, TuneSpec, parse_sweep, plain_value

SWEEP_FILE = "sweep.yaml"
TRIALS_DIR = "trials"
ATTEMPTS_DIR = ".attempts"
TUNE_DIR = "tune"
TUNE_NAME = "sweep"
RESULTS_FILE = "results.parquet"
BEST_CONFIG = "best_config.yaml"
SUMMARY_FILE = "sweep_summary.json"


def load_sweep_file(path: str | Path, overrides: tuple[str, ...] = ()) -> Sweep:
    """Reads and validates a sweep file."""
    return parse_sweep(read_yaml(Path(path)), overrides)


def trial_bundles(config: Config, server_cpus: float) -> list[dict[str, float]]:
    """The placement-group bundles of one trial: the server, then each worker."""
    rt = config.runtime
    worker: dict[str, float] = {"CPU": rt.cpus_per_worker}
    if rt.gpus_per_worker > 0:
        worker["GPU"] = rt.gpus_per_worker
    if rt.backend == "local":  # the one worker runs in the trial process
        return [{**worker, "CPU": max(rt.cpus_per_worker, server_cpus)}]
    return [{"CPU": server_cpus}] + [dict(worker) for _ in range(rt.workers)]


def run_sweep(
    sweep: Sweep,
    sweep_dir: Path,
    *,
    resume: bool = False,
    verbose: int = 1,
) -> dict[str, Any]:
    """Runs (or, with `resume`, continues) the sweep; returns the sweep summary.

    Raises:
        RunDirBusyError: Another process runs a sweep in `sweep_dir`.
    """
    sweep_dir = sweep_dir.resolve()
    if not resume:
        check_run_dir_free(sweep_dir)
    # One process per sweep directory, for the sweep's life (each trial locks its own).
    with run_dir_lock(sweep_dir, create=not resume):
        return _run_sweep(sweep, sweep_dir, resume, verbose)


def _run_sweep(sweep: Sweep, sweep_dir: Path, resume: bool, verbose: int) -> dict[str, Any]:
    from raydpfl.backends.ray.runner import connect, disconnect
    from raydpfl.tune.interrupt import SweepInterrupt
    from raydpfl.tune.status import LAST_SEEN

    if not resume:
        prepare_run_dir(sweep_dir)
        text = {**sweep.base_raw, "tune": sweep.tune_raw}
        (sweep_dir / SWEEP_FILE).write_text(yaml.safe_dump(text, sort_keys=False), "utf-8")
        (sweep_dir / TRIALS_DIR).mkdir()
    earlier = _read_json(sweep_dir / SUMMARY_FILE) if resume else None
    stop = SweepInterrupt()
    started = connect(sweep.base.runtime.address)
    try:
        # Ctrl-C/SIGTERM from here on: Tune's graceful stop. Not earlier: starting Ray
        # would put its own SIGTERM handler over ours.
        with stop, _silent_output(verbose == 0):
            tuner = _tuner(sweep, sweep_dir, resume, verbose)
            LAST_SEEN.clear()
            grid = tuner.fit()
        return finish_sweep(sweep, sweep_dir, grid, stop.record(), earlier)
    finally:
        if started:
            disconnect()


@contextlib.contextmanager
def _silent_output(silent: bool) -> Iterator[None]:
    """With `silent` (--quiet), Tune prints nothing: its new output engine prints its
    experiment header and paths even at verbose=0, its legacy one does not (Ray 2.60)."""
    if not silent or "RAY_AIR_NEW_OUTPUT" in os.environ:
        yield
        return
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # read when fit() starts
    try:
        yield
    finally:
        os.environ.pop("RAY_AIR_NEW_OUTPUT", None)


def _tuner(sweep: Sweep, sweep_dir: Path, resume: bool, verbose: int) -> Any:
    """Tune's experiment: restored from the sweep directory, or new."""
    from ray import tune

    from raydpfl.tune.status import TrialStatusRecorder

    trainable = _trainable(sweep, sweep_dir)
    state = sweep_dir / TUNE_DIR / TUNE_NAME
    if resume and tune.Tuner.can_restore(str(state)):
        return tune.Tuner.restore(
            str(state), trainable, resume_unfinished=True, resume_errored=True
        )
    if resume and any((sweep_dir / TRIALS_DIR).iterdir()):
        raise ConfigError("resume", f"{sweep_dir} holds no Ray Tune state to resume")
    # New, or interrupted before Tune saved anything (while Ray was starting): start over.
    return tune.Tuner(
        trainable,
        param_space=param_space(sweep.spec),
        tune_config=_tune_config(sweep),
        run_config=tune.RunConfig(
            name=TUNE_NAME,
            storage_path=str(sweep_dir / TUNE_DIR),
            verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=0),
            callbacks=[TrialStatusRecorder()],
        ),
    )


def resume_sweep(sweep_dir: Path, verbose: int = 1) -> dict[str, Any]:
    """Continues an interrupted sweep from its directory (its own sweep.yaml)."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / SWEEP_FILE).is_file():
        raise ConfigError("resume", f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE})")
    sweep = load_sweep_file(sweep_dir / SWEEP_FILE)
    return run_sweep(sweep, sweep_dir, resume=True, verbose=verbose)


# ---- Tune wiring ------------------------------------------------------------------------
def param_space(spec: TuneSpec) -> dict[str, Any]:
    """Tune's search space: one flat entry per dotted config key."""
    from ray import tune

    space: dict[str, Any] = {}
    for d in spec.space:
        if d.kind == "grid":
            space[d.key] = tune.grid_search(list(d.values))
        elif d.kind == "choice":
            space[d.key] = tune.choice(list(d.values))
        elif d.kind == "uniform":
            space[d.key] = tune.uniform(d.low, d.high)
        elif d.kind == "loguniform":
            space[d.key] = tune.loguniform(d.low, d.high)
        else:  # randint: both ends included (Tune's upper bound is exclusive)
            space[d.key] = tune.randint(int(d.low), int(d.high) + 1)  # type: ignore[arg-type]
    return space


def _tune_config(sweep: Sweep) -> Any:
    from ray import tune

    spec = sweep.spec
    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        num_samples=spec.num_samples,
        scheduler=_scheduler(sweep),
        search_alg=_search(sweep),
        max_concurrent_trials=spec.max_concurrent_trials,
        trial_dirname_creator=lambda trial: trial.trial_id,
    )


def _scheduler(sweep: Sweep) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    s = sweep.spec.scheduler
    if s.kind == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="round",
        max_t=s.max_t or sweep.base.experiment.algorithm.rounds,
        grace_period=s.grace_period,
        reduction_factor=s.reduction_factor,
    )


def _search(sweep: Sweep) -> Any:
    seed = sweep.sampling_seed()
    kind = sweep.spec.search
    if kind == "random":
        from ray.tune.search import BasicVariantGenerator

        # Tune applies max_concurrent_trials only to searchers it builds itself.
        return BasicVariantGenerator(
            random_state=seed, max_concurrent=sweep.spec.max_concurrent_trials or 0
        )
    try:
        if kind == "optuna":
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(seed=seed)
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(random_state_seed=seed)
    except (ImportError, AssertionError) as e:
        raise ConfigError(
            "tune.search", f"search: {kind} needs the {kind} package ({e}); or use random"
        ) from None


def _trainable(sweep: Sweep, sweep_dir: Path) -> Any:
    from ray import tune

    def resources(params: Mapping[str, Any]) -> Any:
        config = sweep.trial_config(_params_of(sweep, params))
        return tune.PlacementGroupFactory(trial_bundles(config, sweep.spec.server_cpus))

    fn = tune.with_parameters(run_trial, sweep=sweep, sweep_dir=str(sweep_dir))
    return tune.with_resources(fn, resources)


def _params_of(sweep: Sweep, params: Mapping[str, Any]) -> dict[str, Any]:
    return {d.key: params[d.key] for d in sweep.spec.space if d.key in params}


# ---- one trial ----------------------------------------------------------------------------
def run_trial(params: Mapping[str, Any], sweep: Sweep, sweep_dir: str) -> None:
    """One trial: the simulation of `params`, reporting every round to Tune."""
    from ray import tune

    from raydpfl.experiment.build import build_experiment

    config = sweep.trial_config(_params_of(sweep, params))
    config = replace(config, runtime=replace(config.runtime, progress=False))
    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(sweep_dir) / TRIALS_DIR / trial_id
    # One process per trial directory (a stale attempt still running is refused).
    with run_dir_lock(run_dir):
        resume = has_checkpoint(run_dir) and not (run_dir / "summary.json").exists()
        if not resume and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            _set_aside(run_dir)
        exp = build_experiment(config)
        if not resume:
            prepare_run_dir(run_dir)
        reporter = TrialReporter(
            sweep.spec.metric, tune.report, config.experiment.algorithm.rounds
        )
        summary = run_in_trial(exp, run_dir, reporter, resume)
        reporter.flush(summary)


class TrialReporter:
    """Reports each round's numeric row to Tune; the metric is carried forward from the
    latest evaluated round (rounds between evaluations have none of their own).

    The planned last round is held back until `flush`, after the run has written its
    summary and final model: a scheduler that stops the trial on that report would
    otherwise end it before its outputs are complete.
    """

    def __init__(self, metric: str, report: Any, last_round: int) -> None:
        self.metric = metric
        self.report = report
        self.last_round = last_round
        self.latest = math.nan
        self.pending: dict[str, Any] | None = None

    def __call__(self, row: Mapping[str, Any]) -> None:
        value = row.get(self.metric)
        evaluated = isinstance(value, (int, float)) and math.isfinite(value)
        if evaluated:
            self.latest = float(value)
        out = {
            k: float(v)
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        out[self.metric] = self.latest
        out["evaluated"] = evaluated
        if int(row.get("round", 0)) >= self.last_round:
            self.pending = out
        else:
            self.report(out)

    def flush(self, summary: Mapping[str, Any]) -> None:
        """Reports the held-back last round, with the final model's score."""
        if self.pending is None:
            return
        final = summary.get("final_test_accuracy")
        if self.metric == "test_accuracy" and isinstance(final, (int, float)):
            self.pending[self.metric] = float(final)
        self.report(self.pending)
        self.pending = None


def run_in_trial(exp: Any, run_dir: Path, on_round: Any, resume: bool) -> dict[str, Any]:
    """Runs `exp` with this process as the server (inside the trial's placement group):
    the same `run_experiment` as `raydpfl run`."""
    from raydpfl.experiment.build import run_experiment

    in_process = exp.config.runtime.backend == "ray"
    return run_experiment(exp, run_dir, on_round, resume=resume, server_in_process=in_process)


def _set_aside(run_dir: Path) -> None:
    """Moves an earlier attempt (restarted before any checkpoint) out of the way; its
    charge log still counts towards the sweep's privacy (see `selection`)."""
    attempts = run_dir.parent / ATTEMPTS_DIR
    attempts.mkdir(exist_ok=True)
    n = 1
    while (attempts / f"{run_dir.name}-{n}").exists():
        n += 1
    target = attempts / f"{run_dir.name}-{n}"
    target.mkdir()
    for entry in sorted(run_dir.iterdir()):  # all but the lock this trial holds
        if entry.name != LOCK_FILE:
            shutil.move(str(entry), str(target / entry.name))


# ---- results ------------------------------------------------------------------------------
def finish_sweep(
    sweep: Sweep,
    sweep_dir: Path,
    grid: Any,
    interrupted: dict[str, Any] | None = None,
    earlier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes results.parquet, best_config.yaml and sweep_summary.json.

    `interrupted` (the signal that stopped the sweep) goes into the summary with the
    command that continues it; `earlier` is the summary an interrupted run of this sweep
    left, whose interruptions the new summary keeps.
    """
    spec = sweep.spec
    rows = [_trial_row(sweep, sweep_dir, result, interrupted is not None) for result in grid]
    planned = spec.num_trials()
    rows.sort(key=lambda r: r["trial_id"])
    _write_results(sweep_dir / RESULTS_FILE, rows, spec)
    scored = [r for r in rows if r["metric_last"] is not None]
    best = None
    if scored:
        sign = 1.0 if spec.mode == "max" else -1.0
        best = max(scored, key=lambda r: (sign * r["metric_last"], -rows.index(r)))
        best_config = sweep.trial_config(best["params"])
        (sweep_dir / BEST_CONFIG).write_text(dump_config(best_config), "utf-8")
    base = sweep.base.experiment
    private = base.algorithm.name != "fedavg"
    summary: dict[str, Any] = {
        "metric": spec.metric,
        "mode": spec.mode,
        "selection_rule": f"{spec.mode} of each trial's metric at its last reported round",
        "trials": len(rows),
        "trials_completed": sum(r["status"] == "completed" for r in rows),
        "trials_stopped_early": sum(r["status"] == "stopped_early" for r in rows),
        "trials_failed": sum(r["status"] == "error" for r in rows),
        "trials_interrupted": sum(r["status"] == "interrupted" for r in rows),
        # Also the trials Tune had not created yet (it creates them as slots free up).
        "trials_not_started": sum(r["status"] == "not_started" for r in rows)
        + max(0, planned - len(rows)),
        "trials_planned": planned,
        "scheduler": spec.scheduler.kind,
        "search": spec.search,
        "best_trial": None if best is None else best["trial_id"],
        "best_params": None if best is None else best["params"],
        "best_metric": None if best is None else best["metric_last"],
        "best_run_dir": None if best is None else best["run_dir"],
    }
    if private:
        summary["privacy"] = selection_privacy(
            sweep_dir,
            base.privacy.accountant,
            base.privacy.delta,
            (r["epsilon_max"] for r in rows),
        )
        summary["privacy"]["selection_data"] = (
            "the metric is computed on the central test set"
            if base.data.pool == "train" and base.data.dataset != "synthetic"
            else "the metric is computed on the clients' held-out records (unaccounted)"
        )
    past = list((earlier or {}).get("earlier_interruptions", []))
    if earlier and earlier.get("interrupted"):
        past.append(earlier["interrupted"])
    if past:
        summary["earlier_interruptions"] = past
    if interrupted is not None:
        summary["interrupted"] = {**interrupted, "resume": resume_command(sweep_dir)}
    (sweep_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str), "utf-8")
    summary["sweep_dir"] = str(sweep_dir)
    summary["rows"] = rows
    return summary


def resume_command(sweep_dir: Path) -> str:
    """The exact command that continues the sweep in `sweep_dir`."""
    return f"raydpfl tune --resume {shlex.quote(str(sweep_dir))}"


def _trial_row(sweep: Sweep, sweep_dir: Path, result: Any, interrupted: bool) -> dict[str, Any]:
    from raydpfl.tune.status import LAST_SEEN, sweep_status

    spec = sweep.spec
    metrics = dict(result.metrics or {})
    trial_id = metrics.get("trial_id") or Path(result.path).name
    run_dir = sweep_dir / TRIALS_DIR / trial_id
    params = _params_of(sweep, result.config or {})
    rounds = _read_rounds(run_dir)
    summary = _read_json(run_dir / "summary.json")
    planned = sweep.trial_config(params).experiment.algorithm.rounds
    status = sweep_status(
        LAST_SEEN.get(trial_id),
        error=result.error is not None,
        completed=summary is not None,
        ran=bool(rounds) or has_checkpoint(run_dir),
        interrupted=interrupted,
    )
    values = [
        float(v)
        for v in (r.get(spec.metric) for r in rounds)
        if isinstance(v, (int, float)) and math.isfinite(v)
    ]
    best_of = max if spec.mode == "max" else min
    last_eps = rounds[-1].get("epsilon_max") if rounds else None
    return {
        "trial_id": trial_id,
        "status": status,
        "params": {k: plain_value(v) for k, v in params.items()},
        "rounds_completed": len(rounds),
        "rounds_planned": planned,
        "metric_last": values[-1] if values else None,
        "metric_best": best_of(values) if values else None,
        "final_test_accuracy": None if summary is None else summary.get("final_test_accuracy"),
        "epsilon_max": float(last_eps) if isinstance(last_eps, (int, float)) else None,
        "model_sha256": None if summary is None else summary.get("model_sha256"),
        "run_dir": str(run_dir.relative_to(sweep_dir)),
        "error": None if result.error is None else " ".join(str(result.error).split())[:500],
    }


def _write_results(path: Path, rows: list[dict[str, Any]], spec: TuneSpec) -> None:
    columns: dict[str, list[Any]] = {"trial_id": [r["trial_id"] for r in rows]}
    for d in spec.space:
        values = [r["params"].get(d.key) for r in rows]
        columns[d.key] = [None if v is None else v for v in values]
        if any(isinstance(v, (list, dict)) for v in values):
            columns[d.key] = [json.dumps(v) for v in values]
    for key in (
        "status",
        "rounds_completed",
        "rounds_planned",
        "metric_last",
        "metric_best",
        "final_test_accuracy",
        "epsilon_max",
        "model_sha256",
        "run_dir",
        "error",
    ):
        columns[key] = [r[key] for r in rows]
    columns["metric"] = [spec.metric] * len(rows)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.table(columns), tmp)
    tmp.replace(path)


def _read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "rounds.parquet"
    if not path.exists():
        return []
    return pq.read_table(path).to_pylist()


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
