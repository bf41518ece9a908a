"""Building what `raydpfl.registry` holds: algorithms, models and datasets by name.

Built-in algorithms are built by their paper's builder (`raydpfl.experiment.builders`);
a registered algorithm is built here from its entry:

- an `Algorithm` subclass is called with the keyword arguments its constructor names,
  looked up in this order: the options dataclass (``experiment.algorithm.options``),
  ``experiment.algorithm`` (rounds, clients_per_round, local_steps, lr, batch_size) and
  ``experiment.privacy`` (clip_norm, noise_multiplier, sampling_rate, epsilon, delta,
  accountant) and, for an entry registered with ``server=True``,
  ``experiment.algorithm.server`` (server_optimizer, server_lr, server_momentum,
  server_beta2, server_adam_eps, aggregator, trim_fraction); a null
  ``noise_multiplier`` is calibrated so that rounds × local_steps steps spend the budget;
- a function is called with a `BuildContext` and returns the `Algorithm`.

Either way, a private algorithm gets the ledger of the config's accountant, δ and
per-client ε budget, and the server charges each task's declared cost before dispatch.

`import_plugins` is what ``--plugin`` does, in every command and in every Tune trial.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raydpfl import registry
from raydpfl.algorithms.base import Algorithm
from raydpfl.config import as_config_error
from raydpfl.config.load import from_mapping
from raydpfl.config.schema import Config, ConfigError, PrivacyConfig
from raydpfl.data.datasets import ArrayDataset
from raydpfl.data.federated import FederatedDataset
from raydpfl.experiment.privacy_settings import check_delta, noise_multiplier, privacy_metadata
from raydpfl.privacy.accounting.client_level import ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyLedger

Built = tuple[Algorithm, PrivacyLedger | ClientLevelLedger | None, dict[str, Any]]


@dataclass(frozen=True)
class BuildContext:
    """What a registered algorithm's builder function gets.

    Attributes:
        config: The whole validated config.
        options: The entry's options (an instance of its options dataclass), or None.
        dataset: The federated dataset (client sizes: ``dataset.train_sizes()``).
        model: The initial model (e.g. to count parameters).
        server_optimizer: The entry was registered with ``server=True``: it takes
            ``experiment.algorithm.server`` (`raydpfl.register_algorithm`).
    """

    config: Config
    options: Any
    dataset: FederatedDataset
    model: torch.nn.Module
    server_optimizer: bool = False

    def noise_multiplier(self, steps: int) -> float:
        """σ from ``experiment.privacy``, or calibrated so `steps` steps spend ε."""
        return noise_multiplier(self.config.experiment.privacy, steps)[0]


def import_plugins(plugins: Sequence[str]) -> None:
    """Imports each ``--plugin``: a module name (``my_pkg.algos``) or a ``.py`` file from
    any path, imported as the module of its stem (so that its ``raydpfl.register_*``
    calls run) through `raydpfl.registry.plugin_files.import_plugin`, which remembers the
    file for the Ray actors' runtime environment; a file already imported from the same
    path is not imported again.

    Raises:
        ConfigError: Under ``--plugin``: no such file, or its import failed, raised or
            called ``sys.exit`` (the error in one line).
    """
    import sys
    from pathlib import Path

    from raydpfl.registry.plugin_files import (
        PluginImportError,
        import_plugin,
        remember_plugin_file,
    )

    for plugin in plugins:
        if plugin.endswith(".py"):
            module = sys.modules.get(Path(plugin).stem)
            loaded = getattr(module, "__file__", None)
            if loaded is not None and Path(loaded).resolve() == Path(plugin).resolve():
                remember_plugin_file(plugin)  # imported already (by --plugin or an `import`)
                continue
        try:
            import_plugin(plugin)
        except PluginImportError as e:
            raise ConfigError("--plugin", str(e)) from None


def parse_options(entry: registry.Entry, raw: Mapping[str, Any], field: str) -> Any:
    """The entry's options dataclass built from `raw` (strict: unknown keys, wrong types
    and its own range checks are `ConfigError`s under `field`); None without options.

    A model or dataset registered without an options dataclass takes the keyword
    arguments its factory's signature names (`signature_options`), checked the same way.
    """
    options = entry.options
    if options is None and raw and entry.kind in _LEADING_ARGUMENTS:
        with as_config_error(field):
            options = signature_options(_load(entry, field), _LEADING_ARGUMENTS[entry.kind])
    if options is None:
        if raw:
            raise ConfigError(field, f"{entry.kind} {entry.name!r} takes no options")
        return None
    return from_mapping(options, dict(raw), field)


#: The positional arguments of a model or dataset factory that are not options.
_LEADING_ARGUMENTS = {"model": 2, "dataset": 1}  # (input_shape, num_classes) · (root,)
#: The annotations a signature option may have (what a YAML value converts to).
_SIMPLE = (int, float, str, bool)


def signature_options(factory: Callable[..., Any], leading: int) -> type | None:
    """An options dataclass read off `factory`'s keyword parameters after the first
    `leading`: each with its annotation (int, float, str, bool, optionally ``| None``) and
    its default (a parameter without one is required). None when it names none.

    Raises:
        ValueError: A parameter's annotation is not one of those (the factory's options
            then need their own dataclass: ``register_model(..., options=...)``).
    """
    import typing

    try:
        hints = typing.get_type_hints(factory)
        params = list(inspect.signature(factory).parameters.values())[leading:]
    except (TypeError, ValueError, NameError):
        return None
    fields = []
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(param.name, type(param.default))
        bare = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if len(bare) != 1 or bare[0] not in _SIMPLE:
            raise ValueError(
                f"{getattr(factory, '__name__', factory)}'s parameter {param.name} has type "
                f"{hint!r}; register the factory with an options dataclass"
            )
        default = {} if param.default is param.empty else {"default": param.default}
        fields.append((param.name, hint, dataclasses.field(**default)))
    if not fields:
        return None
    name = f"{getattr(factory, '__name__', 'factory')}_options"
    return dataclasses.make_dataclass(name, fields, frozen=True, kw_only=True)


def build_registered_algorithm(
    config: Config, dataset: FederatedDataset, model: torch.nn.Module
) -> Built:
    """The algorithm `experiment.algorithm.name` names, its ledger and privacy metadata."""
    import raydpfl.experiment.builders  # noqa: F401  (registers the built-in names)

    algo = config.experiment.algorithm
    try:
        entry = registry.get("algorithm", algo.name)
    except registry.RegistryError as e:
        raise ConfigError("experiment.algorithm.name", str(e)) from None
    if entry.builtin:
        return entry.load()(config, dataset, model)
    options = parse_options(entry, algo.options, "experiment.algorithm.options")
    target = _load(entry, "experiment.algorithm.name")
    context = BuildContext(
        config, options, dataset, model, registry.SERVER_OPTIMIZER_TAG in entry.tags
    )
    if isinstance(target, type) and issubclass(target, Algorithm):
        algorithm = _construct(target, context)
    else:
        algorithm = target(context)
        if not isinstance(algorithm, Algorithm):
            raise ConfigError(
                "experiment.algorithm.name",
                f"the builder of {algo.name!r} must return an Algorithm, "
                f"got {type(algorithm).__name__}",
            )
    if getattr(algorithm, "name", None) != algo.name:
        # A plug-in subclassing a built-in inherits its class name: errors, checkpoints and
        # records name the algorithm the user registered and ran.
        algorithm.name = algo.name  # type: ignore[misc]
    ledger, meta = ledger_for(algorithm, config.experiment.privacy, dataset.train_sizes())
    return algorithm, ledger, meta


def ledger_for(
    algorithm: Algorithm, privacy: PrivacyConfig, sizes: np.ndarray
) -> tuple[PrivacyLedger | ClientLevelLedger | None, dict[str, Any]]:
    """The ledger of a user's algorithm: the config's accountant, δ and per-client ε budget
    when it is private (its tasks declare their own costs), none otherwise; an algorithm
    whose ``privacy_unit`` is ``client`` gets one population-level `ClientLevelLedger`."""
    if not algorithm.is_private:
        return None, {"unit": "none: non-private run (epsilon is infinite)"}
    if getattr(algorithm, "privacy_unit", "record") == "client":
        # One population-level ledger instead of per-client ones (never both: one unit).
        from raydpfl.experiment.builders.client_level import client_level_ledger

        return client_level_ledger(algorithm, privacy, sizes)
    check_delta(privacy.delta, sizes)
    ledger = PrivacyLedger(privacy.accountant, privacy.delta, privacy.epsilon)
    return ledger, privacy_metadata(privacy)


def _construct(cls: type[Algorithm], context: BuildContext) -> Algorithm:
    """`cls(**kwargs)` with each constructor parameter taken from the options, then the
    algorithm section, then the privacy section (σ calibrated when null)."""
    exp = context.config.experiment
    algo, privacy = exp.algorithm, exp.privacy
    sources: list[Mapping[str, Any]] = []
    if context.options is not None:
        sources.append(dataclasses.asdict(context.options))
    sources.append(
        {k: getattr(algo, k) for k in ("rounds", "clients_per_round", "local_steps", "lr")}
        | {"batch_size": algo.batch_size}
    )
    if context.server_optimizer:
        # Registered with server=True: experiment.algorithm.server as the arguments of
        # ServerOptimizerMixin (server_optimizer, server_lr, ..., aggregator).
        from raydpfl.experiment.builders.core import server_optimizer_kwargs

        sources.append(server_optimizer_kwargs(context.config))
    sigma = privacy.noise_multiplier
    lazy_sigma: Callable[[], float] = functools.partial(
        context.noise_multiplier, algo.rounds * algo.local_steps
    )
    sources.append(
        {
            "clip_norm": privacy.clip_norm,
            "sampling_rate": privacy.sampling_rate,
            "epsilon": privacy.epsilon,
            "delta": privacy.delta,
            "accountant": privacy.accountant,
        }
    )
    kwargs: dict[str, Any] = {}
    missing = []
    for name, param in _init_parameters(cls).items():
        source = next((s for s in sources if name in s), None)
        if source is not None:
            kwargs[name] = source[name]
        elif name == "noise_multiplier":
            kwargs[name] = sigma if sigma is not None else lazy_sigma()
        elif param.default is param.empty:
            missing.append(name)
    if missing:
        raise ConfigError(
            "experiment.algorithm.options",
            f"{cls.__name__} needs {', '.join(missing)}: add them to its options dataclass "
            "(they are not keys of experiment.algorithm or experiment.privacy)",
        )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError("experiment.algorithm", f"{cls.__name__}: {e}") from None


def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters `cls(...)` accepts: its ``__init__``'s, and, while an
    ``__init__`` passes ``**kwargs`` on, its base classes' (a subclass adding one option
    to DP-FedAvg gets DP-FedAvg's arguments too)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        forwards = False
        for name, param in inspect.signature(init).parameters.items():
            if param.kind is param.VAR_KEYWORD:
                forwards = True
            elif name != "self" and param.kind is not param.VAR_POSITIONAL:
                params.setdefault(name, param)
        if not forwards:
            break
    return params


def _load(entry: registry.Entry, field: str) -> Any:
    try:
        return entry.load()
    except (ImportError, AttributeError) as e:
        raise ConfigError(field, f"{entry.kind} {entry.name!r} cannot be loaded: {e}") from None


# ---- models and datasets -----------------------------------------------------------------------
def registered_model_factory(
    name: str, options: Mapping[str, Any], input_shape: tuple[int, ...], num_classes: int
) -> Callable[[], torch.nn.Module] | None:
    """A no-argument factory for a registered (not built-in) model, or None for a built-in.

    The factory carries the registered callable itself, so Ray workers, where the user's
    registration never ran, build the same model.
    """
    import raydpfl.models  # noqa: F401  (registers the zoo)

    entry = registry.get("model", name)
    if entry.builtin:
        return None
    parsed = parse_options(entry, options, "experiment.model.options")
    kwargs = dataclasses.asdict(parsed) if parsed is not None else {}
    target = _load(entry, "experiment.model.name")
    return functools.partial(target, tuple(input_shape), num_classes, **kwargs)


def load_registered_dataset(
    name: str, root: str | None, options: Mapping[str, Any]
) -> ArrayDataset:
    """The arrays of a registered dataset (``load(root, **options)``)."""
    entry = registry.get("dataset", name)
    parsed = parse_options(entry, options, "experiment.data.options")
    kwargs = dataclasses.asdict(parsed) if parsed is not None else {}
    arrays = _load(entry, "experiment.data.dataset")(root, **kwargs)
    if not isinstance(arrays, ArrayDataset):
        raise ConfigError(
            "experiment.data.dataset",
            f"dataset {name!r} must load a raydpfl.data.ArrayDataset, got {type(arrays).__name__}",
        )
    return arrays
