"""`raydpfl tune`: a Ray Tune sweep whose trials are whole simulations.

    SWEEP_DIR/
      sweep.yaml             the sweep file as run (base config, --set applied, tune:)
      sweep_state.json       raydpfl's own state: each trial's key, parameters, Tune status,
                             and the plug-ins (`state`; what `--resume` reads)
      trials/<key>/          one ordinary run directory per trial (t00000, ...; `raydpfl
                             report` reads it; error.log if it failed)
      trials/.attempts/      earlier attempts of trials restarted before their first checkpoint
      tune/sweep/            Ray Tune's own files (pickles: never read back)
      results.parquet        one row per trial: parameters, status, metric, ε
      best_config.yaml       the best trial's full config (runs with `raydpfl run`)
      sweep_summary.json     objective, best trial, and the privacy of selecting it

Each trial reserves its server and its workers together in one placement group
(`PlacementGroupFactory`: one bundle for the server, one per worker), so trials never
wait on each other's workers. The trial process is the server: it hosts the round
loop, and its worker actors are created inside the trial's placement group. Every
round's row is reported to Tune (the metric as of the latest evaluation), so ASHA can
stop weak trials at its rungs; round numbers are Tune's time unit.

An interrupted sweep resumes with `raydpfl tune --resume SWEEP_DIR`: a fresh Tuner over
the same trials (never ``Tuner.restore``, which unpickles; see `state`): finished trials
replay their recorded rounds, unfinished ones restart, and a trial with a checkpoint
continues from it (the run directory's own checkpoint/resume, so it ends with the same
model). Before Ray Tune starts, every trial passes what `raydpfl run` checks
(`preflight_sweep`, `check_trial_resources`). Ctrl-C or
SIGTERM stops a sweep through Tune's own graceful stop (`interrupt`): its state is saved,
the table is written with each trial's status (`status.sweep_status`), and
sweep_summary.json records the signal under "interrupted".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import shutil
from collections.abc import Callable, Iterator, Mapping
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
from raydpfl.simulation.run_lock import LOCK_FILE, check_not_busy, run_dir_lock
from raydpfl.tune.selection import selection_privacy
from raydpfl.tune.spec import Sweep, TuneSpec, parse_sweep, plain_value
from raydpfl.tune.state import STATE_FILE, TRIAL_KEY, SweepState, plan_trials

SWEEP_FILE = "sweep.yaml"
TRIALS_DIR = "trials"
ATTEMPTS_DIR = ".attempts"
TUNE_DIR = "tune"
TUNE_NAME = "sweep"
RESULTS_FILE = "results.parquet"
BEST_CONFIG = "best_config.yaml"
SUMMARY_FILE = "sweep_summary.json"
#: A trial's error, as it happened (traceback), in its own run directory.
TRIAL_ERROR_LOG = "error.log"
#: The resources of a trial that only replays its recorded rounds (no training).
REPLAY_BUNDLE = {"CPU": 0.01}


def load_sweep_file(
    path: str | Path, overrides: tuple[str, ...] = (), plugins: tuple[str, ...] = ()
) -> Sweep:
    """Reads and validates a sweep file; `plugins` (already imported) travel with it."""
    sweep = parse_sweep(read_yaml(Path(path)), overrides)
    return replace(sweep, plugins=plugin_specs(plugins), entries=user_entries(sweep.base))


def plugin_specs(plugins: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``--plugin`` values as trials import them: files by absolute path, modules by name."""
    return tuple(str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins)


def user_entries(config: Config) -> tuple[Any, ...]:
    """The registry entries of the non-built-in algorithm, model and dataset `config` names
    (registered in this process: `--plugin`, or `raydpfl.register_*` from Python)."""
    from raydpfl import registry

    exp = config.experiment
    wanted = (
        ("algorithm", exp.algorithm.name),
        ("model", exp.model.name),
        ("dataset", exp.data.dataset),
    )
    out = []
    for kind, name in wanted:
        if registry.is_registered(kind, name):  # type: ignore[arg-type]
            entry = registry.get(kind, name)  # type: ignore[arg-type]
            if not entry.builtin and not isinstance(entry.target, str):
                out.append(entry)
    return tuple(out)


def trial_bundles(config: Config, server_cpus: float) -> list[dict[str, float]]:
    """The placement-group bundles of one trial: the server, then each worker."""
    rt = config.runtime
    worker: dict[str, float] = {"CPU": rt.cpus_per_worker}
    if rt.gpus_per_worker > 0:
        worker["GPU"] = rt.gpus_per_worker
    if rt.backend == "local":  # the one worker runs in the trial process
        return [{**worker, "CPU": max(rt.cpus_per_worker, server_cpus)}]
    return [{"CPU": server_cpus}] + [dict(worker) for _ in range(rt.workers)]


# ---- pre-flight ---------------------------------------------------------------------------
def probe_configs(sweep: Sweep) -> list[Config]:
    """The base config and one config per value a trial can take in each dimension (every
    grid/choice value, both ends of a range), as `parse_sweep` validated them."""
    configs = [sweep.base]
    for dim in sweep.spec.space:
        configs.extend(sweep.trial_config({dim.key: v}) for v in dim.probe_values())
    return configs


def preflight_sweep(sweep: Sweep) -> None:
    """What `raydpfl run` checks before training, for every trial, before Ray starts: the
    base config is built as run builds it (its data opened and partitioned, its model and
    algorithm built), and each probe value's config passes `run`'s pre-flight (dataset
    files present, a registered entry's options, a first round that ε can pay for).

    Raises:
        ConfigError, DatasetNotFoundError: The first problem, named (one line).
    """
    from raydpfl.experiment.build import build_experiment, preflight

    build_experiment(sweep.base, model=sweep.model)
    for config in probe_configs(sweep)[1:]:
        preflight(config)


def check_trial_resources(sweep: Sweep, have: Mapping[str, float]) -> None:
    """Refuses a sweep whose largest trial needs more CPUs or GPUs than the Ray cluster
    has (`have`: ``ray.cluster_resources()``): Tune would wait for them forever.

    Raises:
        ConfigError: Naming the runtime key to lower and both numbers.
    """
    for config in probe_configs(sweep):
        bundles = trial_bundles(config, sweep.spec.server_cpus)
        rt = config.runtime
        for resource, key in (
            ("CPU", "runtime.cpus_per_worker"),
            ("GPU", "runtime.gpus_per_worker"),
        ):
            need = sum(b.get(resource, 0.0) for b in bundles)
            if need > have.get(resource, 0.0) + 1e-9:
                how = (
                    f"the server's {sweep.spec.server_cpus:g} (tune.server_cpus) + "
                    if rt.backend == "ray" and resource == "CPU"
                    else ""
                )
                workers = rt.workers if rt.backend == "ray" else 1
                per = rt.cpus_per_worker if resource == "CPU" else rt.gpus_per_worker
                raise ConfigError(
                    key if rt.backend == "ray" else "runtime.cpus_per_worker",
                    f"one trial needs {need:g} {resource}s ({how}{workers} worker(s) x "
                    f"{per:g}), but the Ray cluster has {have.get(resource, 0.0):g}; lower "
                    "runtime.workers, runtime.cpus_per_worker/gpus_per_worker or "
                    "tune.server_cpus (Tune would wait for them forever)",
                )


# ---- running ------------------------------------------------------------------------------
def execute_sweep(
    sweep: Sweep,
    sweep_dir: Path,
    *,
    resume: bool = False,
    verbose: int = 0,
    on_progress: Callable[[Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Runs (or, with `resume`, continues) the sweep; returns the sweep summary.

    Everything `raydpfl run` checks before training is checked for every trial before
    Ray Tune starts (`preflight_sweep`, then `check_trial_resources` once Ray is up);
    a refusal leaves no sweep directory behind. `verbose` is Ray Tune's own verbosity
    (0: its tables stay off the terminal); `on_progress` is told, after every step of
    Tune's loop in which something changed, ``{"done", "total", "running", "failed",
    "best"}``.

    Raises:
        RunDirBusyError: Another process runs a sweep in `sweep_dir`.
        ConfigError, DatasetNotFoundError: A trial would be refused (before Ray Tune).
    """
    from raydpfl.backends.ray.runner import connect, disconnect

    sweep_dir = sweep_dir.resolve()
    if not resume:
        check_run_dir_free(sweep_dir)
    preflight_sweep(sweep)
    _ship_plugin_files_by_value(sweep)
    started = connect(sweep.base.runtime.address)
    try:
        import ray

        check_trial_resources(sweep, ray.cluster_resources())
        # One process per sweep directory, for the sweep's life (each trial locks its own).
        with run_dir_lock(sweep_dir, create=not resume):
            return _run_sweep(sweep, sweep_dir, resume, verbose, on_progress)
    finally:
        if started:
            disconnect()


def _ship_plugin_files_by_value(sweep: Sweep) -> None:
    """The user's code is pickled by value into the trials, so a trial need not find its
    file: what the ``--plugin`` files define, and the modules of the objects given from
    Python (the sweep's registry entries and model), unless installed (site-packages) or
    raydpfl's own; ``__main__`` (a script, a notebook) is pickled by value anyway."""
    import sys
    import sysconfig

    from ray import cloudpickle

    modules = [sys.modules.get(Path(p).stem) for p in sweep.plugins if p.endswith(".py")]
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    for obj in [e.target for e in sweep.entries] + [sweep.model]:
        name = getattr(obj, "__module__", None)
        module = sys.modules.get(name) if isinstance(name, str) else None
        where = str(getattr(module, "__file__", "") or "")
        top = (name or "").split(".")[0]
        if module is None or top in ("raydpfl", "__main__") or not where:
            continue
        if not any(where.startswith(p) for p in installed):
            modules.append(module)
    for module in modules:
        if module is not None:
            cloudpickle.register_pickle_by_value(module)


def _run_sweep(
    sweep: Sweep,
    sweep_dir: Path,
    resume: bool,
    verbose: int,
    on_progress: Callable[[Mapping[str, Any]], None] | None,
) -> dict[str, Any]:
    from raydpfl.tune.interrupt import SweepInterrupt
    from raydpfl.tune.status import LAST_SEEN

    if resume:
        state = SweepState.read(sweep_dir)
        # Ray Tune's state from the earlier attempt is never read (it holds pickles):
        # the new Tuner starts from raydpfl's own state and the trials' run directories.
        shutil.rmtree(sweep_dir / TUNE_DIR, ignore_errors=True)
    else:
        prepare_run_dir(sweep_dir)
        text = {**sweep.base_raw, "tune": sweep.tune_raw}
        (sweep_dir / SWEEP_FILE).write_text(yaml.safe_dump(text, sort_keys=False), "utf-8")
        (sweep_dir / TRIALS_DIR).mkdir()
        state = SweepState(sweep_dir / STATE_FILE, sweep.plugins, python_objects(sweep))
        if sweep.spec.search == "random":
            state.params.update(plan_trials(sweep.spec, sweep.sampling_seed()))
        state.write()
    earlier = _read_json(sweep_dir / SUMMARY_FILE) if resume else None
    replay = state.finished(sweep_dir / TRIALS_DIR) if resume else frozenset()
    stop = SweepInterrupt()
    # Ctrl-C/SIGTERM from here on: Tune's graceful stop. Not earlier: starting Ray
    # would put its own SIGTERM handler over ours.
    with stop, _silent_output(verbose == 0), _quiet_trial_errors(verbose == 0):
        tuner = _tuner(sweep, sweep_dir, state, replay, verbose, on_progress)
        LAST_SEEN.clear()
        grid = tuner.fit()
    return finish_sweep(sweep, sweep_dir, grid, stop.record(), earlier, state)


@contextlib.contextmanager
def _silent_output(silent: bool) -> Iterator[None]:
    """With `silent`, Tune prints nothing: its new output engine prints its experiment
    header and paths even at verbose=0, its legacy one does not (Ray 2.60)."""
    if not silent or "RAY_AIR_NEW_OUTPUT" in os.environ:
        yield
        return
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # read when fit() starts
    try:
        yield
    finally:
        os.environ.pop("RAY_AIR_NEW_OUTPUT", None)


class _DropTrialErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Trial task failed")


@contextlib.contextmanager
def _quiet_trial_errors(quiet: bool) -> Iterator[None]:
    """With `quiet`, Tune's log of each failed trial's traceback stays off the terminal:
    the traceback is in the trial's error.log, and the CLI says where in one line."""
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    drop = _DropTrialErrors()
    if quiet:
        logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _tuner(
    sweep: Sweep,
    sweep_dir: Path,
    state: SweepState,
    replay: frozenset[str],
    verbose: int,
    on_progress: Callable[[Mapping[str, Any]], None] | None,
) -> Any:
    """A new Tune experiment over the sweep's trials (never ``Tuner.restore``: `state`)."""
    from ray import tune

    from raydpfl.tune.status import SweepProgress, TrialStatusRecorder

    planned = sweep.spec.search == "random"
    space: dict[str, Any] = (
        {TRIAL_KEY: tune.grid_search(sorted(state.params))} if planned else param_space(sweep.spec)
    )
    recorded = [] if planned else [state.params[k] for k in sorted(state.params)]
    keys = tuple(d.key for d in sweep.spec.space)
    callbacks: list[Any] = [TrialStatusRecorder(state)]
    if on_progress is not None:
        callbacks.append(SweepProgress(on_progress, sweep.spec, _total_trials(sweep, state)))
    return tune.Tuner(
        _trainable(sweep, sweep_dir, state, replay),
        param_space=space,
        tune_config=_tune_config(sweep, lambda trial: state.key_for(trial.config, keys), recorded),
        run_config=tune.RunConfig(
            name=TUNE_NAME,
            storage_path=str(sweep_dir / TUNE_DIR),
            verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=0),
            callbacks=callbacks,
        ),
    )


def _total_trials(sweep: Sweep, state: SweepState) -> int:
    return len(state.params) if sweep.spec.search == "random" else sweep.spec.num_trials()


def python_objects(sweep: Sweep) -> dict[str, str]:
    """The Python objects a sweep's trials use instead of config entries: the model
    factory, and user entries not from a ``--plugin`` (registered from Python)."""
    from raydpfl.experiment.record import PYTHON_PREFIX, object_name

    out = {}
    if sweep.model is not None:
        out["model"] = PYTHON_PREFIX + object_name(sweep.model)
    plugin_modules = {Path(p).stem if p.endswith(".py") else p for p in sweep.plugins}
    for entry in sweep.entries:
        module = str(getattr(entry.target, "__module__", ""))
        if module not in plugin_modules:
            out[entry.kind] = PYTHON_PREFIX + object_name(entry.target)
    return out


def resume_sweep(
    sweep_dir: Path,
    verbose: int = 0,
    plugins: tuple[str, ...] = (),
    on_progress: Callable[[Mapping[str, Any]], None] | None = None,
    model: Any = None,
) -> dict[str, Any]:
    """Continues an interrupted sweep from its directory: its own sweep.yaml and
    sweep_state.json (the plug-ins it recorded are imported again, then `plugins`). A
    sweep whose trials used Python objects needs them again (`model`; an algorithm or
    dataset registered in this process under the recorded name), with the same names.

    Raises:
        ConfigError: Not a sweep directory, one without raydpfl's state (nothing of
            Ray Tune's pickled state is ever loaded), or one whose Python objects are
            missing or differ.
    """
    from raydpfl.experiment.plugins import import_plugins

    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / SWEEP_FILE).is_file():
        raise ConfigError("resume", f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE})")
    check_not_busy(sweep_dir)  # another process runs it: say so first, before anything
    state = SweepState.read(sweep_dir)
    specs = tuple(dict.fromkeys((*state.plugins, *plugin_specs(plugins))))
    import_plugins(specs)
    sweep = replace(load_sweep_file(sweep_dir / SWEEP_FILE, plugins=specs), model=model)
    now = python_objects(sweep)
    for kind, recorded in state.objects.items():
        if now.get(kind) != recorded:
            raise ConfigError(
                "resume",
                f"the sweep's trials ran the {kind} {recorded.removeprefix('python:')} "
                f"from Python, not {now.get(kind, 'the config entry').removeprefix('python:')}; "
                "resume it from Python with the same object: "
                f"raydpfl.resume_sweep({str(sweep_dir)!r}, {kind}=...)",
            )
    return execute_sweep(sweep, sweep_dir, resume=True, verbose=verbose, on_progress=on_progress)


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


def _tune_config(
    sweep: Sweep, dirname: Callable[[Any], str], recorded: list[dict[str, Any]]
) -> Any:
    from ray import tune

    spec = sweep.spec
    random = spec.search == "random"
    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        # Random search: the planned list is one grid over trial keys.
        num_samples=1 if random else spec.num_samples,
        scheduler=_scheduler(sweep),
        search_alg=_search(sweep, recorded),
        max_concurrent_trials=spec.max_concurrent_trials,
        trial_dirname_creator=dirname,
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


def _search(sweep: Sweep, recorded: list[dict[str, Any]]) -> Any:
    seed = sweep.sampling_seed()
    kind = sweep.spec.search
    if kind == "random":
        from ray.tune.search import BasicVariantGenerator

        # Tune applies max_concurrent_trials only to searchers it builds itself.
        return BasicVariantGenerator(max_concurrent=sweep.spec.max_concurrent_trials or 0)
    points = recorded or None  # a resumed sweep's trials first, in their order
    try:
        if kind == "optuna":
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(seed=seed, points_to_evaluate=points)
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(random_state_seed=seed, points_to_evaluate=points)
    except (ImportError, AssertionError) as e:
        raise ConfigError(
            "tune.search", f"search: {kind} needs the {kind} package ({e}); or use random"
        ) from None


def _trainable(sweep: Sweep, sweep_dir: Path, state: SweepState, replay: frozenset[str]) -> Any:
    from ray import tune

    planned = dict(state.params) if sweep.spec.search == "random" else {}

    def resources(params: Mapping[str, Any]) -> Any:
        key = params.get(TRIAL_KEY)
        if key in replay:
            return tune.PlacementGroupFactory([dict(REPLAY_BUNDLE)])
        config = sweep.trial_config(_params_of(sweep, params, planned))
        return tune.PlacementGroupFactory(trial_bundles(config, sweep.spec.server_cpus))

    fn = tune.with_parameters(
        run_trial, sweep=sweep, sweep_dir=str(sweep_dir), planned=planned, replay=replay
    )
    return tune.with_resources(fn, resources)


def _params_of(
    sweep: Sweep, params: Mapping[str, Any], planned: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The trial's parameters: a planned trial's (random search), or Tune's suggestion."""
    key = params.get(TRIAL_KEY)
    if key is not None:
        return dict(planned[key])
    return {d.key: params[d.key] for d in sweep.spec.space if d.key in params}


# ---- one trial ----------------------------------------------------------------------------
def run_trial(
    params: Mapping[str, Any],
    sweep: Sweep,
    sweep_dir: str,
    planned: Mapping[str, Mapping[str, Any]] | None = None,
    replay: frozenset[str] = frozenset(),
) -> None:
    """One trial: the simulation of `params`, reporting every round to Tune; a trial in
    `replay` (finished before the sweep was resumed) reports its recorded rounds again."""
    from ray import tune

    context = tune.get_context()
    key = Path(context.get_trial_dir()).name  # `SweepState.key_for` named it
    run_dir = Path(sweep_dir) / TRIALS_DIR / key
    run_dir.mkdir(parents=True, exist_ok=True)
    prepare_trial_process(sweep)
    config = sweep.trial_config(_params_of(sweep, params, planned or {}))
    config = replace(config, runtime=replace(config.runtime, progress=False))
    reporter = TrialReporter(sweep.spec.metric, tune.report, config.experiment.algorithm.rounds)
    if key in replay:
        replay_trial(run_dir, reporter)
        return
    try:
        # One process per trial directory (a stale attempt still running is refused).
        with run_dir_lock(run_dir):
            resume = has_checkpoint(run_dir) and not (run_dir / "summary.json").exists()
            if not resume and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
                _set_aside(run_dir)
            exp = _build_trial(config, sweep)
            if not resume:
                prepare_run_dir(run_dir)
            summary = run_in_trial(exp, run_dir, reporter, resume)
            reporter.flush(summary)
    except Exception as e:
        _log_trial_error(run_dir, e)
        raise


def prepare_trial_process(sweep: Sweep) -> None:
    """Makes the user's code known in a trial's process: the ``--plugin`` modules and
    files are imported (their registrations run), and the entries registered from Python
    are registered again (their objects came with the sweep). What a plug-in file defines
    is pickled by value to the trial's Ray workers, which need not find the file."""
    import sys

    from ray import cloudpickle

    from raydpfl import registry
    from raydpfl.experiment.plugins import import_plugins

    import_plugins(sweep.plugins)
    for plugin in sweep.plugins:
        if plugin.endswith(".py"):
            cloudpickle.register_pickle_by_value(sys.modules[Path(plugin).stem])
    for entry in sweep.entries:
        if not registry.is_registered(entry.kind, entry.name):
            registry.register(
                entry.kind,
                entry.name,
                entry.target,
                options=entry.options,
                section=entry.section,
                tags=entry.tags,
                notes=entry.notes,
            )


def _build_trial(config: Config, sweep: Sweep) -> Any:
    from raydpfl.experiment.build import build_experiment

    return build_experiment(config, model=sweep.model)


def _log_trial_error(run_dir: Path, e: BaseException) -> None:
    """Appends the trial's error and traceback to its run directory's error.log."""
    import traceback

    with contextlib.suppress(OSError), open(run_dir / TRIAL_ERROR_LOG, "a", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(e)))


def replay_trial(run_dir: Path, reporter: TrialReporter) -> None:
    """Reports a finished trial's recorded rounds to Tune again (nothing is trained)."""
    summary = _read_json(run_dir / "summary.json") or {}
    for row in _read_rounds(run_dir):
        reporter(row)
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
    state: SweepState | None = None,
) -> dict[str, Any]:
    """Writes results.parquet, best_config.yaml and sweep_summary.json.

    `interrupted` (the signal that stopped the sweep) goes into the summary with the
    command that continues it; `earlier` is the summary an interrupted run of this sweep
    left, whose interruptions the new summary keeps; `state` gives each trial's
    parameters by key.
    """
    spec = sweep.spec
    known = state.params if state is not None else {}
    rows = [
        _trial_row(sweep, sweep_dir, result, interrupted is not None, known) for result in grid
    ]
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


def _trial_row(
    sweep: Sweep,
    sweep_dir: Path,
    result: Any,
    interrupted: bool,
    known: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    from raydpfl.tune.status import LAST_SEEN, sweep_status

    spec = sweep.spec
    trial_id = Path(result.path).name  # the trial's key (`SweepState.key_for`)
    run_dir = sweep_dir / TRIALS_DIR / trial_id
    params = (
        dict(known[trial_id]) if trial_id in known else _params_of(sweep, result.config or {}, {})
    )
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
        "error": None if result.error is None else _error_line(result.error),
        "error_file": None if result.error is None else _error_file(sweep_dir, trial_id),
    }


def _error_file(sweep_dir: Path, key: str) -> str:
    """Where a failed trial's traceback is: its run's error.log, or (when it failed
    before its run started) Ray Tune's error.txt; relative to the sweep directory."""
    ours = Path(TRIALS_DIR) / key / TRIAL_ERROR_LOG
    if (sweep_dir / ours).exists():
        return str(ours)
    return str(Path(TUNE_DIR) / TUNE_NAME / key / "error.txt")


def _error_line(error: BaseException) -> str:
    """A trial's error in one line: the original exception's message (Ray wraps it)."""
    cause = error
    while getattr(cause, "cause", None) is not None and cause.cause is not cause:  # type: ignore[attr-defined]
        cause = cause.cause  # type: ignore[attr-defined]
    text = str(cause).strip().splitlines()
    line = " ".join(text[-1].split()) if text else type(cause).__name__
    return f"{type(cause).__name__}: {line}"[:500]


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
