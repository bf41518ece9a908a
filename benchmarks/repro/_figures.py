"""A picture per paper: the paper's number against ours for every cell run, with the
seed-to-seed spread, coloured by the cell's label (`_labels`).

`record.py` writes, per paper, the figure's data (``<paper>.json``: the points, sorted,
rounded) and the figure drawn from it (``<paper>.svg``: matplotlib with the Agg backend,
saved as SVG with a fixed hash salt, text kept as text and no date, so the same data gives
the same bytes) under benchmarks/repro/figures/; ``--check`` compares both with what the
record gives.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import _labels

HERE = Path(__file__).resolve().parent
FIGURES = HERE / "figures"
COLOURS = {
    "within": "#1a9850",
    "explained": "#2166ac",
    "explained_not_dp": "#8e44ad",
    "partly": "#f39c12",
    "tried": "#d73027",
    "unexplained": "#555555",
}
NAMES = {"ali_dpfl": "ALI-DPFL", "fedfdp": "FedFDP", "dpfl_bcs": "DPFL-BCS", "rc_dpfl": "RC-DPFL"}


def figure_path(paper: str, folder: Path = FIGURES) -> Path:
    return folder / f"{paper}.svg"


def data_path(paper: str, folder: Path = FIGURES) -> Path:
    return folder / f"{paper}.json"


def data_text(paper: str, title: str, points: list[dict[str, Any]]) -> str:
    ordered = sorted(
        points,
        key=lambda p: (str(p["table"]), str(p["setting"]), p["method"], str(p["epsilon"])),
    )
    return (
        json.dumps({"paper": paper, "title": title, "points": ordered}, indent=1,
                   ensure_ascii=False)
        + "\n"
    )  # fmt: skip


def svg_text(paper: str, title: str, points: list[dict[str, Any]]) -> str:
    """The figure as SVG text, deterministic for given points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(
        {"svg.hashsalt": f"raydpfl-record-{paper}", "svg.fonttype": "none", "font.size": 9}
    ):
        fig, ax = plt.subplots(figsize=(6.4, 5.2))
        values = [p["paper"] for p in points] + [p["ours"] for p in points]
        values += [p["experiment"]["mean"] for p in points if p.get("experiment")]
        lo, hi = min(values) - 3, max(values) + 3
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.fill_between([lo, hi], [lo - 3, hi - 3], [lo + 3, hi + 3], color="#dddddd",
                        alpha=0.6, lw=0, label="±3 points")  # fmt: skip
        seen: set[str] = set()
        for p in sorted(points, key=lambda q: (_labels.LABELS.index(q["label"]), q["paper"])):
            colour = COLOURS[p["label"]]
            label = _labels.LABEL_TEXT[p["label"]]
            ax.errorbar(
                p["paper"],
                p["ours"],
                yerr=p["std"] or 0.0,
                fmt="o" if p["reproducible"] else "s",
                color=colour,
                ms=5,
                capsize=2,
                lw=0.8,
                label=None if label in seen else label,
            )
            seen.add(label)
            e = p.get("experiment")
            if e:
                ax.plot([p["paper"], p["paper"]], [p["ours"], e["mean"]], color=colour, lw=0.5,
                        ls=":")  # fmt: skip
                ax.plot(p["paper"], e["mean"], marker="D" if p.get("tuned") else "o",
                        mfc="none", color=colour, ms=6, lw=0)  # fmt: skip
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("paper's number")
        ax.set_ylabel("ours (mean over seeds, bar: std)")
        ax.set_title(
            f"{NAMES.get(paper, paper)}: the paper's number against ours "
            f"({len(points)} cells run)",
            fontsize=9,
        )
        ax.legend(loc="upper left", fontsize=7, frameon=False)
        ax.text(
            0.01,
            0.01,
            "square: pools a row no commit reproduces\n"
            "hollow: the experiment the label rests on (diamond: C etc. chosen by test acc.)",
            transform=ax.transAxes,
            va="bottom",
            fontsize=6.5,
        )
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "record.py"})
        plt.close(fig)
    return buf.getvalue()


def outputs(
    figures: dict[str, list[dict[str, Any]]], titles: dict[str, str], folder: Path = FIGURES
) -> dict[Path, str]:
    """Every file the figures make: path -> text (papers with no run cell make none)."""
    out: dict[Path, str] = {}
    for paper, points in figures.items():
        if not points:
            continue
        out[data_path(paper, folder)] = data_text(paper, titles[paper], points)
        out[figure_path(paper, folder)] = svg_text(paper, titles[paper], points)
    return out
