"""W5: a million registered clients on one machine (issue 19).

configs/w5.yaml: FedProx's Synthetic-IID data generated in code (2–4 records of 16
features per client), a logistic regression (68 parameters), DP-FedAvg with one
full-batch clipped-and-noised step per client (q = 1, τ = 1), the Ray backend with
2 workers × 1 thread. One invocation measures every (registered clients, clients per
round) pair of `--clients` × `--cohorts` (default 10k, 100k, 1M × 1,000 and 10,000),
each in its own subprocess whose whole process tree is sampled (`_proctree.py`):

- start-up: from the child's first line to the first round's start: building the
  experiment (data generation, partition, ledger; ``build_seconds``), ``ray.init`` and
  the server actor and worker pool coming up with the dataset (``setup_seconds``);
  the interpreter's imports are reported apart (``import_seconds``);
- s/round: median of the driver's round times after round 1 (round 1 is warm-up: it
  imports the accountant in the server actor);
- peak PSS of the whole process tree (driver, GCS, raylet, server and worker actors);
- bytes per registered client: peak PSS over the registered clients, and the marginal
  figure (peak PSS minus the 10k case's, over the added clients).

Targets (issue 19, ratios on this machine): round time at 1M ≤ 1.2 × the 10k case;
peak PSS at 1M ≤ the 10k case + 2 GiB; start-up at 1M ≤ 30 s. A 1M run starts only if
/proc/meminfo shows at least `--min-free-gib` available (default 18); otherwise it is
skipped, saying so. Results are written after every run (a killed invocation keeps
what it measured) to benchmarks/results/w5-<UTC>.json, with the 1-minute load
average around each run and the machine's CPU count.

    python benchmarks/w5.py [--clients 10000 100000 1000000] [--cohorts 1000 10000]
                            [--rounds 6] [--min-free-gib 18]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

T_START = time.perf_counter()  # the child's start-up clock starts before its imports

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proctree import TreeSampler  # noqa: E402

THIS = Path(__file__).resolve()
CONFIG = ROOT / "configs" / "w5.yaml"
RESULTS_DIR = ROOT / "benchmarks" / "results"
DEFAULT_CLIENTS = (10_000, 100_000, 1_000_000)
DEFAULT_COHORTS = (1_000, 10_000)
SAMPLE_INTERVAL_S = 0.2
PSS_EVERY = 5  # PSS every second: short runs, so sample more often than workloads.py
GIB = 1024**3
#: (figure, bound) at the largest population against the smallest (issue 19).
ROUND_RATIO_MAX = 1.2
MEMORY_ABOVE_MAX_GIB = 2.0
STARTUP_MAX_S = 30.0


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    return float("nan")


# ---- the child: one run, in this process ---------------------------------------------
def run_child(clients: int, cohort: int, rounds: int) -> dict[str, Any]:
    import torch
    from workloads import _run_raydpfl

    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment

    import_seconds = time.perf_counter() - T_START
    torch.set_num_threads(1)
    overrides = [
        f"experiment.data.num_clients={clients}",
        f"algorithm.clients_per_round={cohort}",
        f"algorithm.rounds={rounds}",
        "runtime.backend=ray",
        "runtime.workers=2",
        "runtime.cpus_per_worker=1",
        "runtime.address=null",
        "runtime.device=cpu",
    ]
    t = time.perf_counter()
    exp = build_experiment(load_config(CONFIG, overrides))
    build_seconds = time.perf_counter() - t
    out = _run_raydpfl("raydpfl_ray", exp)
    st = out["startup"]
    out["startup"].update(import_seconds=import_seconds, build_seconds=build_seconds)
    out["startup_seconds"] = build_seconds + st["ray_init_seconds"] + st["setup_seconds"]
    out["records"] = int(exp.dataset.train_sizes().sum())
    return out


# ---- the parent ----------------------------------------------------------------------
def summarise(record: dict[str, Any]) -> dict[str, Any]:
    later = record["round_seconds"][1:]
    tree = record["process_tree"]
    return {
        "clients": record["clients"],
        "cohort": record["cohort"],
        "startup_seconds": record["startup_seconds"],
        "build_seconds": record["startup"]["build_seconds"],
        "setup_seconds": record["startup"]["setup_seconds"],
        "ray_init_seconds": record["startup"]["ray_init_seconds"],
        "import_seconds": record["startup"]["import_seconds"],
        "seconds_per_round": statistics.median(later) if later else float("nan"),
        "client_steps_per_second": (
            statistics.median(
                c / s for c, s in zip(record["round_clients"][1:], later, strict=True)
            )
            if later
            else float("nan")
        ),
        "peak_pss_gib": tree["peak_pss_mib"] / 1024,
        "pss_bytes_per_client": tree["peak_pss_mib"] * 2**20 / record["clients"],
        "loadavg_1min": record["loadavg_1min"],
    }


def targets(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for cohort in sorted({f["cohort"] for f in figures}):
        rows = sorted((f for f in figures if f["cohort"] == cohort), key=lambda f: f["clients"])
        if not rows:
            continue
        small, large = rows[0], rows[-1]
        for f in rows[1:]:  # marginal memory per added client, against the smallest case
            added = f["clients"] - small["clients"]
            extra = (f["peak_pss_gib"] - small["peak_pss_gib"]) * GIB
            f["marginal_bytes_per_client"] = extra / added
        if large["clients"] < 1_000_000 or small["clients"] > 10_000:
            out.append(
                {
                    "cohort": cohort,
                    "status": "not measured",
                    "why": "needs both the 10,000- and the 1,000,000-client runs",
                }
            )
            continue
        ratio = large["seconds_per_round"] / small["seconds_per_round"]
        above = large["peak_pss_gib"] - small["peak_pss_gib"]
        for name, value, bound in (
            ("round time 1M / 10k", ratio, ROUND_RATIO_MAX),
            ("peak PSS 1M - 10k (GiB)", above, MEMORY_ABOVE_MAX_GIB),
            ("start-up at 1M (s)", large["startup_seconds"], STARTUP_MAX_S),
        ):
            out.append(
                {
                    "cohort": cohort,
                    "target": name,
                    "value": value,
                    "bound": bound,
                    "status": "met" if value <= bound else "MISSED",
                }
            )
    return out


def report_lines(figures: list[dict[str, Any]], skipped: list[str], checks: list) -> list[str]:
    lines = [
        "W5 — registered clients × clients per round (Ray, 2 workers × 1 thread)",
        f"{'clients':>10} {'cohort':>7} {'start-up s':>10} {'build s':>8} "
        f"{'s/round':>8} {'steps/s':>8} {'peak PSS GiB':>12} {'B/client':>9} "
        f"{'marginal B/client':>17} {'load':>11}",
    ]
    for f in sorted(figures, key=lambda f: (f["cohort"], f["clients"])):
        marginal = f.get("marginal_bytes_per_client")
        lines.append(
            f"{f['clients']:>10,} {f['cohort']:>7,} {f['startup_seconds']:>10.1f} "
            f"{f['build_seconds']:>8.1f} {f['seconds_per_round']:>8.3f} "
            f"{f['client_steps_per_second']:>8.0f} {f['peak_pss_gib']:>12.2f} "
            f"{f['pss_bytes_per_client']:>9.0f} "
            f"{'' if marginal is None else f'{marginal:.0f}':>17} "
            f"{f['loadavg_1min'][0]:>5.2f}/{f['loadavg_1min'][1]:<5.2f}"
        )
    lines += [f"skipped: {s}" for s in skipped]
    for c in checks:
        if "target" in c:
            lines.append(
                f"target (cohort {c['cohort']:,}) {c['target']}: {c['value']:.3g} "
                f"(bound {c['bound']:g}) {c['status']}"
            )
        else:
            lines.append(f"targets (cohort {c['cohort']:,}): {c['status']}: {c['why']}")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, nargs="+", default=list(DEFAULT_CLIENTS))
    p.add_argument("--cohorts", type=int, nargs="+", default=list(DEFAULT_COHORTS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument(
        "--min-free-gib",
        type=float,
        default=18.0,
        help="skip a 1M-client run unless this much memory is available",
    )
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: results/)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        (cl,), (co,) = args.clients, args.cohorts
        args.json.write_text(json.dumps(run_child(cl, co, args.rounds)))
        return

    from workloads import machine_info, source_info

    started = datetime.now(timezone.utc)
    out = args.out or RESULTS_DIR / f"w5-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "workload": "W5",
        "utc": started.isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "config": str(CONFIG),
        "machine": machine_info(),  # cpu_count, cpus_usable, versions
        "source": source_info(),
        "settings": {
            "rounds": args.rounds,
            "clients": args.clients,
            "cohorts": args.cohorts,
            "ray_workers": 2,
            "threads_per_worker": 1,
            "sample_interval_s": SAMPLE_INTERVAL_S,
            "pss_every": PSS_EVERY,
        },
        "runs": [],
        "figures": [],
        "skipped": [],
        "targets": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for cohort in args.cohorts:
            for clients in sorted(args.clients):
                if cohort > clients:
                    report["skipped"].append(
                        f"{clients:,} clients, cohort {cohort:,}: cohort > clients"
                    )
                    continue
                free = mem_available_gib()
                if clients >= 1_000_000 and free < args.min_free_gib:
                    report["skipped"].append(
                        f"{clients:,} clients, cohort {cohort:,}: {free:.1f} GiB available "
                        f"< {args.min_free_gib:g} GiB"
                    )
                    print(report["skipped"][-1], flush=True)
                    continue
                print(
                    f"W5: {clients:,} clients, {cohort:,} per round ({free:.1f} GiB available)",
                    flush=True,
                )
                path = Path(tmp) / f"{clients}-{cohort}.json"
                cmd = [
                    sys.executable,
                    str(THIS),
                    "--child",
                    "--clients",
                    str(clients),
                    "--cohorts",
                    str(cohort),
                    "--rounds",
                    str(args.rounds),
                    "--json",
                    str(path),
                ]
                load_before = os.getloadavg()[0]
                proc = subprocess.Popen(cmd)
                with TreeSampler(proc.pid, SAMPLE_INTERVAL_S, PSS_EVERY) as sampler:
                    code = proc.wait()
                if code != 0:
                    report["skipped"].append(
                        f"{clients:,} clients, cohort {cohort:,}: exit code {code}"
                    )
                    continue
                record = json.loads(path.read_text())
                record.update(
                    clients=clients,
                    cohort=cohort,
                    process_tree=vars(sampler.result),
                    loadavg_1min=[load_before, os.getloadavg()[0]],
                )
                report["runs"].append(record)
                report["figures"].append(summarise(record))
                report["targets"] = targets(report["figures"])
                out.write_text(json.dumps(report, indent=2))  # as it goes
    lines = report_lines(report["figures"], report["skipped"], report["targets"])
    report["report"] = lines
    out.write_text(json.dumps(report, indent=2))
    print("\n" + "\n".join(lines) + f"\n\nwrote {out}", flush=True)


if __name__ == "__main__":
    main()
