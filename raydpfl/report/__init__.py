"""`raydpfl report`: figures and a Markdown summary of run (or sweep) directories.

    build_report(["runs/a", "runs/b"], out="reports/ab")

writes into the output directory

    report.md             tables comparing the runs, links to the figures
    accuracy.png          test accuracy per evaluated round, runs overlaid
    loss.png              test loss per evaluated round
    epsilon.png           ε spent (largest and mean over clients) per round
    client_accuracy.png   per-client accuracy at the last evaluated round
    fairness.png          accuracy spread, worst client, worst 10%, Ψ per round
    round_metrics.png     algorithm-specific columns (τ, μ, σ, λ, ...) per round; the
                          fairness columns (fair_*) are fairness.png's alone
    best_accuracy.png     best and final accuracy per run / sweep trial
    sweep_params.png      best accuracy against the hyperparameters that vary

(a figure with nothing to show is not drawn; report.md says why). Sweep trials are named
by their swept values (`lr=0.05, clip=1`), and axes by human names with units
(`raydpfl.report.labels`). A directory with no
summary.json or rounds.parquet of its own but with run directories below it is a sweep:
all its trials are reported, ranked by best accuracy. matplotlib is imported only when a
report is drawn, so importing this package stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydpfl.report.runs import ReportError, Run, collect_runs, is_run_dir, load_run

__all__ = [
    "Report",
    "ReportError",
    "Run",
    "build_report",
    "collect_runs",
    "draw_figures",
    "load_run",
]

REPORT_FILE = "report.md"


@dataclass(frozen=True)
class Report:
    """What `build_report` wrote."""

    out_dir: Path
    markdown: Path
    figures: list[Path]
    runs: list[Run]


def default_out_dir(paths: Sequence[str | Path]) -> Path:
    """`<RUN_DIR>/report` for a single input; several inputs need an explicit --out."""
    if len(paths) != 1:
        raise ReportError("--out is required when reporting on several directories")
    return Path(paths[0]) / "report"


def _prepare_out_dir(out: Path) -> None:
    """Creates `out`, or clears a previous report there; refuses any other non-empty dir."""
    from raydpfl.report.plots import FIGURE_FILES

    if out.exists() and not out.is_dir():
        raise ReportError(f"output {str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if is_run_dir(out) or not (out / REPORT_FILE).is_file():
            raise ReportError(
                f"output directory {str(out)!r} is not empty and holds no earlier report; "
                "choose another --out"
            )
        for name in (REPORT_FILE, *FIGURE_FILES):  # only files a report writes
            target = out / name
            if target.is_file():
                target.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create output directory {str(out)!r}: {e}") from None


def build_report(paths: Sequence[str | Path], out: str | Path | None = None) -> Report:
    """Draws the figures and writes report.md for run and/or sweep directories.

    Args:
        paths: Run directories (written by `raydpfl run`) or sweep directories (holding
            run directories one or two levels down).
        out: Output directory; default `<paths[0]>/report` when one path is given. It
            must not exist, be empty or hold an earlier report (whose files are replaced).

    Returns:
        The output directory, report.md and the figures written.

    Raises:
        ReportError: An input is not a run or sweep directory or cannot be read, or the
            output directory cannot be used.
    """
    runs, notes = _collect_ranked(paths)
    notes = [*notes, *_sweep_notes(paths)]
    out_dir = Path(out) if out is not None else default_out_dir(paths)
    for run in runs:
        if out_dir.resolve() == run.path.resolve():
            raise ReportError(f"output directory {str(out_dir)!r} is a run directory")
    _prepare_out_dir(out_dir)

    from raydpfl.report import plots
    from raydpfl.report.summary import Figure, render_markdown

    plan, panels, constants, varying = _plan_figures(runs)
    figures = []
    for planned in plan:  # one figure at a time: drawn, saved, let go
        fig = planned.draw()
        path = plots.save_figure(fig, out_dir / planned.filename) if fig is not None else None
        figures.append(Figure(planned.title, planned.filename, path, planned.why_not))
    if len(panels) > plots.MAX_PANELS:
        cut = ", ".join(f"`{c}`" for p in panels[plots.MAX_PANELS :] for c in p.columns)
        notes = [*notes, f"round_metrics.png shows {plots.MAX_PANELS} panels; not drawn: {cut}"]
    text = render_markdown(
        runs, out_dir, figures, varying=varying, constants=constants, notes=notes
    )
    markdown = out_dir / REPORT_FILE
    markdown.write_text(text, encoding="utf-8")
    return Report(
        out_dir=out_dir,
        markdown=markdown,
        figures=[f.path for f in figures if f.path is not None],
        runs=runs,
    )


def _collect_ranked(paths: Sequence[str | Path]) -> tuple[list[Run], list[str]]:
    """`collect_runs`, with sweep trials ranked by best accuracy (stable, so ties keep
    their path order): a sweep is read best-first, in tables and legends alike."""
    runs, notes = collect_runs(paths)
    if any(r.sweep is not None for r in runs):
        runs.sort(key=lambda r: -(r.best_accuracy if r.best_accuracy is not None else -1.0))
    return runs, notes


@dataclass(frozen=True)
class _PlannedFigure:
    """A figure the report would draw: its report.md title, file, drawing and excuse."""

    title: str
    filename: str
    draw: Callable[[], Any]  # returns a matplotlib Figure, or None: nothing to draw
    why_not: str


def _plan_figures(runs: Sequence[Run]) -> tuple[list[_PlannedFigure], list, dict, dict]:
    """Which figures `runs` get, in report order, with what report.md says beside them.

    Returns:
        (plan, round-metric panels, constant round columns, varying config keys).
    """
    from raydpfl.report import plots
    from raydpfl.report.runs import varying_config_keys

    styles = plots.styles_for(runs)
    varying = varying_config_keys(runs)
    panels, constants = plots.round_metric_panels(runs)
    no_clients = "no run has per-client rows in clients.parquet"
    plan = [
        _PlannedFigure(
            "Test accuracy per round",
            "accuracy.png",
            lambda: plots.draw_accuracy(runs, styles),
            "no evaluated round",
        ),
        _PlannedFigure(
            "Test loss per round",
            "loss.png",
            lambda: plots.draw_loss(runs, styles),
            "no evaluated round",
        ),
        _PlannedFigure(
            "Privacy spent per round",
            "epsilon.png",
            lambda: plots.draw_epsilon(runs, styles),
            "no private run",
        ),
        _PlannedFigure(
            "Per-client accuracy at the last evaluated round",
            "client_accuracy.png",
            lambda: plots.draw_client_accuracy(runs, styles),
            no_clients,
        ),
        _PlannedFigure(
            "Fairness over clients per round",
            "fairness.png",
            lambda: plots.draw_fairness(runs, styles),
            no_clients,
        ),
        _PlannedFigure(
            "Algorithm and training metrics per round",
            "round_metrics.png",
            lambda: plots.draw_round_metrics(runs, styles, panels),
            "no optional rounds.parquet column changes between rounds",
        ),
    ]
    if len(runs) > 1:
        every_run_a_trial = all(r.sweep is not None for r in runs)
        plan.append(
            _PlannedFigure(
                "Best test accuracy per trial"
                if every_run_a_trial
                else "Best test accuracy per run",
                "best_accuracy.png",
                lambda: plots.draw_best_accuracy(runs, styles),
                "fewer than two runs have an evaluated round",
            )
        )
        if any(r.sweep is not None for r in runs):
            plan.append(
                _PlannedFigure(
                    "Best test accuracy against the swept hyperparameters",
                    "sweep_params.png",
                    lambda: plots.draw_sweep_params(runs, styles, varying),
                    "no numeric config value differs between the trials",
                )
            )
    return plan, panels, constants, varying


def draw_figures(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The figures `build_report(paths)` would save, drawn but not written: filename →
    matplotlib Figure (None where there is nothing to draw). Tests and notebooks read
    titles, labels, legends and limits off them rather than off pixels."""
    runs, _notes = _collect_ranked(paths)
    plan, *_ = _plan_figures(runs)
    return {planned.filename: planned.draw() for planned in plan}


def _sweep_notes(paths: Sequence[str | Path]) -> list[str]:
    """One line per `raydpfl tune` sweep: its best trial and the privacy of picking it."""
    import json

    lines = []
    for raw in paths:
        path = Path(raw) / "sweep_summary.json"
        if not path.is_file():
            continue
        try:
            s = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            lines.append(f"sweep {raw}: unreadable sweep_summary.json ({e})")
            continue
        text = (
            f"sweep {Path(raw).name}: {s.get('trials')} trials "
            f"({s.get('trials_completed')} completed, {s.get('trials_stopped_early')} stopped "
            f"early, {s.get('trials_failed')} failed); best trial {s.get('best_trial')} with "
            f"{s.get('metric')} = {_fmt(s.get('best_metric'))}"
        )
        privacy = s.get("privacy") or {}
        if privacy.get("epsilon_sweep") is not None:
            text += (
                f"; epsilon {privacy['epsilon_per_trial_max']:.4g} per trial (tuning excluded), "
                f"{privacy['epsilon_sweep']:.4g} for the whole sweep "
                f"({privacy['epsilon_sweep_label']})"
            )
        lines.append(text)
    return lines


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
