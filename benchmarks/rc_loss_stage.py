"""RC-DPFL's loss stage: M separate forward passes against one batched pass over M models.

    python benchmarks/rc_loss_stage.py [--models 4] [--records 1024] [--repeats 7]

Issue 37 (item 6) suggested cutting the loss stage's cost (each client scores every one of
the M cluster models on its train split, `raydpfl.papers.rc_dpfl.algorithm.
train_loss_and_accuracy`) by one batched pass over the M models. This times both on one
evaluation batch of the Table 1 CNN (`rc_cnn`, 1×28×28, 10 classes; the batch is the
loss stage's `_EVAL_BATCH`, 1,024 records):

- separate: what the loss stage does, `functional_call` of the model with each of the M
  parameter sets in turn;
- batched: the first convolution of the M models as one convolution with their filters
  stacked (M·16 output channels), the second as one grouped convolution (M groups), the
  M classifiers as one batched matrix product.

One process, one torch thread; the two take turns repeat by repeat, so a change in the
machine's load hits them alike. The inputs are random (the time of a dense forward pass
does not depend on the values). Prints the median seconds of each, their ratio, whether
the batched logits are bit-identical to the separate ones, and the 1-minute load average
before and after; writes benchmarks/results/rc_loss_stage-<UTC>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _results import write_result  # noqa: E402
from torch.func import functional_call  # noqa: E402

from raydpfl.papers.rc_dpfl.models import RcCNN  # noqa: E402

Params = dict[str, torch.Tensor]


def separate(model: torch.nn.Module, models: list[Params], x: torch.Tensor) -> list[torch.Tensor]:
    """The loss stage's way: one forward pass per model."""
    return [functional_call(model, params, (x,)) for params in models]


def batched(models: list[Params], x: torch.Tensor) -> list[torch.Tensor]:
    """The M models in one pass: stacked first convolution, grouped second, batched
    classifier (the RcCNN layers, written out with their parameter names)."""
    m = len(models)

    def cat(name: str) -> torch.Tensor:
        return torch.cat([p[name] for p in models])

    h = F.conv2d(x, cat("features.0.weight"), cat("features.0.bias"), padding=2)
    h = F.max_pool2d(F.relu(h), 2)
    h = F.conv2d(h, cat("features.3.weight"), cat("features.3.bias"), padding=2, groups=m)
    h = F.max_pool2d(F.relu(h), 2)
    per_model = h.reshape(x.shape[0], m, -1).transpose(0, 1)  # (M, N, 32·7·7)
    w = torch.stack([p["classifier.weight"] for p in models])  # (M, 10, 32·7·7)
    b = torch.stack([p["classifier.bias"] for p in models])
    return list(torch.baddbmm(b.unsqueeze(1), per_model, w.transpose(1, 2)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=4, help="M (Fashion-MNIST rotation: 4)")
    p.add_argument("--records", type=int, default=1024, help="records per evaluation batch")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = RcCNN((1, 28, 28), 10).eval()
    models = []
    for seed in range(args.models):
        torch.manual_seed(seed)
        models.append(
            {k: v.detach().clone() for k, v in RcCNN((1, 28, 28), 10).named_parameters()}
        )
    x = torch.randn(args.records, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        identical = all(
            torch.equal(a, b)
            for a, b in zip(separate(model, models, x), batched(models, x), strict=True)
        )
        load = [os.getloadavg()[0]]
        times: dict[str, list[float]] = {"separate": [], "batched": []}
        for _ in range(args.repeats):
            t = time.perf_counter()
            separate(model, models, x)
            times["separate"].append(time.perf_counter() - t)
            t = time.perf_counter()
            batched(models, x)
            times["batched"].append(time.perf_counter() - t)
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["batched"] / med["separate"]
    print(
        f"{args.models} models x {args.records} records, 1 thread, median of {args.repeats}: "
        f"separate {med['separate']:.3f} s, batched {med['batched']:.3f} s "
        f"(batched / separate {ratio:.2f}); logits bit-identical: {identical}; "
        f"1-min load {load[0]:.2f} -> {load[1]:.2f}"
    )
    write_result(
        ROOT,
        "rc_loss_stage",
        {
            "models": args.models,
            "records": args.records,
            "repeats": args.repeats,
            "median_s": med,
            "batched_over_separate": ratio,
            "bit_identical": identical,
            "loadavg_1min": load,
        },
    )


if __name__ == "__main__":
    main()
