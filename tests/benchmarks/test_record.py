"""The reproduction record: rows appended by the runners, REPRODUCTION.md regenerated."""

from __future__ import annotations

import argparse
import json
import statistics
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
    "settings": [
        {"prefix": "clip_norm =", "class": "test_tuned", "why": "a sweep"},
        {"prefix": "R_c by rdp", "class": "paper", "why": "the authors' code"},
        {"prefix": "authors' step", "class": "paper", "why": "the published step"},
        {"prefix": "accumulator kept", "class": "paper", "why": "the published step"},
        {"prefix": "noise-free", "class": "ablation", "why": "a diagnostic"},
        {"prefix": "sigma=0", "class": "ablation", "why": "a diagnostic"},
        {"prefix": "study:", "class": "unstated", "why": "a study"},
    ],
    "explanations": [
        {
            "id": "tau2-why",
            "match": {"paper": "ali_dpfl", "method": "tau2"},
            "text": "because of X",
            "link": "benchmarks/repro/x.py",
        }
    ],
    "cells": [
        dict(paper="ali_dpfl", table="V", dataset="fashion_mnist", setting="dir0.05",
             method=m, epsilon=2.0, paper_value=v)
        for m, v in (("tau1", 80.92), ("tau2", 82.15), ("tau3", 84.45), ("ali", 84.85),
                     ("tau5", 80.62), ("tau10", 73.56))
    ]
    + [
        dict(paper="fedfdp", table="6", dataset="fashion_mnist", setting="Dir(0.1), N=10",
             method="fedavg", epsilon=2.0, paper_value=82.69)
    ],
}  # fmt: skip


def test_regenerated_table_labels_each_cell_by_the_experiments_on_it(rec, tmp_path):
    record = _load("record")
    rec.append_rows(
        [
            _row(seed=0, ours=60.0),  # tau1: Δ = 61 − 80.92
            _row(seed=1, ours=62.0),
            _row(method="tau2", ours=70.0),  # Δ -12.15 ...
            _row(method="tau2", ours=80.5, variant="clip_norm = 3"),  # ... lands at a tuned C
            _row(method="tau3", ours=83.0),  # within 3 points: no gap
            _row(method="tau1", ours=65.5, dp=False, variant="authors' step"),  # moves it
            _row(method="ali", ours=55.0, variant="study: Gamma = 1"),  # a variant
            _row(method="tau3", ours=61.5, dp=False, variant="noise-free (sigma = 0)"),
            _row(method="tau5", ours=70.0),  # Δ -10.62 ...
            _row(method="tau5", ours=79.5, variant="R_c by rdp (553)"),  # ... lands, DP, paper's
            _row(method="tau10", ours=50.0),  # Δ -23.56 ...
            _row(method="tau10", ours=50.5, dp=False, variant="noise-free (sigma = 0)"),  # tried
            _row(paper="fedfdp", table="6", setting="Dir(0.1), N=10", method="fedavg",
                 ours=79.9, metric="final_accuracy", dp=False, variant="accumulator kept"),
        ]
    )  # fmt: skip
    text = record.render(rec.load_rows(), DOC)
    lines = text.splitlines()

    def row(method):
        return next(line for line in lines if line.startswith(f"| V | dir0.05 | {method} "))

    tau1 = row("tau1")
    assert "| 80.92 | 61.00 ± 1.41 (n = 2) | -19.92 |" in tau1
    assert "65.50 (n = 1) (*not DP*: authors' step)" in tau1
    # the not-DP published step shrinks |Δ| from 19.92 to 15.42: it moves the gap, no more
    assert "| partly explained | ours, authors' step: 65.50 (n = 1, *not DP*), Δ -15.42 |" in tau1
    assert tau1.rstrip().endswith("| abc1234 † (3) |")  # 2 ours, 1 not DP
    tau2 = row("tau2")
    assert "| -12.15 |" in tau2
    assert "| partly explained ‡ (see *tau2-why* below) |" in tau2  # lands at a tuned C only
    assert "ours, clip_norm = 3 ‡: 80.50 (n = 1), Δ -1.65" in tau2
    assert "- *tau2-why* (cells citing it: partly explained 1): because of X." in text
    assert "[benchmarks/repro/x.py](benchmarks/repro/x.py)" in text
    assert "‡: the experiment the label rests on uses a setting chosen by test accuracy" in text
    tau3 = row("tau3")
    assert "| -1.45 |" in tau3 and "| within | — |" in tau3
    assert "| explained | ours, R_c by rdp (553): 79.50 (n = 1), Δ -1.12 |" in row("tau5")
    assert "| **tried** | ours, noise-free (sigma = 0): 50.50 (n = 1, *not DP*)" in row("tau10")
    # ALI-DPFL itself only ran as a variant: listed there, and as never run.
    assert "### Variants and studies" in text and "study: Gamma = 1" in text
    # our own pipeline's not-DP ablation is a variant, not "the paper's step"
    assert "| noise-free (sigma = 0) | 84.45 | 61.50 (n = 1) (*not DP*) | -22.95 |" in text
    assert "*not DP*: noise-free" not in text
    assert "- Table V, fashion_mnist, dir0.05, ε = 2: ali" in text
    # FedFDP's cell has only a not-DP ablation: beside "not run", and still never run.
    fdp = next(line for line in lines if line.startswith("| 6 | Dir(0.1), N=10 "))
    assert "| not run |" in fdp and "79.90 (n = 1) (*not DP*: accumulator kept); Δ -2.79" in fdp
    assert "fedavg (not-DP ablation only)" in text
    # every label counted: within, explained, explained not DP, partly, tried, unexplained
    summary = [line for line in lines if line.startswith("| ali_dpfl |")]
    assert summary == ["| ali_dpfl | 6 | 5 | 1 | 1 | 0 | 2 | 1 | 0 | 1 | 1 | 0 |"]
    # the definitions head the record
    assert "- **explained**: an experiment on *that* cell" in text
    assert record.render(rec.load_rows(), DOC) == text  # deterministic


def test_an_explanation_cannot_declare_its_own_label_nor_a_setting_go_unclassed(rec):
    record = _load("record")
    rec.append_rows([_row(method="tau2", ours=70.0)])
    declared = DOC | {"explanations": [{**DOC["explanations"][0], "status": "explained"}]}
    with pytest.raises(ValueError, match="declares a status"):
        record.render(rec.load_rows(), declared)
    rec.append_rows([_row(method="tau2", ours=80.0, variant="lr = 2")])
    with pytest.raises(ValueError, match="'lr = 2' has no settings class"):
        record.render(rec.load_rows(), DOC)


def test_a_family_argument_carries_an_experiment_to_the_cells_it_covers(rec):
    record = _load("record")
    family = {
        "id": "shared-trajectory",
        "match": {"paper": "ali_dpfl", "method": ["tau1", "tau5"]},
        "family": {"name": "tau1/tau5", "argument": "both run one trajectory",
                   "cells": [{"paper": "ali_dpfl", "method": ["tau1", "tau5"]}]},
        "text": "one run stands for both",
    }  # fmt: skip
    rec.append_rows(
        [
            _row(method="tau1", ours=60.0),
            _row(method="tau5", ours=60.0),
            _row(method="tau1", ours=80.0, variant="R_c by rdp (553)"),  # on tau1 only
        ]
    )
    text = record.render(rec.load_rows(), DOC | {"explanations": [family]})
    tau5 = next(line for line in text.splitlines() if line.startswith("| V | dir0.05 | tau5 "))
    assert "| explained (see *shared-trajectory* below) |" in tau5
    assert "ours, R_c by rdp (553) [on V dir0.05 tau1]: 80.00 (n = 1), Δ -0.62" in tau5
    assert "Covers the family tau1/tau5 by this argument: both run one trajectory." in text
    with pytest.raises(ValueError, match="needs its 'argument'"):
        bare = {**family, "family": {"cells": family["family"]["cells"]}}
        record.render(rec.load_rows(), DOC | {"explanations": [bare]})


def test_commits_are_named_and_headlines_pool_the_record_commit_only(rec):
    """Every table names its rows' commits (†: not the record commit); a headline pools
    only its rows at the record commit, or is flagged with where its rows come from."""
    record = _load("record")
    assert record.commits([_row(), _row(), _row(commit="def5678+dirty")], "abc1234") == (
        "abc1234 (2), def5678+dirty † § (1)"
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
    # the dirty row is never pooled into a headline: it is counted as left out
    assert row["tau1 ours"] == (
        "| tau1 ours | 80.92 | 62.00 ± 1.41 (n = 2) | re-run at rec0000 (seeds 0, 1) | — | "
        "old1111+dirty † § (1) |"
    )
    assert row["tau2 ours"] == (
        "| tau2 ours | 82.15 | — | **not yet re-run at rec0000** | 70.00 (n = 1) (old1111 † (1)) "
        "| — |"
    )
    assert "**no row**" in row["tau3 ours"]
    assert row["tau2 new flag"] == (
        "| tau2 new flag | 82.15 | — | **not at rec0000**: its flag came after rec0000 "
        "(old1111) | 70.00 (n = 1) (old1111 † (1)) | — |"
    )
    assert "| 65.50 (n = 1) | re-run at rec0000 (seed 0) | — | — |" in row["tau1 not DP"]
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
    # the authors' code at the paper's settings lands on tau1: the gap is explained
    assert summary == ["| ali_dpfl | 6 | 1 | 0 | 1 | 0 | 0 | 0 | 0 | 0 | 5 | 0 |"]
    assert "| explained | authors' code: 79.00 (n = 1), Δ -1.92 |" in tau1
    assert "source: authors' code" in text  # how each number was made


def test_psi_is_tabled_beside_accuracy_for_both_pipelines_with_the_papers(rec):
    """Every row that records Ψ (``extra.psi``) appears in the Ψ table, pooled per seed
    with mean ± std, ours and each authors'-code variant on their own line, the paper's Ψ
    from ``extra.paper_psi`` beside it; rows with no Ψ add no line, and a record with no
    Ψ has no table."""
    record = _load("record")
    authors = dict(source="authors' code", note="re-implemented")
    rec.append_rows(
        [
            _row(seed=0, ours=60.0, extra={"psi": 0.10, "paper_psi": 2.3e7}),
            _row(seed=1, ours=62.0, extra={"psi": 0.14, "paper_psi": 2.3e7}),
            _row(seed=0, ours=80.0, dp=False, extra={"psi": 4.0e8}, **authors),
            _row(seed=0, ours=73.0, variant="noise-free", extra={"psi": 0.83},
                 **authors),
            _row(method="tau2", seed=0, ours=70.0),  # no Ψ: no line
        ]
    )  # fmt: skip
    with pytest.raises(ValueError, match="psi_definitions"):  # whose Ψ is it?
        record.render(rec.load_rows(), DOC)
    doc = json.loads(json.dumps(DOC))
    doc["papers"]["ali_dpfl"]["psi_definitions"] = {
        "ours": "global test losses",
        "authors' code": "local train losses",
    }
    text = record.render(rec.load_rows(), doc)
    assert "### Ψ beside accuracy" in text
    assert "- authors' code: local train losses" in text
    table = [line for line in text.splitlines() if "| 2.3e+07 |" in line]
    assert table == [
        "| V | dir0.05 | tau1 | 2 | authors' code | — | **no** | 80.92 | 80.00 (n = 1) "
        "| 2.3e+07 | 4e+08 |",
        "| V | dir0.05 | tau1 | 2 | authors' code | noise-free | yes | 80.92 "
        "| 73.00 (n = 1) | 2.3e+07 | 0.83 |",
        "| V | dir0.05 | tau1 | 2 | ours | — | yes | 80.92 | 61.00 ± 1.41 (n = 2) "
        "| 2.3e+07 | 0.12 ± 0.0283 |",
    ]
    assert "| tau2 | 2 | ours |" not in text
    plain = record.render([_row(seed=0, ours=60.0)], DOC)  # no Ψ: no table, no refusal
    assert "Ψ beside accuracy" not in plain


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


def test_clip_grid_says_whether_a_clip_norm_gives_the_papers_accuracy_and_order(rec):
    record = _load("record")
    paper = {"tau1": 80.92, "tau2": 82.15, "tau3": 84.45, "ali": 84.85}
    torch_mu = "mu_estimator = code_torch"

    def runs(c, method, values, own=""):
        variant = f"clip_norm = {c}, R_c by rdp (553)" + (f"; {own}" if own else "")
        return [
            _row(method=method, variant=variant, seed=s, ours=v, paper_value=paper[method])
            for s, v in enumerate(values)
        ]

    rows = [
        # C = 1: the paper's order, 9-10 points below it
        *runs(1, "tau1", [71.0, 71.2]), *runs(1, "tau2", [73.0, 73.4]),
        *runs(1, "tau3", [74.0, 74.4]), *runs(1, "ali", [71.0, 71.2], torch_mu),
        # C = 3: within 3 points, in the paper's order except ALI-DPFL ties τ = 3
        *runs(3, "tau1", [80.0, 80.2]), *runs(3, "tau2", [81.0, 81.2]),
        *runs(3, "tau3", [83.0, 83.2]), *runs(3, "ali", [83.0, 83.2], torch_mu),
        # C = 10: within 3 points and in the paper's order
        *runs(10, "tau1", [80.0, 80.2]), *runs(10, "tau2", [81.0, 81.2]),
        *runs(10, "tau3", [83.0, 83.2]), *runs(10, "ali", [84.0, 84.2], torch_mu),
        # a clause the grid has no column for, and a not-DP row: both left out
        *runs(10, "ali", [99.0], "Gamma = 1"),
        _row(method="tau1", variant="clip_norm = 10, R_c by rdp (553)", seed=5, ours=99.0,
             dp=False, paper_value=80.92),
    ]  # fmt: skip
    lines = record.clip_grid([rec.make_row(**r) for r in rows], gap=3.0)
    assert lines[0] == (
        "Table V, dir0.05, ε = 2, R_c by rdp (553): best-round accuracy, "
        "mean ± std over seeds (n)."
    )
    assert lines[2] == (
        "| C | τ = 1 | τ = 2 | τ = 3 | ALI-DPFL, the authors' PyTorch μ | every method lands "
        "| the paper's order |"
    )
    assert (
        lines[4]
        == "| paper | 80.92 | 82.15 | 84.45 | 84.85 | — | τ = 1 < τ = 2 < τ = 3 < ALI-DPFL |"
    )
    by_c = {
        line.split(" | ")[0]: line for line in lines if line.startswith("| ") and line[2].isdigit()
    }
    assert by_c["| 1"].endswith(
        "| no | not kept: τ = 1 = ALI-DPFL, the authors' PyTorch μ < τ = 2 < τ = 3 |"
    )
    assert by_c["| 3"].endswith(
        "| yes | not kept: τ = 1 < τ = 2 < τ = 3 = ALI-DPFL, the authors' PyTorch μ |"
    )
    assert by_c["| 10"] == (
        "| 10 | 80.10 ± 0.14 (n = 2) | 81.10 ± 0.14 (n = 2) | 83.10 ± 0.14 (n = 2) "
        "| 84.10 ± 0.14 (n = 2) | yes | kept: τ = 1 < τ = 2 < τ = 3 < "
        "ALI-DPFL, the authors' PyTorch μ |"
    )
    assert lines[-2].startswith(
        "A clip norm that gives both the paper's accuracy and its order: 10."
    )
    # a column with a seed the others lack: its pool counts for landing (here its std
    # covers the gap), but the order is taken over the seeds every column has, and says so
    extra = _row(method="tau1", variant="clip_norm = 10, R_c by rdp (553)", seed=2, ours=0.0,
                 paper_value=80.92)  # fmt: skip
    lines = record.clip_grid([rec.make_row(**r) for r in [*rows, extra]], gap=3.0)
    ten = next(line for line in lines if line.startswith("| 10 |"))
    assert ten.startswith("| 10 | 53.40 ± 46.25 (n = 3) |")
    assert ten.endswith("| yes | kept (seeds 0, 1): τ = 1 < τ = 2 < τ = 3 < "
                        "ALI-DPFL, the authors' PyTorch μ |")  # fmt: skip
    # one clip norm is no sweep; and without C = 10 no C gives both
    assert record.clip_grid([rec.make_row(**r) for r in rows if "= 1," in r["variant"]], 3.0) == []
    no_ten = [rec.make_row(**r) for r in rows if "= 10," not in r["variant"]]
    assert "No clip norm run gives both" in record.clip_grid(no_ten, 3.0)[-2]


def test_paper_order_is_kept_only_where_every_strict_pair_is():
    record = _load("record")
    paper = {"τ = 1": 1.0, "τ = 2": 2.0, "ALI-DPFL, the paper's μ": 3.0}
    assert record.paper_order_kept(
        {"τ = 1": 5.0, "τ = 2": 6.0, "ALI-DPFL, the paper's μ": 7.0}, paper
    )
    assert not record.paper_order_kept(
        {"τ = 1": 6.0, "τ = 2": 5.0, "ALI-DPFL, the paper's μ": 7.0}, paper
    )
    assert not record.paper_order_kept(
        {"τ = 1": 5.0, "τ = 2": 6.0, "ALI-DPFL, the paper's μ": 6.0}, paper
    )
    assert not record.paper_order_kept({"τ = 1": 5.0}, paper)  # one method has no order


def test_a_claim_counts_its_runs_from_reproducible_rows_and_states_what_is_missing(rec):
    record = _load("record")
    claim = {
        "paper": "ali_dpfl",
        "id": "grid",
        "claim": "the grid",
        "runs": {"table": "V", "method": ["tau1", "tau2"], "variant": "v", "seed": [0, 1]},
        "reason": "two cores",
    }
    assert len(record.claim_runs(claim)) == 4
    rows = [
        rec.make_row(**_row(method="tau1", variant="v", seed=0)),
        rec.make_row(**_row(method="tau1", variant="v", seed=1, commit="abc1234+dirty")),
        rec.make_row(**_row(method="tau2", variant="other", seed=0)),  # not the claim's
        rec.make_row(**_row(method="tau2", variant="v", seed=0, schedule="reduced")),
    ]
    (line,) = record.claim_coverage([claim], rows, {})
    assert line == (
        "- **the grid**: 1 of 4 runs recorded; missing: tau1 (seed 1); tau2 (seed 0, 1). two cores"
    )
    rows += [
        rec.make_row(**_row(method=m, variant="v", seed=s))
        for m, s in (("tau1", 1), ("tau2", 0), ("tau2", 1))
    ]
    assert record.claim_coverage([claim], rows, {}) == ["- **the grid**: 4 of 4 runs recorded."]
    with pytest.raises(ValueError, match="'grid' has 3 run\\(s\\) missing and no 'reason'"):
        record.claim_coverage([{**claim, "reason": ""}], rows[:1], {})
    with pytest.raises(ValueError, match="unknown runs field\\(s\\) \\['cell'\\]"):
        record.claim_runs({**claim, "runs": {"cell": "V"}})


def test_every_claim_in_the_committed_record_has_its_runs_or_a_reason():
    """Issue 52's done-when: each central claim has its rows or a stated reason, counted
    from the committed rows, and REPRODUCTION.md shows the same counts."""
    rec, record, prov_m = _load("_record"), _load("record"), _load("_provenance")
    doc = json.loads((REPRO / "paper_cells.json").read_text())
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    assert {c["paper"] for c in doc["claims"]} == {"ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl"}
    text = (ROOT / "REPRODUCTION.md").read_text(encoding="utf-8")
    for claim in doc["claims"]:
        lines = record.claim_coverage([claim], rows, prov_m.load())  # raises without a reason
        assert lines[0] in text


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

    (tmp_path / "benchmarks" / "repro" / "figures").mkdir(parents=True)
    (tmp_path / "benchmarks" / "repro" / "results.jsonl").write_text("")
    (tmp_path / "benchmarks" / "repro" / "figures" / "ali_dpfl.svg").write_text("")
    (tmp_path / "raydpfl" / "papers" / "ali_dpfl").mkdir(parents=True)
    (tmp_path / "raydpfl" / "papers" / "ali_dpfl" / "README.md").write_text("")
    (tmp_path / "REPRODUCTION.md").write_text("")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(rec, "ROOT", tmp_path)

    (tmp_path / "benchmarks" / "repro" / "results.jsonl").write_text("{}\n")
    (tmp_path / "REPRODUCTION.md").write_text("table\n")
    (tmp_path / "benchmarks" / "repro" / "figures" / "ali_dpfl.svg").write_text("<svg/>\n")
    (tmp_path / "raydpfl" / "papers" / "ali_dpfl" / "README.md").write_text("record\n")
    assert not rec.git_commit().endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert rec.git_commit().endswith("+dirty")


def _label_of(cell_text: str) -> str:
    """The label key of a rendered label cell ("partly explained ‡ (see ...)")."""
    text = cell_text.replace("*", "").split(" (")[0].replace(" ‡", "").strip()
    return {"explained, not DP": "explained_not_dp", "partly explained": "partly"}.get(text, text)


def test_every_label_in_the_committed_record_follows_its_definition():
    """Recomputes each run cell's label from results.jsonl and paper_cells.json by the
    definitions at the top of REPRODUCTION.md (a plain loop over the rows, not the
    generator's code) and checks the rendered table says the same."""
    rec, record, labels = _load("_record"), _load("record"), _load("_labels")
    doc = json.loads((REPRO / "paper_cells.json").read_text())
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    published = {record.cell_key(c): c["paper_value"] for c in doc["cells"]}
    rendered = {}
    for line in (ROOT / "REPRODUCTION.md").read_text(encoding="utf-8").splitlines():
        f = [c.strip() for c in line.split(" | ")]
        if len(f) == 12 and f[4] not in ("paper", "—") and f[5] != "not run":
            rendered[(f[0][2:], f[1], f[2], f[3])] = (_label_of(f[9]), "‡" in f[9])
    checked = 0
    for key, value in published.items():
        paper, table, _ds, setting, method, eps = key
        on_cell = [r for r in rows if record.cell_key(r) == key]
        ours = [r for r in on_cell if not r["variant"] and r["source"] == "run"
                and r["schedule"] == "full"]  # fmt: skip
        if not ours or not any(r["dp"] for r in ours):
            continue
        mine = record.one_per_seed(ours, doc["record_commit"])
        values = [r["ours"] for r in mine]
        mean = sum(values) / len(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        delta = abs(mean - value)
        groups: dict[tuple, list] = {}
        for r in on_cell:
            if r in ours:
                continue
            groups.setdefault((r["source"] == "authors' code", r["variant"]), []).append(r)
        landed, moved = [], []
        for (_, variant), grp in groups.items():
            g = record.one_per_seed(grp, doc["record_commit"])
            vals = [r["ours"] for r in g]
            m = sum(vals) / len(vals)
            s = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cls = labels.settings_class(paper, variant, doc["settings"])
            dp = all(r["dp"] for r in grp)
            if abs(m - value) <= max(3.0, s):
                landed.append((dp, cls))
            if cls != "ablation" and (
                (abs(m - value) <= max(3.0, s) and dp) or delta - abs(m - value) > max(1.0, std, s)
            ):
                moved.append(cls)
        if delta <= max(3.0, std):
            want = "within"
        elif not groups:
            want = "unexplained"
        elif (True, "paper") in landed:
            want = "explained"
        elif (False, "paper") in landed:
            want = "explained_not_dp"
        elif moved:
            want = "partly"
        else:
            want = "tried"
        tuned = want == "partly" and set(moved) == {"test_tuned"}
        eps_txt = "—" if eps is None else f"{eps:g}"
        assert rendered[(table, setting, method, eps_txt)] == (want, tuned), (key, want)
        checked += 1
    assert checked == sum(
        int(n) for line in (ROOT / "REPRODUCTION.md").read_text().splitlines()
        if line.startswith(("| ali_dpfl |", "| fedfdp |", "| dpfl_bcs |", "| rc_dpfl |"))
        for n in [line.split(" | ")[2]]
    )  # fmt: skip


def test_no_headline_pools_a_row_no_commit_reproduces():
    rec, record, prov_m = _load("_record"), _load("record"), _load("_provenance")
    doc = json.loads((REPRO / "paper_cells.json").read_text())
    prov = prov_m.load()
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    for h in doc["headlines"]:
        named = record._headline_rows(h, rows)
        kept = [r for r in named if prov_m.reproducible(r, prov)]
        assert all(not prov_m.is_dirty(r) for r in kept)
    text = (ROOT / "REPRODUCTION.md").read_text(encoding="utf-8")
    head = text.split("## Headline rows")[1].split("\n## ")[0]
    for line in head.splitlines():
        if line.startswith("| ") and not line.startswith(("| headline", "|---")):
            pooled = line.split(" | ")[1:5]
            assert "+dirty" not in " ".join(pooled) and "¶" not in " ".join(pooled), line


def test_provenance_names_every_dirty_row_and_every_commit_without_its_script():
    rec, prov_m = _load("_record"), _load("_provenance")
    rows = rec.load_rows(rec.DEFAULT_RESULTS)
    prov = prov_m.load()
    dirty = {prov_m.digest(r) for r in rows if prov_m.is_dirty(r)}
    assert dirty == set(prov["accepted_dirty"])  # none new, none stale
    absent, unknown = prov_m.absent_scripts(rows, ROOT)
    if unknown:
        pytest.skip(f"this clone lacks {len(unknown)} of the record's commits")
    assert absent == prov["script_absent"]  # what git says, as committed


def test_a_new_dirty_row_is_refused_unless_accepted(rec, tmp_path, capsys):
    record = _load("record")
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(DOC))
    prov = tmp_path / "provenance.json"
    rec.append_rows([_row(), _row(seed=1, commit="abc1234+dirty")])
    args = ["--results", str(rec.results_path()), "--cells", str(cells),
            "--out", str(tmp_path / "R.md"), "--provenance-file", str(prov)]  # fmt: skip
    assert record.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "+dirty" in err[0] and "--accept-dirty" in err[0]
    assert not (tmp_path / "R.md").exists()
    assert record.main([*args, "--accept-dirty"]) == 0
    assert len(json.loads(prov.read_text())["accepted_dirty"]) == 1
    assert record.main([*args, "--check"]) == 0  # accepted: the record is complete
    text = (tmp_path / "R.md").read_text()
    tau1 = next(line for line in text.splitlines() if line.startswith("| V | dir0.05 | tau1 "))
    assert "abc1234 † (1), abc1234+dirty † § (1)" in tau1  # kept in the table, marked
    rec.append_rows([_row(seed=2, commit="abc1234+dirty")])
    assert record.main(args) == 2  # the next one is refused again


def test_each_papers_figure_plots_every_run_cell_with_its_label():
    record = _load("record")
    text = (ROOT / "REPRODUCTION.md").read_text(encoding="utf-8")
    doc = json.loads((REPRO / "paper_cells.json").read_text())
    summary = {
        line.split(" | ")[0][2:]: int(line.split(" | ")[2])
        for line in text.splitlines()
        if line.startswith(tuple(f"| {p} |" for p in record.PAPER_ORDER))
    }
    for paper in record.PAPER_ORDER:
        data = json.loads((REPRO / "figures" / f"{paper}.json").read_text())
        assert len(data["points"]) == summary[paper]
        assert f"(benchmarks/repro/figures/{paper}.svg)" in text
        svg = (REPRO / "figures" / f"{paper}.svg").read_text()
        assert svg.startswith("<?xml") and "<dc:date>" not in svg
        for pt in data["points"]:
            assert pt["label"] in _load("_labels").LABELS
        # the paper folder's README carries the figure in its generated record section
        readme = (ROOT / doc["papers"][paper]["readme"]).read_text(encoding="utf-8")
        section = readme.split(record.README_BEGIN)[1].split(record.README_END)[0]
        assert f"(../../../benchmarks/repro/figures/{paper}.svg)" in section
        assert f"{summary[paper]} run:" in section


def test_rows_of_a_worktree_are_imported_once(rec, tmp_path):
    """A long run from a worktree appends to that tree's results.jsonl; --import-rows
    brings the rows this record lacks, and importing twice adds nothing."""
    record = _load("record")
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(DOC))
    rec.append_rows([_row()])
    other = tmp_path / "other.jsonl"
    rec.append_rows([*rec.load_rows(), _row(seed=1, ours=64.0)], other)
    args = ["--results", str(rec.results_path()), "--cells", str(cells),
            "--out", str(tmp_path / "R.md"), "--provenance-file", str(tmp_path / "p.json"),
            "--import-rows", str(other)]  # fmt: skip
    assert record.main(args) == 0 and record.main(args) == 0
    assert [r["seed"] for r in rec.load_rows()] == [0, 1]
