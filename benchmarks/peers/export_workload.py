"""Exports a workload (W1, W2, W3) as one .npz for the peer benchmarks in this folder.

Runs in the project's main environment: raydpfl builds the Experiment from the
workload's config exactly as `benchmarks/workloads.py` does (same loader, normalisation,
partition, model initialisation), and the server's cohort RNG is replayed as
in `benchmarks/_floors.py`, so a peer trains the very clients and starts from the very
model that raydpfl does. The peers themselves never import raydpfl.

The .npz holds:
    x, y                  training pool (float32, normalised as raydpfl does; int64)
    x_test, y_test        central test set
    client_offsets,       client i's rows of the pool are
    client_rows             client_rows[client_offsets[i]:client_offsets[i + 1]]
    cohorts               int64 [rounds, clients_per_round]: round r's client ids
    param_names           the model's parameter names, named_parameters() order
    param_<k>             the k-th initial parameter tensor (float32)
    meta                  JSON string: workload, model name (the peer builds that
                          architecture), hyperparameters, shapes, seed

Usage (from the repository root, main environment):

    python benchmarks/peers/export_workload.py configs/w1.yaml [--out PATH] [--rounds R]

The default output is $RAYDPFL_PEERS_DATA (or ~/.cache/raydpfl/peers-data)/<name>.npz.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout: the package need not be installed
    sys.path.insert(0, str(ROOT))

DEFAULT_DIR = Path(
    os.environ.get("RAYDPFL_PEERS_DATA", Path.home() / ".cache" / "raydpfl" / "peers-data")
)


def export(config: Path, out: Path | None, rounds: int | None) -> Path:
    """Builds the workload's Experiment with raydpfl and writes its .npz; returns its path."""
    import torch

    from raydpfl.algorithms import DPFedAvg
    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment
    from raydpfl.simulation.seeding import SERVER, numpy_rng

    overrides = ["runtime.backend=local", "runtime.device=cpu"]
    if rounds is not None:
        overrides.append(f"algorithm.rounds={rounds}")
    exp = build_experiment(load_config(config, overrides))
    algo = exp.algorithm
    if not isinstance(algo, DPFedAvg):
        raise SystemExit(f"the peer benchmark runs DP-FedAvg; the config names {algo.name!r}")
    cfg = exp.config
    name = cfg.experiment.name
    seed = cfg.runtime.seed
    ds = exp.dataset
    total_rounds = cfg.experiment.algorithm.rounds

    # The server's cohorts, replayed from its "select" stream (as _floors.record_batches).
    cohorts = np.asarray(
        [
            algo.select(r, ds.num_clients, numpy_rng(seed, r, SERVER, "select"))
            for r in range(total_rounds)
        ],
        dtype=np.int64,
    )
    sizes = np.asarray([len(idx) for idx in ds.client_train], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = np.concatenate([np.asarray(idx, dtype=np.int64) for idx in ds.client_train])

    names = list(exp.init_params)
    params = {
        f"param_{k}": t.detach().cpu().numpy().astype(np.float32)
        for k, t in enumerate(exp.init_params.values())
    }
    num_params = sum(t.numel() for t in exp.init_params.values())
    meta = {
        "workload": name,
        "config": str(config),
        "seed": seed,
        "model": cfg.experiment.model.name,
        "num_params": int(num_params),
        "input_shape": list(ds.input_shape),
        "num_classes": int(ds.num_classes),
        "num_clients": int(ds.num_clients),
        "clients_per_round": int(cohorts.shape[1]),
        "rounds": int(total_rounds),
        "local_steps": int(algo.local_steps),
        "lr": float(algo.lr),
        "sampling_rate": float(algo.sampling_rate),
        "clip_norm": float(algo.clip_norm),
        "noise_multiplier": float(algo.noise_multiplier),
        "client_sizes": {
            "min": int(sizes.min()),
            "median": float(np.median(sizes)),
            "max": int(sizes.max()),
        },
        "torch_version": torch.__version__,
    }

    out = out or DEFAULT_DIR / f"{name}.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(
        tmp,
        x=np.asarray(ds.x, dtype=np.float32),
        y=np.asarray(ds.y, dtype=np.int64),
        x_test=np.asarray(ds.x_test, dtype=np.float32),
        y_test=np.asarray(ds.y_test, dtype=np.int64),
        client_offsets=offsets,
        client_rows=rows,
        cohorts=cohorts,
        param_names=np.asarray(names),
        meta=np.asarray(json.dumps(meta)),
        **params,
    )
    tmp.replace(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="workload config, e.g. configs/w1.yaml")
    parser.add_argument("--out", type=Path, default=None, help="output .npz path")
    parser.add_argument("--rounds", type=int, default=None, help="override the round count")
    args = parser.parse_args()
    t = time.perf_counter()
    path = export(args.config, args.out, args.rounds)
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        shape = f["x"].shape
    print(
        f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {time.perf_counter() - t:.1f} s): "
        f"{meta['workload']}, pool {shape}, {meta['num_clients']} clients "
        f"(sizes {meta['client_sizes']}), {meta['rounds']} rounds x "
        f"{meta['clients_per_round']} clients, {meta['num_params']:,} parameters"
    )


if __name__ == "__main__":
    main()
