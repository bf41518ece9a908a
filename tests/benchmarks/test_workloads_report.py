"""benchmarks/workloads.py's report: a config without a central test set (no accuracy)
must not lose the run's figures."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _workloads():
    if "workloads" in sys.modules:
        return sys.modules["workloads"]
    sys.path.insert(0, str(ROOT / "benchmarks"))  # for its `_proctree` import
    spec = importlib.util.spec_from_file_location(
        "workloads", ROOT / "benchmarks" / "workloads.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["workloads"] = module
    spec.loader.exec_module(module)
    return module


def _run(accuracy):
    return {
        "round_seconds": [2.0, 1.0, 1.2, 1.1],
        "round_clients": [4, 4, 4, 4],
        "round_samples": [40, 40, 40, 40],
        "local_steps": 2,
        "test_accuracy": accuracy,
        "thread_layout": "1 x 1",
        "model_sha256": "abc",
        "process_tree": {
            "peak_rss_mib": 100.0,
            "peak_pss_mib": 90.0,
            "cpu_by_name": {
                "python": {"processes": 1, "user_s": 3.0, "sys_s": 0.5, "minor_faults": 1e5}
            },
        },
    }


def test_median_skips_missing_values_and_is_none_when_all_are_missing():
    w = _workloads()
    assert w._median_or_none([None, None]) is None
    assert w._median_or_none([0.5, None, 0.7]) == 0.6
    figs = w._median_figures([_run(None), _run(None)])
    assert figs["test_accuracy"] is None
    assert figs["seconds_per_round"] == 1.1


def test_a_report_over_several_repeats_keeps_counts_whole():
    """--repeats 2: the medians of ints (cores) stay ints, and the report, which formats
    them with "d", is written (it crashed on 2.0 before, after the whole W1 run)."""
    w = _workloads()
    assert w._median_or_none([2, 2]) == 2 and isinstance(w._median_or_none([2, 2]), int)
    assert w._median_or_none([1, 3, 2, 4]) == 2
    runs = {"raydpfl_ray": [_timed(1.0, cores=2), _timed(1.2, cores=2)]}
    figs = {name: w._median_figures(r) for name, r in runs.items()}
    assert figs["raydpfl_ray"]["cores"] == 2
    assert figs["raydpfl_ray"]["seconds_per_round"] == pytest.approx(1.1)
    work = {"round_samples": [40, 40, 40, 40], "round_clients": [4, 4, 4, 4], "total_samples": 160}
    args = argparse.Namespace(repeats=2, threads=1)
    lines = w.report_lines("w1", figs, w._ratios(figs, runs), [], work, runs, args)
    row = next(line for line in lines if line.startswith("raydpfl_ray"))
    assert " 2 " in row


def test_report_formats_a_missing_accuracy_as_a_dash():
    w = _workloads()
    runs = {"raydpfl_local": [_run(None)], "floor_per_sample": [_run(0.8)]}
    figs = {name: w._median_figures(r) for name, r in runs.items()}
    work = {"round_samples": [40, 40, 40, 40], "round_clients": [4, 4, 4, 4], "total_samples": 160}
    args = argparse.Namespace(repeats=1, threads=1)
    lines = w.report_lines("w3", figs, w._ratios(figs, runs), [], work, runs, args)
    row = next(line for line in lines if line.startswith("raydpfl_local"))
    assert row.rstrip().endswith("-")
    assert not any("test accuracy, raydpfl_local" in line for line in lines)  # no gap vs None
    floor = next(line for line in lines if line.startswith("floor_per_sample"))
    assert floor.rstrip().endswith("0.8000")


def _timed(seconds, cores=1):
    run = _run(0.5)
    run["round_seconds"] = [9.0, seconds, seconds, seconds]
    run["round_seconds_server"] = run["round_seconds"]
    run["startup"] = {
        k: 1.0
        for k in ("ray_init_seconds", "setup_seconds", "finish_seconds", "ray_shutdown_seconds")
    }
    run["cores"] = cores
    return run


def test_the_best_peer_mode_is_the_faster_and_targets_read_their_direction():
    w = _workloads()
    runs = {
        "raydpfl_local": [_timed(2.0)],
        "raydpfl_ray": [_timed(1.25, cores=2)],
        "floor_nonprivate_pool": [_timed(1.0, cores=2)],
        "flower_opacus": [_timed(8.0, cores=2)],
        "flower_opacus_ghost": [_timed(5.0, cores=2)],
    }
    figs = {name: w._median_figures(r) for name, r in runs.items()}
    assert figs["raydpfl_ray"]["client_steps_per_second_per_core"] == pytest.approx(
        4 * 2 / 1.25 / 2
    )
    ratios = w._ratios(figs, runs, ray_workers=2)
    best = ratios["raydpfl_ray/flower_opacus_best"]
    assert best["best"] == "flower_opacus_ghost"
    assert best["seconds_per_round"] == pytest.approx(1.25 / 5.0)
    assert ratios["ray_efficiency"]["seconds_per_round"] == pytest.approx(2.0 / (2 * 1.25))
    targets = {t["ratio"]: t for t in w._targets("w1", ratios)}
    assert targets["raydpfl_ray/floor_nonprivate_pool"]["met"]  # 1.25 <= 1.3
    assert not targets["raydpfl_ray/flower_opacus_best"]["met"]  # 4x, not >= 5x
    assert targets["ray_efficiency"]["direction"] == ">=" and not targets["ray_efficiency"]["met"]
    args = argparse.Namespace(repeats=1, threads=1, noise_sampler="ziggurat")
    work = {"round_samples": [40] * 4, "round_clients": [4] * 4, "total_samples": 160}
    lines = w.report_lines("w1", figs, ratios, list(targets.values()), work, runs, args)
    assert any("NOT MET (missed)" in line and "flower_opacus_best" in line for line in lines)


def test_default_runners_leave_out_the_peers_without_their_environment(monkeypatch, tmp_path):
    w = _workloads()
    monkeypatch.setenv("RAYDPFL_PEERS_VENV", str(tmp_path / "none"))
    names = w.runners_for("w3", None)
    assert "floor_vectorised_pool" in names and not any(n in w.PEERS for n in names)
    assert "floor_vectorised_pool" not in w.runners_for("w1", None)
    assert w.runners_for("w1", ["raydpfl_ray"]) == ["raydpfl_ray"]
