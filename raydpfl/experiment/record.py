"""What a run records about what ran: config.yaml and summary.json from the objects used.

A config names its algorithm, model and dataset; `raydpfl.run_simulation` (and
`raydpfl.run_sweep`) may replace them by Python objects. The record then says what ran,
never the config's defaults for what did not:

- an algorithm object whose exact class has a name (a built-in class, DPFedAvg or
  FedAvg, or a registered one) is recorded by that name, with its actual parameters in
  the config's keys (``experiment.algorithm``: clients_per_round, local_steps, lr,
  batch_size; ``experiment.privacy``: clip_norm, noise_multiplier, sampling_rate;
  ``experiment.algorithm.server``; a registered entry's options), so config.yaml runs
  the same algorithm again;
- any other object (an unregistered class, a model factory, a dataset object) is marked
  as a Python object with its class and parameters: in summary.json
  (``"algorithm": "python:my_module.MyAlgo"`` and ``"algorithm_params"``, likewise
  ``model``), and in a comment block at the top of config.yaml naming the sections
  that were not used.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml

from raydpfl import registry
from raydpfl.algorithms import Algorithm
from raydpfl.config.load import config_from_dict, dump_config
from raydpfl.config.schema import Config, ConfigError
from raydpfl.data.federated import FederatedDataset

#: The marker of a Python object in summary.json's ``algorithm`` and ``model``.
PYTHON_PREFIX = "python:"
#: Constructor parameters recorded under ``experiment.algorithm`` / ``experiment.privacy``.
ALGORITHM_KEYS = ("clients_per_round", "local_steps", "lr", "batch_size")
PRIVACY_KEYS = ("clip_norm", "noise_multiplier", "sampling_rate")
#: `ServerOptimizer`'s attributes → ``experiment.algorithm.server`` keys.
_SERVER_KEYS = {
    "optimizer": "optimizer",
    "lr": "lr",
    "momentum": "momentum",
    "beta2": "beta2",
    "eps": "adam_eps",
}
_PLAIN = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class RunRecord:
    """config.yaml's text and what summary.json says about the algorithm, model, data."""

    config_text: str
    summary: dict[str, Any] = field(default_factory=dict)


def object_name(obj: Any) -> str:
    """``module.QualName`` of a class, function or instance (its class)."""
    target = obj.func if isinstance(obj, functools.partial) else obj
    if not isinstance(target, type) and not inspect.isroutine(target):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"


def object_params(algorithm: Algorithm) -> dict[str, Any]:
    """The algorithm's constructor parameters as the object holds them (plain values),
    its server optimizer's and aggregator's included."""
    from raydpfl.experiment.plugins import _init_parameters

    params = {}
    for name in _init_parameters(type(algorithm)):
        value = getattr(algorithm, name, None)
        if hasattr(algorithm, name) and isinstance(value, _PLAIN):
            params[name] = value
    opt = getattr(algorithm, "server_opt", None)
    if opt is not None:
        params.update({f"server_{k}": getattr(opt, k) for k in _SERVER_KEYS})
    return params


def algorithm_name(algorithm: Algorithm) -> str | None:
    """The config name of the algorithm's exact class: a registered class's, or the core's
    for DPFedAvg and FedAvg; None for any other class."""
    import raydpfl.experiment.builders  # noqa: F401  (registers the core's names)
    from raydpfl.algorithms import DPFedAvg, FedAvg

    cls = type(algorithm)
    for entry in registry.entries("algorithm"):
        if entry.target is cls:
            return entry.name
    return {DPFedAvg: "dp_fedavg", FedAvg: "fedavg"}.get(cls)


def _model_params(model: Callable[[], torch.nn.Module], net: torch.nn.Module) -> dict[str, Any]:
    out: dict[str, Any] = {"num_parameters": int(sum(p.numel() for p in net.parameters()))}
    if isinstance(model, functools.partial):
        out["args"] = [repr(a) for a in model.args]
        out["kwargs"] = {k: repr(v) for k, v in model.keywords.items()}
    return out


def record_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    net: torch.nn.Module | None = None,
    dataset: FederatedDataset | None = None,
) -> RunRecord:
    """What the run records, given the Python objects that replaced the config's (None:
    the config's own ran, and config.yaml is the config as resolved)."""
    if algorithm is None and model is None and dataset is None:
        return RunRecord(dump_config(config))
    raw = yaml.safe_load(dump_config(config))
    exp = raw["experiment"]
    header: list[str] = []
    summary: dict[str, Any] = {}
    if algorithm is not None:
        config, summary_part, line = _record_algorithm(config, raw, algorithm)
        summary.update(summary_part)
        if line:
            header.append(line)
    if model is not None:
        summary["model"] = PYTHON_PREFIX + object_name(model)
        summary["model_params"] = _model_params(model, net) if net is not None else {}
        header.append(
            f"experiment.model: not used; the Python object {object_name(model)} ran "
            f"({summary['model_params'].get('num_parameters', '?')} parameters)"
        )
    if dataset is not None:
        summary["dataset"] = dataset.name
        summary["dataset_object"] = PYTHON_PREFIX + object_name(dataset)
        header.append(
            f"experiment.data: not used; the Python object {object_name(dataset)} "
            f"{dataset.name!r} ran ({dataset.num_clients} clients)"
        )
    del exp
    text = dump_config(config)
    if header:
        lines = ["# What ran differs from the config in these sections (run from Python):"]
        lines += [f"#   {h}" for h in header]
        text = "\n".join(lines) + "\n" + text
    return RunRecord(text, summary)


def _record_algorithm(
    config: Config, raw: dict[str, Any], algorithm: Algorithm
) -> tuple[Config, dict[str, Any], str | None]:
    """The config with the object's actual parameters in its keys (validated; the
    config unchanged when they do not validate), summary fields, and a header line."""
    params = object_params(algorithm)
    name = algorithm_name(algorithm)
    section = raw["experiment"]["algorithm"]
    privacy = raw["experiment"]["privacy"]
    for key in ALGORITHM_KEYS:
        if key in params:
            section[key] = params[key]
    if algorithm.is_private:
        for key in PRIVACY_KEYS:
            if key in params:
                privacy[key] = params[key]
    server = section.setdefault("server", {})
    for attr, key in _SERVER_KEYS.items():
        if f"server_{attr}" in params:
            server[key] = params[f"server_{attr}"]
    if "server_optimizer" in params and getattr(algorithm, "server_opt", None) is None:
        server.update(optimizer="sgd", lr=1.0)  # it ran the plain step, whatever the config
    for key in ("aggregator", "trim_fraction"):
        if key in params:
            server[key] = params[key]
    if name is not None:
        section["name"] = name
        entry = registry.get("algorithm", name)
        options = entry.options
        if options is not None and not entry.builtin:
            import dataclasses

            section["options"] = {
                f.name: params[f.name] for f in dataclasses.fields(options) if f.name in params
            }
    try:
        recorded = config_from_dict(raw)
    except ConfigError:
        recorded, name = config, None  # its values do not fit the schema: marked instead
    summary: dict[str, Any] = {"algorithm_params": params}
    if name is not None:
        summary["algorithm"] = name
        return recorded, summary, None
    summary["algorithm"] = PYTHON_PREFIX + object_name(algorithm)
    line = (
        f"experiment.algorithm: the Python object {object_name(algorithm)} ran "
        f"({', '.join(f'{k}={v!r}' for k, v in params.items())}); the name below is the "
        "config's, not what ran"
    )
    return recorded, summary, line
