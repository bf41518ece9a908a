"""A paper is one folder: raydpfl/papers/<paper>/ holds its code and README, and names
(`MATERIAL` in its __init__) every piece of it that lives elsewhere: its presets, its
reproduction runners, their notes, its tests and its figure in the record. The checks
below keep that shape: everything named exists, every runner, notes file and preset
folder belongs to exactly one paper (or to the record itself), and the record's
registration of a paper (paper_cells.json) points into the paper's material."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "benchmarks" / "repro"
PAPERS = ("ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl")
#: benchmarks/repro/ scripts that are the record's own machinery, or no paper's study
RECORD_ITSELF = {"_record.py", "record.py", "_labels.py", "_figures.py", "_provenance.py"}
NOT_A_PAPER = {"client_level_study.py"}  # client-level DP-FedAvg: the core's, no paper's


def _material(paper: str) -> dict:
    return importlib.import_module(f"raydpfl.papers.{paper}").MATERIAL


def _paths(paper: str) -> list[str]:
    m = _material(paper)
    return [p for v in m.values() for p in ((v,) if isinstance(v, str) else v)]


@pytest.mark.parametrize("paper", PAPERS)
def test_everything_a_paper_names_exists(paper):
    missing = [p for p in _paths(paper) if not (ROOT / p).exists()]
    assert missing == []
    assert set(_material(paper)) == {"readme", "presets", "runners", "notes", "tests", "figure"}


def test_every_runner_notes_file_and_preset_folder_belongs_to_one_paper():
    owners: dict[str, list[str]] = {}
    for paper in PAPERS:
        for p in _paths(paper):
            owners.setdefault(p, []).append(paper)
    assert {p: o for p, o in owners.items() if len(o) > 1} == {}
    unowned = [
        f.name
        for f in REPRO.glob("*.py")
        if f.name not in RECORD_ITSELF | NOT_A_PAPER and f"benchmarks/repro/{f.name}" not in owners
    ]
    assert unowned == []
    notes = [f"benchmarks/repro/notes/{f.name}" for f in (REPRO / "notes").glob("*.md")]
    assert [n for n in notes if n not in owners] == []
    for paper in PAPERS:  # configs/<paper>/ is that paper's and no other's
        assert f"configs/{paper}" in _material(paper)["presets"]


@pytest.mark.parametrize("paper", PAPERS)
def test_the_records_registration_and_the_readme_point_into_the_papers_material(paper):
    info = json.loads((REPRO / "paper_cells.json").read_text(encoding="utf-8"))["papers"][paper]
    m = _material(paper)
    assert info["readme"] == m["readme"] == f"raydpfl/papers/{paper}/README.md"
    for key in ("runner", "authors_runner"):
        if key in info:
            assert info[key] in m["runners"], key
    if "differences" in info:
        assert info["differences"] in m["notes"]
    readme = (ROOT / m["readme"]).read_text(encoding="utf-8")
    for runner in m["runners"]:
        assert runner in readme, runner  # how to run it
    assert f"configs/{paper}/" in readme  # its presets
    assert "<!-- record:begin" in readme and Path(m["figure"]).name in readme  # its record


def test_ali_dpfls_step_budget_lives_in_its_folder_and_registers_with_the_core():
    """The authors' Algorithm 3 (rc_mode: paper_compat) is ALI-DPFL's: the core's step
    budget names no paper and takes the mode from the paper's registration."""
    from raydpfl.papers.ali_dpfl.theory import paper_compat_iteration_budget
    from raydpfl.privacy.accounting import step_budget

    core = (ROOT / "raydpfl" / "privacy" / "accounting" / "step_budget.py").read_text(
        encoding="utf-8"
    )
    code = "\n".join(line for line in core.splitlines() if not line.lstrip().startswith("#"))
    assert "bisect_steps_within" not in code  # the authors' bisection is not the core's
    assert "paper_compat" in step_budget.step_budget_modes()
    got = step_budget.iteration_budget(2.0, 1e-5, 0.015, 1.1, mode="paper_compat")
    assert got == paper_compat_iteration_budget(2.0, 1e-5, 0.015, 1.1) == 317  # the paper's
    with pytest.raises(ValueError, match="mode must be one of exact, paper_compat"):
        step_budget.iteration_budget(2.0, 1e-5, 0.015, 1.1, mode="guess")
