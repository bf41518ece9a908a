"""The one typed config tree: `Config(experiment, runtime)`.

`experiment` says what is simulated (data, model, algorithm, privacy); `runtime` says
how it is run (backend, workers, seed, output). The same experiment runs in-process or
on a cluster by changing `runtime` alone. Every field is validated when the tree is
built; a violation raises `ConfigError` naming the dotted field and what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from raydpfl import registry
from raydpfl.config._base import ConfigError, _check, did_you_mean
from raydpfl.config._mapping import from_mapping
from raydpfl.config.cluster_shift import ClusterShiftConfig

__all__ = ["ConfigError"]

#: The most clients one run may register (each costs index arrays and a ledger entry).
MAX_CLIENTS = 10_000_000


def _check_name(kind: registry.Kind, name: str, builtins: tuple[str, ...], field: str) -> None:
    """`name` must be built in or registered (`raydpfl.registry`, entry points included)."""
    if name in builtins or registry.is_registered(kind, name):
        return
    extra = [n for n in registry.names(kind) if n not in builtins]
    allowed = ", ".join((*builtins, *extra))
    # A near miss is a typo: say which name; otherwise perhaps the user's own, not loaded.
    close = did_you_mean(name, (*builtins, *extra))
    hint = close or (
        f" (your own {kind}? load its file with `--plugin FILE`, or register it in Python "
        "before run_simulation)"
    )
    raise ConfigError(field, f"must be one of {allowed}; got {name!r}{hint}")


def _check_options(
    kind: registry.Kind, name: str, options: Any, builtins: tuple[str, ...]
) -> None:
    """`options` configures registered entries (their options dataclass checks them); a
    core built-in takes its settings from its own keys instead."""
    _check(
        not options or name not in builtins,
        "options",
        f"is for registered {kind}s; the built-in {name!r} takes its settings from its "
        "own keys and section",
    )


def _entry_options(name: str) -> type | None:
    """The options dataclass of algorithm `name`, or None (unknown names: None)."""
    if name in BUILTIN_ALGORITHMS:
        return None  # the core's own take none (and need no registry lookup)
    if not registry.is_registered("algorithm", name):
        return None
    return registry.get("algorithm", name).options


def _option_sections(name: str) -> tuple[dict[str, type], str | None]:
    """Every registered option section with its options dataclass, and the section of
    algorithm `name` (None: it has none, or `name` is not registered)."""
    sections = {
        e.section: e.options for e in registry.entries("algorithm") if e.section is not None
    }
    chosen = registry.get("algorithm", name).section if _entry_options(name) else None
    return sections, chosen  # type: ignore[return-value]


def unread_sections(algorithm: Any) -> list[str]:
    """The option sections in a raw ``experiment.algorithm`` mapping that the algorithm it
    names does not read (`fold_sections` checks and drops them; `raydpfl validate` says so)."""
    if not isinstance(algorithm, Mapping):
        return []
    sections, chosen = _option_sections(algorithm.get("name", AlgorithmConfig.name))
    return [k for k in algorithm if k in sections and k != chosen]


def fold_sections(data: Any, path: str) -> Any:
    """``experiment.algorithm`` with an option section folded into ``options``.

    A registered algorithm may name a section (`raydpfl.registry.Entry.section`): its
    options may be written ``algorithm: {name: ali_dpfl, ali_dpfl: {gamma: 5}}`` as well
    as ``options: {gamma: 5}``. The chosen algorithm's section becomes ``options`` (keys
    given both ways must agree); other algorithms' sections are checked against their
    own options and dropped (a preset written for one algorithm runs another with
    ``--set algorithm.name=...``). Errors name the section's own dotted path.
    """
    if not isinstance(data, dict):
        return data
    sections, chosen = _option_sections(data.get("name", AlgorithmConfig.name))
    present = [k for k in data if k in sections and k != "options"]
    if not present:
        return data
    data = dict(data)
    for key in present:
        raw = data.pop(key)
        from_mapping(sections[key], raw, f"{path}.{key}" if path else key)
        if key != chosen or not raw:
            continue
        given = dict(data.get("options") or {})
        clash = sorted(k for k in set(raw) & set(given) if raw[k] != given[k])
        _check(
            not clash,
            "options",
            f"{', '.join(clash)} given twice with different values "
            f"(options and the section {key})",
        )
        data["options"] = {**raw, **given}
    return data


#: The core's names (the catalogue a YAML config is checked against without importing
#: torch); `raydpfl.registry` adds the seed papers' (`raydpfl.papers`), the user's and
#: third-party packages' own.
BUILTIN_DATASETS: tuple[str, ...] = (
    "synthetic",
    "mnist",
    "fashion_mnist",
    "cifar10",
    "digits",
    "diabetes",
)
#: Datasets with real-valued targets (MSE loss, test MSE reported).
REGRESSION_DATASETS: tuple[str, ...] = ("diabetes",)
#: The registry tag of a model with one real output, or an algorithm with an MSE loss.
REGRESSION_TAG = registry.REGRESSION_TAG
#: The registry tag of an algorithm whose server applies one weighted-mean update per
#: round, and so takes a server optimizer (`experiment.algorithm.server`).
SERVER_OPTIMIZER_TAG = registry.SERVER_OPTIMIZER_TAG
#: The registry tag of an algorithm whose server averages whatever arrives (dropout).
DROPOUT_TAG = registry.DROPOUT_TAG
DatasetName = Literal[BUILTIN_DATASETS]  # type: ignore[valid-type]
PartitionKind = Literal[
    "iid",
    "dirichlet",
    "dirichlet_capped",
    "shards",
    "natural",
    "k_classes",
    "size_skew",
    "dirichlet_sizes",
]
CORE_ALGORITHMS = ("fedavg", "dp_fedavg")
BUILTIN_ALGORITHMS: tuple[str, ...] = CORE_ALGORITHMS
BUILTIN_MODELS: tuple[str, ...] = ("fedavg_cnn", "logreg", "mlp")


def shipped_names(kind: registry.Kind) -> tuple[str, ...]:
    """Every name of `kind` that ships with raydpfl: the core's and the seed papers'
    (registered through `raydpfl.registry`'s plugin group), not a user's."""
    core = {"algorithm": BUILTIN_ALGORITHMS, "model": BUILTIN_MODELS}.get(kind, BUILTIN_DATASETS)
    return core + tuple(e.name for e in registry.entries(kind) if e.builtin and e.name not in core)


def check_task(dataset: str, model: str, algorithm: str) -> None:
    """Refuses a regression model on a classification dataset and the reverse (the loss, the
    targets and the reported metric would not match), and a regression dataset with an
    algorithm without an MSE loss (the registry's `REGRESSION_TAG`). Raises ConfigError
    naming ``model.name`` or ``algorithm.name`` (under ``experiment.``)."""
    if dataset not in REGRESSION_DATASETS and model in BUILTIN_MODELS:
        return  # the common case, settled without the registry
    models = registry.tagged("model", REGRESSION_TAG)
    if model in models and dataset not in REGRESSION_DATASETS:
        raise ConfigError(
            "model.name",
            f"{model} is a regression model (one output, MSE loss); data.dataset {dataset!r} "
            f"is a classification dataset; regression datasets: {list(REGRESSION_DATASETS)}",
        )
    if dataset in REGRESSION_DATASETS and model not in models:
        raise ConfigError(
            "model.name",
            f"data.dataset {dataset!r} is a regression dataset (real-valued targets); "
            f"{model} is a classifier; use one of {list(models)}",
        )
    algorithms = registry.tagged("algorithm", REGRESSION_TAG)
    if dataset in REGRESSION_DATASETS and algorithm not in algorithms:
        raise ConfigError(
            "algorithm.name",
            f"{algorithm} has no regression (MSE) loss; data.dataset {dataset!r} needs one of "
            f"{list(algorithms)}",
        )


AccountantName = Literal["rdp", "prv", "dp_rdp", "pld"]
BackendName = Literal["ray", "local"]
DeviceName = Literal["cpu", "cuda", "auto"]
EngineName = Literal["auto", "bookkeeping", "vmap"]


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """How a centralised dataset is split over clients (ignored for `synthetic`)."""

    # iid; dirichlet (label skew, Dir(alpha)); dirichlet_capped (PFLlib's: a client stops
    # receiving classes once it holds |D|/N records); shards (shards_per_client label shards);
    # natural (one client per natural id, e.g. a FEMNIST writer; fewer clients than ids: a
    # random subset of the ids); k_classes (exactly classes_per_client labels per client);
    # size_skew (IID labels, sizes from size_distribution); dirichlet_sizes (Dir(alpha)
    # labels per client and sizes from size_distribution).
    kind: PartitionKind = "dirichlet"
    alpha: float = 0.5  # Dirichlet concentration; 0.5 is W1's (workloads.md)
    shards_per_client: int = 2  # McMahan et al. 2017's pathological split
    # fewest records per client (Dirichlet, k_classes redraw until met; natural: an id
    # with fewer records gets no client; size partitions: the size floor)
    min_samples_per_client: int = 2
    classes_per_client: int = 2  # k_classes: the k labels every client holds
    # size_skew, dirichlet_sizes: client sizes ∝ lognormal (log-size std size_sigma) or
    # power_law (Pareto with shape power_law_exponent; log-size std 1/exponent) weights.
    size_distribution: Literal["lognormal", "power_law"] = "lognormal"
    size_sigma: float = 1.0  # lognormal: standard deviation of the log client sizes
    power_law_exponent: float = 2.0  # power_law: Pareto shape a; P(size weight > t) = t^-a

    def __post_init__(self) -> None:
        _check(self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        _check(self.shards_per_client >= 1, "shards_per_client", "must be >= 1")
        _check(self.min_samples_per_client >= 1, "min_samples_per_client", "must be >= 1")
        _check(
            self.classes_per_client >= 1,
            "classes_per_client",
            f"must be >= 1, got {self.classes_per_client}",
        )
        _check(self.size_sigma > 0, "size_sigma", f"must be > 0, got {self.size_sigma}")
        _check(
            self.power_law_exponent > 0,
            "power_law_exponent",
            f"must be > 0, got {self.power_law_exponent}",
        )


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    """FedProx's Synthetic(α, β) generator (Li et al., MLSys 2020)."""

    alpha: float = 1.0  # variance of the per-client model mean u_k (how far models differ)
    beta: float = 1.0  # variance of the per-client feature mean B_k (how far inputs differ)
    iid: bool = False  # FedProx's Synthetic-IID (one shared model and feature distribution)
    num_features: int = 60  # input dimension
    num_classes: int = 10  # output classes
    min_samples: int = 50  # records per client: lognormal(4, 2) + min_samples ...
    max_samples: int | None = None  # ... capped at max_samples; null = no cap

    def __post_init__(self) -> None:
        _check(self.alpha >= 0, "alpha", f"must be >= 0, got {self.alpha}")
        _check(self.beta >= 0, "beta", f"must be >= 0, got {self.beta}")
        _check(self.num_features >= 1, "num_features", "must be >= 1")
        _check(self.num_classes >= 2, "num_classes", "must be >= 2")
        _check(self.min_samples >= 2, "min_samples", "must be >= 2")
        _check(
            self.max_samples is None or self.max_samples >= self.min_samples,
            "max_samples",
            f"must be null or >= min_samples ({self.min_samples})",
        )


@dataclass(frozen=True, kw_only=True)
class Cifar100Options:
    """``experiment.data.options`` of ``cifar100`` (the binary version)."""

    labels: Literal["fine", "coarse"] = "fine"  # 100 fine classes or 20 coarse superclasses


@dataclass(frozen=True, kw_only=True)
class ImageFolderOptions:
    """``experiment.data.options`` of ``image_folder`` (``data.root``: the folder)."""

    size: int = 32  # every image is resized to size x size pixels
    grayscale: bool = False  # one channel instead of RGB
    test_fraction: float = 0.2  # held out per class when root has no train/ and test/

    def __post_init__(self) -> None:
        _check(self.size >= 1, "size", f"must be >= 1, got {self.size}")
        _check(
            0 <= self.test_fraction < 1,
            "test_fraction",
            f"must be in [0, 1), got {self.test_fraction}",
        )


@dataclass(frozen=True, kw_only=True)
class Sent140Options:
    """``experiment.data.options`` of ``sent140`` (LEAF's tweets by user)."""

    vocab_size: int = 10000  # word ids kept, padding and unknown included (most frequent)
    max_length: int = 25  # words per tweet kept (padded with 0)

    def __post_init__(self) -> None:
        _check(self.vocab_size >= 3, "vocab_size", f"must be >= 3, got {self.vocab_size}")
        _check(self.max_length >= 1, "max_length", f"must be >= 1, got {self.max_length}")


@dataclass(frozen=True, kw_only=True)
class HFDatasetOptions:
    """``experiment.data.options`` of ``hf_dataset`` (a Hugging Face dataset, offline)."""

    # a save_to_disk folder (relative to data.root or absolute), a local builder over
    # data.root (parquet, csv, json, imagefolder) or a Hub id already in the local cache
    path: str = ""
    train_split: str = "train"  # the split that becomes the clients' pool
    test_split: str = "test"  # the split that becomes the central test set
    feature_column: str = "image"  # the inputs: images, numbers or lists of numbers
    label_column: str = "label"  # integer labels >= 0
    client_column: str | None = None  # a natural client id per record (partition: natural)
    image_size: int | None = None  # resize images to this square size; null = as stored

    def __post_init__(self) -> None:
        _check(bool(self.path), "path", "must name a dataset (a folder or a builder)")
        s = self.image_size
        _check(s is None or s >= 1, "image_size", f"must be null or >= 1, got {s}")


@dataclass(frozen=True, kw_only=True)
class CharTransformerOptions:
    """``experiment.model.options`` of ``char_transformer`` (token windows → next token)."""

    vocab_size: int | None = None  # token ids in [0, vocab_size); null = num_classes
    width: int = 64  # embedding and state width
    heads: int = 4  # attention heads (must divide width)
    layers: int = 2  # transformer blocks

    def __post_init__(self) -> None:
        v = self.vocab_size
        _check(v is None or v >= 2, "vocab_size", f"must be null or >= 2, got {v}")
        _check(self.width >= 1, "width", f"must be >= 1, got {self.width}")
        _check(self.heads >= 1, "heads", f"must be >= 1, got {self.heads}")
        _check(
            self.width % self.heads == 0,
            "heads",
            f"must divide width {self.width}, got {self.heads}",
        )
        _check(self.layers >= 1, "layers", f"must be >= 1, got {self.layers}")


@dataclass(frozen=True, kw_only=True)
class CharLSTMOptions:
    """``experiment.model.options`` of ``char_lstm`` (token windows → next token; an LSTM
    from Linear cells, `raydpfl.models.recurrent.DPLSTM`)."""

    vocab_size: int | None = None  # token ids in [0, vocab_size); null = num_classes
    embed: int = 8  # embedding width (LEAF's Shakespeare LSTM: 8)
    hidden: int = 256  # LSTM state width (LEAF: 256)
    layers: int = 2  # stacked LSTM layers (LEAF: 2)

    def __post_init__(self) -> None:
        v = self.vocab_size
        _check(v is None or v >= 2, "vocab_size", f"must be null or >= 2, got {v}")
        for name in ("embed", "hidden", "layers"):
            value = getattr(self, name)
            _check(value >= 1, name, f"must be >= 1, got {value}")


@dataclass(frozen=True, kw_only=True)
class CharTransformerLoRAOptions(CharTransformerOptions):
    """``experiment.model.options`` of ``char_transformer_lora``: a `char_transformer`
    base, frozen, fine-tuned through low-rank adapters (`raydpfl.models.lora`); only the
    adapters are trained, clipped, noised and uploaded."""

    checkpoint: str | None = None  # the base's state dict (local file); null = base_seed
    checkpoint_sha256: str | None = None  # if set, the checkpoint file must have it
    rank: int = 8  # adapter rank r
    alpha: float = 16.0  # adapter scale α (the update is (α/r)·B A)
    targets: str = "qkv,proj,mlp_in,mlp_out"  # the Linear layers adapted, comma-separated
    base_seed: int = 0  # builds the base when there is no checkpoint (same in every process)

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.checkpoint
        _check(c is None or (isinstance(c, str) and c != ""), "checkpoint", "must be a path")
        h = self.checkpoint_sha256
        hex_ok = h is not None and len(h) == 64 and all(ch in "0123456789abcdefABCDEF" for ch in h)
        _check(h is None or hex_ok, "checkpoint_sha256", "must be 64 hex digits or null")
        _check(h is None or c is not None, "checkpoint_sha256", "needs a checkpoint")
        _check(self.rank >= 1, "rank", f"must be >= 1, got {self.rank}")
        _check(self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        _check(len(names) >= 1, "targets", "must name at least one Linear layer")
        allowed = ("qkv", "proj", "mlp_in", "mlp_out", "head")
        bad = [t for t in names if t not in allowed]
        _check(not bad, "targets", f"must be among {', '.join(allowed)}; got {bad}")


for _name, _target, _options in (
    ("char_transformer", "raydpfl.models.text:CharTransformer", CharTransformerOptions),
    ("char_lstm", "raydpfl.models.text:CharLSTM", CharLSTMOptions),
    (
        "char_transformer_lora",
        "raydpfl.models.lora:char_transformer_lora",
        CharTransformerLoRAOptions,
    ),
):
    with contextlib.suppress(registry.RegistryError):  # a user's registration stands
        registry.register("model", _name, _target, options=_options)


#: Datasets read from files the user brings (`raydpfl.data.readers`): registered in the
#: one registry, their loaders named by "module:function" (imported when first loaded)
#: and their `experiment.data.options` checked against these dataclasses.
READER_DATASETS: dict[str, tuple[str, type | None]] = {
    "cifar100": ("raydpfl.data.readers:load_cifar100", Cifar100Options),
    "femnist": ("raydpfl.data.readers:load_femnist", None),
    "shakespeare": ("raydpfl.data.readers:load_shakespeare", None),
    "sent140": ("raydpfl.data.readers:load_sent140", Sent140Options),
    "image_folder": ("raydpfl.data.readers:load_image_folder", ImageFolderOptions),
    "hf_dataset": ("raydpfl.data.hf:load_hf_dataset", HFDatasetOptions),
}
for _name, (_target, _options) in READER_DATASETS.items():
    with contextlib.suppress(registry.RegistryError):  # a user's registration stands
        registry.register("dataset", _name, _target, options=_options)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The federated dataset."""

    # a built-in name, a file reader (cifar100, femnist, shakespeare, image_folder; options
    # in `options`), or one registered as a dataset
    dataset: str = "synthetic"
    root: str | None = None  # where dataset files live; default $RAYDPFL_DATA or ~/.cache
    num_clients: int = 100  # clients the dataset is partitioned over
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    client_test_fraction: float = 0.2  # share of each client's records held out for its test
    # train: partition the official training split, score on the official test split.
    # all: PFLlib's protocol (ALI-DPFL): pool train+test, score on the clients' test splits.
    pool: Literal["train", "all"] = "train"
    # How a client's records split: test = round(f·n) (nearest) or train = floor((1−f)·n).
    split_rounding: Literal["nearest", "floor_train"] = "nearest"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    cluster_shift: ClusterShiftConfig = field(default_factory=ClusterShiftConfig)
    seed: int | None = None  # partition seed; null = derived from runtime.seed
    # Options of a registered dataset (its options dataclass's fields); built-ins: empty.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("dataset", self.dataset, BUILTIN_DATASETS, "dataset")
        _check_options("dataset", self.dataset, self.options, BUILTIN_DATASETS)
        _check(self.num_clients >= 1, "num_clients", f"must be >= 1, got {self.num_clients}")
        _check(
            self.num_clients <= MAX_CLIENTS,
            "num_clients",
            f"must be <= {MAX_CLIENTS:,} (one machine's worth), got {self.num_clients:,}",
        )
        _check(
            0.0 <= self.client_test_fraction < 1.0,
            "client_test_fraction",
            f"must be in [0, 1), got {self.client_test_fraction}",
        )
        _check(
            self.pool == "train" or self.client_test_fraction > 0,
            "pool",
            "pool: all scores the model on the clients' test splits, so "
            "client_test_fraction must be > 0",
        )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model architecture (see `raydpfl.models`)."""

    name: str = "fedavg_cnn"  # a built-in name, or one registered as a model
    hidden: int = 200  # mlp only
    # Options of a registered model (its options dataclass's fields); built-ins: empty.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("model", self.name, BUILTIN_MODELS, "name")
        _check_options("model", self.name, self.options, BUILTIN_MODELS)
        _check(self.hidden >= 1, "hidden", "must be >= 1")


def server_optimizer_algorithms() -> tuple[str, ...]:
    """Algorithms whose server applies one weighted-mean update Δ̄ per round and so take a
    server optimizer (`experiment.algorithm.server`): FedAvg, DP-FedAvg and those
    registered with `SERVER_OPTIMIZER_TAG`. Client-level DP-FedAvg has its own
    (``options.server_optimizer``)."""
    return ("fedavg", "dp_fedavg", *registry.tagged("algorithm", SERVER_OPTIMIZER_TAG))


@dataclass(frozen=True, kw_only=True)
class ServerOptimizerConfig:
    """The server's step on the round's combined update (by default the weighted mean Δ̄),
    for the algorithms whose server applies one averaged update: fedavg, dp_fedavg,
    fedprox and dp_fedprox (other algorithms refuse a setting other than the default;
    dp_fedavg_client has its own options.server_*). Post-processing of the (noised)
    aggregate or of record-level DP updates: no extra privacy cost."""

    # sgd: θ += lr·Δ (lr 1 = plain FedAvg); momentum: m = β m + Δ, θ += lr·m (FedAvgM);
    # adagrad/adam/yogi: FedAdagrad/FedAdam/FedYogi (Reddi et al. 2021) with
    # β1 = momentum, β2 = beta2 (adam, yogi), τ = adam_eps.
    optimizer: Literal["sgd", "momentum", "adagrad", "adam", "yogi"] = "sgd"
    lr: float = 1.0  # η_s > 0, the server learning rate
    momentum: float = 0.9  # β (momentum) or β1 (adagrad, adam, yogi), in [0, 1)
    beta2: float = 0.99  # β2 of adam and yogi, in [0, 1)
    adam_eps: float = 1e-3  # τ of adagrad, adam and yogi (their adaptivity), > 0
    # How the round's updates are combined before the step: mean (weighted by |D_k|), or
    # the unweighted coordinate-wise median or trimmed mean (Yin et al. 2018), robust to a
    # few outlying updates; median and trimmed_mean need every update at the server.
    aggregator: Literal["mean", "median", "trimmed_mean"] = "mean"
    trim_fraction: float = 0.1  # β of trimmed_mean: ⌊β·m⌋ values cut at each end, in [0, 0.5)

    def __post_init__(self) -> None:
        _check(
            self.aggregator in ("mean", "median", "trimmed_mean"),
            "aggregator",
            f"must be mean, median or trimmed_mean, got {self.aggregator!r}",
        )
        _check(
            0 <= self.trim_fraction < 0.5,
            "trim_fraction",
            f"must be in [0, 0.5), got {self.trim_fraction}",
        )
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _check(0 <= self.momentum < 1, "momentum", f"must be in [0, 1), got {self.momentum}")
        _check(0 <= self.beta2 < 1, "beta2", f"must be in [0, 1), got {self.beta2}")
        _check(self.adam_eps > 0, "adam_eps", f"must be > 0, got {self.adam_eps}")

    @property
    def plain(self) -> bool:
        """sgd at lr 1 on the mean: θ + Δ̄, the algorithm's own step."""
        return self.optimizer == "sgd" and self.lr == 1.0 and self.aggregator == "mean"


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """The federated algorithm and its round schedule."""

    name: str = "dp_fedavg"  # a built-in name, or one registered as an algorithm
    rounds: int = 20  # ali_dpfl and dp_fedavg_fixed_tau: R_s, the most rounds
    clients_per_round: int = 10  # K, <= data.num_clients (DP-FedAvg: uniform, no replacement)
    local_steps: int = 5  # τ
    lr: float = 0.1  # local SGD learning rate
    batch_size: int = 32  # fedavg only; DP-SGD batches are Poisson with rate privacy.sampling_rate
    eval_every: int = 1  # evaluate every k rounds (and always after the last)
    # Also score the global model on every client's test split (clients.parquet).
    evaluate_clients: bool = True
    # Client dropout after charge: each charged client's update is lost with this
    # probability (drawn per round from the run seed); its charge stands.
    dropout: float = 0.0
    server: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # Options of a registered algorithm (its options dataclass's fields; a seed paper's
    # may also be written under its section, e.g. ali_dpfl:); fedavg, dp_fedavg: empty.
    options: dict[str, Any] = field(default_factory=dict)

    #: `raydpfl.config.load.from_mapping` folds option sections into ``options`` first.
    _fold = staticmethod(fold_sections)

    def typed_options(self) -> Any:
        """``options`` as the registered algorithm's options dataclass (None without one)."""
        cls = _entry_options(self.name)
        return None if cls is None else from_mapping(cls, self.options, "options")

    def __post_init__(self) -> None:
        _check_name("algorithm", self.name, BUILTIN_ALGORITHMS, "name")
        _check_options("algorithm", self.name, self.options, BUILTIN_ALGORITHMS)
        cls = _entry_options(self.name)
        if cls is not None and registry.get("algorithm", self.name).builtin:
            # A shipped algorithm's options, resolved (defaults filled in) so that the
            # run's config.yaml says every setting it ran with.
            parsed = from_mapping(cls, self.options, "options")
            object.__setattr__(self, "options", dataclasses.asdict(parsed))
        _check(self.rounds >= 1, "rounds", f"must be >= 1, got {self.rounds}")
        _check(self.clients_per_round >= 1, "clients_per_round", "must be >= 1")
        _check(self.local_steps >= 1, "local_steps", f"must be >= 1, got {self.local_steps}")
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _check(self.batch_size >= 1, "batch_size", "must be >= 1")
        _check(self.eval_every >= 1, "eval_every", "must be >= 1")
        _check(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        if self.dropout:
            self._check_dropout()
        if not self.server.plain:  # (the registry is asked only when it matters)
            takes = server_optimizer_algorithms()
            hint = (
                " (set options.server_optimizer instead)"
                if self.name == "dp_fedavg_client"
                else ""
            )
            _check(
                self.name in takes,
                "server",
                f"is for {', '.join(takes)} (one averaged update per round), "
                f"not {self.name!r}{hint}",
            )

    def _check_dropout(self) -> None:
        """Dropout needs a server that averages whatever arrives: the server-optimizer
        algorithms, those registered with ``dropout=True`` (`DROPOUT_TAG`), and
        client-level DP-FedAvg with central noise (with distributed noise a lost client's
        noise share would be missing from the release)."""
        takes = tuple(
            dict.fromkeys(
                (
                    *server_optimizer_algorithms(),
                    "dp_fedavg_client",
                    *registry.tagged("algorithm", DROPOUT_TAG),
                )
            )
        )
        _check(
            self.name in takes,
            "dropout",
            f"is for {', '.join(takes)} (they average the updates that arrive), not {self.name!r}",
        )
        _check(
            self.name != "dp_fedavg_client" or self.options.get("noise", "central") == "central",
            "dropout",
            "needs options.noise: central with dp_fedavg_client (with distributed noise a "
            "dropped client's noise share would be missing from the release)",
        )


#: The smallest σ (`privacy.noise_multiplier`, the calculators' ``--sigma``) accepted.
MIN_NOISE_MULTIPLIER = 0.01
#: The largest σ accepted: 10^6 x the clip norm is noise only (ε has long reached the
#: floor its δ conversion sets), and the accountants' series overflow past ~1e154.
MAX_NOISE_MULTIPLIER = 1e6
#: The smallest Poisson rate q (`privacy.sampling_rate`) accepted.
MIN_SAMPLING_RATE = 1e-6


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """Record-level DP per client: budget, DP-SGD parameters and the accountant.

    σ below `MIN_NOISE_MULTIPLIER` or q below `MIN_SAMPLING_RATE` are refused: one such
    step is not private in any useful sense (σ = 0.01 costs ε in the hundreds per step at
    q = 1), and the accountants' and the DP-SGD step's float arithmetic breaks down
    towards them (1/σ² overflows under ~1e-154, 1/q in float32 under ~3e-39).
    """

    accountant: AccountantName = "rdp"  # rdp, prv (opacus); dp_rdp, pld (dp-accounting)
    epsilon: float = 8.0  # each client's budget; a task that would exceed it is refused
    delta: float = 1e-5  # each client's δ; keep it < 1/|D_i| of the largest client
    clip_norm: float = 1.0  # C
    noise_multiplier: float | None = 1.0  # σ; null = calibrate to spend `epsilon` in all rounds
    sampling_rate: float = 0.05  # q, Poisson
    # DP noise and Poisson sampling from os.urandom (not reproducible; README: secure noise)
    secure_noise: bool = False
    # The DP-SGD Gaussian sampler of a client's seeded stream: torch's generator, or a
    # faster numba sampler with its own stream (CPU only): a ziggurat
    # (raydpfl/privacy/noise/ziggurat.py) or a vectorised Box-Muller
    # (raydpfl/privacy/noise/boxmuller.py)
    noise_sampler: Literal["torch", "ziggurat", "boxmuller"] = "torch"
    # poisson: each record with probability q, any batch size; fixed: Poisson truncated at
    # max_batch_size (a random subset), padded to that shape on the vectorised engine
    batch_shape: Literal["poisson", "fixed"] = "poisson"
    # B, the cap of batch_shape fixed (required there); the charge is the truncated event
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        _check(self.epsilon > 0, "epsilon", f"must be > 0, got {self.epsilon}")
        _check(0 < self.delta < 1, "delta", f"must be in (0, 1), got {self.delta}")
        _check(self.clip_norm > 0, "clip_norm", f"must be > 0, got {self.clip_norm}")
        _check(
            self.noise_multiplier is None
            or MIN_NOISE_MULTIPLIER <= self.noise_multiplier <= MAX_NOISE_MULTIPLIER,
            "noise_multiplier",
            # the bounds are spelled out for docs/config-reference.md (its generator reads
            # the words before ", got"); they are MIN_/MAX_NOISE_MULTIPLIER, MIN_SAMPLING_RATE
            f"must be in [0.01, 1e+06] or null (calibrate), got {self.noise_multiplier}",
        )
        _check(
            MIN_SAMPLING_RATE <= self.sampling_rate <= 1,
            "sampling_rate",
            f"must be in [1e-06, 1], got {self.sampling_rate}",
        )
        _check(
            self.noise_sampler in ("torch", "ziggurat", "boxmuller"),
            "noise_sampler",
            f"must be torch, ziggurat or boxmuller, got {self.noise_sampler!r}",
        )
        _check(
            not (self.secure_noise and self.noise_sampler != "torch"),
            "noise_sampler",
            "secure_noise draws its noise from os.urandom; leave noise_sampler at torch",
        )
        _check(
            self.batch_shape in ("poisson", "fixed"),
            "batch_shape",
            f"must be poisson or fixed, got {self.batch_shape!r}",
        )
        cap = self.max_batch_size
        if self.batch_shape == "fixed":
            _check(
                isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1,
                "max_batch_size",
                f"must be an int >= 1 with batch_shape fixed, got {cap!r}",
            )
            _check(
                self.noise_multiplier is not None,
                "noise_multiplier",
                "must be set with batch_shape fixed (calibration plans untruncated Poisson "
                "samples), got null",
            )
        else:
            _check(
                cap is None,
                "max_batch_size",
                f"is for batch_shape fixed only (batch_shape is poisson), got {cap!r}",
            )


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """What is simulated."""

    name: str = "experiment"  # names the run directory
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "name", "must be a non-empty string")
        _check(
            self.algorithm.clients_per_round <= self.data.num_clients,
            "algorithm.clients_per_round",
            f"must be <= data.num_clients ({self.data.num_clients}), "
            f"got {self.algorithm.clients_per_round}",
        )
        # Regression vs classification: dataset, model and algorithm must agree.
        check_task(self.data.dataset, self.model.name, self.algorithm.name)


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """How the simulation is run. Changing it never changes the results (same seed)."""

    backend: BackendName = "ray"  # local: one in-process worker, the same results
    # Ray: null or "local" starts a local instance; "auto" joins the running cluster;
    # "ray://host:port" connects through Ray Client.
    address: str | None = None
    workers: int = 2  # ClientWorker actors; each hosts many clients (local backend: 1)
    # Torch threads of each worker's training = max(1, floor(this)), on every backend
    # (the local backend's one worker too), so results do not depend on the backend.
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0  # e.g. 0.25: four workers share one GPU
    # Fixed number of partial-sum groups per round; results do not depend on `workers`.
    aggregation_groups: int = 8
    round_timeout_s: float | None = 3600.0  # a round that takes longer is an error
    max_restarts: int = 3  # a dead worker is restarted and its clients re-run
    seed: int = 0  # the root seed: data, partition, sampling and noise streams derive from it
    output: str = "runs"  # parent folder of run directories
    # Rounds between checkpoints in the run directory (null: none); see --resume.
    checkpoint_every: int | None = 10
    device: DeviceName = "cpu"  # auto: cuda where the worker has a GPU (resolved in each)
    threads: int | None = None  # torch threads of the server (evaluation); null = default
    # Per-sample clipping: book-keeping norms where every layer has a rule, else torch.func.
    engine: EngineName = "auto"
    # Train a group's clients at once, vectorised over clients, where the algorithm
    # supports it (DP-FedAvg): auto = on a GPU, or for small models (<= 20k parameters)
    # on a CPU, where it pays off. Results equal one-at-a-time up to float rounding.
    vectorise_clients: Literal["auto", "on", "off"] = "auto"
    progress: bool = True  # a progress bar on the terminal
    # Trackers told each round's row, comma-separated: tensorboard, mlflow, wandb
    # (raydpfl.callbacks; "" = none). Never changes results.
    callbacks: str = ""

    def __post_init__(self) -> None:
        _check(self.workers >= 1, "workers", f"must be >= 1, got {self.workers}")
        _check(
            self.cpus_per_worker > 0, "cpus_per_worker", f"must be > 0, got {self.cpus_per_worker}"
        )
        _check(
            self.gpus_per_worker == 0
            or 0 < self.gpus_per_worker < 1
            or float(self.gpus_per_worker).is_integer(),
            "gpus_per_worker",
            f"must be 0, a fraction in (0, 1) or a whole number, got {self.gpus_per_worker}",
        )
        _check(self.gpus_per_worker >= 0, "gpus_per_worker", "must be >= 0")
        _check(self.aggregation_groups >= 1, "aggregation_groups", "must be >= 1")
        _check(  # the local backend has one worker, whatever `workers` says (for Ray)
            self.backend != "ray" or self.aggregation_groups >= self.workers,
            "aggregation_groups",
            f"must be >= runtime.workers ({self.workers}) so every Ray worker gets work, "
            f"got {self.aggregation_groups}",
        )
        _check(
            self.round_timeout_s is None or self.round_timeout_s > 0,
            "round_timeout_s",
            "must be > 0 or null (no deadline)",
        )
        _check(self.max_restarts >= 0, "max_restarts", "must be >= 0")
        _check(
            self.address is None
            or self.address in ("local", "auto")
            or self.address.startswith("ray://")
            or ":" in self.address,
            "address",
            f"must be null, local, auto, ray://host:port or host:port, got {self.address!r}",
        )
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(
            self.checkpoint_every is None or self.checkpoint_every >= 1,
            "checkpoint_every",
            f"must be null (no checkpoints) or >= 1, got {self.checkpoint_every}",
        )
        _check(self.threads is None or self.threads >= 1, "threads", "must be null or >= 1")


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole config: `experiment` + `runtime`."""

    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
