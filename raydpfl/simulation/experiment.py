"""`Experiment` (a built, validated experiment) and the server it runs on.

The composition root (`raydpfl.experiment`) builds an `Experiment` from a config; the
backends (in-process, Ray) take one and start its `Server` with `make_server`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from raydpfl.algorithms.base import Algorithm
from raydpfl.config.schema import Config
from raydpfl.data.federated import FederatedDataset
from raydpfl.privacy.accounting.ledger import PrivacyLedger
from raydpfl.simulation.evaluation import CentralTestSet
from raydpfl.simulation.outputs import RunWriter
from raydpfl.simulation.server import Server, ServerSettings
from raydpfl.simulation.worker import ModelSpec, as_tensor

Params = dict[str, torch.Tensor]


@dataclass
class Experiment:
    """A built, validated experiment: everything needed to run it."""

    config: Config
    dataset: FederatedDataset
    algorithm: Algorithm
    ledger: PrivacyLedger | None
    model_spec: ModelSpec
    init_params: Params
    device: str
    metadata: dict[str, Any] = field(default_factory=dict)
    extra_unaccounted: list[str] = field(default_factory=list)
    #: config.yaml's text: what ran (`raydpfl.experiment.record`); None: the config's.
    recorded_config: str | None = None


def _max_batch_size(config: Config) -> int | None:
    """The cap the platform stamps on every DP-SGD mechanism (``privacy.batch_shape:
    fixed``), or None (plain Poisson)."""
    privacy = config.experiment.privacy
    return privacy.max_batch_size if privacy.batch_shape == "fixed" else None


def make_server(
    exp: Experiment,
    writer: RunWriter | None = None,
    on_round: Callable[[Mapping[str, Any]], None] | None = None,
    resume: bool = False,
) -> Server:
    """The server for `exp`, scoring the global model on the central test set.

    With `resume`, the server continues from the last checkpoint in `writer`'s run
    directory (`Server.resume`).
    """
    model = exp.model_spec.build().to(exp.device)
    model.requires_grad_(False)
    test_set = CentralTestSet(
        model,
        as_tensor(exp.dataset.x_test, exp.device),
        as_tensor(exp.dataset.y_test, exp.device),
    )
    algo = exp.config.experiment.algorithm
    settings = ServerSettings(
        run_seed=exp.config.runtime.seed,
        rounds=algo.rounds,
        eval_every=algo.eval_every,
        evaluate_clients=algo.evaluate_clients
        and exp.config.experiment.data.client_test_fraction > 0,
        aggregation_groups=exp.config.runtime.aggregation_groups,
        metadata=exp.metadata,
        extra_unaccounted=tuple(exp.extra_unaccounted),
        checkpoint_every=exp.config.runtime.checkpoint_every,
        dropout=algo.dropout,
        client_names=exp.dataset.client_names,
        max_batch_size=_max_batch_size(exp.config),
    )
    server = Server(
        algorithm=exp.algorithm,
        ledger=exp.ledger,
        train_sizes=exp.dataset.train_sizes(),
        init_params=exp.init_params,
        test_set=test_set,
        settings=settings,
        writer=writer,
        on_round=on_round,
    )
    if resume:
        server.resume()
    return server
