"""Every workload in one command: W1–W3 on both backends against both floors, W3's
memory scaling, the W4 sweep and W5 (a million registered clients); one table, one JSON.

    python benchmarks/run_all.py [--rounds R] [--repeats K] [--engines auto,vmap]
                                 [--skip w4] [--no-peer] [--quick]

- W1, W2, W3: `benchmarks/workloads.py` (each runner in its own sampled subprocess,
  same batches everywhere; plus the Flower+Opacus peer where its environment exists,
  see benchmarks/peers/README.md), once per engine in `--engines`.
- W3 memory: the raydpfl Ray runner on W3 with 10,000 and with 1,000 clients (same
  data, a tenth of the clients per round, so the same records per round); memory per
  client = the difference in peak PSS over the difference in clients. A flat figure
  (≈ 0) is the target: memory grows with the data, not with the number of clients.
- W4: `raydpfl tune configs/w4.yaml` (16 trials, ASHA) in a sampled subprocess: trials
  per hour, peak memory, and whether every trial's result row was written.
- W5: `benchmarks/w5.py` (10k, 100k and 1M registered clients × 1,000 and 10,000 per
  round; the 1M runs only with 18 GiB available): start-up, s/round, peak PSS, bytes
  per registered client, and issue 19's targets.

Prints one table and writes benchmarks/results/run_all-<UTC>.json. `--quick` is a smoke
test (2 rounds, W2 and W3 only, no W4, no peer), not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from _proctree import TreeSampler  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
WORKLOADS_PY = ROOT / "benchmarks" / "workloads.py"
#: Like-for-like denominators of the table: the floor with the same processes and
#: threads, and the peer in its best mode (workloads.py's `best_peer_modes`).
FLOOR_OF = {
    "raydpfl_ray": ("floor_nonprivate_pool", "floor_vectorised_pool"),
    "raydpfl_local": ("floor_nonprivate",),
}
PEER_OF = {"raydpfl_ray": "flower_opacus_best", "raydpfl_local": "opacus_alone_best"}


def _newest(pattern: str, after: float) -> Path:
    found = [p for p in RESULTS_DIR.glob(pattern) if p.stat().st_mtime >= after]
    if not found:
        raise SystemExit(f"no {pattern} written by the benchmark")
    return max(found, key=lambda p: p.stat().st_mtime)


def run_workload(
    name: str,
    args: argparse.Namespace,
    engine: str,
    config: Path | None = None,
    runners: str | None = None,
    no_peers: bool = False,
) -> dict[str, Any]:
    """Runs workloads.py for one workload; returns the JSON it wrote."""
    cmd = [sys.executable, str(WORKLOADS_PY), "--workload", name, "--engine", engine]
    cmd += ["--repeats", str(args.repeats)]
    if args.rounds is not None:
        cmd += ["--rounds", str(args.rounds)]
    if config is not None:
        cmd += ["--config", str(config)]
    if runners is not None:
        cmd += ["--runners", runners]
    if no_peers:
        cmd += ["--no-peers"]
    started = time.time()
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(_newest(f"{name}-*.json", started).read_text())


def w3_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Peak memory of the Ray runner on W3 at 10,000 and at 1,000 clients."""
    base = yaml.safe_load((ROOT / "configs" / "w3.yaml").read_text())
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for clients in (1000, 10000):
            cfg = json.loads(json.dumps(base))
            cfg["experiment"]["data"]["num_clients"] = clients
            # A tenth of the clients per round: the same records per round (~6,000) at
            # both sizes, so only the number of clients differs.
            cfg["experiment"]["algorithm"]["clients_per_round"] = clients // 10
            path = Path(tmp) / f"w3-{clients}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            record = run_workload("w3", args, "auto", path, "raydpfl_ray")
            fig = record["figures"]["raydpfl_ray"]
            out[str(clients)] = {
                "peak_pss_mib": fig["peak_pss_mib"],
                "peak_rss_mib": fig["peak_rss_mib"],
            }
    small, large = out["1000"], out["10000"]
    out["mib_per_extra_client"] = (large["peak_pss_mib"] - small["peak_pss_mib"]) / 9000
    out["kib_per_extra_client"] = out["mib_per_extra_client"] * 1024
    return out


def w4_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The W4 sweep in a sampled subprocess: trials/hour, peak memory, result rows."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "w4"
        cmd = [sys.executable, "-m", "raydpfl", "tune", str(ROOT / "configs" / "w4.yaml")]
        cmd += ["--out", str(out_dir), "--quiet"]
        if args.rounds is not None:
            cmd += ["--set", f"algorithm.rounds={args.rounds}"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        print("$ raydpfl tune configs/w4.yaml", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with TreeSampler(proc.pid, 0.5) as sampler:
            code = proc.wait()
        wall = time.perf_counter() - t0
        if code != 0:
            raise SystemExit(f"W4 sweep failed with exit code {code}")
        rows = pq.read_table(out_dir / "results.parquet").to_pylist()
        summary = json.loads((out_dir / "sweep_summary.json").read_text())
    expected = 16
    return {
        "wall_seconds": wall,
        "trials": len(rows),
        "trials_per_hour": len(rows) / wall * 3600,
        "every_row_written": len(rows) == expected and all(r["status"] != "error" for r in rows),
        "stopped_early": sum(r["status"] == "stopped_early" for r in rows),
        "peak_rss_mib": sampler.result.peak_rss_mib,
        "peak_pss_mib": sampler.result.peak_pss_mib,
        "best_metric": summary["best_metric"],
        "epsilon_sweep": (summary.get("privacy") or {}).get("epsilon_sweep"),
    }


def w5_population(args: argparse.Namespace) -> dict[str, Any]:
    """`benchmarks/w5.py` with its defaults (its own JSON, and its report here)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w5.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "w5.py"), "--out", str(out)]
        if args.rounds is not None:
            cmd += ["--rounds", str(max(2, args.rounds))]
        print("$ " + " ".join(cmd[1:]), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit("W5 failed")
        report = json.loads(out.read_text())
    keep = ("figures", "skipped", "targets", "report", "machine", "settings")
    return {k: report.get(k) for k in keep}


def table(results: dict[str, Any]) -> list[str]:
    """The one table: per workload and engine, each runner's figures and its ratios to
    the like-for-like floor and to the best-configured peer."""
    head = (
        f"{'workload':<9}{'engine':<9}{'runner':<22}{'s/round':>9}{'cores':>6}"
        f"{'steps/s/core':>13}{'x floor':>8}{'floor':>23}{'x peer':>7}{'peer (best mode)':>22}"
        f"{'PSS MiB':>8}"
    )
    lines = [head, "-" * len(head)]
    for key, record in results["workloads"].items():
        workload, engine = key.split(":")
        figs = record["figures"]
        best = record.get("best_peer_modes", {})
        for runner, f in figs.items():
            spr = f["seconds_per_round"]
            floor = next((fl for fl in FLOOR_OF.get(runner, ()) if fl in figs), None)
            peer = best.get(PEER_OF.get(runner, ""))
            floor_ratio = f"{spr / figs[floor]['seconds_per_round']:.2f}" if floor else "-"
            peer_ratio = f"{figs[peer]['seconds_per_round'] / spr:.2f}" if peer else "-"
            per_core = f.get("client_steps_per_second_per_core")
            lines.append(
                f"{workload:<9}{engine:<9}{runner:<22}{spr:>9.3f}{f.get('cores') or '-':>6}"
                f"{(f'{per_core:.1f}' if per_core else '-'):>13}{floor_ratio:>8}"
                f"{floor or '-':>23}{peer_ratio:>7}{peer or '-':>22}{f['peak_pss_mib']:>8.0f}"
            )
        for t in record.get("targets", []):
            verdict = "met" if t["met"] else "MISSED"
            lines.append(
                f"  target {workload}: {t['ratio']} = {t['value']:.3f} {t['direction']} "
                f"{t['bound']:.2f}: {verdict} [{t['what']}]"
            )
    lines.append(
        "(x floor: s/round over the like-for-like non-private floor's (same processes and "
        "threads; W3 also client-vectorised), lower is better; x peer: the best-configured "
        "peer's s/round over this one's, higher is better: Flower+Opacus for the Ray "
        "backend, Opacus alone (sequential, 1 thread) for the local backend)"
    )
    mem = results.get("w3_memory")
    if mem:
        lines.append(
            f"W3 memory (raydpfl ray): peak PSS {mem['1000']['peak_pss_mib']:.0f} MiB at "
            f"1,000 clients, {mem['10000']['peak_pss_mib']:.0f} MiB at 10,000: "
            f"{mem['kib_per_extra_client']:.2f} KiB per extra client"
        )
    w5 = results.get("w5")
    if w5:
        lines += w5.get("report") or []
    w4 = results.get("w4")
    if w4:
        lines.append(
            f"W4 sweep: {w4['trials']} trials in {w4['wall_seconds']:.0f} s = "
            f"{w4['trials_per_hour']:.0f} trials/hour ({w4['stopped_early']} stopped by "
            f"ASHA), peak PSS {w4['peak_pss_mib']:.0f} MiB, every row written: "
            f"{w4['every_row_written']}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, help="rounds of every workload (default: each config's)")
    p.add_argument("--repeats", type=int, default=1, help="runs per runner (medians)")
    p.add_argument("--engines", default="auto", help="comma-separated: auto, bookkeeping, vmap")
    p.add_argument(
        "--skip", nargs="*", default=[], choices=["w1", "w2", "w3", "w3mem", "w4", "w5"]
    )
    p.add_argument("--quick", action="store_true", help="smoke test: 2 rounds, W2 and W3 only")
    p.add_argument(
        "--no-peer", action="store_true", help="leave out Flower+Opacus even where it can run"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.no_peer = True
        args.rounds = 2
        args.skip = sorted({*args.skip, "w1", "w3mem", "w4", "w5"})
    started = datetime.now(timezone.utc)
    results: dict[str, Any] = {
        "utc": started.isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "cpu_count": os.cpu_count(),
        "loadavg_1min_start": os.getloadavg()[0],
        "workloads": {},
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"run_all-{started.strftime('%Y%m%dT%H%M%SZ')}.json"

    def save() -> None:  # after every part: an interrupted invocation keeps what it has
        results["loadavg_1min_end"] = os.getloadavg()[0]
        path.write_text(json.dumps(results, indent=2))

    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        for name in ("w1", "w2", "w3"):
            if name not in args.skip:
                results["workloads"][f"{name}:{engine}"] = run_workload(
                    name, args, engine, no_peers=args.no_peer
                )
                save()
    if "w3mem" not in args.skip:
        results["w3_memory"] = w3_memory(args)
        save()
    if "w4" not in args.skip:
        results["w4"] = w4_sweep(args)
        save()
    if "w5" not in args.skip:
        results["w5"] = w5_population(args)
        save()
    lines = table(results)
    print("\n" + "\n".join(lines))
    results["table"] = lines
    save()
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
