"""The panels of round_metrics.png: related rounds.parquet columns drawn on one axis.

The core's panels (local steps, σ, clip norm, selection, clusters, training statistics)
are listed here. A paper or a plug-in adds the panels of its own columns with
`register_round_panel` (the report's public hook, kept with the other registrations in
`raydpfl.registry.round_panels`), from its registration function (the ``raydpfl.plugins``
entry point), so the report names no paper. A column no panel takes still gets a panel of
its own, named by `raydpfl.report.labels.column_label`.
"""

from __future__ import annotations

from raydpfl.registry.round_panels import (
    RoundPanel,
    register_round_panel,
    registered_round_panels,
)

__all__ = ["RoundPanel", "known_panels", "register_round_panel"]

_CORE: tuple[RoundPanel, ...] = (
    RoundPanel("Local steps per round", "local DP-SGD steps", ("local_steps",), log_ok=False),
    RoundPanel(
        "Noise multiplier σ",
        "σ",
        ("noise_multiplier", "noise_multiplier_next"),
        names={"noise_multiplier": "used", "noise_multiplier_next": "next"},
    ),
    RoundPanel("Clip norm", "C", ("clip_norm_mean", "clip_norm")),
    RoundPanel("Client selection", "value", prefixes=("select", "num_selected", "participation")),
    RoundPanel("Clusters", "value", prefixes=("cluster",)),
    RoundPanel("Training loss (client mean)", "loss", ("train_loss", "schedule_loss")),
    RoundPanel("Fraction of per-example gradients clipped", "fraction", ("clipped_fraction",)),
    RoundPanel("Mean realised Poisson batch size", "examples", ("mean_batch_size",), log_ok=False),
    RoundPanel(
        "Clients refused (budget exhausted)", "clients", ("clients_refused",), log_ok=False
    ),
)


def known_panels() -> tuple[RoundPanel, ...]:
    """Every panel, in drawing order: the registered panels, then the core's."""
    return (*registered_round_panels(), *_CORE)
