"""Regenerates REPRODUCTION.md and its figures from the reproduction record.

    python benchmarks/repro/record.py            # REPRODUCTION.md + benchmarks/repro/figures/
    python benchmarks/repro/record.py --check    # exit 1 if either is out of date
    python benchmarks/repro/record.py --results R.jsonl --cells C.json --out OUT.md
    python benchmarks/repro/record.py --import-rows ../run/benchmarks/repro/results.jsonl
    python benchmarks/repro/record.py --provenance   # which commits lack their rows' script
    python benchmarks/repro/record.py --accept-dirty # record new +dirty rows, marked

Inputs: the rows the runners append to benchmarks/repro/results.jsonl (schema in
``_record.py``), the papers' cells in benchmarks/repro/paper_cells.json (values
transcribed from shared/specs, with the seed line and spec section of each, the
explanations of gaps and the class of every variant's settings) and
benchmarks/repro/provenance.json (`_provenance`). Per paper it writes a table of ours
beside the paper's, with Δ = ours − paper and the cell's label, computed from the
experiments recorded on that cell (`_labels`: within, explained, explained not DP, partly
explained, tried, unexplained; defined at the top of the output), with the explanation
that speaks to the cell, and a figure of the paper's number against ours (`_figures`).
Rows of one cell with the same schedule are pooled over seeds (mean ± sample std; a run
repeated at several commits counts once, its row at the record commit preferred, else its
latest). A non-DP ablation (a published step that is not DP, ``dp: false``) is shown
beside ours, labelled *not DP*; variants and studies (``variant`` set) get their own
table, and so do ablations of our own pipeline that are not DP (``noise-free``), labelled
*not DP* there; rows of a paper's published code re-implemented (``source: "authors'
code"``, written by the paper's ``authors_runner``) get theirs, beside the paper's number
and ours, never pooled with ours; cells with no row at all are listed as never run. The
output depends only on the three files, so it is deterministic.

Provenance: every table names the commits its pooled rows were made at, marks with † a
commit other than the record commit (``record_commit`` in paper_cells.json), with § a row
from an uncommitted tree (``+dirty``) and with ¶ one whose commit lacks the script that
made it: no commit reproduces those two. The headline rows (``headlines``: the numbers
README quotes) get a table of their own at the top: each pooled over its reproducible
rows at the record commit only, or flagged as not yet re-run there, with where its
numbers come from instead; rows no commit reproduces are left out of them and counted. A
dirty row not yet accepted (provenance.json) is refused unless ``--accept-dirty``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import _figures  # noqa: E402
import _labels  # noqa: E402
import _provenance  # noqa: E402
import _record  # noqa: E402

CELLS = HERE / "paper_cells.json"
OUT = ROOT / "REPRODUCTION.md"
KEY_FIELDS = ("paper", "table", "dataset", "setting", "method", "epsilon")
PAPER_ORDER = ("ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl")
#: The source of a row made by re-implementing a paper's published code.
AUTHORS_SOURCE = "authors' code"
#: Variants of a not-DP row that ablate our own pipeline (``ali_dpfl.py --noise-free``),
#: not a paper's published step: shown among the variants, marked not DP.
OWN_ABLATION_PREFIXES = ("noise-free",)


def _eps(value: Any) -> float | None:
    return None if value is None else round(float(value), 6)


def cell_key(d: dict[str, Any]) -> tuple:
    """(paper, table, dataset, setting, method, ε): what ties a row to a paper cell."""
    return tuple(_eps(d.get(k)) if k == "epsilon" else d.get(k) for k in KEY_FIELDS)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _fmt_eps(x: float | None) -> str:
    return "—" if x is None else f"{x:g}"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def one_per_seed(rows: list[dict[str, Any]], record_commit: str | None) -> list[dict[str, Any]]:
    """One row per seed: a run repeated (e.g. re-run at the record commit) counts once.
    The row made at `record_commit` wins; otherwise the latest by date, then by position
    in the record. Seeds keep their first-seen order. A row whose seed was never recorded
    (a number carried over from README) counts only where no row of the cell has a seed:
    it cannot be told apart from a re-run of one of them."""
    if any(r.get("seed") is not None for r in rows):
        rows = [r for r in rows if r.get("seed") is not None]
    chosen: dict[Any, tuple[tuple, dict[str, Any]]] = {}
    for i, r in enumerate(rows):
        rank = (r.get("commit") == record_commit, str(r.get("date") or ""), i)
        seed = r.get("seed")
        if seed not in chosen or rank > chosen[seed][0]:
            chosen[seed] = (rank, r)
    return [r for _, r in chosen.values()]


def pool(rows: list[dict[str, Any]], record_commit: str | None = None) -> dict[str, Any]:
    """Mean, sample std and count over the rows' ``ours``, one row per seed
    (`one_per_seed`: a repeated run counts once, its record-commit row preferred)."""
    rows = one_per_seed(rows, record_commit)
    values = [float(r["ours"]) for r in rows]
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "seeds": sorted({r.get("seed") for r in rows}, key=lambda s: (s is None, s)),
        "rows": rows,
    }


def _ours(p: dict[str, Any]) -> str:
    """Mean ± sample std (n); accuracies to 2 decimals, MSEs to 3 significant digits."""
    mse = any(r.get("metric") == "test_mse" for r in p["rows"])
    f = (lambda x: f"{x:.3g}") if mse else (lambda x: f"{x:.2f}")
    if p["std"] is None:
        return f"{f(p['mean'])} (n = 1)"
    return f"{f(p['mean'])} ± {f(p['std'])} (n = {p['n']})"


def _schedule(rows: list[dict[str, Any]]) -> str:
    runs = sorted({r.get("rounds_run") for r in rows}, key=lambda v: (v is None, v))
    papers = sorted({r.get("rounds_paper") for r in rows}, key=lambda v: (v is None, v))
    ran = "/".join("?" if v is None else str(v) for v in runs)
    of = "/".join("?" if v is None else str(v) for v in papers)
    kind = "reduced" if any(r.get("schedule") == "reduced" for r in rows) else "full"
    return f"{ran} of {of} ({kind})"


def _matches(match: dict[str, Any], key: tuple) -> bool:
    fields = dict(zip(KEY_FIELDS, key, strict=True))
    for k, want in match.items():
        have = fields.get(k)
        options = want if isinstance(want, list) else [want]
        if k == "epsilon":
            options = [_eps(o) for o in options]
        if have not in options:
            return False
    return True


def explanation_for(key: tuple, explanations: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first explanation whose ``match`` (or ``family``) takes the cell, or None.
    An explanation does not say how well it explains: the label is computed
    (`_labels.verdict`); one that still carries a ``status`` is refused."""
    for e in explanations:
        if "status" in e:
            raise ValueError(
                f"explanation {e['id']!r} declares a status; labels are computed from the "
                "experiments on each cell (benchmarks/repro/_labels.py): drop 'status'"
            )
        if "family" in e and not e["family"].get("argument"):
            raise ValueError(f"explanation {e['id']!r}: a family needs its 'argument'")
        if _matches(e["match"], key):
            return e
    return None


def in_family(e: dict[str, Any] | None, key: tuple) -> bool:
    return bool(e and "family" in e and any(_matches(m, key) for m in e["family"]["cells"]))


def label_text(v: _labels.Verdict, e: dict[str, Any] | None, reduced: bool) -> str:
    """The label as the table shows it: bold where nothing explains the gap, ‡ where the
    experiment it rests on was chosen by test accuracy, and the explanation it cites."""
    text = _labels.LABEL_TEXT[v.label]
    if v.label in ("unexplained", "tried"):
        text = f"**{text}**"
    if v.tuned:
        text += " ‡"
    if reduced and v.label in ("unexplained", "tried"):
        text += " (our schedule is reduced; not tested whether that is why)"
    if e is not None and v.label != "within":
        text += f" (see *{e['id']}* below)"
    return text


def _experiment(b: _labels.Experiment, published: float) -> str:
    spread = f" ± {b.std:.2f}" if b.std is not None else ""
    dp = "" if b.dp else ", *not DP*"
    tuned = " ‡" if b.settings == "test_tuned" else ""
    return (
        f"{_md(b.what)}{tuned}: {b.mean:.2f}{spread} (n = {b.n}{dp}), Δ {b.mean - published:+.2f}"
    )


def experiment_text(v: _labels.Verdict, published: float) -> str:
    """The experiment a label rests on, and the one nearest the paper where that is
    another (e.g. one at a test-tuned C that lands, beside the untuned one that moves)."""
    if v.best is None:
        return "—"
    text = _experiment(v.best, published)
    if v.closest is not None:
        text += f"; nearest: {_experiment(v.closest, published)}"
    return text


def _explanation_line(e: dict[str, Any], counts: dict[str, int]) -> str:
    link = f" Experiment: [{e['link']}]({e['link']})." if e.get("link") else ""
    labels = ", ".join(
        f"{_labels.LABEL_TEXT[k]} {counts[k]}" for k in _labels.LABELS if counts.get(k)
    )
    family = (
        f" Covers the family {e['family'].get('name', '')} by this argument: "
        f"{e['family']['argument']}."
        if "family" in e
        else ""
    )
    return f"- *{e['id']}* (cells citing it: {labels}): {e['text']}.{family}{link}"


def _tuned_mark(paper: str, variant: str, rules: list[dict[str, Any]] | None) -> str:
    """ " ‡" after a variant whose settings were chosen by test accuracy."""
    if not variant or rules is None:
        return ""
    return " ‡" if _labels.settings_class(paper, variant, rules) == "test_tuned" else ""


def _variant_label(variant: str) -> str:
    """A variant as a reader sees it: an ALI-DPFL-only change with nothing shared before
    it (``"; mu_estimator = code_torch"``) without the empty first clause."""
    return variant[2:] if variant.startswith("; ") else variant


def _short(commit: Any) -> str:
    return "unknown" if not commit else str(commit)


def commits(
    rows: list[dict[str, Any]], record_commit: str | None, prov: dict[str, Any] | None = None
) -> str:
    """The commits `rows` were made at, with how many rows each, in first-seen order; a
    commit other than `record_commit` is marked † (an unknown one too), and rows no commit
    reproduces are marked § (``+dirty``) or ¶ (the commit lacks the script that made
    them; `_provenance`)."""
    prov = prov or {}
    absent = set(prov.get("script_absent", []))
    counts: dict[str, int] = {}
    for r in rows:
        c = _short(r.get("commit"))
        if _provenance.is_dirty(r):
            c += " §"
        if _provenance.pair(r) in absent:
            c += " ¶"
        counts[c] = counts.get(c, 0) + 1
    out = []
    for c, n in counts.items():
        base = c.split(" ")[0]
        mark = "" if record_commit and base == record_commit else " †"
        out.append(f"{base}{mark}{c[len(base) :]} ({n})")
    return ", ".join(out)


def _headline_rows(h: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a headline names: its cell (``match``), its ``variant`` (default none),
    ``source`` (default our runs; ``*`` any) and ``dp`` (default True)."""
    want_variant = h.get("variant", "")
    want_source = h.get("source", "run")
    want_dp = h.get("dp", True)
    out = []
    for r in rows:
        if not _matches(h["match"], cell_key(r)):
            continue
        if (r.get("variant") or "") != want_variant or r.get("dp", True) != want_dp:
            continue
        if want_source != "*" and (r.get("source") or "run") != want_source:
            continue
        out.append(r)
    return out


def headline_table(
    rows: list[dict[str, Any]], doc: dict[str, Any], prov: dict[str, Any] | None = None
) -> list[str]:
    """The numbers README quotes, each pooled over its rows at the record commit, or
    flagged with where its rows come from when it has none there (and why, where the
    headline's ``elsewhere_because`` says the record commit cannot make that row). Rows
    no commit reproduces (``+dirty``, or a commit without their script) are never pooled
    here: they are counted as left out."""
    prov = prov or {}
    record_commit = doc.get("record_commit")
    headlines = doc.get("headlines", [])
    if not headlines:
        return []
    paper_of = {cell_key(c): c for c in doc["cells"]}
    out = [
        f"## Headline rows at one commit ({record_commit})",
        "",
        f"The numbers README quotes, re-run at commit `{record_commit}`: check it out and "
        "rerun the command to get the same rows. Each is pooled over its rows made at that "
        "commit only (mean ± sample std over seeds). A headline not yet re-run there is "
        "flagged, with its number pooled over the rows made elsewhere and their commits "
        "(re-run at the record commit as time allows: some cost hours on two cores). Rows "
        "that no commit reproduces (§ `+dirty`, ¶ a commit without the script) are never "
        "pooled into a headline; the last column counts those left out.",
        "",
        "| headline | paper | at record commit | status | elsewhere: ours (commit, rows) "
        "| not reproducible, left out |",
        "|---|---|---|---|---|---|",
    ]
    for h in headlines:
        named = _headline_rows(h, rows)
        mine = [r for r in named if _provenance.reproducible(r, prov)]
        left_out = [r for r in named if not _provenance.reproducible(r, prov)]
        at = [r for r in mine if r.get("commit") == record_commit]
        other = one_per_seed([r for r in mine if r.get("commit") != record_commit], None)
        published = next(
            (
                paper_of[cell_key(r)]["paper_value"]
                if cell_key(r) in paper_of
                else r.get("paper_value")
                for r in mine
            ),
            None,
        )
        pooled = pool(at, record_commit) if at else None
        if pooled:
            seeds = ", ".join(str(s) for s in pooled["seeds"])
            status = f"re-run at {record_commit} (seed{'s' if pooled['n'] > 1 else ''} {seeds})"
        elif other and h.get("elsewhere_because"):
            # a variant the record commit's runner cannot make: say so, never "not yet"
            status = f"**not at {record_commit}**: {_md(h['elsewhere_because'])}"
        elif other:
            status = f"**not yet re-run at {record_commit}**"
        else:
            status = "**no row**"
        out.append(
            f"| {_md(h['label'])} | {_fmt(published)} | {_ours(pooled) if pooled else '—'} | "
            f"{status} | "
            + (f"{_ours(pool(other))} ({commits(other, record_commit)})" if other else "—")
            + f" | {commits(left_out, record_commit, prov) if left_out else '—'} |"
        )
    return [*out, ""]


def _commands(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[tuple, None] = {}
    for r in rows:
        seen[(r.get("command") or "(command unknown)", r.get("commit"), r.get("source"))] = None
    out = []
    for command, commit, source in seen:
        origin = "" if source in (None, "run") else f"; source: {source}"
        out.append(f"- `{command}` (commit {commit or 'unknown'}{origin})")
    return out


def tau_claim(rows: list[dict[str, Any]], record_commit: str | None = None) -> list[str]:
    """ALI-DPFL against every fixed τ run beside it (same table, setting, ε and budget).

    The paper claims adaptive τ* beats every fixed τ when R_s < R_c. For each group of
    DP rows with ALI-DPFL and at least one fixed τ (the variant's first clause, its
    budget, must agree; ALI-DPFL's further clauses name its own changes, e.g. Γ), the
    line gives ALI-DPFL's mean against the best fixed τ's, and calls the difference a
    tie when it is within the larger of the two seed-to-seed standard deviations.
    """
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["paper"] != "ali_dpfl" or not r.get("dp", True):
            continue
        budget, _, own = (r.get("variant") or "").partition("; ")
        if r["method"].startswith("tau") and own:
            continue  # a changed baseline: not compared
        where = (r["table"], r["setting"], _eps(r.get("epsilon")), budget)
        label = r["method"] + (f" ({own})" if own else "")
        groups[where][label].append(r)
    out: list[str] = []
    for (table, setting, eps, budget), methods in sorted(groups.items(), key=lambda kv: str(kv)):
        fixed = {m: pool(v, record_commit) for m, v in methods.items() if m.startswith("tau")}
        alis = {m: pool(v, record_commit) for m, v in methods.items() if m.startswith("ali")}
        if not fixed or not alis:
            continue
        best_m, best = max(fixed.items(), key=lambda kv: kv[1]["mean"])
        ranking = ", ".join(
            f"{m} {_ours(p)}" for m, p in sorted(fixed.items(), key=lambda kv: -kv[1]["mean"])
        )
        if table == "study":  # the setting names the budget
            head = f"Study, {setting}, ε = {_fmt_eps(eps)}"
        else:
            head = f"Table {table}, {setting}, ε = {_fmt_eps(eps)}" + (
                f", {budget}" if budget else ""
            )
        out.append(f"- {head}. Fixed τ: {ranking}.")
        for m, p in sorted(alis.items()):
            diff = p["mean"] - best["mean"]
            spread = max(p["std"] or 0.0, best["std"] or 0.0)
            if p["n"] < 2 or best["n"] < 2:
                verdict = "one seed: no spread to compare with"
            elif abs(diff) <= spread:
                verdict = f"a tie: within the seed-to-seed spread (std {spread:.2f})"
            else:
                verdict = "beats it" if diff > 0 else "loses to it"
            taus = sorted({t for r in p["rows"] for t in (r.get("extra") or {}).get("taus", [])})
            used = f"; τ used: {', '.join(map(str, taus))}" if taus else ""
            out.append(
                f"  - {m}: {_ours(p)}, {diff:+.2f} against the best fixed τ ({best_m}): "
                f"{verdict}{used}"
            )
    return out


#: a clip-norm sweep's budget clause: "clip_norm = C, R_c by <accountant> (<R_c>)"
_CLIP_CLAUSE = re.compile(r"^clip_norm = (?P<c>[0-9.]+), (?P<rc>R_c by \w+ \(\d+\))$")
#: the grid's columns: (method, ALI-DPFL's own clause) -> heading
_GRID_COLUMNS = {
    ("tau1", ""): "τ = 1",
    ("tau2", ""): "τ = 2",
    ("tau3", ""): "τ = 3",
    ("ali", ""): "ALI-DPFL, the paper's μ",
    ("ali", "mu_estimator = code_torch"): "ALI-DPFL, the authors' PyTorch μ",
    ("ali", "mu_estimator = code_mindspore"): "ALI-DPFL, the authors' MindSpore μ",
}


def paper_order_kept(ours: dict[str, float], paper: dict[str, float]) -> bool:
    """Whether our means rank the fixed τ as the paper's numbers do, and put each ALI-DPFL
    column (headings starting "ALI") where the paper puts ALI-DPFL among them: every pair
    the paper orders strictly, ours orders the same way strictly (a tie is not kept).
    `ours` and `paper` map a column heading to its mean and to the paper's number."""
    fixed = [h for h in ours if not h.startswith("ALI") and h in paper]
    alis = [h for h in ours if h.startswith("ALI") and h in paper]
    groups = [[*fixed, a] for a in alis] or [fixed]
    for both in groups:
        if len(both) < 2:
            return False
        for a in both:
            for b in both:
                if paper[a] < paper[b] and not ours[a] < ours[b]:
                    return False
    return True


def _order(means: dict[str, float]) -> str:
    """Headings from the lowest mean up, "<" between them and "=" between equal means."""
    ranked = sorted(means, key=means.__getitem__)
    text = ranked[0]
    for lo, hi in itertools.pairwise(ranked):
        text += (" = " if means[hi] == means[lo] else " < ") + hi
    return text


def clip_grid(
    rows: list[dict[str, Any]], gap: float, record_commit: str | None = None
) -> list[str]:
    """ALI-DPFL's claim across the clip norm: per cell run at two or more C (DP rows whose
    variant's first clause is ``clip_norm = C, R_c by ...``), a table of C against the
    fixed τ and ALI-DPFL (each μ estimator), and, per C, whether every method lands (|Δ| at
    most `gap` or its seed-to-seed std) and whether our means rank the methods as the
    paper's numbers do (`paper_order_kept`). Computed from the rows, so the verdict cannot
    go stale."""
    cells: dict[tuple, dict[float, dict[str, list[dict[str, Any]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    papers: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["paper"] != "ali_dpfl" or not r.get("dp", True):
            continue
        budget, _, own = (r.get("variant") or "").partition("; ")
        m = _CLIP_CLAUSE.match(budget)
        column = _GRID_COLUMNS.get((r["method"], own))
        if m is None or column is None:
            continue
        where = (r["table"], r["setting"], _eps(r.get("epsilon")), m["rc"])
        cells[where][float(m["c"])][column].append(r)
        if r.get("paper_value") is not None:
            papers[where][column] = float(r["paper_value"])
    out: list[str] = []
    for where, by_c in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if len(by_c) < 2:
            continue
        table, setting, eps, rc = where
        columns = [h for h in _GRID_COLUMNS.values() if any(h in v for v in by_c.values())]
        paper = papers[where]
        fixed_paper = [h for h in columns if not h.startswith("ALI") and h in paper]
        ali_paper = next((paper[h] for h in columns if h.startswith("ALI") and h in paper), None)
        ranked = sorted(fixed_paper, key=paper.__getitem__)
        order_line = " < ".join(ranked)
        if ali_paper is not None:
            below = [h for h in ranked if paper[h] < ali_paper]
            order_line = " < ".join([*below, "ALI-DPFL", *ranked[len(below) :]])
        out += [
            f"Table {table}, {setting}, ε = {_fmt_eps(eps)}, {rc}: best-round accuracy, "
            "mean ± std over seeds (n).",
            "",
            "| C | " + " | ".join(columns) + " | every method lands | the paper's order |",
            "|---|" + "---|" * len(columns) + "---|---|",
            "| paper | "
            + " | ".join(_fmt(paper.get(h)) for h in columns)
            + f" | — | {order_line} |",
        ]
        both = []
        for c in sorted(by_c):
            pooled = {h: pool(v, record_commit) for h, v in by_c[c].items()}
            lands = len(pooled) == len(columns) and all(
                h in paper and abs(p["mean"] - paper[h]) <= max(gap, p["std"] or 0.0)
                for h, p in pooled.items()
            )
            # rank over the seeds every column has, so that a column run at one seed is
            # not set against another's three-seed mean
            common = set.intersection(*(set(p["seeds"]) for p in pooled.values()))
            means = {
                h: statistics.fmean(
                    float(r["ours"]) for r in p["rows"] if not common or r.get("seed") in common
                )
                for h, p in pooled.items()
            }
            kept = paper_order_kept(means, paper)
            if lands and kept:
                both.append(c)
            over = (
                f" (seed{'s' if len(common) > 1 else ''} "
                f"{', '.join(str(x) for x in sorted(common, key=str))})"
                if common and any(set(p["seeds"]) != common for p in pooled.values())
                else ""
            )
            out.append(
                f"| {c:g} | "
                + " | ".join(_ours(pooled[h]) if h in pooled else "—" for h in columns)
                + f" | {'yes' if lands else 'no'} | {'kept' if kept else 'not kept'}{over}: "
                + _order(means)
                + " |"
            )
        out += [
            "",
            (
                "A clip norm that gives both the paper's accuracy and its order: "
                + ", ".join(f"{c:g}" for c in both)
                + "."
                if both
                else "No clip norm run gives both the paper's accuracy and its order."
            )
            + " A method lands when |Δ| is at most "
            + f"{gap:g} points or its seed-to-seed std; the order is kept when our means rank "
            "the fixed τ as the paper does and put each ALI-DPFL column where the paper puts "
            "ALI-DPFL, over the seeds every column of that C has (named when some column has "
            "more). C is a sweep chosen by test accuracy, which no ε counts (‡).",
            "",
        ]
    return out


#: the row fields a claim's runs may name (each a value or a list of values)
CLAIM_FIELDS = ("table", "setting", "method", "epsilon", "variant", "seed", "source", "dp")


def _claim_blocks(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """A claim's ``runs``: one block of fields, or a list of them."""
    return claim["runs"] if isinstance(claim["runs"], list) else [claim["runs"]]


def claim_runs(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run a claim asks for: the product of its ``runs`` fields' values (a list in
    ``runs`` is expanded, a plain value fixed; ``runs`` may be a list of such blocks)."""
    out: list[dict[str, Any]] = []
    for block in _claim_blocks(claim):
        unknown = set(block) - set(CLAIM_FIELDS)
        if unknown:
            raise ValueError(
                f"claim {claim.get('id')!r}: unknown runs field(s) {sorted(unknown)}; "
                f"allowed: {', '.join(CLAIM_FIELDS)}"
            )
        names = list(block)
        values = [v if isinstance(v, list) else [v] for v in block.values()]
        out += [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]
    return out


def _claim_match(row: dict[str, Any], want: dict[str, Any]) -> bool:
    for k, v in want.items():
        got = row.get(k)
        if k == "variant":
            got = got or ""
        elif k == "source":
            got = got or "run"
        elif k == "dp":
            got = got if got is not None else True
        elif k == "epsilon":
            got, v = _eps(got), _eps(v)
        if got != v:
            return False
    return True


def claim_status(
    claim: dict[str, Any], rows: list[dict[str, Any]], prov: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the runs a claim asks for, those a full-schedule row made at a commit that
    reproduces it has: a reduced schedule or a row no commit reproduces does not count)."""
    wanted = claim_runs(claim)
    counted = [
        r
        for r in rows
        if r.get("schedule", "full") == "full" and _provenance.reproducible(r, prov)
    ]
    have = [w for w in wanted if any(_claim_match(r, w) for r in counted)]
    return wanted, have


def claim_line(
    claim: dict[str, Any], wanted: list[dict[str, Any]], have: list[dict[str, Any]]
) -> str:
    """The record's line for one claim, from `claim_status`: runs recorded of runs asked,
    each missing run named by the fields the claim varies (seeds gathered), and the stated
    reason. Raises when a run is missing and the claim states no reason."""
    missing = [w for w in wanted if w not in have]
    line = f"- **{claim['claim']}**: {len(have)} of {len(wanted)} runs recorded"
    if not missing:
        return line + "."
    if not claim.get("reason"):
        raise ValueError(
            f"claim {claim.get('id')!r} has {len(missing)} run(s) missing and no "
            "'reason': run them, or state why not"
        )
    varied = {k for blk in _claim_blocks(claim) for k, v in blk.items() if isinstance(v, list)}
    groups: dict[tuple, list[Any]] = defaultdict(list)
    for w in missing:
        rest = tuple((k, w[k]) for k in w if k in varied and k != "seed")
        groups[rest].append(w.get("seed"))
    parts = []
    for rest, seeds in groups.items():
        what = ", ".join(
            (f"{v}" if v else "the paper's configuration")
            if k == "variant"
            else f"ε = {_fmt_eps(_eps(v))}"
            if k == "epsilon"
            else f"{v}"
            for k, v in rest
        )
        seed_text = ", ".join(str(s) for s in seeds if s is not None)
        parts.append(what + (f" (seed {seed_text})" if seed_text else ""))
    return line + f"; missing: {'; '.join(parts)}. {claim['reason']}"


def claim_coverage(
    claims: list[dict[str, Any]], rows: list[dict[str, Any]], prov: dict[str, Any]
) -> list[str]:
    """Per claim the paper's issue asks to test, its `claim_line`: how many of the runs it
    asks for are in the record from a commit that reproduces them, which are missing, and
    (required where any is) the stated reason."""
    return [claim_line(c, *claim_status(c, rows, prov)) for c in claims]


def authors_table(
    authors: dict[tuple, list[dict[str, Any]]],
    main: dict[tuple, list[dict[str, Any]]],
    paper_of: dict[tuple, dict[str, Any]],
    record_commit: str | None = None,
    runner: str = "benchmarks/repro/authors_step.py",
    notes: str | None = "benchmarks/repro/notes/authors_step_differences.md",
    prov: dict[str, Any] | None = None,
    rules: list[dict[str, Any]] | None = None,
) -> list[str]:
    """The rows of a paper's published code re-implemented (``source: authors' code``,
    written by ``runner``, its differences from our step in ``notes``), per cell and
    variant, beside the paper's number and our engine's full-schedule rows of the same
    cell. Never pooled with ours, never counted as a run."""
    where = f"; its differences from our step are in `{notes}`" if notes else ""
    out = [
        "### The authors' published code, re-implemented",
        "",
        f"Rows with `source: authors' code` (`{runner}`: the authors' public code "
        f"re-implemented at the settings the spec infers{where}). They are shown beside "
        "ours, not pooled with them.",
        "",
        "| table | setting | method | ε | variant | paper | authors' code | Δ | ours (same cell) "
        "| rounds run of paper's | commits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, v in sorted(authors.items(), key=lambda kv: (str(kv[0][:6]), kv[0][6])):
        key = k[:6]
        f = dict(zip(KEY_FIELDS, key, strict=True))
        published = paper_of.get(key, {}).get("paper_value", v[0].get("paper_value"))
        p = pool(v)
        value = _ours(p) + ("" if all(r.get("dp", True) for r in v) else " (no DP)")
        delta = "—" if published is None else f"{p['mean'] - float(published):+.2f}"
        ours = main.get((*key, "full"))
        out.append(
            f"| {f['table']} | {_md(f['setting'])} | {f['method']} | {_fmt_eps(f['epsilon'])} "
            f"| {_md(k[6]) + _tuned_mark(f['paper'], k[6], rules) or '—'} | {_fmt(published)} "
            f"| {value} | {delta} "
            f"| {_ours(pool(ours)) if ours else '—'} | {_schedule(v)} "
            f"| {commits(v, record_commit, prov)} |"
        )
    return [*out, ""]


def _psi(row: dict[str, Any]) -> float | None:
    """The Ψ a row recorded in ``extra``, None when it has none (or NaN)."""
    v = (row.get("extra") or {}).get("psi")
    return None if v is None or v != v else float(v)


def _fmt_psi(values: list[float]) -> str:
    """Ψ to 3 significant digits: the mean, ± the sample std over two or more seeds."""
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.fmean(values):.3g} ± {statistics.stdev(values):.3g}"


def fairness_table(
    main: dict[tuple, list[dict[str, Any]]],
    authors: dict[tuple, list[dict[str, Any]]],
    paper_of: dict[tuple, dict[str, Any]],
    definitions: dict[str, str] | None = None,
) -> list[str]:
    """Ψ (the p-weighted variance of the clients' losses, FedFDP's fairness metric) beside
    accuracy for every cell whose rows record one: our full-schedule rows and each
    authors'-code variant, one row per seed pooled, with the paper's Ψ (``paper_psi`` in a
    row's ``extra``). Nothing when no row records Ψ. Which losses a pipeline's Ψ is the
    variance of is stated by ``definitions`` (pipeline → text, ``psi_definitions`` in
    paper_cells.json); a pipeline with a Ψ and no definition is refused, as two pipelines
    may measure it on different models and data."""
    definitions = definitions or {}
    groups = [(k[:6], "ours", "", v) for k, v in main.items() if k[6] == "full"]
    groups += [(k[:6], "authors' code", k[6], v) for k, v in authors.items()]
    paper_psi_of: dict[tuple, Any] = {}  # cell → the paper's Ψ, from any row of that cell
    for key, _, _, rows in groups:
        for r in rows:
            if (r.get("extra") or {}).get("paper_psi"):
                paper_psi_of.setdefault(key, r["extra"]["paper_psi"])
    lines, used = [], set()
    for key, who, variant, rows in sorted(groups, key=lambda g: (str(g[0]), g[1], g[2])):
        psis = [x for x in (_psi(r) for r in rows) if x is not None]
        if not psis:
            continue
        used.add(who)
        f = dict(zip(KEY_FIELDS, key, strict=True))
        paper_psi = paper_psi_of.get(key)
        published = paper_of.get(key, {}).get("paper_value", rows[0].get("paper_value"))
        dp = "yes" if all(r.get("dp", True) for r in rows) else "**no**"
        lines.append(
            f"| {f['table']} | {_md(f['setting'])} | {f['method']} | {_fmt_eps(f['epsilon'])} "
            f"| {who} | {_md(variant) or '—'} | {dp} | {_fmt(published)} | {_ours(pool(rows))} "
            f"| {'—' if paper_psi is None else f'{float(paper_psi):.2g}'} | {_fmt_psi(psis)} |"
        )
    if not lines:
        return []
    undefined = sorted(used - set(definitions))
    if undefined:
        raise ValueError(
            f"rows of {undefined} record a Ψ but 'psi_definitions' in paper_cells.json does "
            "not say which losses it is the variance of"
        )
    return [
        "### Ψ beside accuracy",
        "",
        "Ψ, the fairness metric (the p-weighted variance of the clients' losses; lower is "
        "fairer), from every row that records it, beside final accuracy; mean ± std over "
        "seeds. Which losses each pipeline's Ψ is the variance of:",
        "",
        *[f"- {who}: {definitions[who]}" for who in sorted(used)],
        "",
        "| table | setting | method | ε | pipeline | variant | DP | paper acc. | acc. "
        "| paper Ψ | Ψ |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]


def differences_table(notes: str | None) -> list[str]:
    """The table of differences between the authors' step and ours, with "DP-valid?" and
    the measured effect of each, copied from the notes file the authors' runner generates
    (``notes``, relative to the repository; ``authors_step.py --differences``), from its
    table's header to its end. Nothing when the paper names no such file."""
    if not notes:
        return []
    text = (ROOT / notes).read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("| ")), None)
    if start is None:
        raise ValueError(f"{notes} has no table")
    return [
        "#### The authors' step against ours",
        "",
        f"Each difference, whether it is DP-valid and its measured effect (from [{notes}]"
        f"({notes}), generated by the authors' runner).",
        "",
        *text[start:],
        "",
    ]


def render(
    rows: list[dict[str, Any]], doc: dict[str, Any], prov: dict[str, Any] | None = None
) -> str:
    """REPRODUCTION.md's text (`build` without the figures' data)."""
    return build(rows, doc, prov)[0]


def experiments_on(
    key: tuple,
    groups: list[dict[tuple, list[dict[str, Any]]]],
    rules: list[dict[str, Any]],
    record_commit: str | None,
) -> list[_labels.Experiment]:
    """Every experiment recorded on the cell `key`: each (cell, variant) group of the
    variants, not-DP steps and authors' code rows, pooled one row per seed."""
    out = []
    for g in groups:
        for k, v in g.items():
            if k[:6] != key:
                continue
            variant = k[6]
            source = v[0].get("source") or "run"
            who = "authors' code" if source == AUTHORS_SOURCE else "ours"
            what = who + (f", {_variant_label(variant)}" if variant else "")
            p = pool(v, record_commit)
            out.append(
                _labels.pooled_experiment(
                    what,
                    [float(r["ours"]) for r in p["rows"]],
                    all(r.get("dp", True) for r in v),
                    _labels.settings_class(key[0], variant, rules),
                    key,
                )
            )
    return out


def build(
    rows: list[dict[str, Any]], doc: dict[str, Any], prov: dict[str, Any] | None = None
) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """(REPRODUCTION.md's text, {"figures": per paper the figure's points: every run cell
    with a published number, ours with its seed spread, its label and the experiment it
    rests on; "counts": per paper the summary row's counts}).
    `prov` is provenance.json's content (`_provenance`; none: every row counts as
    reproducible)."""
    prov = prov or {}
    rules = doc.get("settings", [])
    figures: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, dict[str, int]] = {}
    threshold = float(doc.get("gap_threshold", 3.0))
    record_commit = doc.get("record_commit")
    explanations = doc.get("explanations", [])
    cells = doc["cells"]
    paper_of = {cell_key(c): c for c in cells}
    lines = [
        "# Reproduction record",
        "",
        "Generated by `python benchmarks/repro/record.py` from `benchmarks/repro/results.jsonl` "
        "(one row per run: paper, table, dataset, setting, method, ε, seed, ours, the paper's "
        "value, the schedule run, commit, command, wall time) and "
        "`benchmarks/repro/paper_cells.json` (the papers' numbers, transcribed from "
        "`shared/specs`). Do not edit by hand: rerun a runner, then this command.",
        "",
        "Δ = ours − paper, in points; every cell run gets a label (below), and the "
        "experiment it rests on is named beside it. *not DP* marks an ablation that runs a "
        "published step which is not differentially private: it explains a number, it does "
        "not reproduce its guarantee. Results are reported as measured, including where they "
        "disagree with the papers.",
        "",
        *_labels.DEFINITIONS,
        "",
        "Commits: each table names the commits its pooled rows were made at, with how many "
        f"rows each; † marks a commit other than the record commit `{record_commit}`. Rows no "
        "commit reproduces are marked: § `+dirty` (an uncommitted tree) and ¶ a commit that "
        "does not contain the script that made the row (`benchmarks/repro/provenance.json`). "
        "They are shown as measured in the paper tables, counted in the summary, and never "
        "pooled into a headline.",
        "",
    ]
    by_paper: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_paper[r["paper"]].append(r)
    summary = [
        "| paper | cells transcribed | cells run | "
        + " | ".join(_labels.LABEL_TEXT[k] for k in _labels.LABELS)
        + " | of which ‡ test-tuned | never run | run cells pooling a row no commit "
        "reproduces |"
    ]
    summary.append("|---" * (len(_labels.LABELS) + 6) + "|")
    bodies: list[str] = []
    for paper in PAPER_ORDER:
        info = doc["papers"][paper]
        prow = by_paper.get(paper, [])
        pcells = [c for c in cells if c["paper"] == paper]
        main: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        notdp: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        variants: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        authors: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for r in prow:
            key = cell_key(r)
            if r.get("source") == AUTHORS_SOURCE:
                authors[(*key, r.get("variant") or "")].append(r)  # its own table
            elif (
                not r.get("dp", True)
                and r.get("variant")
                and not r["variant"].startswith(OWN_ABLATION_PREFIXES)
            ):
                notdp[(*key, r["variant"])].append(r)  # a published step that is not DP
            elif r.get("variant"):
                variants[(*key, r["variant"])].append(r)
            else:
                schedule = r.get("schedule", "full")
                # Reduced schedules pool only with runs of the same length.
                main[(*key, schedule if schedule == "full" else r.get("rounds_run"))].append(r)
        # A run repeated at several commits counts once per seed (its record-commit row).
        for groups in (main, notdp, variants, authors):
            for k, v in groups.items():
                groups[k] = one_per_seed(v, record_commit)
        experiment_groups = [notdp, variants, authors]
        body = [f"## {info['title']}", ""]
        body.append(
            f"Seed `{info['seed']}`, spec `{info['spec']}`, runner `{info['runner']}`. "
            f"Metric: {info['metric']}. Scope: {info['scope']}"
        )
        body.append("")
        for note in doc.get("notes", {}).get(paper, []):
            body += [f"> {note}", ""]
        claims = [c for c in doc.get("claims", []) if c["paper"] == paper]
        statuses = [claim_status(c, prow, prov) for c in claims]
        if claims:
            body += [
                "### The central claims, tested where they live",
                "",
                "The runs issue 52 asks for, counted from the rows (a row no commit "
                "reproduces does not count); what is missing says why.",
                "",
                *(claim_line(c, *st) for c, st in zip(claims, statuses, strict=True)),
                "",
            ]
        # Cells with a published number and our DP run of the paper's configuration.
        table = [
            "| table | setting | method | ε | paper | ours | Δ | rounds run of paper's "
            "| paper's step, not DP | label | experiment it rests on | commits |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        nogap: list[str] = []
        cited: dict[str, dict[str, Any]] = {}
        cited_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        label_counts: dict[str, int] = dict.fromkeys(_labels.LABELS, 0)
        tuned = not_reproducible = 0
        points: list[dict[str, Any]] = []
        shown_notdp: set[tuple] = set()
        run_keys: set[tuple] = set()
        ablation_only: set[tuple] = set()
        ordered = sorted(
            main.items(),
            key=lambda kv: (
                list(paper_of).index(kv[0][:6]) if kv[0][:6] in paper_of else len(paper_of),
                str(kv[0]),
            ),
        )
        for (*key_l, schedule), group in ordered:
            key = tuple(key_l)
            run_keys.add(key)
            published = paper_of.get(key, {}).get("paper_value")
            if published is None:
                published = next(
                    (r["paper_value"] for r in group if r.get("paper_value") is not None), None
                )
            p = pool(group)
            ours_txt = _ours(p) + ("" if group[0].get("dp", True) else " (no DP)")
            nd = [(k, v) for k, v in notdp.items() if k[:6] == key]
            nd_txt = "; ".join(f"{_ours(pool(v))} (*not DP*: {_md(k[6])})" for k, v in nd)
            shown_notdp.update(k for k, _ in nd)
            row_fields = dict(zip(KEY_FIELDS, key, strict=True))
            if published is None:
                nogap.append(
                    f"| {row_fields['table']} | {_md(row_fields['setting'])} | "
                    f"{row_fields['method']} | {_fmt_eps(row_fields['epsilon'])} | "
                    f"{ours_txt} | {group[0].get('metric')} | {_schedule(group)} | "
                    f"{commits(group, record_commit, prov)} |"
                )
                continue
            published = float(published)
            delta = p["mean"] - published
            e = explanation_for(key, explanations)
            exps = experiments_on(key, experiment_groups, rules, record_commit)
            if in_family(e, key):
                # an experiment on another cell of the family counts here, by its argument
                assert e is not None
                members = {g[:6] for grp in experiment_groups for g in grp} - {key}
                for k in sorted(members, key=str):
                    if any(_matches(m, k) for m in e["family"]["cells"]):
                        exps += [
                            dataclasses.replace(x, what=f"{x.what} [on {k[1]} {k[3]} {k[4]}]")
                            for x in experiments_on(k, experiment_groups, rules, record_commit)
                        ]
            v = _labels.verdict(p["mean"], p["std"], published, exps, threshold)
            label_counts[v.label] += 1
            tuned += v.tuned
            if e is not None and v.label != "within":
                cited[e["id"]] = e
                cited_counts[e["id"]][v.label] += 1
            pooled_rows = group + [r for _, val in nd for r in val]
            if not all(_provenance.reproducible(r, prov) for r in p["rows"]):
                not_reproducible += 1
            table.append(
                f"| {row_fields['table']} | {_md(row_fields['setting'])} | "
                f"{row_fields['method']} | {_fmt_eps(row_fields['epsilon'])} | "
                f"{published:.2f} | {ours_txt} | {delta:+.2f} | {_schedule(group)} | "
                f"{nd_txt or '—'} | {label_text(v, e, schedule != 'full')} | "
                f"{experiment_text(v, published)} | "
                f"{commits(pooled_rows, record_commit, prov)} |"
            )
            points.append(
                {
                    "table": row_fields["table"],
                    "setting": row_fields["setting"],
                    "method": row_fields["method"],
                    "epsilon": row_fields["epsilon"],
                    "paper": published,
                    "ours": round(p["mean"], 4),
                    "std": None if p["std"] is None else round(p["std"], 4),
                    "n": p["n"],
                    "label": v.label,
                    "tuned": v.tuned,
                    "reproducible": all(_provenance.reproducible(r, prov) for r in p["rows"]),
                    "experiment": None
                    if v.best is None
                    else {
                        "what": v.best.what,
                        "mean": round(v.best.mean, 4),
                        "std": None if v.best.std is None else round(v.best.std, 4),
                        "n": v.best.n,
                        "dp": v.best.dp,
                    },
                }
            )
        # Non-DP ablations whose cell has no DP run of ours.
        for k, v in sorted(notdp.items(), key=lambda kv: str(kv[0])):
            if k in shown_notdp:
                continue
            key = k[:6]
            ablation_only.add(key)
            f = dict(zip(KEY_FIELDS, key, strict=True))
            published = paper_of.get(key, {}).get("paper_value", v[0].get("paper_value"))
            p = pool(v)
            delta = "—" if published is None else f"{p['mean'] - float(published):+.2f}"
            table.append(
                f"| {f['table']} | {_md(f['setting'])} | {f['method']} | "
                f"{_fmt_eps(f['epsilon'])} | {_fmt(published)} | not run | — | "
                f"{_schedule(v)} | {_ours(p)} (*not DP*: {_md(k[6])}); Δ {delta} | — | — | "
                f"{commits(v, record_commit, prov)} |"
            )
        n_run = len({k for k in run_keys if k in paper_of})
        if len(table) > 2:
            body += ["### Ours beside the paper's", "", *table, ""]
            if tuned:
                body += [
                    "‡: the experiment the label rests on uses a setting chosen by test "
                    "accuracy (no ε in the record or the paper counts that choice).",
                    "",
                ]
            if any(not pt["reproducible"] for pt in points):
                body += [
                    "§ / ¶ in a commits column: the cell pools a row no commit reproduces "
                    "(`+dirty`, or a commit without the script); see the summary.",
                    "",
                ]
            if cited:
                body += ["Gap explanations:", ""]
                body += [_explanation_line(e, cited_counts[i]) for i, e in cited.items()]
                body.append("")
        else:
            body += ["No cell of this paper has been run with a published number to compare.", ""]
        if authors:
            meta = doc["papers"][paper]
            body += authors_table(
                authors,
                main,
                paper_of,
                record_commit,
                meta.get("authors_runner", "benchmarks/repro/authors_step.py"),
                meta.get("differences"),
                prov,
                rules,
            )
            body += differences_table(meta.get("differences"))
        body += fairness_table(
            main, authors, paper_of, doc["papers"][paper].get("psi_definitions")
        )
        if nogap:
            body += [
                "### Runs with no published number",
                "",
                "| table | setting | method | ε | ours | metric | rounds run of paper's "
                "| commits |",
                "|---|---|---|---|---|---|---|---|",
                *nogap,
                "",
            ]
        if variants:
            body += [
                "### Variants and studies",
                "",
                "‡ after a variant: its settings were chosen by test accuracy (`settings` in "
                "paper_cells.json).",
                "",
                "| table | setting | method | ε | variant | paper | ours | Δ | rounds run "
                "| commits |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for k, v in sorted(variants.items(), key=lambda kv: (kv[0][6], str(kv[0][:6]))):
                f = dict(zip(KEY_FIELDS, k[:6], strict=True))
                published = paper_of.get(k[:6], {}).get("paper_value", v[0].get("paper_value"))
                p = pool(v)
                delta = "—" if published is None else f"{p['mean'] - float(published):+.2f}"
                body.append(
                    f"| {f['table']} | {_md(f['setting'])} | {f['method']} | "
                    f"{_fmt_eps(f['epsilon'])} | "
                    f"{_md(_variant_label(k[6])) + _tuned_mark(paper, k[6], rules)} | "
                    f"{_fmt(published)} | {_ours(p)}"
                    f"{'' if all(r.get('dp', True) for r in v) else ' (*not DP*)'} "
                    f"| {delta} | {_schedule(v)} | {commits(v, record_commit, prov)} |"
                )
            body.append("")
        ours_rows = [r for r in prow if r.get("source") != AUTHORS_SOURCE]
        claim = tau_claim(ours_rows, record_commit) if paper == "ali_dpfl" else []
        if claim:
            body += [
                "### Adaptive τ* against every fixed τ (the paper's claim for R_s < R_c)",
                "",
                "ALI-DPFL beside the fixed-τ baselines run with it (mean ± std over seeds; "
                "best-round accuracy). The paper reports ALI-DPFL above every fixed τ in every "
                "Fashion-MNIST R_s < R_c column but Table IV R_c/2 (τ = 2: 83.46 against "
                "83.25; spec ali-dpfl.md §7.2).",
                "",
                *claim,
                "",
            ]
        grid = clip_grid(ours_rows, threshold, record_commit) if paper == "ali_dpfl" else []
        if grid:
            body += [
                "### The claim across the clip norm (C run at the same σ, q, ε and R_c)",
                "",
                "The paper never states C; at a tight R_c, C sets the step length at the same "
                "ε (the sampled Gaussian's cost depends on σ and q only). Each cell run at "
                "two or more C, every fixed τ and ALI-DPFL beside the paper's numbers.",
                "",
                *grid,
            ]
        never = [c for c in pcells if cell_key(c) not in run_keys]
        body += [
            f"### Never run ({len(never)} of {len(pcells)} transcribed cells)",
            "",
            "No run of the paper's configuration in the record (studies, variants and not-DP "
            "ablations do not count).",
            "",
        ]
        grouped: dict[tuple, list[str]] = defaultdict(list)
        for c in never:
            only = " (not-DP ablation only)" if cell_key(c) in ablation_only else ""
            where = (c["table"], c["dataset"], c["setting"], _eps(c.get("epsilon")))
            grouped[where].append(c["method"] + only)
        for (tab, ds, setting, eps), methods in grouped.items():
            body.append(
                f"- Table {tab}, {ds}, {setting}"
                + ("" if eps is None else f", ε = {eps:g}")
                + f": {', '.join(methods)}"
            )
        if not never:
            body.append("- none")
        body.append("")
        if prow:
            body += ["### How each number was made", "", *_commands(prow), ""]
        figures[paper] = points
        if points:
            fig = _figures.figure_path(paper)
            body[2:2] = [
                f"![{paper}: the paper's number against ours, by label]"
                f"({fig.relative_to(ROOT).as_posix()})",
                "",
                "The paper's number (x) against ours (y) for every cell run, with the "
                "seed-to-seed std as a bar, coloured by label; the grey band is ±3 points "
                "around the diagonal (ours = paper); a hollow marker joined to a cell is the "
                "experiment its label rests on.",
                "",
            ]
        bodies += body
        counts[paper] = {
            **label_counts,
            "tuned": tuned,
            "transcribed": len(pcells),
            "run": n_run,
            "never": len(never),
            "not_reproducible": not_reproducible,
            "claim_runs": (
                sum(len(have) for _, have in statuses),
                sum(len(wanted) for wanted, _ in statuses),
            ),
        }
        summary.append(
            f"| {paper} | {len(pcells)} | {n_run} | "
            + " | ".join(str(label_counts[k]) for k in _labels.LABELS)
            + f" | {tuned} | {len(never)} | {not_reproducible} |"
        )
    lines += ["## Summary", "", *summary, "", *headline_table(rows, doc, prov), *bodies]
    text = "\n".join(lines).rstrip() + "\n"
    return text, {"figures": figures, "counts": counts}


README_BEGIN = "<!-- record:begin (written by python benchmarks/repro/record.py; do not edit) -->"
README_END = "<!-- record:end -->"


def _anchor(title: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def readme_block(paper: str, info: dict[str, Any], counts: dict[str, int]) -> str:
    """The record section of a paper folder's README: the paper's summary row in words and
    its figure, linked to REPRODUCTION.md (paths relative to the README)."""
    up = "../" * (len(Path(info["readme"]).parts) - 1)
    tuned = (
        f" ({counts['tuned']} of them ‡: only at a setting chosen by test accuracy)"
        if counts.get("tuned")
        else ""
    )
    labels = ", ".join(
        f"{counts[k]} {_labels.LABEL_TEXT[k]}" + (tuned if k == "partly" else "")
        for k in _labels.LABELS
        if counts.get(k)
    )
    lines = [
        README_BEGIN,
        "",
        f"**In the record** ([REPRODUCTION.md]({up}REPRODUCTION.md#{_anchor(info['title'])})):"
        f" {counts['transcribed']} cells transcribed, {counts['run']} run: {labels or 'none'}"
        f"; {counts['never']} never run. {counts['not_reproducible']} of the cells run pool "
        "a row that no commit reproduces (§ `+dirty` or ¶ a commit without its script). "
        "The labels are defined at the top of REPRODUCTION.md.",
        "",
    ]
    have, wanted = counts.get("claim_runs", (0, 0))
    if wanted:
        lines += [
            f"The central claims it tests: {have} of the {wanted} runs they ask for are in the "
            "record; each missing run is named there, with the reason it is missing.",
            "",
        ]
    figure = _figures.figure_path(paper)
    if counts["run"]:
        lines += [
            f"![{paper}: the paper's number against ours, by label]"
            f"({up}{figure.relative_to(ROOT).as_posix()})",
            "",
        ]
    return "\n".join([*lines, README_END])


def with_readme_block(text: str, block: str, where: str) -> str:
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{where} lacks the record markers ({README_BEGIN!r} ... {README_END!r})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return head + block + tail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=_record.DEFAULT_RESULTS)
    p.add_argument("--cells", type=Path, default=CELLS)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--provenance-file", type=Path, default=_provenance.PROVENANCE)
    p.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="folder of the per-paper figures and their data (default: "
        "benchmarks/repro/figures/, or figures/ beside --out when --out is another file)",
    )
    p.add_argument(
        "--check", action="store_true", help="exit 1 if --out or a figure is out of date"
    )
    p.add_argument(
        "--accept-dirty",
        action="store_true",
        help="accept the results' +dirty rows not yet accepted (listed in the provenance "
        "file); without it a new dirty row is refused",
    )
    p.add_argument(
        "--provenance",
        action="store_true",
        help="recompute from git which rows name a commit without the script that made them",
    )
    p.add_argument(
        "--import-rows",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="first append the rows of another results.jsonl (a worktree's, after a long "
        "run) that this one lacks; exact duplicates are skipped",
    )
    args = p.parse_args(argv)
    if args.import_rows is not None:
        if args.check:
            p.error("--check does not write: drop --import-rows")
        have = {_provenance.digest(r) for r in _record.load_rows(args.results)}
        new = [r for r in _record.load_rows(args.import_rows) if _provenance.digest(r) not in have]
        _record.append_rows(new, args.results)
        print(f"imported {len(new)} row(s) from {args.import_rows}")
    if args.figures is None:
        same = args.out.resolve() == OUT.resolve()
        args.figures = _figures.FIGURES if same else args.out.parent / "figures"
    doc = json.loads(args.cells.read_text(encoding="utf-8"))
    rows = _record.load_rows(args.results)
    prov = _provenance.load(args.provenance_file)
    new_dirty = _provenance.unaccepted_dirty(rows, prov)
    if args.provenance or (args.accept_dirty and new_dirty):
        if args.check:
            p.error("--check does not write: drop --provenance / --accept-dirty")
        if args.provenance:
            absent, unknown = _provenance.absent_scripts(rows, ROOT)
            if unknown:
                print(f"record.py: error: commits not in this repository: {unknown}",
                      file=sys.stderr)  # fmt: skip
                return 2
            prov["script_absent"] = absent
        if args.accept_dirty:
            prov["accepted_dirty"] = [
                *prov.get("accepted_dirty", []),
                *(_provenance.digest(r) for r in new_dirty),
            ]
        _provenance.save(prov, args.provenance_file)
        prov = _provenance.load(args.provenance_file)
        new_dirty = _provenance.unaccepted_dirty(rows, prov)
    if new_dirty:
        print(
            f"record.py: error: {len(new_dirty)} row(s) from an uncommitted tree (+dirty, "
            f"first: {new_dirty[0]['paper']} {new_dirty[0]['table']} {new_dirty[0]['method']} "
            f"at {new_dirty[0]['commit']}); rerun from a worktree of a commit, or pass "
            "--accept-dirty to record them as not reproducible",
            file=sys.stderr,
        )
        return 2
    text, made = build(rows, doc, prov)
    titles = {k: v["title"] for k, v in doc["papers"].items()}
    files = {args.out: text, **_figures.outputs(made["figures"], titles, args.figures)}
    if args.out.resolve() == OUT.resolve():
        # the paper folders' READMEs carry their record section (only for the real record)
        for paper, info in doc["papers"].items():
            if info.get("readme"):
                path = ROOT / info["readme"]
                block = readme_block(paper, info, made["counts"][paper])
                files[path] = with_readme_block(
                    path.read_text(encoding="utf-8"), block, info["readme"]
                )
    if args.check:
        stale = [
            path
            for path, content in files.items()
            if not path.exists() or path.read_text(encoding="utf-8") != content
        ]
        if stale:
            print(
                f"{', '.join(str(s) for s in stale)} out of date: run python "
                "benchmarks/repro/record.py"
            )
            return 1
        print(f"{args.out} and its figures are up to date")
        return 0
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    print(f"wrote {args.out}, its figures and the papers' record sections ({len(files)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
