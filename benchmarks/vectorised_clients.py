"""One-client-at-a-time versus vectorised-over-clients DP-SGD, same clients, same draws.

    python benchmarks/vectorised_clients.py                   # both cases, CPU, 1 thread
    python benchmarks/vectorised_clients.py --case w3 --repeats 5
    python benchmarks/vectorised_clients.py --case rc --vec-engine vmap   # RC-DPFL's CNN
    python benchmarks/vectorised_clients.py --device cuda --budget-mib 8192
    python benchmarks/vectorised_clients.py --case rc --batch-shape fixed   # + fixed shapes

Cases (shared/workloads.md):
- ``w3``: many small clients: 1,000 clients with 2..10 records each (≈ 6), one full-batch
  clipped-and-noised step (q = 1, τ = 1), the 4,266-parameter MNIST CNN (``mnist_cnn`` if
  registered, else ``bcs_mnist_cnn``).
- ``w1``: FedAvgCNN (582,026 parameters), 20 clients × τ = 5 steps, |D_i| ≈ 600 and
  q = 50 / mean |D_i| so Poisson batches are ≈ 50.
- ``rc``: one cluster's group of the RC-DPFL Fashion-MNIST rotation cell (issue 37,
  item 6): the paper's ``rc_cnn`` (28,938 parameters), 6 clients (a majority cluster;
  a group shares one cluster model) of |D_i| = 2,857 records each, b = 32 so
  q = 32 / 2,857, and `--rc-steps` of the round's K·⌈N/b⌉ = 90 Poisson steps (the
  per-step cost is what is compared; default 10). The cell's clients share q and σ, so
  a cluster's group meets `multi_client`'s one-mechanism rule.

Both paths run `DPFedAvg`'s client half in this process on resident random data
(speed does not depend on pixel values): the sequential path is `local_update` per
client with the worker's default engine (``auto``: book-keeping for these models), the
parameters copied in per client as the worker does; the vectorised path is
`local_update_group` over the whole group. Each repetition runs both, alternating
which goes first, with fresh generators on the same seeds, so both do exactly the same
work (checked: the realised batch sizes agree). Figures: samples/s (realised Poisson
samples per second) per path, medians over repetitions, and the ratio
vectorised / sequential. Absolute numbers vary with machine load; quote the ratio.
Results: benchmarks/results/vectorised_clients.json.

``--batch-shape fixed`` (``privacy.batch_shape: fixed``) also times the vectorised path
with every client's Poisson sample truncated at B (`--max-batch-size`; default
⌈q·max|D_i| + 3·sd⌉, so truncation is rare) and every step on (clients, B) padded batches,
against the same path on Poisson shapes (padded to each step's largest batch; the first
step unpadded): per step the fixed path always computes C·B slots, so on a CPU it pays
for the padding; on an accelerator fixed shapes are what lets kernels and graphs be
reused. Figures: samples/s of both and the ratio fixed / Poisson (time), medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raydpfl.algorithms import DPFedAvg  # noqa: E402
from raydpfl.algorithms.base import ClientContext, ClientData  # noqa: E402
from raydpfl.models import build_model  # noqa: E402
from raydpfl.privacy.mechanisms.kernel import MechanismUse  # noqa: E402
from raydpfl.privacy.per_sample import multi_client  # noqa: E402
from raydpfl.privacy.per_sample.engines import make_engine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "vectorised_clients.json"


def _small_cnn_name() -> str:
    """W3's 4,266-parameter CNN: ``mnist_cnn`` once registered, else ``bcs_mnist_cnn``."""
    import raydpfl.papers.dpfl_bcs.models  # noqa: F401  (registers the DPFL-BCS models)

    try:
        build_model("mnist_cnn", (1, 28, 28), 10)
    except ValueError:
        return "bcs_mnist_cnn"
    return "mnist_cnn"


def make_case(
    case: str,
    device: torch.device,
    seed: int = 0,
    model: str | None = None,
    rc_steps: int = 10,
) -> dict:
    """Model, data pool, client indices and the algorithm of one case."""
    g = torch.Generator().manual_seed(seed)
    if case == "w3":
        clients = 1000
        sizes = torch.randint(2, 11, (clients,), generator=g).tolist()
        model_name, q, steps = _small_cnn_name(), 1.0, 1
    elif case == "w1":
        clients = 20
        sizes = torch.randint(300, 901, (clients,), generator=g).tolist()
        model_name, steps = "fedavg_cnn", 5
        q = 50.0 / (sum(sizes) / clients)
    elif case == "rc":
        clients, records, batch = 6, 2857, 32
        sizes = [records] * clients
        model_name, steps = "rc_cnn", rc_steps
        q = batch / records
    else:
        raise ValueError(case)
    model_name = model or model_name
    total = sum(sizes)
    x = torch.randn((total, 1, 28, 28), generator=g).to(device)
    y = torch.randint(0, 10, (total,), generator=g).to(device)
    perm = torch.randperm(total, generator=g).to(device)
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    indices = [perm[offsets[k] : offsets[k + 1]] for k in range(clients)]
    torch.manual_seed(seed)
    model = build_model(model_name, (1, 28, 28), 10).to(device).requires_grad_(False)
    alg = DPFedAvg(
        clients_per_round=clients,
        local_steps=steps,
        lr=0.1,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=q,
    )
    return {
        "case": case,
        "model": model_name,
        "num_params": sum(p.numel() for p in model.parameters()),
        "clients": clients,
        "mean_records": total / clients,
        "sampling_rate": q,
        "local_steps": steps,
        "model_obj": model,
        "x": x,
        "y": y,
        "indices": indices,
        "alg": alg,
    }


def _generators(n: int, device: torch.device) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(10_000 + k) for k in range(n)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_sequential(c: dict, device: torch.device, engine) -> tuple[float, int]:
    model, alg = c["model_obj"], c["alg"]
    tasks = alg.plan(0, list(range(c["clients"])), None)
    broadcast = {n: p.detach().clone() for n, p in model.named_parameters()}
    resident = {n: p.clone() for n, p in broadcast.items()}
    gens = _generators(c["clients"], device)
    _sync(device)
    t0 = time.perf_counter()
    samples = 0.0
    for k, task in enumerate(tasks):
        for n, t in resident.items():  # the worker's load_params
            t.copy_(broadcast[n])
        ctx = ClientContext(model, engine, gens[k], device)
        data = ClientData(k, c["x"], c["y"], c["indices"][k])
        r = alg.local_update(ctx, resident, data, task)
        samples += r.metrics["mean_batch_size"] * task.local_steps
    _sync(device)
    return time.perf_counter() - t0, round(samples)


def _fixed(tasks, indices, cap: int | None):
    """The tasks as the platform stamps them under ``privacy.batch_shape: fixed``."""
    if cap is None:
        return tasks
    out = []
    for t, idx in zip(tasks, indices, strict=True):
        use = t.mechanisms[0]
        stamped = MechanismUse(use.mechanism.with_batch_shape(cap, int(idx.numel())), use.count)
        out.append(dataclasses.replace(t, mechanisms=(stamped,)))
    return out


def default_cap(c: dict) -> int:
    """⌈q·max|D_i| + 3·sd⌉: a cap the Poisson sample of the largest client rarely passes."""
    n, q = max(int(i.numel()) for i in c["indices"]), c["sampling_rate"]
    return max(1, math.ceil(q * n + 3 * math.sqrt(q * (1 - q) * n)))


def run_vectorised(
    c: dict,
    device: torch.device,
    engine,
    budget: int,
    vec_engine: str = "auto",
    cap: int | None = None,
) -> tuple[float, int]:
    model, alg = c["model_obj"], c["alg"]
    tasks = _fixed(alg.plan(0, list(range(c["clients"])), None), c["indices"], cap)
    broadcast = {n: p.detach().clone() for n, p in model.named_parameters()}
    gens = _generators(c["clients"], device)
    multi_client._ENGINES[model] = multi_client.MultiClientDPSGD(
        model, memory_budget_bytes=budget, engine=vec_engine
    )
    _sync(device)
    t0 = time.perf_counter()
    ctxs = [ClientContext(model, engine, g, device) for g in gens]
    datas = [ClientData(k, c["x"], c["y"], idx) for k, idx in enumerate(c["indices"])]
    results = alg.local_update_group(ctxs, broadcast, datas, tasks)
    _sync(device)
    elapsed = time.perf_counter() - t0
    samples = sum(
        r.metrics["mean_batch_size"] * t.local_steps for r, t in zip(results, tasks, strict=True)
    )
    return elapsed, round(samples)


def bench(case: str, args: argparse.Namespace, device: torch.device) -> dict:
    c = make_case(case, device, model=args.model, rc_steps=args.rc_steps)
    engine = make_engine(c["model_obj"], args.engine)
    budget = args.budget_mib * 2**20
    # warm-up (lazy init, allocator) — not timed
    few = {**c, "clients": min(c["clients"], 4), "indices": c["indices"][:4]}
    run_sequential(few, device, engine)
    run_vectorised(few, device, engine, budget, args.vec_engine)
    seq_rates, vec_rates, ratios = [], [], []
    for rep in range(args.repeats):
        order = ("seq", "vec") if rep % 2 == 0 else ("vec", "seq")
        out = {}
        for which in order:
            if which == "seq":
                out[which] = run_sequential(c, device, engine)
            else:
                out[which] = run_vectorised(c, device, engine, budget, args.vec_engine)
        (ts, ns), (tv, nv) = out["seq"], out["vec"]
        if ns != nv:
            raise RuntimeError(f"paths did different work: {ns} vs {nv} samples")
        seq_rates.append(ns / ts)
        vec_rates.append(nv / tv)
        ratios.append(ts / tv)
        print(
            f"  {case} rep {rep + 1}: sequential {ns / ts:8.1f} samples/s ({ts:.2f} s), "
            f"vectorised {nv / tv:8.1f} samples/s ({tv:.2f} s), ratio {ts / tv:.2f}",
            flush=True,
        )
    fixed = bench_fixed(c, args, device, engine, budget) if args.batch_shape == "fixed" else {}
    row = {k: v for k, v in c.items() if k not in ("model_obj", "x", "y", "indices", "alg")}
    row.update(
        samples_per_run=ns,
        sequential_engine=type(engine).__name__,
        vectorised_engine=multi_client.for_model(c["model_obj"]).engine,
        sequential_samples_per_s=seq_rates,
        vectorised_samples_per_s=vec_rates,
        ratios=ratios,
        median_sequential=statistics.median(seq_rates),
        median_vectorised=statistics.median(vec_rates),
        median_ratio=statistics.median(ratios),
        ratio_of_medians=statistics.median(vec_rates) / statistics.median(seq_rates),
        **fixed,
    )
    print(
        f"{case}: sequential ({row['sequential_engine']}) median "
        f"{row['median_sequential']:.1f} samples/s, "
        f"vectorised ({row['vectorised_engine']}) median "
        f"{row['median_vectorised']:.1f} samples/s, median ratio {row['median_ratio']:.2f}x",
        flush=True,
    )
    return row


def bench_fixed(c: dict, args: argparse.Namespace, device: torch.device, engine, budget) -> dict:
    """The vectorised path on Poisson shapes and on fixed (clients, B) shapes, alternating."""
    cap = args.max_batch_size or default_cap(c)
    run_vectorised(c, device, engine, budget, args.vec_engine, cap)  # warm-up
    poisson, fixed, ratios = [], [], []
    for rep in range(args.repeats):
        order = (None, cap) if rep % 2 == 0 else (cap, None)
        out = {k: run_vectorised(c, device, engine, budget, args.vec_engine, k) for k in order}
        (tp, np_), (tf, nf) = out[None], out[cap]
        poisson.append(np_ / tp)
        fixed.append(nf / tf)
        ratios.append(tf / tp)
        print(
            f"  {c['case']} rep {rep + 1}: vectorised Poisson {np_ / tp:8.1f} samples/s "
            f"({tp:.2f} s), fixed at B={cap} {nf / tf:8.1f} samples/s ({tf:.2f} s, {nf} of "
            f"{np_} samples kept), time fixed/Poisson {tf / tp:.2f}",
            flush=True,
        )
    print(
        f"{c['case']}: fixed shapes (B={cap}) median time {statistics.median(ratios):.2f}x "
        "the Poisson shapes'",
        flush=True,
    )
    return {
        "max_batch_size": cap,
        "vectorised_poisson_samples_per_s": poisson,
        "vectorised_fixed_samples_per_s": fixed,
        "fixed_over_poisson_time": ratios,
        "median_fixed_over_poisson_time": statistics.median(ratios),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--case", nargs="+", choices=("w3", "w1", "rc"), default=["w3", "w1"])
    p.add_argument("--rc-steps", type=int, default=10, help="Poisson steps per client (rc)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--engine", default="auto", help="engine of the sequential path")
    p.add_argument(
        "--vec-engine",
        default="auto",
        choices=("auto", "bookkeeping", "vmap"),
        help="engine of the vectorised path (auto: grouped book-keeping where supported)",
    )
    p.add_argument("--budget-mib", type=int, default=512, help="vectorised memory budget")
    p.add_argument("--model", default=None, help="override the case's model (zoo name)")
    p.add_argument(
        "--batch-shape",
        default="poisson",
        choices=("poisson", "fixed"),
        help="fixed: also time the vectorised path on truncated, fixed-shape batches",
    )
    p.add_argument("--max-batch-size", type=int, default=None, help="B of --batch-shape fixed")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [bench(case, args, device) for case in args.case]
    report = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.platform(),
        "cpus": __import__("os").cpu_count(),
        "load_avg": __import__("os").getloadavg(),
        "budget_mib": args.budget_mib,
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
