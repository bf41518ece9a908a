"""The one registry of algorithms, models and datasets, built in or a user's own.

A new algorithm, model or dataset is one definition and one registration; the config
validates names and options against this registry, and `raydpfl run` or
`raydpfl.run_simulation` then build it like a built-in:

    import raydpfl

    @raydpfl.register_model("tiny_mlp")
    def tiny_mlp(input_shape, num_classes, hidden: int = 32):
        ...  # returns a torch.nn.Module

    @raydpfl.register_algorithm("dp_fedavg_momentum", options=MomentumOptions)
    class DPFedAvgMomentum(DPFedAvg):
        ...

    raydpfl.run_simulation({"experiment": {"algorithm": {"name": "dp_fedavg_momentum",
        "options": {"momentum": 0.9}}, "model": {"name": "tiny_mlp"}}})

What each kind's target is:
- **algorithm**: an `Algorithm` subclass, built with the keyword arguments its
  constructor names, taken from the options dataclass, ``experiment.algorithm`` and
  ``experiment.privacy`` (σ calibrated to the budget when ``noise_multiplier`` is null);
  or a function ``build(context) -> Algorithm`` (`raydpfl.experiment.plugins`).
- **model**: ``factory(input_shape, num_classes, **options) -> torch.nn.Module``.
- **dataset**: ``load(root, **options) -> raydpfl.data.ArrayDataset``, partitioned over
  clients like the built-in datasets.

Third-party packages register through the entry-point groups in `ENTRY_POINT_GROUPS`
(``[project.entry-points."raydpfl.algorithms"] my_algo = "my_pkg.algo:MyAlgo"``): the
name is known at once, the object is imported when it is first built. A package with
several entries (algorithms with their models, options and a config section) names one
function in the group `PLUGIN_GROUP` instead
(``[project.entry-points."raydpfl.plugins"] my_pkg = "my_pkg:register"``); it is called
once, before the first lookup, and registers them with `register`. raydpfl's own seed
papers (`raydpfl.papers`) register exactly that way.

This module imports nothing from raydpfl, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["algorithm", "model", "dataset"]
KINDS: tuple[Kind, ...] = ("algorithm", "model", "dataset")
#: The entry-point group each kind is discovered in.
ENTRY_POINT_GROUPS: dict[Kind, str] = {
    "algorithm": "raydpfl.algorithms",
    "model": "raydpfl.models",
    "dataset": "raydpfl.datasets",
}

#: The entry-point group of registration functions (``register() -> None``), called once.
PLUGIN_GROUP = "raydpfl.plugins"

#: Tags the core checks (`Entry.tags`; `register_algorithm`'s keyword arguments set them).
#: An algorithm whose server averages whatever updates arrive (``algorithm.dropout``).
DROPOUT_TAG = "dropout"
#: An algorithm whose server applies one weighted-mean update per round, and so takes a
#: server optimizer and aggregator (``experiment.algorithm.server``).
SERVER_OPTIMIZER_TAG = "server_optimizer"
#: A model with one real output, or an algorithm with an MSE loss.
REGRESSION_TAG = "regression"
#: How `raydpfl audit` can put canaries into an algorithm (its tag is ``audit:<kind>``).
AUDIT_KINDS = ("dp_fedavg", "dp_sgd_loop", "client")

__all__ = [
    "AUDIT_KINDS",
    "DROPOUT_TAG",
    "ENTRY_POINT_GROUPS",
    "KINDS",
    "PLUGIN_GROUP",
    "REGRESSION_TAG",
    "SERVER_OPTIMIZER_TAG",
    "Entry",
    "RegistryError",
    "algorithm_tags",
    "entries",
    "get",
    "is_registered",
    "names",
    "register",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "tagged",
    "unregister",
]


class RegistryError(ValueError):
    """A name registered twice, or an entry that is not what its kind needs."""


@dataclass(frozen=True)
class Entry:
    """One registered algorithm, model or dataset.

    Attributes:
        kind: ``algorithm``, ``model`` or ``dataset``.
        name: What a config's ``name`` field (``data.dataset`` for datasets) selects.
        target: The object (see the module docstring), or ``"module:attr"`` imported on
            first use (entry points).
        options: A dataclass whose fields are the entry's options (from the config's
            ``options`` mapping, validated strictly), or None for no options.
        builtin: Shipped with raydpfl. A built-in algorithm's target is a function
            ``build(config, dataset, model) -> (algorithm, ledger, metadata)``.
        section: For an algorithm with options: the key under ``experiment.algorithm``
            that also holds them (``ali_dpfl: {gamma: 5}`` as well as ``options:
            {gamma: 5}``); several names may share one section.
        tags: Facts about the entry the core checks without knowing it by name: an
            algorithm or model tagged ``regression`` has an MSE loss (the only ones a
            regression dataset may use); an algorithm tagged ``audit:<how>`` is one
            `raydpfl audit` puts canaries into.
        notes: Facts in words, by topic (``notes["audit"]``: why the audit refuses a
            private algorithm, named in the refusal).
    """

    kind: Kind
    name: str
    target: Any
    options: type | None = None
    builtin: bool = False
    section: str | None = None
    tags: frozenset[str] = frozenset()
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def load(self) -> Any:
        """The target object, importing a ``"module:attr"`` target."""
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            obj: Any = importlib.import_module(module)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
            return obj
        return self.target


_ENTRIES: dict[Kind, dict[str, Entry]] = {kind: {} for kind in KINDS}
_ENTRY_POINTS_LOADED: set[Kind] = set()


def _check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise RegistryError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind  # type: ignore[return-value]


def register(
    kind: Kind,
    name: str,
    target: Any,
    *,
    options: type | None = None,
    builtin: bool = False,
    replace: bool = False,
    section: str | None = None,
    tags: tuple[str, ...] | frozenset[str] = (),
    notes: Mapping[str, str] | None = None,
) -> Entry:
    """Registers `target` as `name` of `kind`; returns the entry (fields: `Entry`).

    Raises:
        RegistryError: `name` is taken (unless `replace`), is not an identifier-like
            string, `options` is not a dataclass, or a `section` without options.
    """
    kind = _check_kind(kind)
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise RegistryError(f"{kind} name must be a word like 'my_algo', got {name!r}")
    if options is not None and not (
        isinstance(options, type) and dataclasses.is_dataclass(options)
    ):
        raise RegistryError(f"{kind} {name!r}: options must be a dataclass type, got {options!r}")
    if not isinstance(target, str) and not callable(target):
        raise RegistryError(f"{kind} {name!r}: the target must be callable, got {target!r}")
    if section is not None and (options is None or not section.isidentifier()):
        raise RegistryError(
            f"{kind} {name!r}: section must be a word and needs an options dataclass"
        )
    existing = _ENTRIES[kind].get(name)
    if existing is not None and not replace and existing.target is not target:
        raise RegistryError(
            f"{kind} {name!r} is already registered (to {_describe(existing.target)}); "
            "pick another name or pass replace=True"
        )
    entry = Entry(
        kind, name, target, options, builtin, section, frozenset(tags), dict(notes or {})
    )
    _ENTRIES[kind][name] = entry
    return entry


def unregister(kind: Kind, name: str) -> None:
    """Removes a registration (tests, notebooks re-running a cell)."""
    _ENTRIES[_check_kind(kind)].pop(name, None)


def _decorator(
    kind: Kind,
    name: str | None,
    options: type | None,
    replace: bool,
    *,
    section: str | None = None,
    tags: tuple[str, ...] = (),
    notes: Mapping[str, str] | None = None,
) -> Callable:
    def wrap(target: Any) -> Any:
        register(
            kind,
            name or target.__name__,
            target,
            options=options,
            replace=replace,
            section=section,
            tags=tags,
            notes=notes,
        )
        return target

    return wrap


def algorithm_tags(
    *,
    dropout: bool = False,
    server: bool = False,
    audit: str | None = None,
    regression: bool = False,
) -> tuple[str, ...]:
    """The `Entry.tags` that `register_algorithm`'s keyword arguments declare.

    Raises:
        RegistryError: `audit` is not one of `AUDIT_KINDS`.
    """
    tags = []
    if dropout:
        tags.append(DROPOUT_TAG)
    if server:
        tags.append(SERVER_OPTIMIZER_TAG)
    if audit is not None:
        if audit not in AUDIT_KINDS:
            raise RegistryError(
                f"audit must be one of {', '.join(AUDIT_KINDS)} or None, got {audit!r}"
            )
        tags.append(f"audit:{audit}")
    if regression:
        tags.append(REGRESSION_TAG)
    return tuple(tags)


def register_algorithm(
    name: str | None = None,
    *,
    options: type | None = None,
    replace: bool = False,
    section: str | None = None,
    dropout: bool = False,
    server: bool = False,
    audit: str | None = None,
    regression: bool = False,
    notes: Mapping[str, str] | None = None,
) -> Callable:
    """Decorator: registers an `Algorithm` subclass (or a builder function) by name.

    The keyword arguments declare what the core checks before a run, without knowing the
    algorithm by name (each becomes one of the entry's `Entry.tags`):

    Args:
        name: The config's ``experiment.algorithm.name`` (default: the target's name).
        options: A dataclass of the algorithm's own options (``experiment.algorithm.
            options``), validated strictly.
        replace: Re-register a taken name (a notebook cell run twice).
        section: A key under ``experiment.algorithm`` that also holds the options.
        dropout: The server averages whatever updates arrive (its aggregate is a
            weighted mean over the results it is given, a lost client simply absent), so
            ``experiment.algorithm.dropout`` > 0 is allowed: each charged client's update
            is then lost with that probability, its charge standing.
        server: The server applies one weighted-mean update Δ̄ per round and takes a
            server optimizer and a robust aggregator (``experiment.algorithm.server``).
            A class opting in receives the settings as constructor keyword arguments
            ``server_optimizer``, ``server_lr``, ``server_momentum``, ``server_beta2``,
            ``server_adam_eps``, ``aggregator`` and ``trim_fraction`` (the arguments of
            `raydpfl.algorithms.server_optimizers.ServerOptimizerMixin`, which DP-FedAvg
            and FedAvg subclasses already have). Such a server averages what arrives, so
            ``server=True`` allows ``dropout`` too.
        audit: How `raydpfl audit` puts canaries into it (`AUDIT_KINDS`):
            ``"dp_sgd_loop"`` (a record-level algorithm whose client half is the shared
            DP-SGD loop, `raydpfl.dp_sgd_local_update`), ``"dp_fedavg"`` (DP-FedAvg's
            own client half) or ``"client"`` (client-level DP-FedAvg); None: not
            audited (say why in ``notes={"audit": ...}``, which the refusal quotes).
        regression: It trains with an MSE loss (the only algorithms a regression
            dataset may use).
        notes: Facts in words, by topic (``{"audit": "why the audit refuses it"}``).
    """
    tags = algorithm_tags(dropout=dropout, server=server, audit=audit, regression=regression)
    return _decorator("algorithm", name, options, replace, section=section, tags=tags, notes=notes)


def register_model(
    name: str | None = None,
    *,
    options: type | None = None,
    replace: bool = False,
    regression: bool = False,
) -> Callable:
    """Decorator: registers ``factory(input_shape, num_classes, **options) -> nn.Module``;
    `regression`: one real output trained with an MSE loss (for regression datasets)."""
    tags = (REGRESSION_TAG,) if regression else ()
    return _decorator("model", name, options, replace, tags=tags)


def register_dataset(
    name: str | None = None, *, options: type | None = None, replace: bool = False
) -> Callable:
    """Decorator: registers ``load(root, **options) -> ArrayDataset`` by name."""
    return _decorator("dataset", name, options, replace)


_PLUGINS_LOADED = False


def _load_plugins() -> None:
    """Calls every registration function of `PLUGIN_GROUP` (once per process)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True  # first: a plugin's own lookups must not recurse
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            ep.load()()
        except Exception as e:
            raise RegistryError(
                f"the raydpfl plugin {ep.name!r} ({ep.value}) failed to register: "
                f"{type(e).__name__}: {e}"
            ) from e


def _load_entry_points(kind: Kind) -> None:
    """Registers the plugins and the entry points of `kind`'s group (once; names only,
    objects lazily)."""
    _load_plugins()
    if kind in _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED.add(kind)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUPS[kind]):
        if ep.name not in _ENTRIES[kind]:
            _ENTRIES[kind][ep.name] = Entry(kind, ep.name, ep.value)


def names(kind: Kind) -> tuple[str, ...]:
    """Every registered name of `kind` (entry points included), in registration order."""
    kind = _check_kind(kind)
    _load_entry_points(kind)
    return tuple(_ENTRIES[kind])


def is_registered(kind: Kind, name: str) -> bool:
    """Whether `name` is registered as `kind` (entry points included)."""
    return name in names(kind)


def get(kind: Kind, name: str) -> Entry:
    """The entry of `name`.

    Raises:
        RegistryError: Not registered (the message lists what is).
    """
    kind = _check_kind(kind)
    _load_entry_points(kind)
    entry = _ENTRIES[kind].get(name)
    if entry is None:
        raise RegistryError(
            f"unknown {kind} {name!r}; registered: {', '.join(_ENTRIES[kind]) or 'none'}"
        )
    return entry


def entries(kind: Kind) -> tuple[Entry, ...]:
    """Every registered entry of `kind` (entry points included), in registration order."""
    return tuple(get(kind, name) for name in names(kind))


def tagged(kind: Kind, tag: str) -> tuple[str, ...]:
    """The names of `kind` whose entry carries `tag`."""
    return tuple(e.name for e in entries(kind) if tag in e.tags)


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
