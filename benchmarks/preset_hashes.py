"""Model and ledger hashes of short runs of every private algorithm and the presets.

A refactor that promises "same bits" (the privacy kernel, the papers' move) runs this on
a worktree of the commit before and on the change, and compares:

    python benchmarks/preset_hashes.py --out /tmp/before.json            # in the old tree
    python benchmarks/preset_hashes.py --out /tmp/after.json --compare /tmp/before.json

Each case is `raydpfl run CONFIG --set runtime.backend=local ...` with a few rounds, one
thread, in its own process; the figures are the run's summary.json `model_sha256` and
`ledger_sha256` (secure-noise runs draw from os.urandom: only their ledger is compared).
The package imported is the one on the interpreter's path: run it from the tree to test
(``PYTHONPATH=<tree>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOCAL = ["runtime.backend=local", "runtime.threads=1"]
SMALL_IMAGES = ["experiment.data.dataset=digits", "experiment.model.name=mlp"]
QUICKSTART = "configs/quickstart.yaml"
FEDFDP = "configs/fedfdp/table2_mnist.yaml"
BCS = "configs/dpfl_bcs/fashion_mnist_dpfl_bcs_gaussian.yaml"
ALI = "configs/ali_dpfl/fashion_mnist/tableii_rc.yaml"
RC = "configs/rc_dpfl/fmnist_rotation/rc_dpfl_eps5.yaml"


def _case(config: str, *overrides: str, ledger_only: bool = False) -> dict:
    return {"config": config, "overrides": [*LOCAL, *overrides], "ledger_only": ledger_only}


def _named(config: str, name: str, *overrides: str) -> dict:
    return _case(config, f"experiment.algorithm.name={name}", *overrides)


#: name -> case. Record-level algorithms on the quickstart's Synthetic data or digits;
#: each paper's family on its own preset, shrunk (digits + mlp, few rounds) to fit minutes.
CASES: dict[str, dict] = {
    "quickstart": _case(QUICKSTART, "experiment.algorithm.rounds=3"),
    "quickstart_boxmuller": _case(
        QUICKSTART, "experiment.algorithm.rounds=3", "experiment.privacy.noise_sampler=boxmuller"
    ),
    "quickstart_ziggurat": _case(
        QUICKSTART, "experiment.algorithm.rounds=3", "experiment.privacy.noise_sampler=ziggurat"
    ),
    "quickstart_vectorised": _case(
        QUICKSTART, "experiment.algorithm.rounds=3", "runtime.vectorise_clients=on"
    ),
    "quickstart_calibrated": _case(
        QUICKSTART, "experiment.algorithm.rounds=3", "experiment.privacy.noise_multiplier=null"
    ),
    "quickstart_secure_noise": _case(
        QUICKSTART,
        "experiment.algorithm.rounds=3",
        "experiment.privacy.secure_noise=true",
        ledger_only=True,
    ),
    "fmnist_dp_fedavg": _case("configs/fmnist_dp_fedavg.yaml", "experiment.algorithm.rounds=2"),
    **{
        name: _named(QUICKSTART, name, "experiment.algorithm.rounds=3")
        for name in (
            "fedavg",
            "fedprox",
            "scaffold",
            "feddyn",
            "qffl",
            "dp_fedprox",
            "dp_scaffold",
            "dp_feddyn",
            "dp_qffl",
            "pe_dpfl",
            "adap_dp_fl",
        )
    },
    **{
        name: _named(ALI, name, "experiment.algorithm.rounds=3", *SMALL_IMAGES)
        for name in ("ali_dpfl", "dp_fedavg_fixed_tau")
    },
    **{
        name: _named(FEDFDP, name, "experiment.algorithm.rounds=3", *SMALL_IMAGES)
        for name in ("fedfdp", "fedfair")
    },
    **{
        name: _named(
            BCS,
            name,
            "experiment.algorithm.rounds=3",
            "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
            *SMALL_IMAGES,
        )
        for name in ("dpfl_bcs", "bcs_dpsgd", "bcs_fedsgd", "bcs_pfa", "bcs_weiavg")
    },
    **{
        name: _named(
            BCS,
            name,
            "experiment.algorithm.rounds=3",
            "experiment.data.client_test_fraction=0.2",
            "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
            *SMALL_IMAGES,
        )
        for name in ("bcs_privatefl", "bcs_privatefl_bcs")
    },
    "bcs_dmldp": _named(
        "configs/dpfl_bcs/fashion_mnist_dpfl_bcs_laplace.yaml",
        "bcs_dmldp",
        "experiment.algorithm.rounds=3",
        "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
        *SMALL_IMAGES,
    ),
    "dpfl_bcs_laplace": _case(
        "configs/dpfl_bcs/fashion_mnist_dpfl_bcs_laplace.yaml",
        "experiment.algorithm.rounds=3",
        "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
        *SMALL_IMAGES,
    ),
    "dpfl_bcs_paper_alg2": _case(
        "configs/dpfl_bcs/fashion_mnist_dpfl_bcs_gaussian_paper_alg2.yaml",
        "experiment.algorithm.rounds=3",
        "experiment.algorithm.dpfl_bcs.stage1_rounds=2",
        *SMALL_IMAGES,
    ),
    **{
        name: _named(RC, name, "experiment.algorithm.rounds=2", *SMALL_IMAGES)
        for name in (
            "rc_dpfl",
            "rc_dp_fedavg",
            "km_cdpfl",
            "f_cdpfl",
            "o_cdpfl",
            "rc_local",
            "mr_mtl",
        )
    },
    "rc_dpfl_gumbel": _named(
        RC,
        "rc_dpfl",
        "experiment.algorithm.rounds=3",
        *SMALL_IMAGES,
        "experiment.algorithm.rc_dpfl.selection_privacy=gumbel",
    ),
    **{
        Path(p).stem: _case(p, "experiment.algorithm.rounds=5")
        for p in (
            "configs/client_level/dp_fedavg_client_synthetic.yaml",
            "configs/client_level/dp_fedavg_client_adaptive_synthetic.yaml",
            "configs/client_level/dp_ftrl_client_synthetic.yaml",
        )
    },
}


def run_case(name: str, case: dict, workdir: Path) -> dict:
    """Runs one case in its own process; returns its hashes (or its error)."""
    out = workdir / name
    cmd = [
        sys.executable,
        "-m",
        "raydpfl",
        "run",
        str(ROOT / case["config"]),
        "--out",
        str(out),
        "--no-progress",
    ]
    for o in case["overrides"]:
        cmd += ["--set", o]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    row: dict = {"seconds": round(time.perf_counter() - t0, 1)}
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        row["error"] = f"exit {proc.returncode}: {tail[0][:300]}"
        return row
    s = json.loads(summary.read_text())
    row["model_sha256"] = None if case["ledger_only"] else s.get("model_sha256")
    row["ledger_sha256"] = s.get("ledger_sha256")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for the hashes")
    p.add_argument("--compare", type=Path, help="a JSON file from an earlier invocation")
    p.add_argument("--only", nargs="*", help="case names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="cases run at once")
    args = p.parse_args(argv)
    names = args.only or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        found = pool.map(lambda n: run_case(n, CASES[n], Path(tmp)), names)
        rows = dict(zip(names, found, strict=True))
    args.out.write_text(json.dumps(rows, indent=1))
    before = json.loads(args.compare.read_text()) if args.compare else {}
    if "after" in before and isinstance(before["after"], dict):
        # A committed record (benchmarks/results/preset_hashes-*.json) nests the hashes
        # under before/after; compare with the later. A plain --out file is flat.
        before = before["after"]
    if args.compare and not set(rows) & set(before):
        p.error(f"{args.compare} holds none of these cases: nothing would be compared")
    differ = 0
    for name, row in rows.items():
        if "error" in row:
            line = f"{name}: ERROR {row['error']}"
            differ += 1
        else:
            model, ledger = str(row["model_sha256"])[:16], str(row["ledger_sha256"])[:16]
            line = f"{name}: model {model} ledger {ledger}"
        if name in before:
            same = all(
                before[name].get(k) == row.get(k)
                for k in ("model_sha256", "ledger_sha256", "error")
            )
            line += "  = before" if same else f"  DIFFERS from before {before[name]}"
            differ += not same
        print(line + f"  ({row['seconds']} s)", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
