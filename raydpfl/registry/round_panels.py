"""The report's extension point for an algorithm's own round metrics: panels of
round_metrics.png that a paper or a plug-in registers from its registration function.

It lives beside the other registrations (layer 0), so a plug-in registers its panels
without importing the report, and the report draws them without naming any plug-in;
`raydpfl.report.panels` re-exports it as the report's public hook and adds the core's own
panels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RoundPanel", "register_round_panel", "registered_round_panels"]


@dataclass(frozen=True)
class RoundPanel:
    """One panel of round_metrics.png: related rounds.parquet columns on one axis."""

    title: str
    ylabel: str
    columns: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    names: Mapping[str, str] | None = None  # legend names of the columns
    log_ok: bool = True  # may switch to a log scale when values span > 2 decades

    def matches(self, column: str) -> bool:
        return column in self.columns or column.startswith(self.prefixes)


_REGISTERED: list[RoundPanel] = []


def register_round_panel(panel: RoundPanel) -> None:
    """Adds a panel for an algorithm's own rounds.parquet columns (drawn before the
    core's, in registration order; a column goes to the first panel that takes it, so a
    registered panel may also take a core column, e.g. ``local_steps`` beside τ).
    Registering the same title again replaces the earlier panel (a plug-in registered
    twice draws once)."""
    if not isinstance(panel, RoundPanel):
        raise TypeError(f"register_round_panel takes a RoundPanel, not {type(panel).__name__}")
    for i, p in enumerate(_REGISTERED):
        if p.title == panel.title:
            _REGISTERED[i] = panel
            return
    _REGISTERED.append(panel)


def registered_round_panels() -> tuple[RoundPanel, ...]:
    """The registered panels, in registration order, after the plug-ins have registered
    (their registration functions run once per process)."""
    from raydpfl import registry

    registry.names("algorithm")  # loads the plug-ins once: their register() runs
    return tuple(_REGISTERED)
