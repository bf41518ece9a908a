"""What secure-noise mode (``privacy.secure_noise: true``) costs, on one CPU thread.

    python benchmarks/secure_noise.py [--repeats 15]

Times (median of `--repeats`, after one warm-up each) the Gaussian noise of one
FedAvgCNN step (582,026 values: `gaussian_like` per parameter tensor) from a seeded
PyTorch generator (research mode) and from os.urandom (secure mode, 4 Box-Muller draws
per value), and one W1-like DP-SGD step (`dp_sgd_step_`: Poisson batch of ~30 from 600
records, book-keeping clipping, noise, update) in each mode. Run from the repository root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from raydpfl.models import build_model  # noqa: E402
from raydpfl.privacy.noise.secure_noise import SecureGenerator  # noqa: E402
from raydpfl.privacy.per_sample.dpsgd import dp_sgd_step_, gaussian_like, poisson_sample  # noqa: E402
from raydpfl.privacy.per_sample.engines import make_engine  # noqa: E402


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("fedavg_cnn", (1, 28, 28), 10).requires_grad_(False)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = make_engine(model, "bookkeeping")
    x, y = torch.randn(600, 1, 28, 28), torch.randint(0, 10, (600,))
    gens = {"research": torch.Generator().manual_seed(0), "secure": SecureGenerator()}
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"FedAvgCNN: {sum(p.numel() for p in params.values()):,} parameters, 1 thread; "
        f"load average {load} (1, 5, 15 min)"
    )
    rows = {}
    for mode, gen in gens.items():

        def noise(gen: torch.Generator = gen) -> None:
            for p in params.values():
                gaussian_like(p, 1.0, gen)

        def step(gen: torch.Generator = gen) -> None:
            idx = poisson_sample(600, 0.05, gen)
            dp_sgd_step_(
                engine,
                params,
                x[idx],
                y[idx],
                lr=0.0,  # keeps the parameters (and the cost) the same step after step
                clip_norm=1.0,
                noise_multiplier=1.0,
                expected_batch_size=30.0,
                generator=gen,
            )

        rows[mode] = (median_ms(noise, args.repeats), median_ms(step, args.repeats))
    print(f"{'':10}{'noise draw (ms)':>18}{'DP-SGD step (ms)':>18}")
    for mode, (n_ms, s_ms) in rows.items():
        print(f"{mode:10}{n_ms:18.1f}{s_ms:18.1f}")
    (rn, rs), (sn, ss) = rows["research"], rows["secure"]
    print(f"secure / research: noise {sn / rn:.1f}x, step {ss / rs:.2f}x (+{ss - rs:.0f} ms)")


if __name__ == "__main__":
    main()
