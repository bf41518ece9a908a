"""W1 and W3 on one GPU: one client at a time against clients vectorised, end to end.

    python benchmarks/gpu.py [--workload w1 w3] [--rounds 5] [--device cuda]

Runs each workload's config (configs/w1.yaml, configs/w3.yaml: the real Fashion-MNIST
data, resident on the device) on the local backend, in this process, three ways:

- ``one_at_a_time``:   runtime.vectorise_clients=off (the default 8 aggregation groups);
- ``vectorised``:      vectorise_clients=on, the default 8 aggregation groups, so each
                       vectorised call trains one group (W1: 2-3 clients);
- ``vectorised_1grp``: vectorise_clients=on with runtime.aggregation_groups=1: the whole
                       cohort in one vectorised call (the setting for one GPU worker).

Figures per case: seconds per round (median of rounds 2..R; no evaluation round is
timed), the ratio to one-at-a-time, peak device memory, and the GPU's busy share: the
summed kernel time of one more round under torch.profiler, divided by the median
unprofiled round (one stream, so kernels do not overlap). Writes
benchmarks/results/gpu-<UTC>.json. Run from the repository root; `--device cpu` runs
the same code on the CPU (no busy share), which is how CI-less machines check it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

CASES = {
    "one_at_a_time": ["runtime.vectorise_clients=off"],
    "vectorised": ["runtime.vectorise_clients=on"],
    "vectorised_1grp": ["runtime.vectorise_clients=on", "runtime.aggregation_groups=1"],
}
RESULTS_DIR = ROOT / "benchmarks" / "results"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def kernel_seconds(run_round: Any, device: str) -> float | None:
    """Summed device time of the kernels one call of `run_round` launches."""
    if not device.startswith("cuda"):
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_round()
        _sync(device)
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e6


def run_case(workload: str, case: str, rounds: int, device: str) -> dict[str, Any]:
    """`rounds` timed rounds of `workload` in `case`, then one profiled round."""
    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment, make_local_backend, make_server

    overrides = [
        "runtime.backend=local",
        f"runtime.device={device}",
        # two rounds more than run, evaluation never due: no timed round evaluates
        f"algorithm.rounds={rounds + 2}",
        "algorithm.eval_every=100000",
        *CASES[case],
    ]
    exp = build_experiment(load_config(ROOT / "configs" / f"{workload}.yaml", overrides))
    backend, server = make_local_backend(exp), make_server(exp)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for r in range(rounds):
        t = time.perf_counter()
        server.run_round(backend, r)
        _sync(device)
        seconds.append(time.perf_counter() - t)
    median = statistics.median(seconds[1:]) if rounds > 1 else seconds[0]
    busy_s = kernel_seconds(lambda: server.run_round(backend, rounds), device)
    return {
        "workload": workload,
        "case": case,
        "overrides": overrides,
        "round_seconds": seconds,
        "s_per_round": median,
        "kernel_s_per_round": busy_s,
        "gpu_busy": None if busy_s is None else busy_s / median,
        "peak_device_mib": (
            torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
        ),
        "clients_per_round": exp.config.experiment.algorithm.clients_per_round,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", nargs="+", choices=("w1", "w3"), default=["w1", "w3"])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (>= 2)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    ap.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (round 1 warms up)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA device is visible; use --device cpu to run this on the CPU")
    rows = []
    for workload in args.workload:
        for case in args.cases:
            row = run_case(workload, case, args.rounds, args.device)
            rows.append(row)
            busy = _fmt(row["gpu_busy"], "{:.0%}")
            print(f"{workload} {case:16s} {row['s_per_round']:8.3f} s/round, GPU busy {busy}")
    for row in rows:
        base = [
            r for r in rows if r["workload"] == row["workload"] and r["case"] == "one_at_a_time"
        ]
        row["speedup_vs_one_at_a_time"] = (
            base[0]["s_per_round"] / row["s_per_round"] if base else None
        )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report = {
        "utc": stamp,
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "torch": torch.__version__,
        "rows": rows,
    }
    out = args.out or RESULTS_DIR / f"gpu-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print("workload case              s/round  x one-at-a-time  GPU busy  peak MiB")
    for r in rows:
        speed = _fmt(r["speedup_vs_one_at_a_time"], "{:.1f}x")
        busy = _fmt(r["gpu_busy"], "{:.0%}")
        peak = _fmt(r["peak_device_mib"], "{:.0f}")
        print(
            f"{r['workload']:8s} {r['case']:16s} {r['s_per_round']:8.3f} "
            f"{speed:>16s} {busy:>9s} {peak:>9s}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
