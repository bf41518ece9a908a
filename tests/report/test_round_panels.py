"""round_metrics.png's panels: the core's, and those papers and plug-ins register."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydpfl.registry import round_panels
from raydpfl.report import collect_runs
from raydpfl.report.panels import RoundPanel, known_panels, register_round_panel
from raydpfl.report.plots import round_metric_panels
from tests.report.test_report import add_round_columns, make_run

REPORT = Path(__file__).resolve().parents[2] / "raydpfl" / "report"
PAPER_NAMES = ("ALI-DPFL", "ali_dpfl", "FedFDP", "fedfdp", "RC-DPFL", "rc_dpfl", "DPFL-BCS")


@pytest.fixture()
def scratch_panels(monkeypatch):
    """The registered panels as the plug-ins left them, restored after the test."""
    round_panels.registered_round_panels()  # the plug-ins register first, into the real list
    monkeypatch.setattr(round_panels, "_REGISTERED", list(round_panels._REGISTERED))


def test_a_plugin_panel_groups_its_columns_before_the_cores(tmp_path, scratch_panels):
    run = tmp_path / "run"
    make_run(run, rounds=4)
    add_round_columns(run, my_rate=[0.1, 0.2, 0.4, 0.3], my_rate_next=[0.2, 0.4, 0.3, 0.3])
    before = [p.title for p in round_metric_panels(collect_runs([run])[0])[0]]
    assert "My rate" in " ".join(before)  # ungrouped: one panel per column

    register_round_panel(RoundPanel("My schedule", "rate", prefixes=("my_rate",)))
    panels, _ = round_metric_panels(collect_runs([run])[0])

    mine = [p for p in panels if p.title == "My schedule"]
    assert len(mine) == 1 and mine[0].columns == ("my_rate", "my_rate_next")
    assert not [p for p in panels if p.title != "My schedule" and "my_rate" in p.columns]
    # registering it again replaces it: one panel
    register_round_panel(RoundPanel("My schedule", "rate", ("my_rate",)))
    assert [p.title for p in known_panels()].count("My schedule") == 1
    with pytest.raises(TypeError, match="RoundPanel"):
        register_round_panel({"title": "x"})  # type: ignore[arg-type]


def test_the_papers_panels_come_from_their_registration_not_from_the_report():
    titles = [p.title for p in known_panels()]
    # registered by raydpfl.papers.ali_dpfl / .fedfdp through the hook
    for title in ("Smoothness estimate μ (ALI-DPFL)", "Fairness weight λ"):
        assert title in titles
    for path in (REPORT / "panels.py", REPORT / "plots.py"):
        code = "\n".join(
            line for line in path.read_text(encoding="utf-8").splitlines()
            if not line.lstrip().startswith("#")
        )  # fmt: skip
        assert not [n for n in PAPER_NAMES if n in code], path.name
