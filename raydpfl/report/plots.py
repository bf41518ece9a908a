"""Figures of one or more runs (matplotlib, Agg canvas; imported lazily).

Every `draw_*` function takes the loaded runs and their shared `Style`s and returns a
`matplotlib.figure.Figure`, or None when there is nothing to draw (the caller records
why); `save_figure` writes it as a PNG. Drawing and saving are apart so that tests can
read titles, labels, legends and limits off the figure instead of off pixels. No pyplot:
figures live on an Agg canvas, so the process-wide matplotlib backend and state are
left alone.

Each quantity is drawn in one figure only: the per-client fairness metrics are in
fairness.png (from clients.parquet), so the `fair_*` columns the server also writes to
rounds.parquet are not drawn again in round_metrics.png. Axes and legends use the human
names of `raydpfl.report.labels`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.report.labels import column_label, param_label, param_title
from raydpfl.report.panels import RoundPanel, known_panels
from raydpfl.report.runs import Run, fairness_by_round, last_round_accuracies

__all__ = [
    "FIGURE_FILES",
    "RoundPanel",
    "Style",
    "draw_accuracy",
    "draw_best_accuracy",
    "draw_client_accuracy",
    "draw_epsilon",
    "draw_fairness",
    "draw_loss",
    "draw_round_metrics",
    "draw_sweep_params",
    "round_metric_panels",
    "save_figure",
    "styles_for",
]

DPI = 130
MAX_LABELLED = 10  # beyond this many runs only the best few are coloured and labelled
HIGHLIGHT = 6
MAX_PANELS = 12

FIGURE_FILES = (
    "accuracy.png",
    "loss.png",
    "epsilon.png",
    "client_accuracy.png",
    "fairness.png",
    "round_metrics.png",
    "best_accuracy.png",
    "sweep_params.png",
)


# ---- styles --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Style:
    """How one run is drawn in every figure (same colour everywhere)."""

    color: Any
    label: str | None  # None: drawn in grey without a legend entry (many runs)
    linewidth: float = 1.8
    alpha: float = 1.0
    zorder: int = 3


def styles_for(runs: Sequence[Run]) -> list[Style]:
    """One style per run: distinct colours; with many runs only the best few stand out."""
    from matplotlib import colormaps

    n = len(runs)
    if n <= MAX_LABELLED:
        cmap = colormaps["tab10"]
        return [Style(cmap(i % 10), r.label) for i, r in enumerate(runs)]
    best = sorted(
        range(n),
        key=lambda i: -(runs[i].best_accuracy if runs[i].best_accuracy is not None else -1.0),
    )[:HIGHLIGHT]
    cmap = colormaps["tab10"]
    rank = {i: k for k, i in enumerate(best)}
    return [
        Style(cmap(rank[i]), runs[i].label, 2.0, 1.0, 4)
        if i in rank
        else Style("0.6", None, 1.0, 0.5, 2)
        for i in range(n)
    ]


# ---- figure helpers --------------------------------------------------------------------------
def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: Path) -> Path:
    """Writes `fig` as a PNG (white background) and returns `path`."""
    fig.savefig(path, dpi=DPI, facecolor="white")
    return path


def _round_axis(ax, rounds: Sequence[np.ndarray]) -> None:
    """A round axis: "round" with integer ticks only (there is no round 2.5).

    When every point sits on one round, matplotlib would span ±0.1 around it in
    fractional ticks; the axis is padded to the rounds either side instead, so the one
    marker sits in the middle of an integer axis.
    """
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round", fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    finite = [r[np.isfinite(r)] for r in rounds if len(r)]
    allr = np.concatenate(finite) if finite else np.empty(0)
    if allr.size and allr.min() == allr.max():
        ax.set_xlim(allr[0] - 1, allr[0] + 1)


def _style_axes(ax, xlabel: str | None = None, ylabel: str | None = None, title: str = ""):
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=11)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=11)
    if title:
        ax.set_title(title, fontsize=12)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=9)


def _run_legend(fig, runs: Sequence[Run], styles: Sequence[Style], extra=()) -> None:
    """A legend of the runs (and `extra` (handle, label) pairs) below the axes."""
    from matplotlib.lines import Line2D

    handles, labels = [], []
    for _run, st in zip(runs, styles, strict=True):
        if st.label is not None:
            handles.append(Line2D([], [], color=st.color, lw=2.2))
            labels.append(st.label)
    hidden = sum(st.label is None for st in styles)
    if hidden:
        handles.append(Line2D([], [], color="0.6", lw=1.2, alpha=0.7))
        labels.append(f"{hidden} other runs")
    for h, lab in extra:
        handles.append(h)
        labels.append(lab)
    if not handles:
        return
    longest = max(len(s) for s in labels)
    ncols = max(1, min(len(labels), 3 if longest <= 30 else 2 if longest <= 48 else 1))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def _lines(ax, x, y, st: Style, *, linestyle: str = "-", marker_below: int = 40) -> None:
    if len(x) == 0:
        return
    marker = "o" if len(x) <= marker_below else None
    ax.plot(
        x,
        y,
        color=st.color,
        lw=st.linewidth,
        alpha=st.alpha,
        zorder=st.zorder,
        linestyle=linestyle,
        marker=marker,
        markersize=3.5 if len(x) > 1 else 6,
    )


def _maybe_log(ax, values: Sequence[np.ndarray], ratio: float = 50.0) -> bool:
    """Log y scale when all finite values are > 0 and span more than `ratio`."""
    finite = [v[np.isfinite(v)] for v in values if len(v)]
    if not finite:
        return False
    allv = np.concatenate(finite)
    if allv.size and (allv > 0).all() and allv.max() / allv.min() > ratio:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        if allv.max() / allv.min() < 100:  # under two decades: label minor ticks 2 and 5
            ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
        else:
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
        return True
    return False


def _two_and_five(value: float, _pos: Any = None) -> str:
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(mantissa, 6) in (2.0, 5.0) else ""


def accuracy_limits(values: Sequence[np.ndarray]) -> tuple[float, float] | None:
    """An accuracy axis's range when the values are fractions (else None): from just
    below the lowest tenth they reach to just above the highest value, within [0, 1]
    padded, so runs that all score 0.85-0.95 are not squeezed into a tenth of the axis."""
    finite = [v[np.isfinite(v)] for v in values if len(v)]
    allv = np.concatenate(finite) if finite else np.empty(0)
    if not (allv.size and allv.min() >= 0 and allv.max() <= 1):
        return None
    lo = max(-0.02, math.floor(allv.min() * 10) / 10 - 0.05)
    return lo, min(1.02, max(allv.max() + 0.05, lo + 0.1))


def _accuracy_limits(ax, values: Sequence[np.ndarray]) -> None:
    limits = accuracy_limits(values)
    if limits is not None:
        ax.set_ylim(*limits)


def identical_note(
    series: Sequence[tuple[np.ndarray, np.ndarray]], styles: Sequence[Style]
) -> str:
    """Names the labelled runs whose curves coincide, or "".

    Curves that are equal point for point hide each other (the last drawn covers the
    rest): sweep trials that differ only in the learning rate spend the same ε and draw
    the same batch sizes, so the figure would show one trial's colour and no sign of the
    others. The note goes into the title, where it covers no data.
    """
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(series):
        if len(x) == 0 or styles[i].label is None:
            continue
        for group in groups:
            x0, y0 = series[group[0]]
            if np.array_equal(x, x0) and np.array_equal(y, y0, equal_nan=True):
                group.append(i)
                break
        else:
            groups.append([i])
    same = [g for g in groups if len(g) > 1]
    if not same:
        return ""
    labelled = sum(
        st.label is not None and len(x) > 0 for st, (x, _) in zip(styles, series, strict=True)
    )
    if len(same) == 1 and len(same[0]) == labelled:
        return f"(one curve: the same for all {labelled} runs)"
    names = "; ".join(" = ".join(str(styles[i].label) for i in g) for g in same)
    return _wrap(f"(curves drawn over each other: {names})", 90)


# ---- per-round curves ------------------------------------------------------------------------
def _curve_figure(
    runs: Sequence[Run],
    styles: Sequence[Style],
    column: str,
    *,
    title: str,
    accuracy: bool = False,
):
    series = [r.evaluated(column) for r in runs]
    if not any(len(x) for x, _ in series):
        return None
    fig = _figure(9, 5.6)
    ax = fig.add_subplot()
    order = sorted(range(len(runs)), key=lambda i: styles[i].zorder)
    for i in order:
        x, y = series[i]
        _lines(ax, x, y, styles[i])
    ylabel = column_label(column)
    note = identical_note(series, styles)
    _style_axes(ax, None, ylabel, f"{title}\n{note}" if note else title)
    _round_axis(ax, [x for x, _ in series])
    if accuracy:
        _accuracy_limits(ax, [y for _, y in series])
    elif _maybe_log(ax, [y for _, y in series]):
        ax.set_ylabel(f"{ylabel} (log scale)", fontsize=11)
    _run_legend(fig, runs, styles)
    return fig


def draw_accuracy(runs: Sequence[Run], styles: Sequence[Style]):
    """Central test accuracy at every evaluated round, all runs overlaid."""
    return _curve_figure(
        runs,
        styles,
        "test_accuracy",
        title="Test accuracy of the global model (central test set)",
        accuracy=True,
    )


def draw_loss(runs: Sequence[Run], styles: Sequence[Style]):
    """Central test loss at every evaluated round."""
    return _curve_figure(
        runs, styles, "test_loss", title="Test loss of the global model (central test set)"
    )


def draw_epsilon(runs: Sequence[Run], styles: Sequence[Style]):
    """ε spent (largest and mean over clients) per round; non-private runs are left out."""
    from matplotlib.lines import Line2D

    idx = [i for i, r in enumerate(runs) if r.private and len(r.evaluated("epsilon_max")[0])]
    if not idx:
        return None
    sub_runs = [runs[i] for i in idx]
    sub_styles = [styles[i] for i in idx]
    fig = _figure(9, 5.6)
    ax = fig.add_subplot()
    budgets = {r.epsilon_budget for r in sub_runs if r.epsilon_budget is not None}
    for run, st in sorted(zip(sub_runs, sub_styles, strict=True), key=lambda p: p[1].zorder):
        _lines(ax, *run.evaluated("epsilon_max"), st)
        _lines(ax, *run.evaluated("epsilon_mean"), st, linestyle="--")
    extra = [
        (Line2D([], [], color="black", lw=1.8), column_label("epsilon_max")),
        (Line2D([], [], color="black", lw=1.8, ls="--"), column_label("epsilon_mean")),
    ]
    for budget in sorted(budgets):
        ax.axhline(budget, color="0.3", lw=1.2, ls=":")
        if len(budgets) > 1:
            ax.annotate(
                f"budget {budget:g}",
                (1.0, budget),
                xycoords=("axes fraction", "data"),
                xytext=(-4, 3),
                textcoords="offset points",
                ha="right",
                fontsize=8,
                color="0.3",
            )
    if len(budgets) == 1:
        extra.append(
            (Line2D([], [], color="0.3", lw=1.2, ls=":"), f"budget ε = {next(iter(budgets)):g}")
        )
    elif budgets:
        extra.append((Line2D([], [], color="0.3", lw=1.2, ls=":"), "ε budgets"))
    deltas = {r.delta for r in sub_runs if r.delta is not None}
    at = f" at δ = {next(iter(deltas)):g}" if len(deltas) == 1 else ""
    skipped = len(runs) - len(sub_runs)
    title = "Privacy spent per client" + at
    if skipped:
        title += f"\n({skipped} non-private run{'s' if skipped > 1 else ''} not shown)"
    note = identical_note([r.evaluated("epsilon_max") for r in sub_runs], sub_styles)
    if note:
        title += f"\n{note}"
    _style_axes(ax, None, "ε spent (record-level, per client)", title)
    _round_axis(ax, [run.evaluated("epsilon_max")[0] for run in sub_runs])
    ax.set_ylim(bottom=0)
    _run_legend(fig, sub_runs, sub_styles, extra)
    return fig


# ---- per-client figures ----------------------------------------------------------------------
def _wrap(text: str, width: int = 34) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def draw_client_accuracy(runs: Sequence[Run], styles: Sequence[Style]):
    """Distribution of per-client test accuracy at each run's last evaluated round."""
    data, labels, colors = [], [], []
    for run, st in zip(runs, styles, strict=True):
        if run.clients is None:
            continue
        rnd, acc = last_round_accuracies(run.clients)
        if acc.size == 0:
            continue
        data.append(acc)
        labels.append(f"{_wrap(run.label)}\n(round {rnd}, {acc.size} clients)")
        colors.append(st.color if st.label is not None else "0.6")
    if not data:
        return None
    n = len(data)
    fig = _figure(9, max(3.2, 1.2 + 0.75 * n))
    ax = fig.add_subplot()
    pos = np.arange(n, 0, -1)  # first run on top
    box_args: dict[str, Any] = {
        "positions": pos,
        "widths": 0.55,
        "showfliers": False,
        "patch_artist": True,
        "medianprops": {"color": "black", "lw": 1.5},
    }
    try:  # matplotlib >= 3.10
        box = ax.boxplot(data, orientation="horizontal", **box_args)
    except TypeError:  # older: the since-deprecated `vert`
        box = ax.boxplot(data, vert=False, **box_args)
    for patch, c in zip(box["boxes"], colors, strict=True):
        patch.set_facecolor(c)
        patch.set_alpha(0.35)
    rng = np.random.default_rng(0)
    for p, acc, c in zip(pos, data, colors, strict=True):
        jitter = rng.uniform(-0.18, 0.18, size=acc.size)
        ax.scatter(acc, p + jitter, s=14, color=c, alpha=0.8, edgecolors="none", zorder=4)
        ax.scatter(
            [acc.mean()], [p], marker="D", s=36, color="white", edgecolors="black", zorder=5
        )
    ax.set_yticks(pos, labels, fontsize=9)
    ax.set_ylim(0.4, n + 0.6)
    _style_axes(
        ax,
        "client test accuracy (global model on each client's held-out records)",
        None,
        "Per-client test accuracy at the last evaluated round\n"
        "(box: quartiles, dots: clients, ◇: mean over clients)",
    )
    limits = accuracy_limits(data)
    if limits is not None:
        ax.set_xlim(*limits)
    return fig


def draw_fairness(runs: Sequence[Run], styles: Sequence[Style]):
    """Fairness over clients per evaluated round: accuracy spread, worst clients, Ψ."""
    tables = []
    for run, st in zip(runs, styles, strict=True):
        if run.clients is None:
            continue
        table = fairness_by_round(run.clients)
        if table["round"].size:
            tables.append((run, st, table))
    if not tables:
        return None
    panels = [
        ("acc_std", "std of client accuracy", "Spread of client accuracy (lower is fairer)"),
        ("acc_worst", "accuracy", "Worst client's accuracy"),
        ("acc_worst10", "accuracy", "Mean accuracy of the worst 10% of clients"),
        ("psi", "Ψ", "Ψ: weighted variance of client test losses"),
    ]
    fig = _figure(11, 7.8)
    axes = fig.subplots(2, 2, sharex=True).ravel()
    for ax, (key, ylabel, title) in zip(axes, panels, strict=True):
        values = []
        for _run, st, table in sorted(tables, key=lambda t: t[1].zorder):
            y = table[key].copy()
            y[~np.isfinite(y)] = np.nan
            values.append(y)
            _lines(ax, table["round"], y, st)
        _style_axes(ax, None, ylabel, title)
        _round_axis(ax, [t[2]["round"] for t in tables])
        if key == "psi":
            if _maybe_log(ax, values, ratio=20):
                ax.set_ylabel("Ψ (log scale)", fontsize=11)
            if any((~np.isfinite(t[2]["psi"]) & ~np.isnan(t[2]["psi"])).any() for t in tables):
                ax.set_title(title + "\n(diverged rounds, Ψ = ∞, not drawn)", fontsize=12)
        elif key != "acc_std":
            _accuracy_limits(ax, values)
        for a in axes[:2]:
            a.tick_params(labelbottom=True)
    fig.suptitle(
        "Fairness over clients (global model on each client's held-out records; "
        "Ψ weighted by training-set size)",
        fontsize=12,
    )
    _run_legend(fig, [t[0] for t in tables], [t[1] for t in tables])
    return fig


# ---- algorithm-specific round metrics -------------------------------------------------------
#: rounds.parquet columns drawn by the other figures (or bookkeeping), never in round_metrics.
STANDARD_COLUMNS = frozenset(
    {
        "round",
        "test_accuracy",
        "test_loss",
        "epsilon_max",
        "epsilon_mean",
        "wall_seconds",
        "updates_received",
        "clients_trained",
        "client_accuracy_mean",
        "client_accuracy_std",
    }
)
#: The server's per-client fairness columns: fairness.png draws them from clients.parquet.
FAIRNESS_PREFIX = "fair_"


def _drawn_elsewhere(column: str) -> bool:
    """True for columns another figure already shows, so no panel repeats them."""
    return column in STANDARD_COLUMNS or column.startswith(FAIRNESS_PREFIX)


def _varies(runs: Sequence[Run], column: str) -> bool:
    values = [r.rounds[column] for r in runs if column in r.rounds]
    allv = np.concatenate(values) if values else np.empty(0)
    allv = allv[~np.isnan(allv)]
    return allv.size > 0 and not np.all(allv == allv[0])


def round_metric_panels(runs: Sequence[Run]) -> tuple[list[RoundPanel], dict[str, float]]:
    """Panels for the optional rounds.parquet columns present in any run.

    Known columns (local steps and τ, the panels papers and plug-ins register through
    `raydpfl.report.panels.register_round_panel`, σ schedules, selection, clusters,
    training statistics) are grouped; any other numeric column gets a panel of its own, named by
    `column_label`. Columns with one value throughout (every run, every round) are not
    drawn, nor are columns another figure shows (`_drawn_elsewhere`).

    Returns:
        (panels, constants): panels to draw (at most MAX_PANELS, known ones first) and
        the constant columns with their value.
    """
    present: list[str] = []
    for run in runs:
        for c in run.rounds:
            if not _drawn_elsewhere(c) and c not in present:
                present.append(c)
    constants: dict[str, float] = {}
    varying = []
    for c in present:
        if _varies(runs, c):
            varying.append(c)
        else:
            vals = np.concatenate([r.rounds[c] for r in runs if c in r.rounds])
            vals = vals[~np.isnan(vals)]
            if vals.size:
                constants[c] = float(vals[0])
    panels: list[RoundPanel] = []
    used: set[str] = set()
    for panel in known_panels():
        cols = tuple(c for c in varying if panel.matches(c) and c not in used)
        if panel.columns:  # keep the panel's own column order
            cols = tuple(c for c in panel.columns if c in cols) + tuple(
                c for c in cols if c not in panel.columns
            )
        if cols:
            panels.append(
                RoundPanel(panel.title, panel.ylabel, cols, names=panel.names, log_ok=panel.log_ok)
            )
            used.update(cols)
    for c in sorted(c for c in varying if c not in used):
        label = column_label(c)
        panels.append(RoundPanel(_sentence_case(label), label, (c,)))
    return panels, constants


def _sentence_case(label: str) -> str:
    """A label as a panel title: first letter capitalised when the first word is a plain
    lower-case word ("my value" → "My value"), never a symbol or name (τ, q-FFL, ε)."""
    first = label.split(" ", 1)[0]
    if first.isascii() and first.isalpha() and first.islower():
        return label[:1].upper() + label[1:]
    return label


_LINESTYLES = ("-", "--", ":", "-.")


def draw_round_metrics(runs: Sequence[Run], styles: Sequence[Style], panels: Sequence[RoundPanel]):
    """Trajectories of the algorithm-specific and training columns, one panel per group."""
    from matplotlib.lines import Line2D

    panels = list(panels)[:MAX_PANELS]
    if not panels:
        return None
    ncols = 1 if len(panels) == 1 else 2 if len(panels) <= 6 else 3
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(5.2 * ncols if ncols > 1 else 9, 3.4 * nrows + 1.2)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False).ravel())
    drawn: list[int] = []
    for ax, panel in zip(axes, panels, strict=False):
        values = []
        xs = []
        shown: set[str] = set()
        for i in sorted(range(len(runs)), key=lambda i: styles[i].zorder):
            run, st = runs[i], styles[i]
            plotted: list[np.ndarray] = []
            for k, col in enumerate(panel.columns):
                if col not in run.rounds:
                    continue
                y = run.rounds[col]
                if any(np.array_equal(y, p, equal_nan=True) for p in plotted):
                    continue  # two columns with the same values (local_steps = τ): draw once
                plotted.append(y)
                shown.add(col)
                ok = np.isfinite(y)
                values.append(y[ok])
                xs.append(run.round_index[ok])
                _lines(ax, run.round_index[ok], y[ok], st, linestyle=_LINESTYLES[k % 4])
            if plotted and i not in drawn:
                drawn.append(i)
        notes = [
            identical_note(
                [
                    (r.round_index, r.rounds[col])
                    if col in r.rounds
                    else (np.empty(0), np.empty(0))
                    for r in runs
                ],
                styles,
            )
            for col in panel.columns
        ]
        note = next((n for n in notes if n), "")
        _style_axes(ax, None, panel.ylabel, f"{panel.title}\n{note}" if note else panel.title)
        _round_axis(ax, xs)
        ax.title.set_fontsize(11)
        if panel.log_ok and _maybe_log(ax, values, ratio=100):
            ax.set_ylabel(f"{panel.ylabel} (log)", fontsize=11)
        if len(panel.columns) > 1:
            names = panel.names or {}
            keys = [k for k, c in enumerate(panel.columns) if c in shown]
            ax.legend(
                [Line2D([], [], color="black", lw=1.5, ls=_LINESTYLES[k % 4]) for k in keys],
                [names.get(panel.columns[k], column_label(panel.columns[k])) for k in keys],
                fontsize=8,
                loc="best",
                framealpha=0.8,
            )
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("Algorithm and training metrics per round", fontsize=13)
    drawn.sort()
    _run_legend(fig, [runs[i] for i in drawn], [styles[i] for i in drawn])
    return fig


# ---- comparisons and sweeps -----------------------------------------------------------------
def draw_best_accuracy(runs: Sequence[Run], styles: Sequence[Style]):
    """Best and final test accuracy per run (trial), best first."""
    rows = [(r, st) for r, st in zip(runs, styles, strict=True) if r.best_accuracy is not None]
    if len(rows) < 2:
        return None
    rows.sort(key=lambda p: -(p[0].best_accuracy or 0.0))
    n = len(rows)
    fig = _figure(9, max(3.0, 1.3 + 0.42 * n))
    ax = fig.add_subplot()
    pos = np.arange(n, 0, -1)
    best = np.array([r.best_accuracy for r, _ in rows], dtype=float)
    final = np.array(
        [r.final_accuracy if r.final_accuracy is not None else np.nan for r, _ in rows]
    )
    colors = [st.color if st.label is not None else "0.6" for _, st in rows]
    ax.barh(pos, best, height=0.65, color=colors, alpha=0.75)
    ax.scatter(final, pos, marker="|", s=220, color="black", zorder=4)
    for p, b in zip(pos, best, strict=True):
        ax.text(b, p, f" {b:.4f}", va="center", ha="left", fontsize=8)
    ax.set_yticks(pos, [_wrap(r.label, 40) for r, _ in rows], fontsize=8 if n > 15 else 9)
    ax.set_ylim(0.4, n + 0.6)
    hi = float(np.nanmax(np.concatenate([best, final])))
    ax.set_xlim(0, hi * 1.12 if hi > 0 else 1)
    sweeps = {r.sweep for r, _ in rows}
    what = "trial" if None not in sweeps else "run"
    _style_axes(
        ax, "best test accuracy (central test set)", None, f"Best test accuracy per {what}"
    )
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig.legend(
        [Patch(color="0.6", alpha=0.75), Line2D([], [], color="black", marker="|", ls="", ms=14)],
        ["best test accuracy (value printed)", "final test accuracy"],
        loc="outside lower center",
        ncols=2,
        fontsize=9,
        frameon=False,
    )
    return fig


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _numeric_params(
    runs: Sequence[Run], varying: Mapping[str, Sequence[Any]]
) -> list[tuple[str, list[float | None]]]:
    """The varying config keys with at least two distinct numbers, swept keys first (the
    ones the sweep searched, before values that merely came out different, e.g. a
    calibrated σ); seeds are left out."""
    swept = [k for r in runs for k in r.swept]
    keys = sorted(varying, key=lambda k: (k not in swept, swept.index(k) if k in swept else 0))
    params = []
    for key in keys:
        if key.endswith(".seed"):
            continue
        nums = [_as_number(v) for v in varying[key]]
        if sum(v is not None for v in nums) >= 2 and len({v for v in nums if v is not None}) > 1:
            params.append((key, nums))
    return params


def _point_name(run: Run, key: str) -> str:
    """What a point on `key`'s axis is: the trial's other swept values (its x already
    says `key`'s), or the run's label when it is no sweep trial."""
    if not run.swept:
        return run.label
    return param_label({k: v for k, v in run.swept.items() if k != key})


def draw_sweep_params(
    runs: Sequence[Run],
    styles: Sequence[Style],
    varying: Mapping[str, Sequence[Any]],
    max_params: int = 4,
):
    """Best accuracy against each numeric hyperparameter that varies across the trials."""
    params = _numeric_params(runs, varying)[:max_params]
    if not params:
        return None
    best = [r.best_accuracy for r in runs]
    fig = _figure(4.6 * len(params) + 0.6, 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(params), sharey=True, squeeze=False).ravel())
    for ax, (key, nums) in zip(axes, params, strict=True):
        xs, ys, cs, names = [], [], [], []
        for x, y, st, run in zip(nums, best, styles, runs, strict=True):
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
                cs.append(st.color if st.label is not None else "0.6")
                names.append(_point_name(run, key))
        ax.scatter(xs, ys, c=cs, s=46, edgecolors="black", linewidths=0.5, zorder=3)
        if len(xs) <= 10:
            for x, y, name in zip(xs, ys, names, strict=True):
                if not name:
                    continue
                ax.annotate(
                    _wrap(name, 24),
                    (x, y),
                    xytext=(5, 4),
                    textcoords="offset points",
                    fontsize=7,
                    color="0.25",
                )
            ax.margins(x=0.15, y=0.12)
        xa = np.asarray(xs)
        if (xa > 0).all() and xa.max() / xa.min() >= 20:
            ax.set_xscale("log")
        _style_axes(ax, param_title(key), None)
    axes[0].set_ylabel("best test accuracy", fontsize=11)
    fig.suptitle("Best test accuracy against the hyperparameters that vary", fontsize=12)
    return fig
