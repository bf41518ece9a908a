"""The one config → objects layer: `build_experiment(config)` and `run_experiment`.

Nothing below this module receives a config object: data, models, algorithms and the
privacy package take plain arguments. Everything a config can get wrong is checked
here (or in the schema) before any training or Ray work starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydpfl import registry
from raydpfl.algorithms import Algorithm
from raydpfl.backends.local import LocalBackend
from raydpfl.callbacks import (
    Callback,
    RunInfo,
    callbacks_from_names,
    check_callback_names,
    parse_callback_names,
)
from raydpfl.config import as_config_error
from raydpfl.config.load import dump_config, load_config
from raydpfl.config.resume import check_resume_config, flatten
from raydpfl.config.schema import BUILTIN_DATASETS, Config, ConfigError, DataConfig, PrivacyConfig
from raydpfl.data.cluster_shift import ClusteredDataset, make_cluster_shift
from raydpfl.data.datasets import find_dataset_files, load_dataset
from raydpfl.data.federated import FederatedDataset, federate, synthetic_federated
from raydpfl.experiment.plugins import (
    build_registered_algorithm,
    ledger_for,
    load_registered_dataset,
    parse_options,
    registered_model_factory,
)
from raydpfl.experiment.privacy_settings import apply_noise_mode
from raydpfl.experiment.record import record_run
from raydpfl.simulation.backend import Backend, worker_threads
from raydpfl.simulation.experiment import Experiment, make_server
from raydpfl.simulation.integrity import ResumeError, read_manifest
from raydpfl.simulation.outputs import RunWriter
from raydpfl.simulation.run_lock import run_dir_lock
from raydpfl.simulation.seeding import NO_ROUND, SERVER, derive_seed, numpy_rng
from raydpfl.simulation.worker import ClientWorker, ModelSpec, resolve_device

Params = dict[str, torch.Tensor]
#: The run's resolved config, the first file a run writes.
CONFIG_FILE = "config.yaml"


def build_experiment(
    config: Config,
    *,
    dataset: FederatedDataset | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    algorithm: Algorithm | None = None,
) -> Experiment:
    """Loads data, builds the model, algorithm and ledger, and validates what depends on data.

    Args:
        config: The validated config tree.
        dataset: A federated dataset to use instead of `experiment.data`'s.
        model: A callable with no arguments returning a fresh `torch.nn.Module`, used
            instead of `experiment.model` (e.g. a class defined in the user's script).
        algorithm: An algorithm instance used instead of `experiment.algorithm.name`'s;
            the config still gives the schedule (rounds, eval_every) and, when the
            algorithm is private, the ledger's accountant, δ and per-client ε budget.

    Raises:
        ConfigError: A value that only the data can refute (e.g. δ ≥ 1/|D_i|), a dataset
            that cannot be partitioned as asked, or an argument of the wrong kind (named).
        DatasetNotFoundError: Dataset files are missing.
    """
    exp, rt = config.experiment, config.runtime
    _check_user_objects(dataset, model, algorithm)
    given = {"algorithm": algorithm, "model": model, "dataset": dataset}  # from Python
    preflight(config, dataset_given=dataset is not None, algorithm_given=algorithm is not None)
    if rt.threads is not None:
        torch.set_num_threads(rt.threads)
    # The server evaluates on this process's device; Ray workers resolve their own.
    device = _server_device(rt.backend, rt.device)
    if dataset is None:
        dataset = load_federated(exp.data, rt.seed)
    sizes = dataset.train_sizes()
    if (sizes == 0).any():
        raise ConfigError(
            "experiment.data",
            f"{int((sizes == 0).sum())} client(s) got no training records; "
            "use fewer clients or a smaller client_test_fraction",
        )
    spec, net = _initial_model(config, dataset, model)
    init_params = {n: p.detach().clone() for n, p in net.named_parameters()}

    metadata: dict[str, Any] = {
        "experiment": exp.name,
        "algorithm": exp.algorithm.name if algorithm is None else algorithm.name,
        "dataset": exp.data.dataset if dataset is None else dataset.name,
        "num_clients": dataset.num_clients,
        "seed": rt.seed,
        "backend": rt.backend,
        "workers": rt.workers if rt.backend == "ray" else 1,
    }
    if algorithm is None:
        algorithm, ledger, privacy = build_registered_algorithm(config, dataset, net)
    else:
        ledger, privacy = ledger_for(algorithm, config.experiment.privacy, sizes)
    noise = _checked_noise_source(config)
    apply_noise_mode(algorithm, privacy, noise.secure_noise, noise.noise_sampler)
    metadata["privacy"] = privacy
    # config.yaml and summary.json say what ran: the objects given, not the config's keys.
    record = record_run(config, net=net, **given)
    metadata.update(record.summary)
    extra = _unaccounted_data_releases(config)
    return Experiment(
        config=config,
        dataset=dataset,
        algorithm=algorithm,
        ledger=ledger,
        model_spec=spec,
        init_params=init_params,
        device=device,
        metadata=metadata,
        extra_unaccounted=extra,
        recorded_config=record.config_text,
    )


def _initial_model(
    config: Config,
    dataset: FederatedDataset,
    model: Callable[[], torch.nn.Module] | None,
) -> tuple[ModelSpec, torch.nn.Module]:
    """The model's spec (what workers rebuild) and θ^init on the run's "init" stream."""
    exp, rt = config.experiment, config.runtime
    model_options = {"hidden": exp.model.hidden} if exp.model.name == "mlp" else {}
    if model is None:  # a registered (not built-in) model travels as its factory
        model = registered_model_factory(
            exp.model.name, exp.model.options, tuple(dataset.input_shape), dataset.num_classes
        )
        label = exp.model.name
    else:
        label = _callable_name(model)
    spec = ModelSpec(
        label,
        tuple(dataset.input_shape),
        dataset.num_classes,
        model_options if model is None else {},
        factory=model,
    )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(rt.seed, NO_ROUND, SERVER, "init"))
            net = spec.build()
    except (ValueError, TypeError) as e:
        field_name = "experiment.model.name" if model is None else "model"
        raise ConfigError(field_name, str(e).removeprefix("model: ")) from None
    buffers = [name for name, _ in net.named_buffers()]
    if buffers and rt.vectorise_clients == "on":
        # torch.func cannot train a model that writes its buffers in place inside the
        # client-vectorised transform (a 100-line traceback in round 1); `auto` trains
        # such a model one client at a time (`multi_client.pays_off`), as `off` does.
        raise ConfigError(
            "runtime.vectorise_clients",
            f"on, but the model has buffers ({', '.join(buffers[:3])}), which the "
            "client-vectorised path cannot update; use auto or off",
        )
    return spec, net


def _checked_noise_source(config: Config) -> PrivacyConfig:
    """``experiment.privacy`` after refusing a CPU-only noise sampler on a GPU run."""
    rt = config.runtime
    noise = config.experiment.privacy
    if noise.noise_sampler != "torch" and (
        rt.device == "cuda" or (rt.device == "auto" and torch.cuda.is_available())
    ):
        raise ConfigError(
            "experiment.privacy.noise_sampler",
            f"{noise.noise_sampler} samples on the CPU; runtime.device is {rt.device!r} "
            "(use cpu, or noise_sampler torch)",
        )
    return noise


def _unaccounted_data_releases(config: Config) -> list[str]:
    """Evaluation outputs on held-out client records the run releases outside the ledger."""
    exp = config.experiment
    extra: list[str] = []
    if exp.data.client_test_fraction > 0 and exp.algorithm.evaluate_clients:
        extra.append(
            "client_test_metrics (per-client test loss/accuracy on held-out client records)"
        )
    if (
        exp.data.dataset == "synthetic"
        or exp.data.pool == "all"
        or exp.data.cluster_shift.kind != "none"
    ):
        extra.append(
            "central_test_metrics (the central test set is the union of the clients' "
            "held-out records)"
        )
    return extra


#: What `preflight` cannot check without loading the data (`raydpfl validate` says so).
NOT_CHECKED_BEFORE_LOADING = (
    "delta < 1/|D_i| of the largest client, that the partition gives every client records, "
    "and the model on the data's shapes"
)


#: Record-level presets whose every task is charged `PrivacyCost(σ, q, local_steps)` with
#: σ, q from ``experiment.privacy`` as they are (when σ is not null): their first round's
#: charge is known from the config alone. Algorithms that set σ or the step count
#: themselves (ALI-DPFL's R_c, PE-DPFL, Adap DP-FL, the papers' presets) check their own.
FIXED_SIGMA_PRESETS = ("dp_fedavg",)


def preflight(config: Config, dataset_given: bool = False, algorithm_given: bool = False) -> None:
    """What can be checked before any data is loaded, shared by `raydpfl validate`,
    `raydpfl run` and `run_simulation`: the dataset's files are on disk (built-ins), a
    registered algorithm's, model's or dataset's options parse, and a fixed-σ preset
    (`FIXED_SIGMA_PRESETS`) can pay for its first round within ``privacy.epsilon``.

    Raises:
        DatasetNotFoundError: The dataset's files are missing (the message says how to
            get them).
        ConfigError: A registered entry's options are invalid (the key is named),
            ``runtime.callbacks`` names an unknown tracker or one that is not installed,
            or one round of the configured DP-SGD already costs more than
            ``privacy.epsilon`` (no round could ever run).
    """
    if not algorithm_given:
        check_first_round_affordable(config)
    with as_config_error("runtime.callbacks"):
        check_callback_names(parse_callback_names(config.runtime.callbacks))
    data = config.experiment.data
    if not dataset_given and data.dataset in BUILTIN_DATASETS and data.dataset != "synthetic":
        find_dataset_files(data.dataset, data.root)
    exp = config.experiment
    checks = (
        ("algorithm", exp.algorithm.name, exp.algorithm.options, "experiment.algorithm.options"),
        ("model", exp.model.name, exp.model.options, "experiment.model.options"),
        ("dataset", data.dataset, data.options, "experiment.data.options"),
    )
    for kind, name, options, field_name in checks:
        if registry.is_registered(kind, name) and not registry.get(kind, name).builtin:
            parse_options(registry.get(kind, name), options, field_name)


def first_round_epsilon(config: Config) -> float | None:
    """ε one client spends in one round of a `FIXED_SIGMA_PRESETS` algorithm (its one
    task: ``local_steps`` steps of σ = ``privacy.noise_multiplier`` at q =
    ``privacy.sampling_rate``) under the configured accountant and δ, as the ledger
    computes it; None when the config does not fix it (another algorithm, σ null)."""
    exp = config.experiment
    privacy = exp.privacy
    if exp.algorithm.name not in FIXED_SIGMA_PRESETS or privacy.noise_multiplier is None:
        return None
    from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger

    cost = PrivacyCost(
        noise_multiplier=privacy.noise_multiplier,
        sampling_rate=privacy.sampling_rate,
        steps=exp.algorithm.local_steps,
    )
    ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    try:
        return ledger.epsilon_after(0, cost)
    except (ValueError, ArithmeticError) as e:
        raise ConfigError("experiment.privacy", f"cannot account one round: {e}") from None


def check_first_round_affordable(config: Config) -> None:
    """Refuses a fixed-σ preset whose one round already costs more than
    ``privacy.epsilon``: the ledger would refuse every task and train nothing.

    Raises:
        ConfigError: Naming ``experiment.privacy.epsilon`` and the ε one round costs.
    """
    eps = first_round_epsilon(config)
    privacy = config.experiment.privacy
    if eps is None or eps <= privacy.epsilon:
        return
    raise ConfigError(
        "experiment.privacy.epsilon",
        f"{privacy.epsilon:g} cannot pay for one round: one round of DP-SGD "
        f"(sigma={privacy.noise_multiplier:g}, q={privacy.sampling_rate:g}, "
        f"{config.experiment.algorithm.local_steps} local steps) costs epsilon={eps:.4g} at "
        f"delta={privacy.delta:g} ({privacy.accountant}), so no client could ever train; "
        "raise epsilon or sigma, or lower sampling_rate or local_steps",
    )


def _check_user_objects(dataset: Any, model: Any, algorithm: Any) -> None:
    """One clear error, naming the argument, for a user object of the wrong kind."""
    if dataset is not None and not isinstance(dataset, FederatedDataset):
        raise ConfigError(
            "dataset",
            "must be a raydpfl.data.FederatedDataset (e.g. from raydpfl.data.federate), "
            f"got {type(dataset).__name__}",
        )
    if model is not None and not callable(model):
        raise ConfigError(
            "model",
            "must be a callable with no arguments returning a torch.nn.Module (a Module "
            f"class, or a function), got {type(model).__name__}",
        )
    if algorithm is not None and not isinstance(algorithm, Algorithm):
        hint = " (an instance, not the class)" if isinstance(algorithm, type) else ""
        raise ConfigError(
            "algorithm",
            f"must be a raydpfl.algorithms.Algorithm instance{hint}, "
            f"got {getattr(algorithm, '__name__', type(algorithm).__name__)}",
        )


def _callable_name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "custom_model"))


def load_clustered(data: DataConfig, rng: np.random.Generator) -> FederatedDataset:
    """The federated dataset with cluster structure (`data.cluster_shift.kind != none`)."""
    cs = data.cluster_shift
    sizes = cs.sizes
    if sum(sizes) != data.num_clients:
        raise ConfigError(
            "experiment.data.num_clients",
            f"must equal the sum of cluster_shift.cluster_sizes ({sum(sizes)}), "
            f"got {data.num_clients}",
        )
    if data.dataset == "synthetic":
        raise ConfigError(
            "experiment.data.dataset", "cluster_shift needs an image dataset, not synthetic"
        )
    arrays = load_dataset(data.dataset, data.root)
    official = cs.split_mode == "official_train_test"
    with as_config_error("experiment.data.cluster_shift"):
        built = make_cluster_shift(
            arrays.x_train,
            arrays.y_train,
            shift=cs.kind,  # type: ignore[arg-type]
            rng=rng,
            cluster_sizes=sizes,
            num_classes=arrays.num_classes,
            samples_per_client=cs.samples_per_client,
            test_fraction=data.client_test_fraction if not official else 0.2,
            split_mode=cs.split_mode,
            x_test=arrays.x_test if official else None,
            y_test=arrays.y_test if official else None,
            test_samples_per_client=cs.test_samples_per_client,
            shuffle_clients=cs.shuffle_clients,
            name=data.dataset,
        )
    fields = {f.name: getattr(built.dataset, f.name) for f in dataclasses.fields(built.dataset)}
    return ClusteredDataset(**fields, clusters=tuple(int(c) for c in built.clusters))


def load_federated(data: DataConfig, run_seed: int) -> FederatedDataset:
    """Builds the federated dataset named by `data` on the partition stream."""
    seed = run_seed if data.seed is None else data.seed
    rng = numpy_rng(seed, NO_ROUND, SERVER, "partition")
    if data.cluster_shift.kind != "none":
        return load_clustered(data, rng)
    with as_config_error("experiment.data"):
        if data.dataset == "synthetic":
            s = data.synthetic
            return synthetic_federated(
                alpha=s.alpha,
                beta=s.beta,
                num_clients=data.num_clients,
                rng=rng,
                iid=s.iid,
                num_features=s.num_features,
                num_classes=s.num_classes,
                min_samples=s.min_samples,
                max_samples=s.max_samples,
                client_test_fraction=data.client_test_fraction,
            )
        if data.dataset in BUILTIN_DATASETS:
            arrays = load_dataset(data.dataset, data.root)
        else:
            arrays = load_registered_dataset(data.dataset, data.root, data.options)
        return federate(
            arrays,
            num_clients=data.num_clients,
            partition=data.partition.kind,
            rng=rng,
            alpha=data.partition.alpha,
            shards_per_client=data.partition.shards_per_client,
            client_test_fraction=data.client_test_fraction,
            min_samples_per_client=data.partition.min_samples_per_client,
            pool=data.pool,
            split_rounding=data.split_rounding,
            classes_per_client=data.partition.classes_per_client,
            size_distribution=data.partition.size_distribution,
            size_sigma=data.partition.size_sigma,
            power_law_exponent=data.partition.power_law_exponent,
        )


def make_local_backend(exp: Experiment) -> Backend:
    """The in-process backend: one resident worker (the Ray backend lives in
    `raydpfl.backends.ray`, started by `run_experiment`)."""
    rt = exp.config.runtime
    worker = ClientWorker(
        exp.algorithm,
        exp.model_spec,
        exp.dataset,
        rt.seed,
        rt.device,
        rt.engine,
        rt.vectorise_clients,
    )
    return LocalBackend(worker, worker_threads(rt.cpus_per_worker), rt.round_timeout_s)


def run_experiment(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None = None,
    resume: bool = False,
    server_in_process: bool = False,
    callbacks: Sequence[Callback] = (),
    temporary: bool = False,
) -> dict[str, Any]:
    """Runs `exp` on its backend, writing outputs to `run_dir` (None: in memory only).

    The resolved config is written first; the server then writes the rest. With
    `resume`, `run_dir` is an interrupted run of the same config: it continues from
    its last checkpoint (and ends with the same model as an uninterrupted run). With
    `server_in_process` (Ray only; Tune trials), the server runs in this process.
    `callbacks` (and those named in ``runtime.callbacks``) are told the run's start,
    each round's row after `on_round`, and the summary; they are closed in any case.
    With `temporary` (`run_dir` is removed when the caller is done with it), callbacks are
    told of no run directory, so that none writes files there to be lost
    (`check_callbacks_keep_files` refuses those that would have to).

    Raises:
        RunDirBusyError: Another process is running in `run_dir` (its lock is held for
            the run's life; see `raydpfl.simulation.run_lock`).
    """
    if resume and run_dir is None:
        raise ValueError("resume needs the run directory")
    if temporary:
        check_callbacks_keep_files(exp.config, callbacks, run_dir_kept=False)
    args = (on_round, resume, server_in_process, callbacks, temporary)
    if run_dir is None:
        return _run_experiment(exp, None, *args)
    # One process per run directory, for the run's life (re-entrant: the CLI holds it
    # already); a second one is refused before Ray starts.
    with run_dir_lock(run_dir):
        return _run_experiment(exp, run_dir, *args)


def check_callbacks_keep_files(
    config: Config, callbacks: Sequence[Callback], run_dir_kept: bool
) -> None:
    """Refuses, in one line naming the option, a tracker that would write its files into a
    run directory that is not kept (`run_simulation` or `audit` without `run_dir` run in a
    temporary directory removed when they return): its files would be deleted silently.

    Raises:
        ConfigError: ``runtime.callbacks`` names ``tensorboard``, or `callbacks` holds a
            `TensorBoardCallback` without ``log_dir``.
    """
    if run_dir_kept:
        return
    from raydpfl.callbacks import TensorBoardCallback

    why = (
        "writes its event files into the run directory, and this run keeps none (without "
        "run_dir its outputs go to a temporary directory removed when the call returns, "
        "event files included); give run_dir="
    )
    if "tensorboard" in parse_callback_names(config.runtime.callbacks):
        raise ConfigError(
            "runtime.callbacks",
            f"tensorboard {why}..., or drop tensorboard from runtime.callbacks and pass "
            "callbacks=[TensorBoardCallback(log_dir=...)]",
        )
    for cb in callbacks:
        if isinstance(cb, TensorBoardCallback) and cb.log_dir is None:
            raise ConfigError(
                "callbacks", f"TensorBoardCallback() without log_dir {why}..., or a log_dir"
            )


def _run_experiment(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None,
    resume: bool,
    server_in_process: bool,
    callbacks: Sequence[Callback],
    temporary: bool,
) -> dict[str, Any]:
    if resume:
        assert run_dir is not None
        check_resume(run_dir, exp.config)
    if run_dir is not None and not resume:
        with _undone_if_refused(run_dir):
            RunWriter(run_dir).write_config(exp.recorded_config or dump_config(exp.config))
            return _watched_run(
                exp, run_dir, on_round, resume, server_in_process, callbacks, temporary
            )
    return _watched_run(exp, run_dir, on_round, resume, server_in_process, callbacks, temporary)


@contextlib.contextmanager
def _undone_if_refused(run_dir: Path) -> Iterator[None]:
    """A fresh run refused before it wrote anything but its config.yaml (the Ray cluster
    cannot fit its workers, Ctrl-C while Ray starts) takes config.yaml back: the
    directory is left as it was found (empty, or absent apart from its lock), so the
    same ``--out`` is accepted again."""
    before = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    try:
        yield
    except BaseException:
        made = {p.name for p in run_dir.iterdir()} - before if run_dir.is_dir() else set()
        if made <= {CONFIG_FILE}:
            with contextlib.suppress(OSError):
                (run_dir / CONFIG_FILE).unlink()
        raise


def _watched_run(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None,
    resume: bool,
    server_in_process: bool,
    callbacks: Sequence[Callback],
    temporary: bool,
) -> dict[str, Any]:
    watchers = [*callbacks_from_names(parse_callback_names(exp.config.runtime.callbacks))]
    watchers += list(callbacks)
    try:
        info = _run_info(exp, None if temporary else run_dir, resume)
        for cb in watchers:
            cb.on_run_start(info)
        summary = _run_backend(exp, run_dir, _tell(on_round, watchers), resume, server_in_process)
        if run_dir is not None:
            summary["run_dir"] = str(run_dir)
        for cb in watchers:
            cb.on_run_end(summary)
        return summary
    finally:
        for cb in watchers:
            cb.close()


def _run_backend(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None,
    resume: bool,
    server_in_process: bool,
) -> dict[str, Any]:
    if exp.config.runtime.backend == "ray":
        from raydpfl.backends.ray.runner import run_on_ray  # Ray is imported only here

        return run_on_ray(exp, run_dir, on_round, resume, server_in_process)
    writer = RunWriter(run_dir) if run_dir is not None else None
    server = make_server(exp, writer, on_round, resume=resume)
    with make_local_backend(exp) as backend:
        return server.run(backend)


def _tell(
    on_round: Callable[[Mapping[str, Any]], None] | None, watchers: Sequence[Callback]
) -> Callable[[Mapping[str, Any]], None] | None:
    """One on_round for the server: the caller's, then every callback's."""
    if not watchers:
        return on_round

    def tell(row: Mapping[str, Any]) -> None:
        if on_round is not None:
            on_round(row)
        for cb in watchers:
            cb.on_round_end(row)

    return tell


def _run_info(exp: Experiment, run_dir: Path | None, resume: bool) -> RunInfo:
    privacy = exp.metadata.get("privacy") or {}
    unit = privacy.get("epsilon_unit") or str(privacy.get("unit", "record")).split(":")[0]
    return RunInfo(
        name=exp.config.experiment.name,
        run_dir=run_dir,
        config=flatten(exp.config),
        resumed=resume,
        epsilon_unit=unit,
    )


def check_resume(run_dir: Path, config: Config) -> None:
    """Refuses, before any training or Ray work, to resume `run_dir` with `config` when the
    checkpoint fails verification or `config` changes a result-changing key.

    Raises:
        ResumeError: Not a resumable run directory, a finished run, or a checkpoint file
            that does not match its manifest (named).
        ConfigError: `config` differs from the run's config.yaml outside
            `raydpfl.config.resume.RESUME_SAFE_KEYS` (the first such key is named).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ResumeError(f"{run_dir} is not a run directory (no config.yaml)")
    if (run_dir / "summary.json").exists():
        raise ResumeError(f"{run_dir} is a finished run; nothing to resume")
    try:
        read_manifest(run_dir)
    except FileNotFoundError as e:
        raise ResumeError(str(e)) from None
    check_resume_config(load_config(run_dir / "config.yaml"), config)


def _server_device(backend: str, device: str) -> str:
    """The device of the server (and, locally, of the worker) in this process."""
    if backend == "ray":  # Ray workers resolve their own device; the driver may have no GPU
        return "cuda" if device in ("cuda", "auto") and torch.cuda.is_available() else "cpu"
    try:
        return str(resolve_device(device))
    except RuntimeError:
        raise ConfigError(
            "runtime.device", "cuda was requested but no CUDA device is visible"
        ) from None
