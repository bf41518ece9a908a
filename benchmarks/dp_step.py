"""One DP-SGD step against one non-private SGD step: FedAvgCNN on Fashion-MNIST, one core.

    python benchmarks/dp_step.py [--batches 3 30] [--steps 1500]

One process, one torch thread, with the allocator settings every training process of
raydpfl and every floor gets (`raydpfl.backends.allocator.tune_allocator`). Per batch
size, three kinds of step take turns step by step in a shuffled order, `--steps` of
each, so a change in the machine's load hits them alike and none always runs just after
the same other one (each kind has its own model, parameters and stream):

- ``sgd``: the non-private floor's step (`benchmarks/_floors.py`: forward, summed cross
  entropy over the expected batch, backward, ``torch.optim.SGD``);
- ``dp``: raydpfl's DP-SGD step as W1/W2 run it (`raydpfl.privacy.per_sample.dpsgd.dp_sgd_step_`,
  book-keeping engine, ``privacy.noise_sampler: boxmuller``, σ = 1, C = 1);
- ``dp_gemm``: the same step with the Linear weight sums added by a GEMM before the noise
  (`LOW_RANK_MAX_BATCH` = 0), the path a batch over `LOW_RANK_MAX_BATCH` takes.

Batches are consecutive Fashion-MNIST training images (random ones, said so, where the
Debian files are missing); every 5 steps the parameters go back to their start, as a
client's τ = 5 steps would. Prints the median ms per step of each (and the 10th
percentile), the ratio dp / sgd and the difference dp_gemm − dp of the medians (for a
batch over `LOW_RANK_MAX_BATCH` both are the same path: the difference is then the
measurement's noise), and the 1-minute load average before and after; writes
benchmarks/results/dp_step-<UTC>.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _results import write_result  # noqa: E402

from raydpfl.backends.allocator import tune_allocator  # noqa: E402
from raydpfl.models.zoo import FedAvgCNN  # noqa: E402
from raydpfl.privacy.noise.noise_samplers import seeded_stream  # noqa: E402
from raydpfl.privacy.per_sample import dpsgd  # noqa: E402
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping  # noqa: E402

STEPS_PER_CLIENT = 5
#: The library's threshold, restored after every `dp_gemm` step.
DEFAULT_LOW_RANK_MAX = dpsgd.LOW_RANK_MAX_BATCH


def _images(n: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """n Fashion-MNIST training images and labels, normalised as raydpfl loads them."""
    from raydpfl.data.datasets import DatasetNotFoundError, load_dataset

    try:
        data = load_dataset("fashion_mnist")
    except DatasetNotFoundError:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 1, 28, 28, generator=g)
        return x, torch.randint(0, 10, (n,), generator=g), "random (Fashion-MNIST not found)"
    x = torch.from_numpy(data.x_train[:n].copy())
    return x, torch.from_numpy(data.y_train[:n].copy()), "fashion_mnist train[:n]"


def _stepper(batch: int, x: torch.Tensor, y: torch.Tensor) -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    start = {k: v.detach().clone() for k, v in FedAvgCNN((1, 28, 28), 10).named_parameters()}

    def batches() -> Callable[[], tuple[torch.Tensor, torch.Tensor, bool]]:
        state = {"at": 0, "steps": 0}

        def next_batch() -> tuple[torch.Tensor, torch.Tensor, bool]:
            at = state["at"]
            state["at"] = (at + batch) % (x.shape[0] - batch)
            state["steps"] += 1
            return x[at : at + batch], y[at : at + batch], state["steps"] % STEPS_PER_CLIENT == 0

        return next_batch

    floor_model = FedAvgCNN((1, 28, 28), 10)
    floor_params = dict(floor_model.named_parameters())
    opt = torch.optim.SGD(floor_model.parameters(), lr=0.1)
    floor_batch = batches()

    def sgd() -> None:
        xb, yb, reset = floor_batch()
        if reset:
            with torch.no_grad():
                for k, p in floor_params.items():
                    p.copy_(start[k])
        loss = F.cross_entropy(floor_model(xb), yb, reduction="sum") / batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def dp_with(low_rank_max: int) -> Callable[[], None]:
        # each kind its own model, parameters and stream, as `sgd` has: none of them
        # finds another's tensors in the cache
        engine = BookkeepingClipping(FedAvgCNN((1, 28, 28), 10))
        params = {k: v.clone() for k, v in start.items()}
        generator = seeded_stream("boxmuller", 0)
        next_batch = batches()

        def dp() -> None:
            xb, yb, reset = next_batch()
            if reset:
                for k, p in params.items():
                    p.copy_(start[k])
            dpsgd.LOW_RANK_MAX_BATCH = low_rank_max
            try:
                dpsgd.dp_sgd_step_(
                    engine,
                    params,
                    xb,
                    yb,
                    lr=0.1,
                    clip_norm=1.0,
                    noise_multiplier=1.0,
                    expected_batch_size=batch,
                    generator=generator,
                )
            finally:
                dpsgd.LOW_RANK_MAX_BATCH = DEFAULT_LOW_RANK_MAX

        return dp

    return {"sgd": sgd, "dp": dp_with(DEFAULT_LOW_RANK_MAX), "dp_gemm": dp_with(0)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[3, 30])
    p.add_argument("--steps", type=int, default=1500, help="timed steps of each kind")
    args = p.parse_args(argv)
    if min(args.batches) < 1 or args.steps < 10:
        p.error("--batches must be >= 1 and --steps >= 10")
    torch.set_num_threads(1)
    tuned = tune_allocator()  # as the backends' processes and the floors run
    x, y, source = _images(4000)
    load = [os.getloadavg()[0]]
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for batch in args.batches:
        steps = _stepper(batch, x, y)
        for fn in steps.values():  # warm-up: numba cache load, allocator
            for _ in range(20):
                fn()
        times: dict[str, list[float]] = {name: [] for name in steps}
        order = list(steps)
        shuffle = random.Random(batch)
        for _ in range(args.steps):
            shuffle.shuffle(order)  # no kind always runs right after the same other one
            for name in order:
                fn = steps[name]
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        p10 = {name: statistics.quantiles(v, n=10)[0] for name, v in times.items()}
        figures[str(batch)] = {
            name: {"median_ms": med[name], "p10_ms": p10[name]} for name in times
        }
        figures[str(batch)]["ratios"] = {"dp/sgd": med["dp"] / med["sgd"]}
        figures[str(batch)]["dp_gemm_minus_dp_ms"] = med["dp_gemm"] - med["dp"]
        print(
            f"batch {batch:>3}: "
            + "  ".join(f"{n} {med[n]:.3f} ms (p10 {p10[n]:.3f})" for n in steps)
            + f"  | dp/sgd {med['dp'] / med['sgd']:.3f}, dp_gemm - dp "
            f"{med['dp_gemm'] - med['dp']:+.3f} ms"
        )
    load.append(os.getloadavg()[0])
    print(
        f"FedAvgCNN, 1 thread, {args.steps} steps of each kind, alternating; data: "
        f"{source}; LOW_RANK_MAX_BATCH {DEFAULT_LOW_RANK_MAX}; allocator tuned: {tuned}; "
        f"1-min load {load[0]:.2f} -> "
        f"{load[1]:.2f}"
    )
    write_result(
        ROOT,
        "dp_step",
        {
            "batches": args.batches,
            "steps_per_kind": args.steps,
            "data": source,
            "low_rank_max_batch": DEFAULT_LOW_RANK_MAX,
            "allocator_tuned": tuned,
            "figures": figures,
            "loadavg_1min": load,
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
        },
    )


if __name__ == "__main__":
    main()
