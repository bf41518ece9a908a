"""`raydpfl report`: figures and report.md from run and sweep directories.

Run directories are written here with pandas in the layout of
`raydpfl.simulation.outputs.RunWriter`, so no training is needed.
"""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from raydpfl.cli.main import main
from raydpfl.report import ReportError, build_report, collect_runs, draw_figures, load_run
from raydpfl.report.plots import round_metric_panels
from raydpfl.report.runs import fairness_by_round
from raydpfl.simulation.fairness import fairness_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SINGLE_RUN_FIGURES = [
    "accuracy.png",
    "loss.png",
    "epsilon.png",
    "client_accuracy.png",
    "fairness.png",
    "round_metrics.png",
]
FAIR_COLUMNS = [  # what the server writes beside each evaluated round (simulation/server.py)
    "fair_psi",
    "fair_loss_mean",
    "fair_acc_mean",
    "fair_acc_var",
    "fair_acc_std",
    "fair_acc_mean_weighted",
    "fair_acc_var_weighted",
    "fair_acc_std_weighted",
    "fair_acc_worst",
    "fair_acc_worst10",
]
CLIENT_COLUMNS = [
    "round",
    "client_id",
    "test_accuracy",
    "test_loss",
    "epsilon",
    "num_examples",
    "num_test_examples",
]


def make_run(
    path: Path,
    *,
    name: str = "exp",
    algorithm: str = "dp_fedavg",
    seed: int = 0,
    rounds: int = 8,
    eval_every: int = 1,
    private: bool = True,
    clients: bool | None = True,
    lr: float = 0.5,
    clip: float = 1.0,
    acc_offset: float = 0.0,
    ali: bool = False,
    fair: bool = False,
    summary: bool = True,
) -> dict:
    """Writes a run directory; returns its summary dict. clients=None: no clients.parquet;
    fair=True: the server's fair_* columns in rounds.parquet (at evaluated rounds)."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    r = np.arange(1, rounds + 1)
    evaluated = (r % eval_every == 0) | (r == rounds)
    acc = np.where(evaluated, np.minimum(0.3 + 0.07 * r + acc_offset, 0.95), np.nan)
    loss = np.where(evaluated, 2.0 / r, np.nan)
    eps = 0.6 * r if private else np.full(rounds, np.inf)
    table = {
        "round": r,
        "test_accuracy": acc,
        "test_loss": loss,
        "epsilon_max": eps,
        "epsilon_mean": eps * 0.7,
        "local_steps": np.full(rounds, 5.0),
        "clients_trained": np.full(rounds, 4),
        "clients_refused": np.zeros(rounds, dtype=int),
        "updates_received": np.full(rounds, 4),
        "clipped_fraction": rng.uniform(0.2, 0.6, rounds),
        "wall_seconds": np.full(rounds, 0.5),
    }
    if ali:
        table.update(
            tau=np.array([1.0, 12, 20, 17, 9, 30, 25, 11][:rounds]),
            tau_next=np.array([12.0, 20, 17, 9, 30, 25, 11, 11][:rounds]),
            mu=np.r_[rng.uniform(0.5, 50, rounds - 1), np.nan],
            iterations_done=np.cumsum([1.0, 12, 20, 17, 9, 30, 25, 11][:rounds]),
        )
    if fair:
        for key in FAIR_COLUMNS:
            table[key] = np.where(evaluated, rng.uniform(0.1, 0.9, rounds), np.nan)
    pd.DataFrame(table).to_parquet(path / "rounds.parquet")
    if clients is not None:
        rows = []
        if clients:
            for rnd in r[evaluated]:
                for c in range(10):
                    rows.append(
                        {
                            "round": int(rnd),
                            "client_id": c,
                            "test_accuracy": float(rng.uniform(0.1, 1.0)),
                            "test_loss": float(rng.uniform(0.2, 3.0)),
                            "epsilon": float(eps[rnd - 1]),
                            "num_examples": 100 + 50 * c,
                            "num_test_examples": 25,
                        }
                    )
        pd.DataFrame(rows, columns=CLIENT_COLUMNS).astype(
            {"round": "int32", "client_id": "int32", "num_examples": "int64"}
        ).to_parquet(path / "clients.parquet")
    config = {
        "experiment": {
            "name": name,
            "data": {"dataset": "synthetic"},
            "algorithm": {"name": algorithm, "rounds": rounds, "lr": lr},
            "privacy": {"accountant": "rdp", "epsilon": 10.0, "delta": 1e-5, "clip_norm": clip},
        },
        "runtime": {"seed": seed, "output": "runs"},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    finite = acc[np.isfinite(acc)]
    data = {
        "final_test_accuracy": float(finite[-1]),
        "best_test_accuracy": float(finite.max()),
        "epsilon_max": float(eps[-1]) if private else None,
        "epsilon_mean": float(eps[-1] * 0.7) if private else None,
        "delta": 1e-5 if private else None,
        "accountant": "rdp" if private else None,
        "private": private,
        "rounds_completed": rounds,
        "rounds_planned": rounds,
        "stop_reason": "completed all rounds",
        "wall_seconds": 0.5 * rounds,
        "model_sha256": "0" * 64,
        "unaccounted_releases": [f"client_dataset_sizes of {name}"],
        "experiment": name,
        "algorithm": algorithm,
        "dataset": "synthetic",
        "seed": seed,
        "privacy": {"epsilon_budget": 10.0, "delta": 1e-5} if private else {},
    }
    if summary:
        (path / "summary.json").write_text(json.dumps(data), encoding="utf-8")
    return data


def assert_valid_png(path: Path, min_bytes: int = 8_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) >= min_bytes, (path, len(data))
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width >= 400 and height >= 250, (path, width, height)
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.std() > 0.01, f"{path} is blank"


# ---- one run -------------------------------------------------------------------------------
def test_single_run_report_has_every_figure_and_the_runs_numbers(tmp_path):
    run = tmp_path / "run"
    s = make_run(run, name="alpha", algorithm="ali_dpfl", eval_every=2, ali=True)

    report = build_report([run])

    assert report.out_dir == run / "report"
    for name in SINGLE_RUN_FIGURES:
        assert_valid_png(run / "report" / name)
    text = (run / "report" / "report.md").read_text()
    for figure in SINGLE_RUN_FIGURES:
        assert f"]({figure})" in text
    for words in (
        "alpha",
        "ali_dpfl",
        "synthetic",
        f"{s['best_test_accuracy']:.4f} (round 8)",
        f"{s['final_test_accuracy']:.4f}",
        f"{s['epsilon_max']:.4g}",
        "1e-05",
        "rdp",
        "4.0 s",
        "completed all rounds",
        "client_dataset_sizes of alpha",
        "8/8",
    ):
        assert words in text, words


def test_round_metrics_draw_the_algorithm_columns_and_list_constant_ones(tmp_path):
    run = tmp_path / "run"
    make_run(run, algorithm="ali_dpfl", ali=True)

    build_report([run])

    text = (run / "report" / "report.md").read_text()
    assert "`local_steps` = 5" in text  # constant: listed, not drawn
    assert "`clients_refused` = 0" in text
    assert_valid_png(run / "report" / "round_metrics.png")


def test_fairness_per_round_matches_the_fairness_helper(tmp_path):
    make_run(tmp_path / "run", eval_every=3, rounds=6)
    clients = pd.read_parquet(tmp_path / "run" / "clients.parquet")
    clients.loc[0, "test_accuracy"] = np.nan  # a client without held-out records

    table = fairness_by_round({c: clients[c].to_numpy(float) for c in clients})

    assert table["round"].tolist() == [3.0, 6.0]
    first = clients[clients["round"] == 3]
    ok = first["test_accuracy"].notna()
    acc = fairness_metrics(accuracies=first["test_accuracy"][ok].to_numpy())
    psi = fairness_metrics(
        losses=first["test_loss"].to_numpy(), weights=first["num_examples"].to_numpy()
    )["psi"]
    assert table["clients"][0] == 9
    assert table["acc_std"][0] == pytest.approx(acc["acc_std"])
    assert table["acc_worst"][0] == pytest.approx(acc["acc_worst"])
    assert table["acc_worst10"][0] == pytest.approx(acc["acc_worst10"])
    assert table["psi"][0] == pytest.approx(psi)


def test_runs_without_client_rows_skip_the_client_figures(tmp_path):
    make_run(tmp_path / "empty", clients=False)  # clients.parquet with no rows
    make_run(tmp_path / "absent", clients=None, seed=1)  # no clients.parquet

    report = build_report([tmp_path / "empty", tmp_path / "absent"], out=tmp_path / "rep")

    names = {p.name for p in report.figures}
    assert {"accuracy.png", "epsilon.png", "best_accuracy.png"} <= names
    assert not {"client_accuracy.png", "fairness.png"} & names
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "no run has per-client rows in clients.parquet" in text


def test_an_unfinished_run_is_reported_from_its_rounds(tmp_path):
    make_run(tmp_path / "run", rounds=5, summary=False)

    build_report([tmp_path / "run"])

    text = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "unfinished (no summary.json)" in text
    assert f"{0.3 + 0.07 * 5:.4f} (round 5)" in text
    assert "5/5" in text  # planned rounds from config.yaml


# ---- several runs ----------------------------------------------------------------------------
def test_several_runs_are_overlaid_and_compared(tmp_path):
    a = make_run(tmp_path / "a", name="first", seed=0)
    b = make_run(tmp_path / "b", name="second", algorithm="fedavg", private=False, acc_offset=0.05)

    report = build_report([tmp_path / "a", tmp_path / "b"], out=tmp_path / "out")

    for name in [*SINGLE_RUN_FIGURES, "best_accuracy.png"]:
        assert_valid_png(tmp_path / "out" / name)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "[first · dp_fedavg · seed 0](../a/)" in text
    assert "[second · fedavg · seed 0](../b/)" in text
    assert f"{a['best_test_accuracy']:.4f}" in text
    assert f"{b['best_test_accuracy']:.4f}" in text
    assert "∞ (non-private)" in text
    assert "client_dataset_sizes of first" in text
    assert "client_dataset_sizes of second" in text
    assert "| algorithm.name |" in text  # the settings that differ
    assert [r.label for r in report.runs] == [
        "first · dp_fedavg · seed 0",
        "second · fedavg · seed 0",
    ]


def test_equal_labels_are_made_unique(tmp_path):
    make_run(tmp_path / "x" / "run")
    make_run(tmp_path / "y" / "other")

    report = build_report([tmp_path / "x" / "run", tmp_path / "y" / "other"], out=tmp_path / "o")

    labels = [r.label for r in report.runs]
    assert len(set(labels)) == 2
    assert labels[0].endswith("(run)")


def test_several_runs_need_an_output_directory(tmp_path):
    make_run(tmp_path / "a")
    make_run(tmp_path / "b")

    with pytest.raises(ReportError, match="--out is required"):
        build_report([tmp_path / "a", tmp_path / "b"])


# ---- sweeps ----------------------------------------------------------------------------------
def test_a_sweep_directory_reports_every_trial_ranked(tmp_path):
    sweep = tmp_path / "sweep"
    for k, (lr, offset) in enumerate([(0.01, 0.0), (0.1, 0.1), (1.0, 0.05)]):
        make_run(sweep / f"trial_{k}", lr=lr, acc_offset=offset, seed=k)
    (sweep / "notes").mkdir()  # not a run: ignored
    (sweep / "broken").mkdir()  # a run without rounds.parquet: skipped with a note
    (sweep / "broken" / "summary.json").write_text("{}")

    report = build_report([sweep])

    assert report.out_dir == sweep / "report"
    assert [r.name for r in report.runs] == ["trial_1", "trial_2", "trial_0"]
    # No sweep.yaml: the trials are named by the config values that differ between them.
    assert [r.label for r in report.runs] == ["lr=0.1, seed=1", "lr=1, seed=2", "lr=0.01, seed=0"]
    for name in ["accuracy.png", "best_accuracy.png", "sweep_params.png"]:
        assert_valid_png(sweep / "report" / name)
    text = (sweep / "report" / "report.md").read_text()
    assert "3 trials of sweep sweep, ranked by best test accuracy" in text
    first, second, third = (
        text.index(link)
        for link in (
            "[lr=0.1, seed=1](../trial_1/)",
            "[lr=1, seed=2](../trial_2/)",
            "[lr=0.01, seed=0](../trial_0/)",
        )
    )
    assert first < second < third
    assert "| algorithm.lr |" in text
    assert "skipped sweep trial" in text and "broken" in text
    # Reporting again replaces the earlier report (its folder is not taken for a trial).
    again = build_report([sweep])
    assert len(again.runs) == 3


def test_a_tune_sweep_summary_is_quoted_with_both_epsilons(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "trials" / "t0", seed=0)
    summary = {
        "trials": 8,
        "trials_completed": 3,
        "trials_stopped_early": 5,
        "trials_failed": 0,
        "best_trial": "t0",
        "metric": "test_accuracy",
        "best_metric": 0.81234,
        "privacy": {
            "epsilon_per_trial_max": 2.5,
            "epsilon_sweep": 6.25,
            "epsilon_sweep_label": "composed over trials",
        },
    }
    (sweep / "sweep_summary.json").write_text(json.dumps(summary))

    report = build_report([sweep])

    text = report.markdown.read_text()
    assert "best trial t0 with test_accuracy = 0.8123" in text
    assert "epsilon 2.5 per trial (tuning excluded), 6.25 for the whole sweep" in text


def test_trials_two_levels_down_are_found(tmp_path):
    make_run(tmp_path / "sweep" / "group_a" / "t0", seed=0)
    make_run(tmp_path / "sweep" / "group_b" / "t1", seed=1)

    report = build_report([tmp_path / "sweep"])

    assert sorted(r.name for r in report.runs) == ["group_a/t0", "group_b/t1"]


# ---- what the figures say --------------------------------------------------------------------
def drawn(figures: dict) -> dict:
    return {name: fig for name, fig in figures.items() if fig is not None}


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def figure_legend_texts(fig) -> list[str]:
    """The entries of the figure-level legends (the runs, and ε's line styles)."""
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def axes_words(fig) -> list[str]:
    """Every title, axis label and in-panel legend entry of `fig`."""
    words = [fig.get_suptitle()] if fig.get_suptitle() else []
    for ax in visible_axes(fig):
        words += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        if ax.get_legend() is not None:
            words += [t.get_text() for t in ax.get_legend().get_texts()]
    return [w for w in words if w]


def add_round_columns(run_dir: Path, **columns: list[float]) -> None:
    table = pd.read_parquet(run_dir / "rounds.parquet")
    for name, values in columns.items():
        table[name] = values
    table.to_parquet(run_dir / "rounds.parquet")


def test_no_panel_is_drawn_twice_across_the_figures(tmp_path):
    make_run(tmp_path / "a", algorithm="ali_dpfl", ali=True, fair=True)
    make_run(tmp_path / "b", algorithm="ali_dpfl", ali=True, fair=True, seed=1, lr=0.1)

    figures = drawn(draw_figures([tmp_path / "a", tmp_path / "b"]))

    titles = [ax.get_title() for fig in figures.values() for ax in visible_axes(fig)]
    titles = [t for t in titles if t]
    assert len(titles) == len(set(titles)), titles
    # The server's fair_* columns are fairness.png's (from clients.parquet), not panels
    # of round_metrics.png, nor "constant columns" listed in report.md.
    panels, constants = round_metric_panels(collect_runs([tmp_path / "a", tmp_path / "b"])[0])
    assert not [c for p in panels for c in p.columns if c.startswith("fair_")]
    assert not [c for c in constants if c.startswith("fair_")]
    assert [p.title for p in panels] == [
        "Local steps per round (τ for ALI-DPFL)",
        "Smoothness estimate μ (ALI-DPFL)",
        "DP-SGD iterations (ALI-DPFL)",
        "Fraction of per-example gradients clipped",
    ]
    assert len(visible_axes(figures["fairness.png"])) == 4


def test_axes_and_legends_use_human_names(tmp_path):
    run = tmp_path / "run"
    make_run(run, rounds=4, fair=True)
    add_round_columns(run, qffl_loss_mean=[2.0, 1.5, 1.2, 1.1], my_probe_value=[1.0, 3, 2, 4])

    figures = draw_figures([run])

    assert figures["accuracy.png"].axes[0].get_ylabel() == "test accuracy"
    assert figures["loss.png"].axes[0].get_ylabel() == "test loss"
    legend = figure_legend_texts(figures["epsilon.png"])
    assert {"ε (max over clients)", "ε (mean over clients)"} <= set(legend)
    metric_titles = [ax.get_title() for ax in visible_axes(figures["round_metrics.png"])]
    assert "q-FFL mean loss" in metric_titles  # a known column, by its name
    assert "My probe value" in metric_titles  # an unknown one, spelled out
    raw = re.compile(r"\b[a-z0-9]+_[a-z0-9_]+\b")  # a column name such as fair_psi
    words = [w for fig in drawn(figures).values() for w in axes_words(fig)]
    assert not [w for w in words if raw.search(w)], words


def test_sweep_legends_name_trials_by_their_swept_values(tmp_path):
    sweep = tmp_path / "sweep"
    grid = [(0.05, 1.0), (0.05, 2.0), (0.5, 1.0), (0.5, 2.0)]
    for k, (lr, clip) in enumerate(grid):
        make_run(sweep / "trials" / f"a1b2c_0000{k}", lr=lr, clip=clip, acc_offset=0.02 * k)
    space = {"algorithm.lr": {"grid": [0.05, 0.5]}, "privacy.clip_norm": {"grid": [1.0, 2.0]}}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"tune": {"space": space}}))

    figures = draw_figures([sweep])

    expected = ["lr=0.5, clip=2", "lr=0.5, clip=1", "lr=0.05, clip=2", "lr=0.05, clip=1"]
    for name in ("accuracy.png", "loss.png", "fairness.png", "round_metrics.png"):
        assert figure_legend_texts(figures[name]) == expected, name  # best trial first
    bars = figures["best_accuracy.png"].axes[0]
    assert [t.get_text() for t in bars.get_yticklabels()] == expected
    params = visible_axes(figures["sweep_params.png"])
    assert [ax.get_xlabel() for ax in params] == [
        "learning rate (algorithm.lr)",
        "clip norm C (privacy.clip_norm)",
    ]
    # Each point names the trial's other swept value (its x is the panel's own).
    point_names = sorted(t.get_text() for t in params[0].texts)
    assert point_names == ["clip=1", "clip=1", "clip=2", "clip=2"]


def test_compared_runs_that_share_a_name_are_told_apart_by_their_settings(tmp_path):
    make_run(tmp_path / "a", lr=0.5)
    make_run(tmp_path / "b", lr=0.1)

    figures = draw_figures([tmp_path / "a", tmp_path / "b"])

    assert figure_legend_texts(figures["accuracy.png"]) == [
        "exp · dp_fedavg · seed 0 · lr=0.5",
        "exp · dp_fedavg · seed 0 · lr=0.1",
    ]


def integer_ticks_in_view(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    return ticks


def test_a_run_with_one_evaluated_round_gets_a_padded_integer_round_axis(tmp_path):
    make_run(tmp_path / "run", rounds=2, eval_every=2)  # evaluated at round 2 only

    figures = draw_figures([tmp_path / "run"])

    for name in ("accuracy.png", "loss.png", "fairness.png"):
        for ax in visible_axes(figures[name]):
            assert ax.get_xlim() == (1.0, 3.0), name
            assert integer_ticks_in_view(ax) == [1.0, 2.0, 3.0], name
            assert ax.get_xlabel() == "round"
            assert ax.lines[0].get_marker() == "o"  # one point: a marker, not a line
    for ax in visible_axes(figures["epsilon.png"]):  # ε: every round, 1 and 2
        assert integer_ticks_in_view(ax) == [1.0, 2.0]


def test_round_axes_of_longer_runs_tick_whole_rounds_only(tmp_path):
    make_run(tmp_path / "run", rounds=3, algorithm="ali_dpfl", ali=True)

    figures = drawn(draw_figures([tmp_path / "run"]))

    for name in ("accuracy.png", "loss.png", "epsilon.png", "fairness.png"):
        for ax in visible_axes(figures[name]):
            assert integer_ticks_in_view(ax) == [1.0, 2.0, 3.0], name
    for ax in visible_axes(figures["round_metrics.png"]):  # μ stops a round early
        integer_ticks_in_view(ax)


# ---- output directory ------------------------------------------------------------------------
def test_a_report_is_regenerated_in_place_but_other_directories_are_kept(tmp_path):
    make_run(tmp_path / "run", ali=True, algorithm="ali_dpfl")
    out = tmp_path / "out"
    build_report([tmp_path / "run"], out=out)
    (out / "sweep_params.png").write_bytes(b"stale")  # a file an earlier report wrote

    build_report([tmp_path / "run"], out=out)

    assert not (out / "sweep_params.png").exists()
    assert (out / "report.md").is_file()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("precious")
    with pytest.raises(ReportError, match="not empty"):
        build_report([tmp_path / "run"], out=busy)
    assert (busy / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in busy.iterdir()) == ["keep.txt"]


# ---- command line ----------------------------------------------------------------------------
def test_cli_report_writes_the_report(tmp_path, capsys):
    make_run(tmp_path / "run")

    code = main(["report", str(tmp_path / "run")])

    assert code == 0
    assert "report.md" in capsys.readouterr().out
    assert (tmp_path / "run" / "report" / "accuracy.png").is_file()


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ("empty", "is not a run directory (no rounds.parquet or summary.json)"),
        ("missing", "does not exist"),
        ("summary_only", "missing rounds.parquet"),
        ("file", "is not a directory"),
        ("bad_parquet", "cannot read"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, setup, words):
    target = tmp_path / "target"
    if setup == "empty":
        target.mkdir()
    elif setup == "summary_only":
        target.mkdir()
        (target / "summary.json").write_text("{}")
    elif setup == "file":
        target.write_text("x")
    elif setup == "bad_parquet":
        target.mkdir()
        (target / "rounds.parquet").write_text("not parquet")

    code = main(["report", str(target)])

    err = capsys.readouterr().err
    assert code == 2
    assert words in err
    assert err.count("\n") == 1 and err.startswith("raydpfl: error:")
    assert not (target / "report").exists()


def test_cli_several_runs_without_out_exits_2(tmp_path, capsys):
    make_run(tmp_path / "a")
    make_run(tmp_path / "b")

    code = main(["report", str(tmp_path / "a"), str(tmp_path / "b")])

    assert code == 2
    assert "--out is required" in capsys.readouterr().err


def test_importing_the_cli_and_report_package_does_not_import_matplotlib():
    code = "import sys, raydpfl.cli.main, raydpfl.report; print('matplotlib' in sys.modules)"

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "False"


def test_load_run_reads_numeric_columns_as_floats(tmp_path):
    make_run(tmp_path / "run", rounds=4, eval_every=2)

    run = load_run(tmp_path / "run")

    assert run.rounds["round"].dtype == np.float64
    assert math.isnan(run.rounds["test_accuracy"][0])
    assert run.evaluated()[0].tolist() == [2.0, 4.0]
    assert run.clients is not None and run.clients["round"].size == 20


def test_curves_drawn_over_each_other_are_named_in_the_title(tmp_path):
    # Same ε schedule (make_run's ε does not depend on the seed), different accuracy.
    make_run(tmp_path / "a", seed=0, lr=0.5)
    make_run(tmp_path / "b", seed=1, lr=0.1, acc_offset=0.05)
    make_run(tmp_path / "c", seed=2, lr=0.2, acc_offset=-0.05)

    figures = drawn(draw_figures([tmp_path / "a", tmp_path / "b", tmp_path / "c"]))

    (eps_ax,) = visible_axes(figures["epsilon.png"])
    assert "the same for all 3 runs" in eps_ax.get_title()
    (acc_ax,) = visible_axes(figures["accuracy.png"])
    assert "\n" not in acc_ax.get_title()  # distinct curves: no note


def test_identical_note_names_only_the_runs_that_coincide():
    from raydpfl.report.plots import Style, identical_note

    x = np.arange(1, 4)
    series = [(x, np.array([1.0, 2, 3])), (x, np.array([1.0, 2, 3])), (x, np.array([3.0, 2, 1]))]
    styles = [Style("C0", "lr=0.5"), Style("C1", "lr=0.1"), Style("C2", "lr=0.2")]

    assert identical_note(series, styles) == "(curves drawn over each other: lr=0.5 = lr=0.1)"
    assert identical_note(series[1:], styles[1:]) == ""


def test_client_accuracy_axis_zooms_on_the_range_the_clients_reach(tmp_path):
    make_run(tmp_path / "a")
    clients = pd.read_parquet(tmp_path / "a" / "clients.parquet")
    clients["test_accuracy"] = np.linspace(0.86, 0.96, len(clients))
    clients.to_parquet(tmp_path / "a" / "clients.parquet")

    (ax,) = visible_axes(drawn(draw_figures([tmp_path / "a"]))["client_accuracy.png"])

    lo, hi = ax.get_xlim()
    assert 0.7 <= lo < 0.86 and 0.96 < hi <= 1.02  # not 0..1 with the boxes in a corner


def test_accuracy_limits_keep_fractions_in_range_and_leave_other_values_alone():
    from raydpfl.report.plots import accuracy_limits

    assert accuracy_limits([np.array([0.0, 0.02])]) == pytest.approx((-0.02, 0.08))
    assert accuracy_limits([np.array([0.93, 0.999])]) == pytest.approx((0.85, 1.02))
    assert accuracy_limits([np.array([12.0, 40.0])]) is None  # percentages: untouched
