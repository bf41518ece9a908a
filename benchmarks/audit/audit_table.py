"""The audit table: claimed ε beside the white-box and black-box empirical lower bounds.

For the quickstart, one preset per paper whose algorithm the audit supports (ALI-DPFL,
FedFDP, RC-DPFL) and workload W1, runs `raydpfl audit` (Steinke, Nasr & Jagielski 2023;
`raydpfl.audit`) in both modes, each row one CLI command, and writes

- ``benchmarks/audit/results.json``: per row the command, the audit.json fields (scores
  and inclusion left out) and the wall time;
- ``benchmarks/audit/results.md``: the markdown table.

The paper presets are cut (fewer rounds, evaluation only at the end, fewer canaries) so
that each row takes about 3 minutes or less on a 2-core machine; the cuts are in
`ROWS` and in the table's command column. A lower bound above the claim (or above the
ε of the audited releases alone) is a bug: the script says so and exits 1.

    python benchmarks/audit/audit_table.py                 # every row (~17 min, 2 busy cores)
    python benchmarks/audit/audit_table.py --only quickstart fedfdp   # some rows
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: (row, config, --set overrides, canaries); each row runs in both modes.
ROWS: list[tuple[str, str, list[str], int]] = [
    ("quickstart", "configs/quickstart.yaml", [], 1000),
    (
        "ali_dpfl",
        "configs/ali_dpfl/fashion_mnist/tableii_rc.yaml",
        # ε = 1.4 gives R_c = 36 (paper_compat) = R_s: τ = 1 throughout, as in the preset
        [
            "experiment.privacy.epsilon=1.4",
            "experiment.algorithm.rounds=36",
            "experiment.algorithm.eval_every=36",
        ],
        500,
    ),
    (
        "fedfdp",
        "configs/fedfdp/table3_fashion_mnist.yaml",
        [
            "experiment.algorithm.rounds=10",
            "experiment.algorithm.eval_every=10",
            "experiment.algorithm.evaluate_clients=false",
        ],
        500,
    ),
    (
        "rc_dpfl",
        "configs/rc_dpfl/fmnist_rotation/rc_dpfl_eps10.yaml",
        # σ given (the preset calibrates z_i per client on its |D_i| for 200 rounds: tens
        # of seconds of RDP calibration per client, twice), 600 records per client, 3
        # rounds: the full-batch GMM round, a GMM-stage round, a loss-based round
        [
            "experiment.algorithm.rounds=3",
            "experiment.algorithm.eval_every=3",
            "experiment.data.cluster_shift.samples_per_client=600",
            "experiment.privacy.noise_multiplier=1.0",
        ],
        420,
    ),
    (
        "w1",
        "configs/w1.yaml",
        ["experiment.algorithm.rounds=10", "experiment.algorithm.eval_every=10"],
        1000,
    ),
]
MODES = ("white-box", "black-box")


def command(config: str, sets: list[str], canaries: int, mode: str) -> list[str]:
    """The `raydpfl audit` command line of one row and mode (without --out)."""
    cmd = ["raydpfl", "audit", config, "--canaries", str(canaries), "--mode", mode]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_row(name: str, config: str, sets: list[str], canaries: int, mode: str) -> dict:
    """Runs one audit as a subprocess (the CLI, in-process backend) and reads audit.json."""
    cmd = command(config, sets, canaries, mode)
    with tempfile.TemporaryDirectory(prefix="raydpfl-audit-table-") as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "raydpfl", *cmd[1:], "--out", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
        result = json.loads((out / "audit.json").read_text())
    summary = result.pop("summary", {})
    result.pop("scores", None)
    result.pop("inclusion", None)
    return {
        "row": name,
        "mode": mode,
        "command": shlex.join(cmd),
        "wall_s": round(wall, 1),
        "algorithm": summary.get("algorithm"),
        "rounds_run": summary.get("rounds_completed", summary.get("rounds")),
        "stdout": proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "",
        **result,
    }


def markdown(rows: list[dict]) -> str:
    """The table: one line per (row, mode)."""
    head = (
        "| workload | algorithm | mode | canaries (in) | correct / guesses "
        "| ε lower bound (95 %) | accountant ε | ε of audited releases | δ | wall |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in rows:
        audited = r.get("epsilon_audited") or r["epsilon_claimed"]
        lines.append(
            f"| {r['row']} | {r.get('algorithm')} | {r['mode']} | {r['canaries']} "
            f"({r['included']}) | {r['correct']} / {r['guesses']} "
            f"| **{r['epsilon_lower_bound']:.2f}** | {r['epsilon_claimed']:.2f} "
            f"| {audited:.2f} | {r['delta']:g} | {r['wall_s']:.0f} s |"
        )
    cmds = "\n".join(f"- `{r['row']}`, {r['mode']}: `{r['command']}`" for r in rows)
    return head + "\n".join(lines) + "\n\nCommands:\n\n" + cmds + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="row names (default: all)")
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    args = parser.parse_args(argv)
    path = HERE / "results.json"
    done = (
        {(r["row"], r["mode"]): r for r in json.loads(path.read_text())} if path.exists() else {}
    )
    bugs = []
    for name, config, sets, canaries in ROWS:
        if args.only and name not in args.only:
            continue
        for mode in args.modes:
            r = run_row(name, config, sets, canaries, mode)
            done[(name, mode)] = r
            print(f"{name:10s} {mode:9s} {r['wall_s']:6.1f}s  {r['stdout']}", flush=True)
            limit = min(r["epsilon_claimed"], r.get("epsilon_audited") or r["epsilon_claimed"])
            if r["epsilon_lower_bound"] > limit:
                bugs.append(r["command"])
            order = [(n, m) for n, *_ in ROWS for m in MODES]
            rows = [done[k] for k in order if k in done]
            path.write_text(json.dumps(rows, indent=1) + "\n")
            (HERE / "results.md").write_text(markdown(rows))
    if bugs:
        print("LOWER BOUND ABOVE THE CLAIM (a bug):\n  " + "\n  ".join(bugs), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
