"""The record's labels: what a gap between ours and a paper's number is called, computed
from the experiments on that cell, never declared.

A cell of a paper with our DP run of the paper's configuration gets one label
(`verdict`). Its Δ = ours − paper and its experiments are the other rows recorded on the
same cell (same paper, table, dataset, setting, method and ε): the variants of our
pipeline, the paper's published code re-implemented, the published steps that are not DP
and our own ablations, each pooled over its seeds. An explanation in paper_cells.json
carries the text and the cells it speaks to (``match``); it no longer says how well it
explains them: the label comes from what the experiments measured. An explanation may
name a family of cells it covers by a shown argument (``family``: the cells and the
``argument``), and then an experiment on one cell of the family counts on every cell of
it, compared with each cell's own published number.

Every variant an experiment ran with is classed by its settings (``settings`` rules in
paper_cells.json, by clause): ``paper`` (stated by the paper or implied by it or by its
published code), ``unstated`` (DP-valid, but a choice the paper neither states nor
implies), ``test_tuned`` (picked by test accuracy: a sweep whose best was kept) or
``ablation`` (a diagnostic of our own pipeline, not a candidate setting). A clause with no
rule is an error: the record never guesses how a setting was chosen.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

#: The labels, strongest first, with the text the tables show.
LABELS = ("within", "explained", "explained_not_dp", "partly", "tried", "unexplained")
LABEL_TEXT = {
    "within": "within",
    "explained": "explained",
    "explained_not_dp": "explained, not DP",
    "partly": "partly explained",
    "tried": "tried",
    "unexplained": "unexplained",
}
#: How settings were chosen, from least to most restrictive (a variant takes the most
#: restrictive class of its clauses).
SETTINGS_CLASSES = ("paper", "unstated", "test_tuned", "ablation")
#: The least by which an experiment must shrink |Δ| to "move the gap", in points (and at
#: least the larger seed-to-seed std of the two pools).
MIN_MOVE = 1.0

DEFINITIONS = [
    "Labels (computed by `benchmarks/repro/_labels.py` from the rows, never written by "
    "hand; a test recomputes them from the data). Δ = ours − paper for our DP run of the "
    "paper's configuration; an *experiment* on a cell is any other row recorded on that same "
    "cell (a variant of our pipeline, the paper's published code re-implemented, a published "
    "step that is not DP, an ablation), pooled over its seeds; it *lands* when its |Δ| is at "
    "most 3 points or its seed-to-seed std, and it *moves the gap* when it shrinks |Δ| by more "
    f"than {MIN_MOVE:g} point and more than either pool's std.",
    "",
    "- **within**: |Δ| ≤ 3 points or ours' seed-to-seed std: no gap to explain.",
    "- **explained**: an experiment on *that* cell (or on a stated family of cells it covers "
    "by a shown argument) lands, DP-valid, with settings the paper states or implies "
    "(settings class `paper`).",
    "- **explained, not DP**: an experiment with the paper's stated or implied settings "
    "lands, but only through a published step that is not differentially private: the "
    "paper's number is accounted for, its guarantee is not reproduced.",
    "- **partly explained**: an experiment moves the gap but leaves more than 3 points, or "
    "lands only at settings the paper does not state (`unstated`) or that were chosen by "
    "test accuracy (`test_tuned`, flagged ‡).",
    "- **tried**: experiments ran on the cell and none moved the gap.",
    "- **unexplained**: no experiment ran on the cell (an explanation may still argue a "
    "cause, by reading code or arithmetic: it is cited, the label stays).",
    "",
    "Settings classes (`settings` in `benchmarks/repro/paper_cells.json`, by clause of the "
    "variant): `paper` = stated by the paper, or implied by it or its published code; "
    "`unstated` = DP-valid but neither stated nor implied; `test_tuned` = chosen by test "
    "accuracy (a sweep whose best was kept; no ε counts that choice); `ablation` = a "
    "diagnostic of our own pipeline (e.g. noise removed), never an explanation by itself.",
]


def clauses(variant: str) -> list[str]:
    """The clauses of a variant label, split at ", " and "; " outside parentheses
    (``"divisor=expected (q·n_i, raydpfl's), C=3"`` is two clauses)."""
    out: list[str] = []
    depth, start, i = 0, 0, 0
    while i < len(variant):
        ch = variant[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and variant.startswith((", ", "; "), i):
            out.append(variant[start:i])
            start = i + 2
            i += 2
            continue
        i += 1
    out.append(variant[start:])
    return [c.strip() for c in out if c.strip()]


def settings_class(paper: str, variant: str, rules: list[dict[str, Any]]) -> str:
    """The class of a variant's settings: the most restrictive class of its clauses, each
    classed by the first rule (``prefix``, optionally ``paper``) it starts with; ``paper``
    for the paper's configuration (no variant)."""
    worst = "paper"
    for clause in clauses(variant):
        rule = next(
            (
                r
                for r in rules
                if clause.startswith(r["prefix"]) and r.get("paper", paper) == paper
            ),
            None,
        )
        if rule is None:
            raise ValueError(
                f"{paper}: variant clause {clause!r} has no settings class; add a rule to "
                f"'settings' in paper_cells.json (class one of {', '.join(SETTINGS_CLASSES)})"
            )
        if rule["class"] not in SETTINGS_CLASSES:
            raise ValueError(
                f"settings rule {rule['prefix']!r}: class must be one of "
                f"{', '.join(SETTINGS_CLASSES)}, not {rule['class']!r}"
            )
        if SETTINGS_CLASSES.index(rule["class"]) > SETTINGS_CLASSES.index(worst):
            worst = rule["class"]
    return worst


@dataclass(frozen=True)
class Experiment:
    """One experiment on a cell: its rows' pool, how it was made and what it measured."""

    what: str  # e.g. "authors' code, C=3" (for the reader)
    mean: float
    std: float | None
    n: int
    dp: bool
    settings: str  # a SETTINGS_CLASSES entry
    cell: tuple  # the cell it ran on (a family member may differ from the labelled one)


@dataclass(frozen=True)
class Verdict:
    label: str
    best: Experiment | None  # the experiment the label rests on (None: within/unexplained)
    closest: Experiment | None = None  # the experiment nearest the paper, where not `best`

    @property
    def tuned(self) -> bool:
        return self.best is not None and self.best.settings == "test_tuned"


def lands(e: Experiment, published: float, threshold: float) -> bool:
    return abs(e.mean - published) <= max(threshold, e.std or 0.0)


def moves(e: Experiment, delta: float, std: float | None, published: float) -> bool:
    return abs(delta) - abs(e.mean - published) > max(MIN_MOVE, std or 0.0, e.std or 0.0)


def verdict(
    ours_mean: float,
    ours_std: float | None,
    published: float,
    experiments: list[Experiment],
    threshold: float,
) -> Verdict:
    """The label of one cell (the definitions in `DEFINITIONS`, in that order)."""
    delta = ours_mean - published
    if abs(delta) <= max(threshold, ours_std or 0.0):
        return Verdict("within", None)
    if not experiments:
        return Verdict("unexplained", None)

    def closest(pick: list[Experiment]) -> Experiment:
        return min(pick, key=lambda e: (abs(e.mean - published), e.what))

    landed = [e for e in experiments if lands(e, published, threshold)]
    explained = [e for e in landed if e.dp and e.settings == "paper"]
    if explained:
        return Verdict("explained", closest(explained))
    not_dp = [e for e in landed if not e.dp and e.settings == "paper"]
    if not_dp:
        return Verdict("explained_not_dp", closest(not_dp))
    partly = [
        e
        for e in experiments
        if e.settings != "ablation"
        and ((e in landed and e.dp) or moves(e, delta, ours_std, published))
    ]
    if partly:
        # the label rests on the experiment with the least chosen settings that earns it
        # (‡ only where every one that does was tuned on test accuracy), closest first
        least = min(SETTINGS_CLASSES.index(e.settings) for e in partly)
        best = closest([e for e in partly if SETTINGS_CLASSES.index(e.settings) == least])
        nearest = closest(partly)
        return Verdict("partly", best, None if nearest == best else nearest)
    return Verdict("tried", closest(experiments))


def pooled_experiment(
    what: str, values: list[float], dp: bool, settings: str, cell: tuple
) -> Experiment:
    return Experiment(
        what=what,
        mean=statistics.fmean(values),
        std=statistics.stdev(values) if len(values) > 1 else None,
        n=len(values),
        dp=dp,
        settings=settings,
        cell=cell,
    )
