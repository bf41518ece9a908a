"""Gaussian noise of one DP-SGD step: torch's generator against the counter-based CPU
samplers (``privacy.noise_sampler``: ziggurat, boxmuller).

    python benchmarks/noise_sampler.py [--values 582026] [--calls 400]

One process, one torch thread; the three samplers take turns call by call, so a change
in the machine's load hits them alike. Each call is the one DP-SGD makes per parameter
tensor (`raydpfl.privacy.per_sample.dpsgd.fill_gaussian_`, which hands a counter-based stream to
`raydpfl.privacy.noise.counter_noise.fill_normal_`). Prints, per sampler, the best,
10th-percentile and median milliseconds per noise tensor of `--values` float32 values
(FedAvgCNN: 582,026), the ratios torch / sampler of the best times, each compiled
sampler's first call (numba compile or cache load; the ziggurat's, made first, includes
numba's import) and the 1-minute load average before and after, and writes
benchmarks/results/noise_sampler-<UTC>.json.
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
from _results import write_result  # noqa: E402

from raydpfl.privacy.noise import counter_noise  # noqa: E402
from raydpfl.privacy.noise.noise_samplers import NOISE_SAMPLERS, seeded_stream  # noqa: E402
from raydpfl.privacy.per_sample.dpsgd import fill_gaussian_  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--values", type=int, default=582_026)
    p.add_argument("--calls", type=int, default=400)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = torch.empty(args.values)
    gens = {name: seeded_stream(name, 0) for name in NOISE_SAMPLERS}  # torch first
    compiled = [name for name, g in gens.items() if counter_noise.is_counter_noise(g)]
    load = [os.getloadavg()[0]]
    first_call = {}
    for name in compiled:
        t0 = time.perf_counter()
        counter_noise.fill_normal_(out, 1.0, gens[name])  # numba: compile, or load the cache
        first_call[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in gens}
    for _ in range(args.calls):
        for name, gen in gens.items():
            t = time.perf_counter()
            fill_gaussian_(out, 1.0, gen)  # the call DP-SGD makes for each parameter tensor
            times[name].append((time.perf_counter() - t) * 1e3)
    load.append(os.getloadavg()[0])
    figs = {
        name: {
            "best_ms": min(v),
            "p10_ms": statistics.quantiles(v, n=10)[0],
            "median_ms": statistics.median(v),
        }
        for name, v in times.items()
    }
    ratios = {name: figs["torch"]["best_ms"] / figs[name]["best_ms"] for name in compiled}
    for name, f in figs.items():
        print(
            f"{name:<9} best {f['best_ms']:.3f} ms  p10 {f['p10_ms']:.3f}  "
            f"median {f['median_ms']:.3f}  ({args.values:,} values, 1 thread)"
        )
    print(
        "torch / sampler (best): "
        + ", ".join(f"{name} {r:.2f}" for name, r in ratios.items())
        + "; first call (numba compile or cache load): "
        + ", ".join(f"{name} {s:.2f} s" for name, s in first_call.items())
        + f"; 1-min load {load[0]:.2f} -> {load[1]:.2f}"
    )
    write_result(
        ROOT,
        "noise_sampler",
        {
            "values": args.values,
            "calls": args.calls,
            "figures": figs,
            "torch_over_ziggurat_best": ratios["ziggurat"],
            "torch_over_boxmuller_best": ratios["boxmuller"],
            # the ziggurat's (this key's meaning before boxmuller was added)
            "first_call_seconds": first_call["ziggurat"],
            "first_call_seconds_by_sampler": first_call,
            "loadavg_1min": load,
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
        },
    )


if __name__ == "__main__":
    main()
