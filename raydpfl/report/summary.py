"""report.md: tables comparing the runs, links to the figures, privacy side releases."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.report.runs import Run, fairness_by_round

__all__ = ["Figure", "last_fairness", "render_markdown"]

MAX_VARYING_COLUMNS = 8


@dataclass(frozen=True)
class Figure:
    """A figure of the report: drawn (`path`) or not, and why not."""

    title: str
    filename: str
    path: Path | None
    why_not: str = ""


def _cell(value: Any) -> str:
    text = "–" if value is None else str(value)
    return " ".join(text.replace("|", "\\|").split())


def _num(value: float | None, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return format(value, spec)


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m} min {s:02d} s"
    h, rest = divmod(round(seconds), 3600)
    return f"{h} h {rest // 60:02d} min"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)
    return lines


def _link(run: Run, out_dir: Path) -> str:
    try:
        rel = os.path.relpath(run.path.resolve(), out_dir.resolve())
    except ValueError:  # another drive (Windows)
        rel = str(run.path.resolve())
    return f"[{run.label.replace('[', '(').replace(']', ')')}]({Path(rel).as_posix()}/)"


def _epsilon(run: Run) -> str:
    if not run.private:
        return "∞ (non-private)"
    return _num(run.epsilon_max, ".4g")


def _value(v: Any) -> str:
    if isinstance(v, float):
        return format(v, ".6g")
    return "–" if v is None else str(v)


def render_markdown(
    runs: Sequence[Run],
    out_dir: Path,
    figures: Sequence[Figure],
    *,
    varying: Mapping[str, Sequence[Any]],
    constants: Mapping[str, float],
    notes: Sequence[str] = (),
) -> str:
    """The text of report.md."""
    out = _header(runs)
    out += _runs_section(runs, out_dir)
    out += _varying_section(runs, varying)
    out += _fairness_section(runs)
    out += _figures_section(figures, constants)
    out += _releases_section(runs)
    out += _notes_section(runs, notes)
    return "\n".join(out).rstrip() + "\n"


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raydpfl")
    except PackageNotFoundError:  # a source tree that was never installed
        return "(not installed)"


def _plural(count: int, word: str) -> str:
    return f"{word}{'s' if count != 1 else ''}"


def _what_is_reported(runs: Sequence[Run]) -> str:
    """The report's subject: N runs, or N trials of the named sweeps."""
    sweeps = sorted({r.sweep for r in runs if r.sweep is not None})
    sweep_word = _plural(len(sweeps), "sweep")
    if sweeps and all(r.sweep is not None for r in runs):
        return (
            f"{len(runs)} {_plural(len(runs), 'trial')} of {sweep_word} "
            f"{', '.join(sweeps)}, ranked by best test accuracy"
        )
    what = f"{len(runs)} {_plural(len(runs), 'run')}"
    if sweeps:
        what += f" (with {sweep_word} {', '.join(sweeps)}; ranked by best test accuracy)"
    return what


def _header(runs: Sequence[Run]) -> list[str]:
    """Title, what is reported, when and by which version, and how to read the numbers."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        "# raydpfl report",
        "",
        f"{_what_is_reported(runs)}; generated {stamp} by raydpfl {_installed_version()}.",
        "",
        "Accuracy is the global model's on the central test set, at evaluated rounds. "
        "ε is the largest record-level ε any client spent (per-client DP), at the δ and "
        "accountant shown; see each run's summary.json for the full privacy statement.",
        "",
        "## Runs",
        "",
    ]


_RUN_COLUMNS = (
    "#",
    "run",
    "experiment",
    "algorithm",
    "dataset",
    "rounds",
    "best accuracy",
    "final accuracy",
    "ε",
    "δ",
    "accountant",
    "wall time",
    "stop reason",
)


def _run_row(i: int, run: Run, out_dir: Path) -> list[Any]:
    planned = run.rounds_planned
    best_round = run.best_round
    return [
        i,
        _link(run, out_dir),
        run.experiment,
        run.algorithm,
        run.dataset,
        f"{run.rounds_completed}/{planned}" if planned else run.rounds_completed,
        _num(run.best_accuracy) + (f" (round {best_round})" if best_round is not None else ""),
        _num(run.final_accuracy),
        _epsilon(run),
        _num(run.delta, "g") if run.private else "–",
        run.accountant if run.private else "–",
        _duration(run.wall_seconds),
        run.stop_reason,
    ]


def _runs_section(runs: Sequence[Run], out_dir: Path) -> list[str]:
    """The table of runs (its heading closes the header)."""
    return _table(_RUN_COLUMNS, [_run_row(i, run, out_dir) for i, run in enumerate(runs, 1)])


def _varying_section(runs: Sequence[Run], varying: Mapping[str, Sequence[Any]]) -> list[str]:
    """The settings that differ between several runs, the first `MAX_VARYING_COLUMNS` as
    columns and the rest named below."""
    if not varying or len(runs) <= 1:
        return []
    keys = list(varying)[:MAX_VARYING_COLUMNS]
    out = ["", "## Settings that differ between the runs", ""]
    out += _table(
        ["#", "run", *keys],
        [
            [i, run.label, *(_value(varying[k][i - 1]) for k in keys)]
            for i, run in enumerate(runs, 1)
        ],
    )
    if len(varying) > len(keys):
        rest = ", ".join(f"`{k}`" for k in list(varying)[len(keys) :])
        out += ["", f"Also differ: {rest}."]
    return out


def _fairness_section(runs: Sequence[Run]) -> list[str]:
    """Per-client fairness at the last evaluated round; nothing when no run has clients."""
    rows = []
    for i, run in enumerate(runs, 1):
        last = last_fairness(run)
        if last is None:
            continue
        rows.append(
            [
                i,
                run.label,
                int(last["round"]),
                int(last["clients"]),
                _num(last["acc_mean"]),
                _num(last["acc_std"]),
                _num(last["acc_worst"]),
                _num(last["acc_worst10"]),
                _num(last["psi"], ".4g"),
            ]
        )
    if not rows:
        return []
    out = [
        "",
        "## Fairness over clients at the last evaluated round",
        "",
        "Global model on each client's held-out records; clients without held-out "
        "records are left out. Ψ: variance of the clients' test losses weighted by "
        "training-set size.",
        "",
    ]
    header = ["#", "run", "round", "clients", "mean accuracy", "std", "worst", "worst 10%", "Ψ"]
    return out + _table(header, rows)


def _figures_section(figures: Sequence[Figure], constants: Mapping[str, float]) -> list[str]:
    """The drawn figures, then those not drawn (and why), then the constant columns."""
    out = ["", "## Figures", ""]
    missing = []
    for fig in figures:
        if fig.path is None:
            missing.append(f"- {fig.title}: not drawn ({fig.why_not})")
            continue
        out += [f"### {fig.title}", "", f"![{fig.title}]({fig.filename})", ""]
    if missing:
        out += ["Not drawn:", "", *missing, ""]
    if constants:
        consts = ", ".join(f"`{k}` = {v:g}" for k, v in constants.items())
        out += [f"Round columns with one value throughout (not drawn): {consts}.", ""]
    return out


def _releases_section(runs: Sequence[Run]) -> list[str]:
    """Each run's releases that its ε does not cover (summary.json's own list)."""
    out = [
        "## Releases outside the privacy accounting",
        "",
        "What each run published that its ε does not cover (summary.json `unaccounted_releases`).",
        "",
    ]
    for i, run in enumerate(runs, 1):
        out.append(f"### {i}. {_cell(run.label)}")
        out.append("")
        if not run.finished:
            out.append("- unknown: the run has no summary.json")
        elif run.unaccounted_releases:
            out += [f"- {_cell(item)}" for item in run.unaccounted_releases]
        else:
            out.append("- none")
        out.append("")
    return out


def _notes_section(runs: Sequence[Run], notes: Sequence[str]) -> list[str]:
    """The caller's notes and the unfinished runs; nothing when there are neither."""
    if not notes and all(r.finished for r in runs):
        return []
    out = ["## Notes", ""]
    out += [f"- {_cell(n)}" for n in notes]
    out += [
        f"- {_cell(r.label)}: no summary.json (interrupted or still running); figures "
        "come from its finished rounds"
        for r in runs
        if not r.finished
    ]
    out.append("")
    return out


def last_fairness(run: Run) -> dict[str, float] | None:
    """Fairness metrics at the run's last evaluated round (None without client rows)."""
    if run.clients is None:
        return None
    table = fairness_by_round(run.clients)
    if not table["round"].size:
        return None
    return {k: float(np.asarray(v)[-1]) for k, v in table.items()}
