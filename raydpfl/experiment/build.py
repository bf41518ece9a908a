"""The one config → objects layer: `build_experiment(config)` and `run_experiment`.

Nothing below this module receives a config object: data, models, algorithms and the
privacy package take plain arguments. Everything a config can get wrong is checked
here (or in the schema) before any training or Ray work starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms import Algorithm, DPFedAvg, FedAvg
from raydpfl.algorithms.adap_dp_fl import AdapDpFl
from raydpfl.algorithms.ali_dpfl import AliDpfl, DPFedAvgFixedTau
from raydpfl.algorithms.ali_dpfl_theory import classic_epsilon, iteration_budget
from raydpfl.algorithms.pe_dpfl import PeDpfl
from raydpfl.algorithms.pe_dpfl import calibrate_noise_multiplier as calibrate_pe_noise
from raydpfl.backends.local import LocalBackend
from raydpfl.config.load import dump_config, load_config
from raydpfl.config.resume import check_resume_config
from raydpfl.config.schema import Config, ConfigError, DataConfig, PrivacyConfig
from raydpfl.data.datasets import load_dataset
from raydpfl.data.federated import FederatedDataset, federate, synthetic_federated
from raydpfl.experiment.privacy_settings import check_delta, noise_multiplier, privacy_metadata
from raydpfl.privacy.calibration import epsilon_for
from raydpfl.privacy.ledger import PrivacyLedger
from raydpfl.simulation.backend import Backend, worker_threads
from raydpfl.simulation.experiment import Experiment, make_server
from raydpfl.simulation.integrity import ResumeError, read_manifest
from raydpfl.simulation.outputs import RunWriter
from raydpfl.simulation.seeding import NO_ROUND, SERVER, derive_seed, numpy_rng
from raydpfl.simulation.worker import ClientWorker, ModelSpec, resolve_device

Params = dict[str, torch.Tensor]

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
    model_options = {"hidden": exp.model.hidden} if exp.model.name == "mlp" else {}
    spec = ModelSpec(
        exp.model.name if model is None else _callable_name(model),
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
        algorithm, ledger, privacy = _make_algorithm(config, dataset, net)
    else:
        ledger, privacy = _ledger_for(algorithm, config.experiment.privacy, sizes)
    metadata["privacy"] = privacy
    extra = []
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


def _ledger_for(
    algorithm: Algorithm, privacy: PrivacyConfig, sizes: np.ndarray
) -> tuple[PrivacyLedger | None, dict[str, Any]]:
    """The ledger of a user-supplied algorithm: the config's accountant, δ and per-client
    ε budget when it is private (its tasks declare their own costs), none otherwise."""
    if not algorithm.is_private:
        return None, {"unit": "none: non-private run (epsilon is infinite)"}
    check_delta(privacy.delta, sizes)
    ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    return ledger, privacy_metadata(privacy)


def _make_algorithm(
    config: Config, dataset: FederatedDataset, model: torch.nn.Module
) -> tuple[Algorithm, PrivacyLedger | None, dict[str, Any]]:
    """The algorithm, its ledger (None when non-private) and the privacy metadata."""
    exp = config.experiment
    algo, privacy = exp.algorithm, exp.privacy
    sizes = dataset.train_sizes()
    builder = _paper_builder(algo.name)
    if builder is not None:
        return builder.build(config, dataset, model)
    if algo.name == "fedavg":
        fedavg = FedAvg(
            clients_per_round=algo.clients_per_round,
            local_steps=algo.local_steps,
            lr=algo.lr,
            batch_size=algo.batch_size,
        )
        return fedavg, None, {"unit": "none: non-private run (epsilon is infinite)"}
    check_delta(privacy.delta, sizes)
    ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    meta = privacy_metadata(privacy)
    if algo.name == "dp_fedavg":
        sigma, calibrated = noise_multiplier(privacy, algo.rounds * algo.local_steps)
        algorithm: Algorithm = DPFedAvg(
            clients_per_round=algo.clients_per_round,
            local_steps=algo.local_steps,
            lr=algo.lr,
            clip_norm=privacy.clip_norm,
            noise_multiplier=sigma,
            sampling_rate=privacy.sampling_rate,
        )
        meta.update(noise_multiplier=sigma, noise_calibrated=calibrated)
        return algorithm, ledger, meta
    if algo.name in ("pe_dpfl", "adap_dp_fl"):
        return _ali_baseline(config, sizes, model, ledger, meta)
    return _ali(config, sizes, model, ledger, meta)


def _paper_builder(name: str) -> Any:
    """The per-paper builder module serving algorithm `name` (None: built here)."""
    from raydpfl.config import dpfl_bcs, fedfdp, rc_dpfl
    from raydpfl.experiment import builders  # noqa: F401  (the package the modules live in)

    for section, module in (
        (fedfdp, "fedfdp"),
        (dpfl_bcs, "dpfl_bcs"),
        (rc_dpfl, "rc_dpfl"),
    ):
        if name in section.NAMES:
            return importlib.import_module(f"raydpfl.experiment.builders.{module}")
    return None


def _ali_baseline(
    config: Config,
    sizes: np.ndarray,
    model: torch.nn.Module,
    ledger: PrivacyLedger,
    meta: dict[str, Any],
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """PE-DPFL or Adap DP-FL (ALI-DPFL's baselines): each stops on its own accountant."""
    exp = config.experiment
    algo, privacy = exp.algorithm, exp.privacy
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        local_steps=algo.local_steps,
        lr=algo.lr,
        sampling_rate=privacy.sampling_rate,
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        accountant=privacy.accountant,
    )
    try:
        if algo.name == "pe_dpfl":
            pe = algo.pe_dpfl
            sigma = privacy.noise_multiplier
            calibrated = sigma is None
            if sigma is None:
                sigma = calibrate_pe_noise(
                    privacy.epsilon, privacy.delta, algo.rounds, privacy.accountant
                )
            algorithm: Algorithm = PeDpfl(
                **common,
                update_clip_norm=pe.update_clip_norm or privacy.clip_norm,
                noise_multiplier=sigma,
                reg_weight=pe.reg_weight,
                perturbation_std=pe.perturbation_std,
                num_perturbations=pe.num_perturbations,
            )
        else:
            ad = algo.adap_dp_fl
            if privacy.noise_multiplier is None:
                raise ConfigError(
                    "experiment.privacy.noise_multiplier",
                    "adap_dp_fl needs the initial sigma (it decays it adaptively)",
                )
            sigma, calibrated = privacy.noise_multiplier, False
            num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            algorithm = AdapDpFl(
                **common,
                clip_norm=privacy.clip_norm,
                noise_multiplier=sigma,
                noise_decay=ad.noise_decay,
                num_params=num_params,
                patience=ad.patience,
                clip_factor=ad.clip_factor,
                clip_estimator=ad.clip_estimator,
                clip_min=ad.clip_min,
                clip_max=ad.clip_max,
                min_noise_multiplier=ad.min_noise_multiplier,
                loss_clip=ad.loss_clip,
            )
    except ValueError as e:
        raise ConfigError(f"experiment.algorithm.{algo.name}", str(e)) from None
    meta.update(noise_multiplier=sigma, noise_calibrated=calibrated)
    return algorithm, ledger, meta


def _ali(
    config: Config,
    sizes: np.ndarray,
    model: torch.nn.Module,
    ledger: PrivacyLedger,
    meta: dict[str, Any],
) -> tuple[Algorithm, PrivacyLedger, dict[str, Any]]:
    """ALI-DPFL or its fixed-τ baseline: σ fixed, the budget sets R_c (Algorithm 3)."""
    exp = config.experiment
    algo, privacy, ali = exp.algorithm, exp.privacy, exp.algorithm.ali_dpfl
    if privacy.noise_multiplier is None:
        raise ConfigError(
            "experiment.privacy.noise_multiplier",
            f"{algo.name} needs a fixed sigma (the budget sets the iteration cap R_c, "
            "not sigma); the paper's is 1.1",
        )
    sigma, q = privacy.noise_multiplier, privacy.sampling_rate
    try:
        r_c = iteration_budget(
            privacy.epsilon,
            privacy.delta,
            q,
            sigma,
            mode=ali.rc_mode,
            conversion=ali.rc_conversion,
            accountant=privacy.accountant,
        )
    except ValueError as e:
        raise ConfigError("experiment.privacy", f"cannot derive R_c: {e}") from None
    if r_c < 1:
        raise ConfigError(
            "experiment.privacy.epsilon",
            f"the budget allows no DP-SGD iteration at sigma={sigma}, q={q}; raise epsilon",
        )
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    min_batch = max(1.0, q * float(sizes.min()))
    common = dict(
        clients_per_round=algo.clients_per_round,
        rounds_budget=algo.rounds,
        iteration_budget=r_c,
        lr=algo.lr,
        clip_norm=privacy.clip_norm,
        noise_multiplier=sigma,
        sampling_rate=q,
        num_params=num_params,
        min_batch=min_batch,
        normalizer=ali.normalizer,
        fixed_divisor=ali.fixed_divisor,
    )
    algorithm: AliDpfl
    if algo.name == "dp_fedavg_fixed_tau":
        algorithm = DPFedAvgFixedTau(local_steps=algo.local_steps, **common)
    else:
        algorithm = AliDpfl(
            **common,
            gamma=ali.gamma,
            gamma_mode=ali.gamma_mode,
            mu_probe_size=ali.mu_probe_size,
            tau_formula=ali.tau_formula,
            tau_init=ali.tau_init,
            tau_max=ali.tau_max,
            last_round=ali.last_round,
        )
    meta.update(
        noise_multiplier=sigma,
        noise_calibrated=False,
        iteration_budget_R_c=r_c,
        rounds_budget_R_s=algo.rounds,
        rc_mode=ali.rc_mode,
        rc_conversion="classic" if ali.rc_mode == "paper_compat" else ali.rc_conversion,
        classic_epsilon_at_R_c=classic_epsilon(q, sigma, r_c, privacy.delta),
        ledger_epsilon_at_R_c=epsilon_for(sigma, q, r_c, privacy.delta, privacy.accountant),
        min_batch_B_hat=min_batch,
        num_params_d=num_params,
        adaptive_tau=algorithm.adaptive,
    )
    return algorithm, ledger, meta


def load_federated(data: DataConfig, run_seed: int) -> FederatedDataset:
    """Builds the federated dataset named by `data` on the partition stream."""
    seed = run_seed if data.seed is None else data.seed
    rng = numpy_rng(seed, NO_ROUND, SERVER, "partition")
    if data.cluster_shift.kind != "none":
        from raydpfl.experiment.builders.rc_dpfl import load_clustered

        return load_clustered(data, rng)
    try:
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
        arrays = load_dataset(data.dataset, data.root)
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
        )
    except ValueError as e:
        raise ConfigError("experiment.data", str(e)) from None


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
    return LocalBackend(worker, worker_threads(rt.cpus_per_worker))


def run_experiment(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None = None,
    resume: bool = False,
    server_in_process: bool = False,
) -> dict[str, Any]:
    """Runs `exp` on its backend, writing outputs to `run_dir` (None: in memory only).

    The resolved config is written first; the server then writes the rest. With
    `resume`, `run_dir` is an interrupted run of the same config: it continues from
    its last checkpoint (and ends with the same model as an uninterrupted run). With
    `server_in_process` (Ray only; Tune trials), the server runs in this process.
    """
    if resume and run_dir is None:
        raise ValueError("resume needs the run directory")
    if resume:
        check_resume(run_dir, exp.config)
    if run_dir is not None and not resume:
        RunWriter(run_dir).write_config(dump_config(exp.config))
    if exp.config.runtime.backend == "ray":
        from raydpfl.backends.ray.runner import run_on_ray  # Ray is imported only here

        summary = run_on_ray(exp, run_dir, on_round, resume, server_in_process)
    else:
        writer = RunWriter(run_dir) if run_dir is not None else None
        server = make_server(exp, writer, on_round, resume=resume)
        with make_local_backend(exp) as backend:
            summary = server.run(backend)
    if run_dir is not None:
        summary["run_dir"] = str(run_dir)
    return summary


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
