"""Reproduces RC-DPFL's Fashion-MNIST covariate-shift table (Table 5) and writes the presets.

    python benchmarks/repro/rc_dpfl.py --write-configs        # configs/rc_dpfl/**.yaml
    python benchmarks/repro/rc_dpfl.py --epsilons 10 5 2 --methods rc_dpfl o_cdpfl
    python benchmarks/repro/rc_dpfl.py --rounds 8 --samples-per-client 500 --lr 0.05
    python benchmarks/repro/rc_dpfl.py --report               # table from saved results
    python benchmarks/repro/rc_dpfl.py --epsilons 5 --methods rc_dpfl --run-dir runs/rc  # resume

Every run is the preset `configs/rc_dpfl/fmnist_rotation/<method>_eps<ε>.yaml` (21 clients
in clusters {3, 6, 6, 6}, cluster k rotated by k·90°, official train/test split shared out
equally, the Table 1 CNN, b = 32, K = 1, E = 200, η = 0.005, c = 3, δ = 1e-4; spec §6.8),
optionally reduced by `--rounds`, `--samples-per-client`, `--test-samples-per-client` and
`--lr` (say so when you report). σ is calibrated per client to spend ε exactly over the run
(two-stage for RC-DPFL, §5.2).

Reported per run, from each client's final model (its cluster's model; the global one
for DP-FedAvg) on its own test split: the mean accuracy of all clients, of the majority
(clusters 1–3) and of the minority (cluster 0), the worst client, the largest gap between
two clients, and the clustering accuracy (Hungarian-matched) and exact-partition indicator
of the final assignment. With `--reference-epochs N` it also trains, per true cluster, a
non-private θ* (SGD, N epochs on the cluster's pooled train data) and reports F_acc and
F_loss (§7.1). Ours is printed beside the paper's Table 5 "All" and "Min". Results go to
benchmarks/results/rc_dpfl_repro*.json (one entry per run, appended as runs finish) and to
the reproduction record benchmarks/repro/results.jsonl (rows All, Maj and Min per run;
`_record.py`; `--no-record` skips it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from raydpfl.config import config_from_dict  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _record  # noqa: E402

CONFIG_DIR = ROOT / "configs" / "rc_dpfl"
RESULTS_DIR = ROOT / "benchmarks" / "results"
EPSILONS = (10.0, 5.0, 4.0, 3.0, 2.0)
#: name in this repo → the paper's table label
METHODS = {
    "rc_dp_fedavg": "DPFedAvg",
    "f_cdpfl": "f-CDPFL",
    "km_cdpfl": "KM-CDPFL",
    "rc_dpfl": "RC-DPFL",
    "o_cdpfl": "Oracle-CDPFL",
}
#: Table 5 (FMNIST, rotation): (All, Maj, Min) mean accuracy in % per ε.
PAPER_FMNIST = {
    "rc_dp_fedavg": {
        10: (62.62, 66.27, 42.32),
        5: (62.22, 65.86, 41.61),
        4: (62.32, 65.86, 44.84),
        3: (59.58, 62.90, 38.15),
        2: (59.78, 62.96, 43.23),
    },
    "f_cdpfl": {
        10: (78.19, 76.12, 76.21),
        5: (74.37, 73.43, 73.43),
        4: (75.26, 72.48, 77.89),
        3: (70.10, 67.82, 69.85),
        2: (70.42, 67.35, 69.88),
    },
    "km_cdpfl": {
        10: (60.17, 57.79, 59.81),
        5: (57.65, 58.75, 31.72),
        4: (57.34, 63.22, 15.95),
        3: (54.82, 53.31, 32.33),
        2: (53.55, 58.30, 19.70),
    },
    "rc_dpfl": {
        10: (80.26, 80.50, 79.03),
        5: (78.15, 78.41, 77.23),
        4: (77.80, 78.12, 76.21),
        3: (74.04, 75.11, 69.35),
        2: (74.84, 74.93, 73.29),
    },
    "o_cdpfl": {
        10: (80.46, 80.76, 79.76),
        5: (78.44, 78.42, 78.35),
        4: (78.31, 78.31, 77.81),
        3: (75.19, 75.02, 75.33),
        2: (75.11, 75.21, 75.00),
    },
}
#: Settings of the paper's tables (spec §6.8, §6.9, §6.18): dataset, shift, split, model, b, η, c.
SETTINGS = {
    "mnist_rotation": ("mnist", "rotation", "seed_pool_80_20", "rc_cnn", 32, 0.005, 1.0),
    "fmnist_rotation": (
        "fashion_mnist",
        "rotation",
        "official_train_test",
        "rc_cnn",
        32,
        0.005,
        3.0,
    ),
    "cifar10_rotation": (
        "cifar10",
        "rotation",
        "official_train_test",
        "rc_resnet18",
        32,
        0.001,
        5.0,
    ),
    "cifar10_label": ("cifar10", "label", "official_train_test", "rc_resnet18", 32, 0.001, 3.0),
}
_MODEL_OPTS: dict[str, Any] = {}


def preset(setting: str, method: str, epsilon: float) -> dict[str, Any]:
    """The paper's configuration of one cell (Tables 3–10)."""
    dataset, shift, split, model, b, lr, clip = SETTINGS[setting]
    return {
        "experiment": {
            "name": f"rc_dpfl-{setting}-{method}-eps{epsilon:g}",
            "data": {
                "dataset": dataset,
                "num_clients": 21,
                "client_test_fraction": 0.2,
                "cluster_shift": {
                    "kind": shift,
                    "cluster_sizes": "3,6,6,6",
                    "split_mode": split,
                },
            },
            "model": {"name": model},
            "algorithm": {
                "name": method,
                "rounds": 200,
                "clients_per_round": 21,
                "lr": lr,
                "eval_every": 10,
                "rc_dpfl": {"num_clusters": 4, "batch_size": b, "local_epochs": 1},
            },
            "privacy": {
                "accountant": "rdp",
                "epsilon": float(epsilon),
                "delta": 1e-4,
                "clip_norm": clip,
                "noise_multiplier": None,
            },
        },
        "runtime": {"backend": "local", "seed": 0, "threads": 1},
    }


def preset_path(setting: str, method: str, epsilon: float) -> Path:
    return CONFIG_DIR / setting / f"{method}_eps{epsilon:g}.yaml"


def write_configs() -> list[Path]:
    out = []
    for setting in SETTINGS:
        for method in METHODS:
            for eps in EPSILONS:
                path = preset_path(setting, method, eps)
                path.parent.mkdir(parents=True, exist_ok=True)
                header = (
                    f"# RC-DPFL paper, {setting}, {METHODS[method]}, epsilon={eps:g} "
                    "(written by benchmarks/repro/rc_dpfl.py --write-configs)\n"
                )
                path.write_text(
                    header + yaml.safe_dump(preset(setting, method, eps), sort_keys=False)
                )
                out.append(path)
    return out


def _reduce(cfg: dict[str, Any], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    exp = cfg["experiment"]
    if args.rounds:
        exp["algorithm"]["rounds"] = args.rounds
        exp["algorithm"]["eval_every"] = args.rounds
    if args.lr:
        exp["algorithm"]["lr"] = args.lr
    if args.samples_per_client:
        exp["data"]["cluster_shift"]["samples_per_client"] = args.samples_per_client
    if args.test_samples_per_client:
        exp["data"]["cluster_shift"]["test_samples_per_client"] = args.test_samples_per_client
    if args.gmm_stage_rounds is not None:
        exp["algorithm"]["rc_dpfl"]["gmm_stage_rounds"] = args.gmm_stage_rounds
    cfg["runtime"]["seed"] = seed
    return cfg


def _run_dir(args: argparse.Namespace, setting: str, method: str, eps: float, seed: int):
    """The run's directory under ``--run-dir`` (None without it)."""
    if args.run_dir is None:
        return None
    return Path(args.run_dir) / f"{setting}_{method}_eps{eps:g}_seed{seed}"


def _open_run_dir(run_dir: Path | None, cfg: Any) -> tuple[Any, bool]:
    """(the run's writer or None, whether it resumes an interrupted run).

    A directory with a checkpoint and no summary is resumed (the engine verifies the
    checkpoint and refuses a config that differs from the saved one); an empty or absent
    one starts fresh with checkpoints every ``runtime.checkpoint_every`` rounds; a
    finished one is refused (its row was written when it finished)."""
    if run_dir is None:
        return None, False
    from raydpfl.config import dump_config
    from raydpfl.experiment.build import check_resume
    from raydpfl.simulation.outputs import RunWriter, prepare_run_dir

    if (run_dir / "summary.json").exists():
        raise SystemExit(f"{run_dir} is a finished run; remove it to run again")
    if (run_dir / "config.yaml").exists():
        check_resume(run_dir, cfg)
        return RunWriter(run_dir), True
    prepare_run_dir(run_dir)
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(cfg))
    return writer, False


def _progress(method: str, eps: float):
    """Prints every 10th round's row (time and test accuracy) as the run goes."""

    def report(row: Any) -> None:
        r = int(row["round"]) if "round" in row else None
        if r is not None and r % 10 == 0:
            acc = row.get("test_accuracy")
            print(
                f"  [{method} eps={eps:g}] round {r} ({row.get('wall_seconds', 0):.1f}s/round, "
                f"test acc {acc})",
                flush=True,
            )

    return report


def _evaluate_final(exp: Any, server: Any, backend: Any) -> dict[str, np.ndarray]:
    """Per-client test accuracy (%) and train loss of each client's final model."""
    import torch

    from raydpfl.algorithms.multi_model import model_params
    from raydpfl.simulation.evaluation import evaluate

    n = exp.dataset.num_clients
    keys = exp.algorithm.evaluation_model_keys(n) or ["global"] * n
    worker = backend.worker
    accs, losses = [], []
    for c in range(n):
        params = model_params(server.params, keys[c])
        test = evaluate(
            worker.model, params, worker.x[worker.client_test[c]], worker.y[worker.client_test[c]]
        )
        train = evaluate(
            worker.model,
            params,
            worker.x[worker.client_train[c]],
            worker.y[worker.client_train[c]],
        )
        accs.append(100.0 * test.accuracy)
        losses.append(train.loss)
    del torch
    return {"acc": np.asarray(accs), "train_loss": np.asarray(losses), "keys": np.asarray(keys)}


def _references(exp: Any, backend: Any, clusters: np.ndarray, epochs: int, lr: float, seed: int):
    """θ* per true cluster: non-private SGD (batch 32) on the cluster's pooled train data;
    returns each client's test accuracy (%) and train loss under its cluster's θ*."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call

    from raydpfl.simulation.evaluation import evaluate

    worker = backend.worker
    accs, losses = np.zeros(len(clusters)), np.zeros(len(clusters))
    for k in sorted(set(clusters.tolist())):
        members = np.flatnonzero(clusters == k)
        idx = torch.cat([worker.client_train[c] for c in members])
        params = {n: t.clone().requires_grad_(True) for n, t in exp.init_params.items()}
        gen = torch.Generator().manual_seed(seed * 100 + k)
        for _ in range(epochs):
            order = idx[torch.randperm(len(idx), generator=gen)]
            for s in range(0, len(order), 32):
                rows = order[s : s + 32]
                loss = F.cross_entropy(
                    functional_call(worker.model, params, (worker.x[rows],)), worker.y[rows]
                )
                grads = torch.autograd.grad(loss, list(params.values()))
                with torch.no_grad():
                    for p, g in zip(params.values(), grads, strict=True):
                        p.sub_(g, alpha=lr)
        fixed = {n: t.detach() for n, t in params.items()}
        for c in members:
            accs[c] = (
                100.0
                * evaluate(
                    worker.model,
                    fixed,
                    worker.x[worker.client_test[c]],
                    worker.y[worker.client_test[c]],
                ).accuracy
            )
            losses[c] = evaluate(
                worker.model,
                fixed,
                worker.x[worker.client_train[c]],
                worker.y[worker.client_train[c]],
            ).loss
    return accs, losses


def run_one(setting: str, method: str, eps: float, seed: int, args: argparse.Namespace) -> dict:
    import torch

    from raydpfl.experiment.build import build_experiment, make_local_backend, make_server
    from raydpfl.papers.rc_dpfl.metrics import (
        fairness_accuracy,
        fairness_loss,
        group_accuracies,
        hungarian_clustering_accuracy,
        is_exact_partition,
        max_accuracy_disparity,
        worst_client_accuracy,
    )

    torch.set_num_threads(args.threads)
    cfg = config_from_dict(_reduce(preset(setting, method, eps), args, seed))
    t0 = time.time()
    exp = build_experiment(cfg)
    clusters = np.asarray(exp.dataset.clusters, dtype=np.int64)
    run_dir = _run_dir(args, setting, method, eps, seed)
    writer, resume = _open_run_dir(run_dir, cfg)
    server = make_server(exp, writer, _progress(method, eps), resume=resume)
    resumed_from = server.resumed_from  # the round the checkpoint had completed
    with make_local_backend(exp) as backend:
        summary = server.run(backend)
        final = _evaluate_final(exp, server, backend)
        ref = None
        if args.reference_epochs:
            ref = _references(exp, backend, clusters, args.reference_epochs, 0.05, seed)
    groups = group_accuracies(final["acc"], clusters)
    assigned = np.asarray([int(k[1:]) if k.startswith("m") else 0 for k in final["keys"]])
    rec = {
        "setting": setting,
        "method": method,
        "epsilon": eps,
        "seed": seed,
        "rounds": cfg.experiment.algorithm.rounds,
        "lr": cfg.experiment.algorithm.lr,
        "samples_per_client": int(exp.dataset.train_sizes()[0]),
        "all": groups["all"],
        "majority": groups["majority"],
        "minority": groups["minority"],
        "worst_client": worst_client_accuracy(final["acc"]),
        "max_gap": max_accuracy_disparity(final["acc"]),
        "clustering_accuracy": hungarian_clustering_accuracy(clusters, assigned),
        "exact_partition": bool(is_exact_partition(clusters, assigned)),
        "epsilon_max": summary["epsilon_max"],
        "noise_multiplier": summary["privacy"]["noise_multiplier"],
        "gmm": {k: v for k, v in server.rows[0].items() if k.startswith(("gmm_", "cluster_"))},
        "wall_seconds": time.time() - t0,
        "resumed_from_round": resumed_from,
        "paper_all_maj_min": PAPER_FMNIST.get(method, {}).get(int(eps))
        if setting == "fmnist_rotation"
        else None,
    }
    if ref is not None:
        rec["F_acc"] = fairness_accuracy(final["acc"], ref[0])
        rec["F_loss"] = fairness_loss(final["train_loss"], ref[1])
    return rec


#: The paper's table of each setting's All/Maj/Min accuracies (spec §8).
TABLE_OF_SETTING = {
    "mnist_rotation": "3",
    "fmnist_rotation": "5",
    "cifar10_rotation": "7",
    "cifar10_label": "9",
}


def record_rows(rec: dict, args: argparse.Namespace) -> None:
    """Appends one run to the reproduction record: its All, Maj and Min rows."""
    changed = [
        f"{name} {value}"
        for name, value in (
            ("--rounds", args.rounds),
            ("--lr", args.lr),
            ("--samples-per-client", args.samples_per_client),
            ("--test-samples-per-client", args.test_samples_per_client),
            ("--gmm-stage-rounds", args.gmm_stage_rounds),
        )
        if value is not None
    ]
    paper = rec.get("paper_all_maj_min") or (None, None, None)
    for i, (column, key) in enumerate((("All", "all"), ("Maj", "majority"), ("Min", "minority"))):
        _record.record(
            paper="rc_dpfl",
            table=TABLE_OF_SETTING[rec["setting"]],
            dataset=SETTINGS[rec["setting"]][0],
            setting=column,
            method=rec["method"],
            epsilon=rec["epsilon"],
            seed=rec["seed"],
            ours=rec[key],
            metric=f"mean_client_accuracy_{key}",
            paper_value=paper[i],
            rounds_run=rec["rounds"],
            rounds_paper=200,
            schedule="reduced" if changed else "full",
            dp=True,
            wall_s=rec["wall_seconds"],
            note="each client's final model on its own test split"
            + (f"; reduced: {', '.join(changed)}" if changed else "")
            + (
                f"; resumed from its round-{rec['resumed_from_round']} checkpoint (wall_s is "
                "the resumed part only)"
                if rec.get("resumed_from_round")
                else ""
            ),
            extra={
                k: rec[k]
                for k in ("lr", "samples_per_client", "clustering_accuracy", "epsilon_max")
            },
        )


def table(records: list[dict]) -> str:
    lines = [
        "| method | ε | All (ours / paper) | Min (ours / paper) | Maj (ours) | worst | gap "
        "| clust. acc | ε spent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (list(METHODS).index(r["method"]), -r["epsilon"])):
        paper = r.get("paper_all_maj_min") or (float("nan"),) * 3
        single = r["method"] == "rc_dp_fedavg"
        clust = "–" if single else format(r["clustering_accuracy"], ".2f")
        lines.append(
            f"| {METHODS[r['method']]} | {r['epsilon']:g} | {r['all']:.2f} / {paper[0]:.2f} | "
            f"{r['minority']:.2f} / {paper[2]:.2f} | {r['majority']:.2f} | "
            f"{r['worst_client']:.2f} | {r['max_gap']:.2f} | "
            f"{clust} | "
            f"{r['epsilon_max']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write-configs", action="store_true", help="write configs/rc_dpfl/")
    p.add_argument("--report", action="store_true", help="print the table of saved results")
    p.add_argument("--setting", default="fmnist_rotation", choices=list(SETTINGS))
    p.add_argument("--epsilons", nargs="+", type=float, default=[10.0, 5.0, 2.0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--rounds", type=int, default=None, help="reduce E (paper: 200)")
    p.add_argument("--lr", type=float, default=None, help="override η (paper: 0.005)")
    p.add_argument("--samples-per-client", type=int, default=None)
    p.add_argument("--test-samples-per-client", type=int, default=None)
    p.add_argument("--gmm-stage-rounds", type=int, default=None, help="fix E_c")
    p.add_argument("--reference-epochs", type=int, default=0, help="train θ* for F_acc/F_loss")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--out", default="rc_dpfl_repro.json", help="file in benchmarks/results/")
    p.add_argument(
        "--run-dir",
        default=None,
        help="keep each run's outputs and checkpoints in DIR/<setting>_<method>_eps<ε>_seed<s>; "
        "the same command resumes an interrupted run from its last checkpoint",
    )
    _record.add_record_args(p)
    args = p.parse_args(argv)
    _record.check_tree(args)
    if args.write_configs:
        paths = write_configs()
        print(f"wrote {len(paths)} presets under {CONFIG_DIR.relative_to(ROOT)}")
        return 0
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if args.report:
        records = []
        for path in sorted(RESULTS_DIR.glob("rc_dpfl_repro*.json")):
            records += json.loads(path.read_text())
        print(table(records))
        return 0
    out = RESULTS_DIR / args.out
    for eps in args.epsilons:
        for method in args.methods:
            for seed in args.seeds:
                rec = run_one(args.setting, method, eps, seed, args)
                _record.append_json(out, rec)
                if not args.no_record:
                    record_rows(rec, args)
                print(
                    json.dumps(
                        {
                            k: rec[k]
                            for k in ("method", "epsilon", "all", "minority", "wall_seconds")
                        }
                    ),
                    flush=True,
                )
    print(table(json.loads(out.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
