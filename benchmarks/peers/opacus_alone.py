"""Peer benchmark: Opacus alone (no Flower, no Ray) on W1 / W2 / W3, one process, one thread.

Runs in the peer venv made by `setup_env.sh` (it needs only torch, numpy and Opacus; it
never imports raydpfl, Flower or Ray). It reads the export written by
`export_workload.py` and trains the same workload as `flower_opacus.py`, with the same
client recipe, but without a federated-learning framework around it:

- One process, one torch thread (OMP_NUM_THREADS=1, set before torch is imported, and
  `torch.set_num_threads(1)`); each round trains the export's cohort for that round, its
  clients one after another, then aggregates.
- Client recipe as `flower_opacus.py`'s (its model classes and its `make_private` are
  imported from there): the export's model, SGD(lr), Opacus `make_private` with
  noise_multiplier sigma, max_grad_norm C, "mean" cross entropy and `grad_sample_mode`
  "hooks" or "ghost", over an Opacus Poisson `DPDataLoader` at rate q; exactly tau steps
  (an empty Poisson batch is still a step: noise only); the optimizer's
  `expected_batch_size` is q*|D_i|.
- Its best configuration: the model, its Opacus wrapper (GradSampleModule) and the DP
  optimizer are built ONCE and reused for every client. Per client: the global weights
  are copied into the wrapped model's parameters in place, a new `DPDataLoader` is made
  over the client's records, the optimizer's gradients / summed gradients / per-sample
  state are cleared and its `expected_batch_size` set to q*|D_i|. (`--check-reuse`
  checks that a reused wrapper gives bit-identical updates to a freshly built one.) The
  privacy accountant's step hook is detached: no epsilon is computed (the workload fixes
  sigma), and a reused wrapper's hook would carry the first client's sample rate.
- Server: FedAvg weighted by |D_i| (as Flower's FedAvg with num-examples = |D_i|), from
  the export's initial parameters, exactly the export's cohorts.

Round time = wall clock from a round's start to the end of its aggregation (all cohort
clients trained one after another + FedAvg). Seconds per round = median over rounds
2..R (round 1 includes first-call warm-up). The final global model is scored on the
export's test set after the last round, outside the round times.

Allocator (`--allocator`, default "tuned"): as `flower_opacus.py`, the process runs with
raydpfl's glibc malloc settings (MALLOC_MMAP_THRESHOLD_ = 64 MiB, MALLOC_TRIM_THRESHOLD_ =
256 MiB), re-executing itself with them when its environment lacks them; "default"
runs with glibc's defaults.

Usage (from the repository root):

    $RAYDPFL_PEERS_VENV/bin/python benchmarks/peers/opacus_alone.py \\
        ~/.cache/raydpfl/peers-data/w1.npz [--rounds R] \\
        [--grad-sample-mode {hooks,ghost}] [--allocator {tuned,default}] [--out-dir DIR]
    $RAYDPFL_PEERS_VENV/bin/python benchmarks/peers/opacus_alone.py \\
        ~/.cache/raydpfl/peers-data/w1.npz --check-reuse [--grad-sample-mode ghost]

Writes benchmarks/results/peers/opacus_alone[-ghost]-<workload>-<UTC>.json (exactly one
file per run; "-ghost" with `--grad-sample-mode ghost`), prints a table, and prints
`wrote <path>` as the last line of stdout. `--check-reuse` writes no file.
"""

from __future__ import annotations

import os

# One torch thread in this one process: set before torch is imported (by flower_opacus).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flower_opacus as fo  # (the peer's models, export reader and Opacus setup)
import numpy as np
import torch
from torch.utils.data import TensorDataset

RUNNERS = {"hooks": "opacus_alone", "ghost": "opacus_alone_ghost"}
THREAD_LAYOUT = "1 process x 1 torch thread, clients one after another"


class ReusedClient:
    """The model, its Opacus wrapper and the DP optimizer, built once; `train` runs one
    client's local DP-SGD on them, starting from given global parameters."""

    def __init__(self, wl: fo.Workload, mode: str, first_client: int = 0) -> None:
        from opacus.data_loader import DPDataLoader

        meta = wl.meta
        self.wl = wl
        self.q = float(meta["sampling_rate"])
        self.steps = int(meta["local_steps"])
        model = wl.build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=float(meta["lr"]))
        # make_private needs a loader; every client gets its own in `train`.
        x, y = wl.client_data(first_client)
        loader = DPDataLoader(TensorDataset(x, y), sample_rate=self.q)
        self.model, self.optimizer, self.criterion, _ = fo.make_private(
            model,
            optimizer,
            loader,
            mode=mode,
            noise_multiplier=float(meta["noise_multiplier"]),
            clip_norm=float(meta["clip_norm"]),
        )
        self.optimizer.attach_step_hook(None)  # no accountant: no epsilon is computed
        self.named = list(self.model._module.named_parameters())  # the optimizer's params
        self.model.train()

    def _reset(self, n: int, generator: torch.Generator | None) -> None:
        """Clears everything a previous client could leave behind, and checks it."""
        opt = self.optimizer
        opt.zero_grad(set_to_none=True)  # p.grad, p.grad_sample, p.summed_grad
        opt.original_optimizer.state.clear()  # plain SGD keeps none; for other optimizers
        opt.expected_batch_size = self.q * n  # the workload's divisor, q * |D_i|
        opt.generator = generator  # None: torch's default RNG
        for _, p in self.named:
            if p.grad is not None or getattr(p, "grad_sample", None) is not None:
                raise RuntimeError("stale gradient state after zero_grad")
            if getattr(p, "summed_grad", None) is not None or p._forward_counter != 0:
                raise RuntimeError("stale Opacus accumulation state after zero_grad")
        if opt._step_skip_queue or any(
            getattr(m, "activations", None) for m in self.model._module.modules()
        ):
            raise RuntimeError("stale Opacus activations / skip queue between clients")

    def train(
        self,
        cid: int,
        global_state: dict[str, torch.Tensor],
        generator: torch.Generator | None = None,
    ) -> tuple[dict[str, torch.Tensor], int, int]:
        """Client `cid`'s tau DP-SGD steps from `global_state`; returns (its parameters,
        |D_i|, records sampled). `generator` (optional) drives both the Poisson sampling
        and the noise."""
        from opacus.data_loader import DPDataLoader

        x, y = self.wl.client_data(cid)
        n = int(x.shape[0])
        with torch.no_grad():
            for name, p in self.named:
                p.copy_(global_state[name])
        self._reset(n, generator)
        loader = DPDataLoader(TensorDataset(x, y), sample_rate=self.q, generator=generator)
        samples = fo.run_local_steps(
            self.model, self.optimizer, self.criterion, loader, self.steps
        )
        return {name: p.detach().clone() for name, p in self.named}, n, samples


def check_reuse(wl: fo.Workload, mode: str, clients: int = 6) -> dict[str, Any]:
    """Trains the first round's first `clients` clients with one reused wrapper (each after
    the previous ones) and with a freshly built wrapper each, from the initial model, with
    the same seeded generator for sampling and noise; returns the largest difference."""
    cohort = [int(c) for c in wl.cohorts[0][:clients]]
    reused = ReusedClient(wl, mode, first_client=cohort[-1])
    worst = 0.0
    rows = []
    for k, cid in enumerate(cohort):
        a, n, sa = reused.train(cid, wl.init_params, torch.Generator().manual_seed(100 + k))
        fresh = ReusedClient(wl, mode, first_client=cid)
        b, _, sb = fresh.train(cid, wl.init_params, torch.Generator().manual_seed(100 + k))
        diff = max(float((a[name] - b[name]).abs().max()) for name in a)
        moved = max(float((a[name] - wl.init_params[name]).abs().max()) for name in a)
        finite = all(bool(torch.isfinite(t).all()) for t in a.values())
        rows.append(
            {
                "client": cid,
                "records": n,
                "sampled": [sa, sb],
                "max_abs_diff": diff,
                "max_abs_update": moved,
                "finite": finite,
            }
        )
        worst = max(worst, diff)
    return {"grad_sample_mode": mode, "max_abs_diff": worst, "clients": rows}


def _versions() -> dict[str, str]:
    """Versions of what is importable here (Flower and Ray need not be)."""
    out = {"python": platform.python_version()}
    for pkg in ("flwr", "opacus", "torch", "ray", "numpy"):
        if importlib.util.find_spec(pkg) is not None:
            try:
                out[pkg] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                out[pkg] = "unknown"
    out["torch"] = torch.__version__
    return out


def run(export: str, rounds: int | None, grad_sample_mode: str, allocator: str) -> dict[str, Any]:
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    torch.set_num_threads(1)
    fo.quiet_opacus()
    wl = fo.load_workload(export)
    meta = wl.meta
    rounds = int(rounds or meta["rounds"])
    if rounds > len(wl.cohorts):
        raise SystemExit(f"the export has {len(wl.cohorts)} cohorts; asked for {rounds} rounds")
    torch.manual_seed(int(meta["seed"]))  # Poisson sampling and noise: torch's default RNG
    cohorts = wl.cohorts[:rounds]
    trainer = ReusedClient(wl, grad_sample_mode, first_client=int(cohorts[0][0]))
    sizes = np.diff(wl.offsets)
    global_state = {k: v.clone() for k, v in wl.init_params.items()}

    round_seconds: list[float] = []
    round_clients: list[int] = []
    round_samples: list[int] = []
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_round1 = time.perf_counter()
    for cohort in cohorts:
        t0 = time.perf_counter()
        total = float(sum(int(sizes[int(c)]) for c in cohort))
        acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
        samples = 0
        for c in cohort:
            state, n, s = trainer.train(int(c), global_state)
            samples += s
            for k, v in state.items():  # FedAvg: weights |D_i| / sum |D_j|
                acc[k].add_(v, alpha=n / total)
        global_state = acc
        round_seconds.append(time.perf_counter() - t0)
        round_clients.append(len(cohort))
        round_samples.append(samples)
    t_done = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    accuracy = fo.evaluate_accuracy(wl, global_state)
    t_end = time.perf_counter()
    load_after = os.getloadavg()

    timed = round_seconds[1:] or round_seconds
    per_round = statistics.median(timed)
    cpr = statistics.median(round_clients[1:] or round_clients)
    if len(round_seconds) > 1:
        sps = statistics.median(s / t for s, t in zip(round_samples[1:], timed, strict=True))
    else:
        sps = round_samples[0] / round_seconds[0]
    return {
        "runner": RUNNERS[grad_sample_mode],
        "workload": meta["workload"],
        "export": export,
        "rounds": rounds,
        "cohorts": "exact (raydpfl's cohorts, by client id)",
        "model": meta.get("model", "fedavg_cnn"),
        "num_params": meta.get("num_params"),
        "num_clients": meta["num_clients"],
        "client_loader": "Opacus DPDataLoader, Poisson rate q (q = 1: every record, full batch)",
        "client_setup": "model, Opacus wrapper and DP optimizer built once, reused for every "
        "client (weights copied in, new DPDataLoader, optimizer state cleared)",
        "thread_layout": THREAD_LAYOUT,
        "hyperparameters": {
            k: meta[k]
            for k in ("local_steps", "lr", "sampling_rate", "clip_norm", "noise_multiplier")
        },
        "torch_seed": int(meta["seed"]),
        "figures": {
            "seconds_per_round": per_round,
            "seconds_per_round_min": min(timed),
            "seconds_per_round_max": max(timed),
            "client_steps_per_second": cpr * meta["local_steps"] / per_round,
            "samples_per_second": sps,
            "test_accuracy": accuracy,
            "total_wall_seconds": t_end - t_start,
            "rounds_wall_seconds": sum(round_seconds),
            "launch_to_round1_seconds": t_round1 - t_start,
            "evaluation_seconds": t_end - t_done,
        },
        "rusage_rounds": {  # this process, over all rounds (round 1 included)
            "user_seconds": ru1.ru_utime - ru0.ru_utime,
            "system_seconds": ru1.ru_stime - ru0.ru_stime,
            "minor_page_faults": ru1.ru_minflt - ru0.ru_minflt,
        },
        "memory": {
            "max_rss_mib": fo._max_rss_kib() / 1024,
            "note": "peak RSS (ru_maxrss) of the one process: one copy of the export",
        },
        "grad_sample_mode": grad_sample_mode,
        "allocator": {
            "mode": allocator,
            "env": dict(fo.ALLOCATOR_ENV) if allocator == "tuned" else {},
            "process_env_ok": fo.allocator_env_ok(allocator),
            "note": "ok: the process started with the MALLOC_* variables (tuned) or "
            "without them (default)",
        },
        "round_seconds": round_seconds,
        "round_clients": round_clients,
        "round_samples": round_samples,
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "machine": fo._machine(),
        "versions": _versions(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fo.add_peer_options(parser, "the process gets")
    parser.add_argument(
        "--check-reuse",
        action="store_true",
        help="check that the reused wrapper's updates equal a fresh wrapper's (no run)",
    )
    args = parser.parse_args()
    export = str(Path(args.export).resolve())
    if args.check_reuse:
        torch.set_num_threads(1)
        fo.quiet_opacus()
        res = check_reuse(fo.load_workload(export), args.grad_sample_mode)
        print(json.dumps(res, indent=2))
        if res["max_abs_diff"] != 0.0:
            raise SystemExit("reused and fresh wrappers differ")
        return
    fo.reexec_for_allocator(args.allocator)  # returns only once the environment is right

    out = run(export, args.rounds, args.grad_sample_mode, args.allocator)
    path = fo.write_result(out, args.out_dir)

    fig = out["figures"]
    alloc = out["allocator"]
    print(f"Opacus alone on {out['workload']}: {out['rounds']} rounds, {THREAD_LAYOUT}")
    print(
        f"  grad_sample_mode {out['grad_sample_mode']}; allocator {alloc['mode']} "
        f"(process ok: {alloc['process_env_ok']})"
    )
    print("  rounds (s): " + " ".join(f"{s:.2f}" for s in out["round_seconds"]))
    rows = [
        ("s/round (median, rounds 2..R)", f"{fig['seconds_per_round']:.2f}"),
        (
            "  min / max",
            f"{fig['seconds_per_round_min']:.2f} / {fig['seconds_per_round_max']:.2f}",
        ),
        ("client-steps/s", f"{fig['client_steps_per_second']:.1f}"),
        ("samples/s", f"{fig['samples_per_second']:.0f}"),
        ("start -> round 1 (s)", f"{fig['launch_to_round1_seconds']:.2f}"),
        ("evaluation (s)", f"{fig['evaluation_seconds']:.2f}"),
        ("total wall (s)", f"{fig['total_wall_seconds']:.2f}"),
        ("test accuracy", f"{fig['test_accuracy']:.4f}"),
        ("peak RSS (MiB)", f"{out['memory']['max_rss_mib']:.0f}"),
        (
            "rounds: user / sys s, faults",
            f"{out['rusage_rounds']['user_seconds']:.1f} / "
            f"{out['rusage_rounds']['system_seconds']:.1f}, "
            f"{out['rusage_rounds']['minor_page_faults']:,}",
        ),
        (
            "load avg before / after",
            " / ".join(f"{out[k][0]:.2f}" for k in ("load_average_before", "load_average_after")),
        ),
    ]
    for k, v in rows:
        print(f"  {k:<32} {v}")
    v = out["versions"]
    print(f"  opacus {v['opacus']}, torch {v['torch']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
