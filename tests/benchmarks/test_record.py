"""The reproduction record: rows appended by the runners, REPRODUCTION.md regenerated."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "benchmarks" / "repro"
SPECS = ROOT.parent / "shared" / "specs"


def _load(name: str):
    """The runner module `name` under its own name (the runners `import _record`)."""
    return load_script(name, REPRO / f"{name}.py")


@pytest.fixture()
def rec(monkeypatch, tmp_path):
    """_record with its results file in tmp_path."""
    monkeypatch.setenv("RAYDPFL_REPRO_RESULTS", str(tmp_path / "results.jsonl"))
    return _load("_record")


def _row(**kw):
    base = dict(
        paper="ali_dpfl",
        table="V",
        dataset="fashion_mnist",
        setting="dir0.05",
        method="tau1",
        epsilon=2.0,
        seed=0,
        ours=80.0,
        metric="best_accuracy",
        paper_value=None,
        rounds_run=106,
        rounds_paper=106,
        dp=True,
        commit="abc1234",
        command="python benchmarks/repro/ali_dpfl.py --cells V:dir0.05",
        source="run",
    )
    base.update(kw)
    return base


DOC = {
    "gap_threshold": 3.0,
    "papers": {
        p: {
            "title": f"Paper {p}",
            "seed": "seed.txt",
            "spec": "spec.md",
            "runner": "runner.py",
            "metric": "accuracy",
            "scope": "test cells",
        }
        for p in ("ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl")
    },
    "explanations": [
        {
            "id": "tau2-why",
            "status": "explained",
            "match": {"paper": "ali_dpfl", "method": "tau2"},
            "text": "because of X",
            "link": "benchmarks/repro/x.py",
        }
    ],
    "cells": [
        dict(paper="ali_dpfl", table="V", dataset="fashion_mnist", setting="dir0.05",
             method=m, epsilon=2.0, paper_value=v)
        for m, v in (("tau1", 80.92), ("tau2", 82.15), ("tau3", 84.45), ("ali", 84.85))
    ]
    + [
        dict(paper="fedfdp", table="6", dataset="fashion_mnist", setting="Dir(0.1), N=10",
             method="fedavg", epsilon=2.0, paper_value=82.69)
    ],
}  # fmt: skip


def test_regenerated_table_has_delta_never_run_and_unexplained(rec, tmp_path):
    record = _load("record")
    rec.append_rows(
        [
            _row(seed=0, ours=60.0),  # tau1: Δ = 61 − 80.92, no explanation
            _row(seed=1, ours=62.0),
            _row(method="tau2", ours=70.0),  # explained gap
            _row(method="tau3", ours=83.0),  # within 3 points: no verdict
            _row(method="tau1", ours=65.5, dp=False, variant="authors' step"),
            _row(method="ali", ours=55.0, variant="study: Gamma = 1"),  # a variant
            _row(method="tau3", ours=61.5, dp=False, variant="noise-free (sigma = 0)"),
            _row(paper="fedfdp", table="6", setting="Dir(0.1), N=10", method="fedavg",
                 ours=79.9, metric="final_accuracy", dp=False, variant="accumulator kept"),
        ]
    )  # fmt: skip
    text = record.render(rec.load_rows(), DOC)
    tau1 = next(line for line in text.splitlines() if line.startswith("| V | dir0.05 | tau1 "))
    assert "| 80.92 | 61.00 ± 1.41 (n = 2) | -19.92 |" in tau1
    assert "65.50 (n = 1) (*not DP*: authors' step)" in tau1
    assert tau1.rstrip().endswith("| **unexplained** | abc1234 † (3) |")  # 2 ours, 1 not DP
    tau2 = next(line for line in text.splitlines() if line.startswith("| V | dir0.05 | tau2 "))
    assert "| -12.15 |" in tau2 and "explained (see *tau2-why* below)" in tau2
    assert "- *tau2-why* (explained): because of X." in text
    assert "[benchmarks/repro/x.py](benchmarks/repro/x.py)" in text
    tau3 = next(line for line in text.splitlines() if line.startswith("| V | dir0.05 | tau3 "))
    assert tau3.rstrip().endswith("| — | abc1234 † (1) |")
    assert "| +0.08 |" not in tau3 and "| -1.45 |" in tau3
    # ALI-DPFL itself only ran as a variant: listed there, and as never run.
    assert "### Variants and studies" in text and "study: Gamma = 1" in text
    # our own pipeline's not-DP ablation is a variant, not "the paper's step"
    assert "| noise-free (sigma = 0) | 84.45 | 61.50 (n = 1) (*not DP*) | -22.95 |" in text
    assert "*not DP*: noise-free" not in text
    assert "- Table V, fashion_mnist, dir0.05, ε = 2: ali" in text
    # FedFDP's cell has only a not-DP ablation: beside "not run", and still never run.
    fdp = next(line for line in text.splitlines() if line.startswith("| 6 | Dir(0.1), N=10 "))
    assert "| not run |" in fdp and "79.90 (n = 1) (*not DP*: accumulator kept); Δ -2.79" in fdp
    assert "fedavg (not-DP ablation only)" in text
    summary = [line for line in text.splitlines() if line.startswith("| ali_dpfl |")]
    assert summary == ["| ali_dpfl | 4 | 3 | 2 | 1 | 1 |"]
    assert record.render(rec.load_rows(), DOC) == text  # deterministic


def test_commits_are_named_and_headlines_pool_the_record_commit_only(rec):
    """Every table names its rows' commits (†: not the record commit); a headline pools
    only its rows at the record commit, or is flagged with where its rows come from."""
    record = _load("record")
    assert record.commits([_row(), _row(), _row(commit="def5678+dirty")], "abc1234") == (
        "abc1234 (2), def5678+dirty † (1)"
    )
    assert record.commits([_row(commit=None)], "abc1234") == "unknown † (1)"
    rec.append_rows(
        [
            _row(seed=0, ours=60.0, commit="old1111+dirty"),
            _row(seed=0, ours=61.0, commit="rec0000"),
            _row(seed=1, ours=63.0, commit="rec0000"),
            _row(method="tau2", ours=70.0, commit="old1111"),
            _row(method="tau1", ours=65.5, dp=False, variant="authors' step", commit="rec0000"),
        ]
    )
    doc = DOC | {
        "record_commit": "rec0000",
        "headlines": [
            {"label": "tau1 ours", "match": {"paper": "ali_dpfl", "method": "tau1"}},
            {"label": "tau2 ours", "match": {"paper": "ali_dpfl", "method": "tau2"}},
            {"label": "tau3 ours", "match": {"paper": "ali_dpfl", "method": "tau3"}},
            {"label": "tau2 new flag", "match": {"paper": "ali_dpfl", "method": "tau2"},
             "elsewhere_because": "its flag came after rec0000 (old1111)"},
            {"label": "tau1 not DP", "match": {"paper": "ali_dpfl", "method": "tau1"},
             "variant": "authors' step", "dp": False},
        ],
    }  # fmt: skip
    text = record.render(rec.load_rows(), doc)
    lines = text.splitlines()
    assert "## Headline rows at one commit (rec0000)" in text
    row = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| tau")}
    assert row["tau1 ours"] == (
        "| tau1 ours | 80.92 | 62.00 ± 1.41 (n = 2) | re-run at rec0000 (seeds 0, 1) | "
        "60.00 (n = 1) (old1111+dirty † (1)) |"
    )
    assert row["tau2 ours"] == (
        "| tau2 ours | 82.15 | — | **not yet re-run at rec0000** | 70.00 (n = 1) (old1111 † (1)) |"
    )
    assert "**no row**" in row["tau3 ours"]
    assert row["tau2 new flag"] == (
        "| tau2 new flag | 82.15 | — | **not at rec0000**: its flag came after rec0000 "
        "(old1111) | 70.00 (n = 1) (old1111 † (1)) |"
    )
    assert "| 65.50 (n = 1) | re-run at rec0000 (seed 0) | — |" in row["tau1 not DP"]
    # the cell's main row counts seed 0 once (its record-commit row wins over the older
    # one) and names the commits of the rows it pooled (with the not-DP row beside it)
    tau1 = next(line for line in lines if line.startswith("| V | dir0.05 | tau1 "))
    assert "| 62.00 ± 1.41 (n = 2) |" in tau1
    assert tau1.endswith("| rec0000 (3) |")
    # without a record-commit row, the latest run of a seed is the one counted
    late = [_row(seed=0, ours=50.0, date="2026-11-01T00:00:00Z", commit="a"),
            _row(seed=0, ours=52.0, date="2026-11-02T00:00:00Z", commit="b"),
            _row(seed=1, ours=54.0, commit="c")]  # fmt: skip
    assert [r["ours"] for r in record.one_per_seed(late, "rec0000")] == [52.0, 54.0]
    assert record.pool(late)["n"] == 2
    # a number carried over from README with no seed counts only in a cell with no seeds
    # (it may be one of the seeded runs: FedFDP Table 6 eps = 2 once read n = 4 for 3 seeds)
    readme = _row(seed=None, ours=62.1, commit="d", source="README (commit d, 2026-11-24)")
    assert [r["ours"] for r in record.one_per_seed([readme, *late], "rec0000")] == [52.0, 54.0]
    assert record.one_per_seed([readme], "rec0000") == [readme]


def test_authors_code_rows_are_runs_shown_beside_ours_never_pooled(rec):
    """A row of the authors' code re-implemented (authors_step.py) names its commit and
    command like a run, gets its own table beside the paper's number and ours, and is
    neither pooled with our rows nor counted as a run of the cell nor in the τ claim."""
    record = _load("record")
    row = rec.make_row(**_row(source="authors' code", commit=None, command=None))
    assert row["commit"] and row["command"].startswith("python ") and row["date"]
    authors = dict(source="authors' code", note="re-implemented")
    rec.append_rows(
        [
            _row(seed=0, ours=60.0),
            _row(seed=1, ours=62.0),
            _row(seed=0, ours=79.0, **authors),
            _row(seed=0, ours=81.0, dp=False, variant="sigma=0 (noise-free, clipped)",
                 **authors),
            _row(method="tau2", seed=0, ours=70.0, **authors),  # a cell we never ran
        ]
    )  # fmt: skip
    text = record.render(rec.load_rows(), DOC)
    lines = text.splitlines()
    tau1 = next(line for line in lines if line.startswith("| V | dir0.05 | tau1 | 2 | 80.92"))
    assert "61.00 ± 1.41 (n = 2)" in tau1  # ours alone
    assert "### The authors' published code, re-implemented" in text
    ours = "61.00 ± 1.41 (n = 2)"
    assert f"| V | dir0.05 | tau1 | 2 | — | 80.92 | 79.00 (n = 1) | -1.92 | {ours} |" in text
    assert (
        "| V | dir0.05 | tau1 | 2 | sigma=0 (noise-free, clipped) | 80.92 | 81.00 (n = 1) "
        "(no DP) | +0.08 | 61.00 ± 1.41 (n = 2) |"
    ) in text
    assert "| V | dir0.05 | tau2 | 2 | — | 82.15 | 70.00 (n = 1) | -12.15 | — |" in text
    assert "- Table V, fashion_mnist, dir0.05, ε = 2: tau2, tau3, ali" in text  # still never run
    summary = [line for line in lines if line.startswith("| ali_dpfl |")]
    assert summary == ["| ali_dpfl | 4 | 1 | 1 | 1 | 3 |"]
    assert "source: authors' code" in text  # how each number was made


def test_tau_claim_compares_ali_with_the_best_fixed_tau(rec):
    record = _load("record")
    budget = "study: R_s = R_c·1/3 at eps = 1.55"
    study = dict(table="study", setting="s", epsilon=1.55, variant=budget)
    rows = [
        *(_row(**study, method="tau1", seed=s, ours=v) for s, v in ((0, 50.0), (1, 52.0))),
        *(_row(**study, method="tau3", seed=s, ours=v) for s, v in ((0, 60.0), (1, 62.0))),
        *(_row(**study, method="ali", seed=s, ours=v) for s, v in ((0, 55.0), (1, 57.0))),
        *(
            _row(**{**study, "variant": budget + "; Gamma = 1"}, method="ali", seed=s, ours=v,
                 extra={"taus": [1, 2]})
            for s, v in ((0, 61.0), (1, 61.4))
        ),
    ]  # fmt: skip
    lines = record.tau_claim([rec.make_row(**r) for r in rows])
    assert lines[0].startswith("- Study, s, ε = 1.55. Fixed τ: tau3 61.00 ± 1.41 (n = 2), tau1")
    assert "  - ali: 56.00 ± 1.41 (n = 2), -5.00 against the best fixed τ (tau3): loses to it" in (
        lines
    )
    assert lines[2].startswith("  - ali (Gamma = 1): 61.20 ± 0.28 (n = 2), +0.20")
    assert "a tie: within the seed-to-seed spread (std 1.41); τ used: 1, 2" in lines[2]


def test_main_writes_and_checks(rec, tmp_path, capsys):
    record = _load("record")
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(DOC))
    rec.append_rows([_row()])
    out = tmp_path / "R.md"
    args = ["--results", str(rec.results_path()), "--cells", str(cells), "--out", str(out)]
    assert record.main(args) == 0 and out.exists()
    assert record.main([*args, "--check"]) == 0
    rec.append_rows([_row(seed=1, ours=70.0)])
    assert record.main([*args, "--check"]) == 1
    assert "out of date" in capsys.readouterr().out


def test_rows_are_checked_and_runners_append_them(rec):
    with pytest.raises(ValueError, match="lacks"):
        rec.make_row(paper="ali_dpfl")
    with pytest.raises(ValueError, match="unknown row field"):
        rec.make_row(**_row(colour="red"))
    row = rec.make_row(**_row(source="README (commit 1234567)", commit=None, command=None))
    assert row["commit"] is None and row["command"] is None  # never invented for old numbers
    assert set(row) == set(rec.ROW_FIELDS)
    ali = _load("ali_dpfl")
    ali.record_row(
        {
            "cell": "V:dir0.05", "method": "tau3", "seed": 2, "eval_every": 5, "R_c": 317,
            "R_s": 106, "rounds": 105, "iterations": 315, "best_accuracy": 70.5,
            "final_accuracy": 69.0, "epsilon_ledger": 1.9, "stop_reason": "R_c",
            "paper": 84.45, "wall_seconds": 12.0, "clip_norm": 0.1,
        },
        argparse.Namespace(normalizer="expected", mu_probe_size=None),
    )  # fmt: skip
    (written,) = rec.load_rows()
    assert written["table"] == "V" and written["setting"] == "dir0.05"
    assert written["rounds_paper"] == 105 and written["paper_value"] == 84.45
    assert written["source"] == "run" and written["command"].startswith("python ")
    assert written["dp"] is True and written["variant"] == ""


def test_paper_cells_match_the_runners_tables():
    doc = json.loads((REPRO / "paper_cells.json").read_text())
    cells = {
        (c["paper"], c["table"], c["setting"], c["method"], c["epsilon"]): c["paper_value"]
        for c in doc["cells"]
        if c["dataset"] in ("fashion_mnist",)
    }
    ali = _load("ali_dpfl")
    for method, by_cell in ali.PAPER_FMNIST.items():
        for key, value in by_cell.items():
            cell = next(c for c in ali.CELLS if c.key == key)
            assert cells[("ali_dpfl", cell.table, cell.label, method, cell.epsilon)] == value
    rc = _load("rc_dpfl")
    for method, by_eps in rc.PAPER_FMNIST.items():
        for eps, (all_, maj, min_) in by_eps.items():
            assert cells[("rc_dpfl", "5", "Maj", method, float(eps))] == maj
            assert cells[("rc_dpfl", "5", "All", method, float(eps))] == all_
            assert cells[("rc_dpfl", "5", "Min", method, float(eps))] == min_
    fdp = _load("fedfdp")
    for key, by_method in fdp.PAPER.items():
        c = fdp.BY_KEY[key]
        for method, (acc, _psi) in by_method.items():
            eps = c.epsilon if c.private else None
            assert cells[("fedfdp", str(c.table), fdp.setting_label(c), method, eps)] == acc
    assert len(doc["cells"]) == 128 + 75 + 48 + 20
    assert all(c.get("source") for c in doc["cells"])


@pytest.mark.skipif(not SPECS.exists(), reason="shared/specs not available")
def test_paper_cells_spot_checked_against_the_specs():
    ali = (SPECS / "ali-dpfl.md").read_text()
    assert "| ALI-DPFL | 89.62 | 84.85 | 85.45 | 86.12 |" in ali  # Table V
    assert "| τ = 1 | 85.65 | 79.98 | 39.33 |" in ali  # Table II, 2R_c
    fdp = (SPECS / "fedfdp.md").read_text()
    assert "82.69" in fdp and "86.97" in fdp  # Table 6, FedAvg ε = 2 and FedFDP ε = 4


def test_the_committed_record_is_valid_and_regenerated():
    rec = _load("_record")
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    assert rows, "benchmarks/repro/results.jsonl is empty"
    for row in rows:
        assert set(row) == set(rec.ROW_FIELDS)
        assert rec.make_row(**row) == row
        if row["source"] not in rec.RUN_SOURCES:
            assert row["source"].startswith("README (commit ")
    record = _load("record")
    assert record.main(["--check"]) == 0, "run python benchmarks/repro/record.py"


def test_the_authors_step_differences_are_tabled_in_the_record():
    # issue 37: each difference between the authors' step and ours goes into a table in
    # REPRODUCTION.md with "DP-valid?" and its measured effect
    text = (ROOT / "REPRODUCTION.md").read_text(encoding="utf-8")
    notes = (REPRO / "notes" / "authors_step_differences.md").read_text(encoding="utf-8")
    header = "| difference | authors' code | raydpfl | DP-valid? | measured effect |"
    assert header in text
    table = [line for line in notes.splitlines() if line.startswith("| ")]
    assert len(table) > 5
    for line in table:
        assert line in text
    assert _load("record").differences_table(None) == []


def _variant_spelling(variant: str) -> str:
    """A variant with its spacing and empty clauses dropped: two labels that agree here
    name the same change."""
    clauses = (c.replace(" ", "") for c in variant.split(";"))
    return ";".join(c for c in clauses if c)


def test_one_variant_has_one_label_in_the_committed_record():
    # rows of one change spelled two ways are pooled as two variants (seed 0 of the
    # code_torch claim rerun once read n = 1 beside its seeds 1-2 at n = 2)
    rec = _load("_record")
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    labels: dict[tuple, set[str]] = {}
    for row in rows:
        labels.setdefault((row["paper"], _variant_spelling(row["variant"])), set()).add(
            row["variant"]
        )
    split = {k: v for k, v in labels.items() if len(v) > 1}
    assert not split, f"one variant recorded under several labels: {split}"


def test_a_runners_json_dump_keeps_the_entries_of_a_runner_beside_it(rec, tmp_path):
    """Two invocations appending to one dump (benchmarks/results/<runner>.json) keep each
    other's entries: each append reads the file just before writing it."""
    dump = tmp_path / "results" / "ali_dpfl_repro.json"
    rec.append_json(dump, {"run": "a1"})  # invocation A's first run (makes the folder)
    rec.append_json(dump, {"run": "b1"})  # invocation B, started meanwhile
    rec.append_json(dump, {"run": "a2"})  # A again: B's entry stays

    assert json.loads(dump.read_text()) == [{"run": "a1"}, {"run": "b1"}, {"run": "a2"}]


@pytest.mark.parametrize(
    "argv, refused",
    [([], True), (["--allow-dirty"], False), (["--no-record"], False)],
)
def test_a_runner_refuses_to_record_from_an_uncommitted_tree(
    rec, monkeypatch, capsys, argv, refused
):
    """Rows must name a commit that produces them: a dirty tree is refused before any
    work, in one line, unless told otherwise (then the row's commit says +dirty)."""
    monkeypatch.setattr(rec, "git_commit", lambda: "abc1234+dirty")
    p = argparse.ArgumentParser()
    rec.add_record_args(p)
    args = p.parse_args(argv)
    if refused:
        with pytest.raises(SystemExit) as e:
            rec.check_tree(args)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "uncommitted changes" in err[0] and "--allow-dirty" in err[0]
    else:
        rec.check_tree(args)
    monkeypatch.setattr(rec, "git_commit", lambda: "abc1234")
    rec.check_tree(p.parse_args([]))  # a clean tree records


@pytest.mark.parametrize(
    "runner",
    ["ali_dpfl", "ali_tau_budget", "dpfl_bcs", "fedfdp", "rc_dpfl", "accumulator_ablation"],
)
def test_every_recording_runner_checks_its_tree(runner):
    text = (REPRO / f"{runner}.py").read_text()
    assert "_record.add_record_args(p)" in text and "_record.check_tree(args)" in text


def test_the_records_own_outputs_do_not_make_a_tree_dirty(rec, tmp_path, monkeypatch):
    """A batch of runs from a clean worktree records every row: the rows the first run
    appended (and the regenerated REPRODUCTION.md) are not 'uncommitted changes', while an
    edit to the code still is."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "repro").mkdir(parents=True)
    (tmp_path / "benchmarks" / "repro" / "results.jsonl").write_text("")
    (tmp_path / "REPRODUCTION.md").write_text("")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(rec, "ROOT", tmp_path)

    (tmp_path / "benchmarks" / "repro" / "results.jsonl").write_text("{}\n")
    (tmp_path / "REPRODUCTION.md").write_text("table\n")
    assert not rec.git_commit().endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert rec.git_commit().endswith("+dirty")
