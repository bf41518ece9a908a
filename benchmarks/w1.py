"""W1 benchmark: raydpfl against the non-private and per-sample floors, same work.

W1 (shared/workloads.md) is DP-FedAvg on Fashion-MNIST, 100 clients, 20 per round,
τ = 5 DP-SGD steps each, FedAvgCNN, 20 rounds; configs/w1.yaml describes it. Three
runners do exactly the same work (same cohorts, same Poisson batches, same model and
initialisation); each runs in its own subprocess so that peak memory is its own:

- raydpfl:           the simulator, local backend, built from the config.
- floor_nonprivate:  plain forward + backward + SGD on the same batches (`_floors.py`).
- floor_per_sample:  vmap-of-grad DP-SGD on the same batches and noise (`_floors.py`).

Usage (from the repository root):

    python benchmarks/w1.py [--rounds R] [--threads T] [--repeats K]
                            [--runners raydpfl,floor_nonprivate,floor_per_sample]

Prints a table and writes benchmarks/results/w1-<UTC timestamp>.json. See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: the package need not be installed
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RUNNERS = ("raydpfl", "floor_nonprivate", "floor_per_sample")
DEFAULT_CONFIG = ROOT / "configs" / "w1.yaml"
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: One torch thread per core of the 2-core machine the targets were set on.
DEFAULT_THREADS = 2
#: workloads.md targets for the *ray* backend; shown beside the ratios for reference.
TARGET_VS_NONPRIVATE = 1.6  # raydpfl s/round ≤ 1.6 × non-private floor
TARGET_VS_PER_SAMPLE = 1 / 2.5  # raydpfl ≥ 2.5 × faster than the per-sample floor
_RUSAGE_WHO = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)

# Progress callback: (0-based round, wall seconds of that round).
OnRound = Callable[[int, float], None]


# ---- child: one runner, one process ---------------------------------------------------
def run_child(runner: str, config: Path, rounds: int | None, threads: int) -> dict[str, Any]:
    """Runs one runner in this process and returns its raw per-round record."""
    from raydpfl.config import load_config
    from raydpfl.simulation.build import build_experiment

    torch.set_num_threads(threads)
    overrides = [f"runtime.threads={threads}", "runtime.device=cpu"]
    if rounds is not None:
        overrides.append(f"algorithm.rounds={rounds}")
    exp = build_experiment(load_config(config, overrides))
    total_rounds = exp.config.experiment.algorithm.rounds

    def progress(round_idx: int, seconds: float) -> None:
        print(f"  [{runner}] round {round_idx + 1}/{total_rounds}: {seconds:.2f} s", flush=True)

    if runner == "raydpfl":
        out = _run_raydpfl(exp, progress)
    else:
        import _floors

        plan = _floors.record_batches(exp, total_rounds)  # untimed pre-pass
        floor = _floors.run_nonprivate if runner == "floor_nonprivate" else _floors.run_per_sample
        result = floor(plan, progress)
        out = {
            "round_seconds": result.round_seconds,
            "round_clients": [len(clients) for clients in plan.rounds],
            "round_samples": plan.round_samples(),
            "test_accuracy": result.test_accuracy,
        }
    # ru_maxrss is KiB on Linux. RUSAGE_CHILDREN adds any worker processes a backend
    # started (none for the local backend); the sum bounds the run's peak from above.
    rss_kib = sum(resource.getrusage(who).ru_maxrss for who in _RUSAGE_WHO)
    return {
        "runner": runner,
        "local_steps": exp.algorithm.local_steps,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mib": rss_kib / 1024,
        **out,
    }


def _run_raydpfl(exp: Any, progress: OnRound) -> dict[str, Any]:
    """raydpfl's own server and local backend; times come from ``server.rows``."""
    from raydpfl.simulation.build import make_local_backend, make_server

    server = make_server(exp, on_round=lambda row: progress(row["round"] - 1, row["wall_seconds"]))
    with make_local_backend(exp) as backend:
        summary = server.run(backend)
    rows = server.rows
    if summary["rounds_completed"] != exp.config.experiment.algorithm.rounds:
        raise RuntimeError(f"raydpfl stopped early: {summary['stop_reason']}")
    return {
        "round_seconds": [row["wall_seconds"] for row in rows],
        "round_clients": [row["clients_trained"] for row in rows],
        # mean_batch_size is a mean over clients of a mean over steps, every client
        # running the same τ steps, so this product is the round's total exactly.
        "round_samples": [
            round(row["mean_batch_size"] * row["clients_trained"] * row["local_steps"])
            for row in rows
        ],
        "test_accuracy": summary["final_test_accuracy"],
    }


# ---- parent: run every runner in a subprocess, compare -------------------------------
def figures(run: dict[str, Any]) -> dict[str, float]:
    """The W1 figures of one run; round 1 is warm-up and left out of every rate."""
    secs, timed = run["round_seconds"], range(1, len(run["round_seconds"]))
    per_round = statistics.median(secs[i] for i in timed)
    client_steps = statistics.median(run["round_clients"][i] * run["local_steps"] for i in timed)
    return {
        "seconds_per_round": per_round,
        "client_steps_per_second": client_steps / per_round,
        "samples_per_second": statistics.median(run["round_samples"][i] / secs[i] for i in timed),
        "peak_rss_mib": run["peak_rss_mib"],
        "test_accuracy": run["test_accuracy"],
    }


def check_same_work(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Asserts every run trained the same clients on the same number of records per round.

    raydpfl's count comes from its own ``mean_batch_size`` metric; the floors' from the
    batches recorded by replaying raydpfl's RNG streams. A replay that drifted from
    raydpfl's draw order would give different Poisson batches, hence different totals.
    """
    (ref_name, ref_runs), *_ = runs.items()
    ref = ref_runs[0]
    for name, name_runs in runs.items():
        for k, run in enumerate(name_runs):
            for key in ("round_clients", "round_samples"):
                if run[key] != ref[key]:
                    raise SystemExit(
                        f"batch check failed: {name} (repeat {k + 1}) {key} = {run[key]}, "
                        f"but {ref_name} has {ref[key]}"
                    )
    return {
        "round_clients": ref["round_clients"],
        "round_samples": ref["round_samples"],
        "total_samples": sum(ref["round_samples"]),
    }


def machine_info(threads: int) -> dict[str, Any]:
    """What the figures depend on: hardware, torch build, thread settings."""
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu_model = models[0].split(":", 1)[1].strip() if models else ""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_threads_per_process": threads,
    }


def _median_figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    per_repeat = [figures(run) for run in runs]
    return {key: statistics.median(f[key] for f in per_repeat) for key in per_repeat[0]}


def _ratios(figs: dict[str, dict[str, float]], runs: dict[str, list]) -> dict[str, Any]:
    """raydpfl s/round over each floor's: of the medians, and per repeat."""
    out: dict[str, Any] = {}
    if "raydpfl" not in figs:
        return out
    for floor in ("floor_nonprivate", "floor_per_sample"):
        if floor in figs:
            out[f"raydpfl/{floor}"] = {
                "seconds_per_round": figs["raydpfl"]["seconds_per_round"]
                / figs[floor]["seconds_per_round"],
                "per_repeat": [
                    figures(a)["seconds_per_round"] / figures(b)["seconds_per_round"]
                    for a, b in zip(runs["raydpfl"], runs[floor], strict=True)
                ],
            }
    return out


def print_report(
    figs: dict[str, dict[str, float]], ratios: dict[str, Any], work: dict[str, Any], args: Any
) -> None:
    """The table and ratios, as quoted in reports."""
    rounds = len(work["round_samples"])
    clients = work["round_clients"][0]
    print(
        f"\nW1: {rounds} rounds, {clients} clients/round, {work['total_samples']} sampled "
        f"records in all (identical across runners: batch check passed)"
    )
    threads_note = "" if args.threads_given else f" (default {DEFAULT_THREADS}: a 2-core machine)"
    print(
        f"torch threads per process: {args.threads}{threads_note}; repeats: {args.repeats}"
        f"{' (figures are medians across repeats)' if args.repeats > 1 else ''}; "
        f"rates use rounds 2..{rounds}"
    )
    header = (
        f"{'runner':<18}{'s/round':>9}{'client-steps/s':>16}{'samples/s':>11}"
        f"{'peak RSS MiB':>14}{'test acc':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, f in figs.items():
        print(
            f"{name:<18}{f['seconds_per_round']:>9.3f}{f['client_steps_per_second']:>16.1f}"
            f"{f['samples_per_second']:>11.0f}{f['peak_rss_mib']:>14.0f}"
            f"{f['test_accuracy']:>10.4f}"
        )
    targets = {
        "raydpfl/floor_nonprivate": f"target for the ray backend: <= {TARGET_VS_NONPRIVATE}",
        "raydpfl/floor_per_sample": f"target for the ray backend: <= {TARGET_VS_PER_SAMPLE:.2f}, "
        "i.e. >= 2.5x faster",
    }
    for key, r in ratios.items():
        print(f"{key} (s/round): {r['seconds_per_round']:.2f}  [{targets[key]}]")
    if "raydpfl" in figs and "floor_per_sample" in figs:
        # Same batches, same noise, same arithmetic up to summation order: a gap here
        # means raydpfl computes something other than DP-SGD as specified.
        gap = figs["raydpfl"]["test_accuracy"] - figs["floor_per_sample"]["test_accuracy"]
        print(f"test accuracy, raydpfl - per-sample floor: {gap:+.4f} (same noise: expect ~0)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, help="rounds (default: the config's, 20)")
    p.add_argument(
        "--threads",
        type=int,
        help=f"torch threads per process (default {DEFAULT_THREADS}: one per core of 2)",
    )
    p.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, run in order")
    p.add_argument("--repeats", type=int, default=1, help="runs per runner; figures are medians")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the W1 config")
    # Child mode, used by the parent: run one runner and write its record to --json.
    p.add_argument("--runner", choices=RUNNERS, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.threads_given = args.threads is not None
    args.threads = args.threads or DEFAULT_THREADS
    if args.rounds is not None and args.rounds < 2:
        p.error("--rounds must be >= 2: round 1 is warm-up and left out of the figures")
    if args.threads < 1 or args.repeats < 1:
        p.error("--threads and --repeats must be >= 1")
    args.runner_list = [r.strip() for r in args.runners.split(",") if r.strip()]
    unknown = sorted(set(args.runner_list) - set(RUNNERS))
    if unknown or not args.runner_list:
        p.error(f"--runners: unknown {unknown}; choose from {', '.join(RUNNERS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.runner is not None:
        if args.json is None:
            raise SystemExit("--runner needs --json")
        record = run_child(args.runner, args.config, args.rounds, args.threads)
        args.json.write_text(json.dumps(record))
        return

    started = datetime.now(timezone.utc)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.runner_list}
    with tempfile.TemporaryDirectory() as tmp:
        # Runners interleave within each repeat, so slow drift of the machine spreads
        # over all of them instead of biasing one.
        for k in range(args.repeats):
            for name in args.runner_list:
                out = Path(tmp) / f"{name}-{k}.json"
                cmd = [sys.executable, __file__, "--runner", name, "--json", str(out)]
                cmd += ["--threads", str(args.threads), "--config", str(args.config)]
                if args.rounds is not None:
                    cmd += ["--rounds", str(args.rounds)]
                print(f"repeat {k + 1}/{args.repeats}: {name}", flush=True)
                # Other work on a shared machine skews the figures; the 1-minute load
                # average around each run makes that visible in the JSON.
                load_before = os.getloadavg()[0]
                subprocess.run(cmd, check=True)
                record = json.loads(out.read_text())
                record["loadavg_1min"] = [load_before, os.getloadavg()[0]]
                runs[name].append(record)

    work = check_same_work(runs)
    figs = {name: _median_figures(name_runs) for name, name_runs in runs.items()}
    ratios = _ratios(figs, runs)
    print_report(figs, ratios, work, args)

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"w1-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    report = {
        "workload": "W1",
        "utc": started.isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "config": str(args.config),
        "machine": machine_info(args.threads),
        "settings": {
            "rounds": len(work["round_samples"]),
            "threads": args.threads,
            "repeats": args.repeats,
            "runners": args.runner_list,
        },
        "batch_check": work,
        "figures": figs,
        "ratios": ratios,
        "runs": runs,
    }
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
