"""Where a W1 round's time goes: raydpfl's local backend, one process, one thread.

    python benchmarks/profile_w1.py [--rounds 7] [--config configs/w1.yaml] [KEY=VALUE ...]

Wraps the hot functions of the training path with wall-clock timers (each part's own
time, nested parts subtracted), runs W1 for R rounds and prints a table of seconds per
round and % of the round over rounds 2..R-1 (round 1 warms up, round R evaluates), with
the minor page faults and user/system CPU seconds per round. The wrappers cost a few
microseconds per call (~1%). Run from the repository root.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

_own: dict[str, float] = collections.defaultdict(float)
_stack: list[float] = []
_counting = [False]


def _wrap(owner: Any, name: str, label: str | None, labeller: Any = None) -> None:
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        _stack.append(0.0)
        try:
            return f(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            inner = _stack.pop()
            if _counting[0]:
                _own[labeller(*args) if labeller else label] += dt - inner
            if _stack:
                _stack[-1] += dt

    setattr(owner, name, timed)


def _instrument() -> None:
    import raydpfl.algorithms.base as base
    import raydpfl.algorithms.dp_fedavg as dp_fedavg
    import raydpfl.algorithms.local_dp_sgd as loop
    import raydpfl.privacy.per_sample.bookkeeping as bk
    import raydpfl.privacy.per_sample.dpsgd as dpsgd
    import raydpfl.simulation.worker as worker

    def layer(rec: Any, *_: Any) -> str:
        return type(rec.module).__name__

    # the forward pass with its recording hooks (the rest of `_norms_and_losses`, whose
    # backward and norm rules are timed on their own below)
    _wrap(bk.BookkeepingClipping, "_norms_and_losses", "forward (hooks record inputs)")
    _wrap(torch.autograd, "grad", "backward to the layer outputs")
    _wrap(bk, "_positions", "patch extraction (Conv2d unfold)")
    _wrap(bk, "_norm_sq", None, lambda rec, *a: f"per-sample norms: {layer(rec)}")
    _wrap(bk, "_add_weighted_grads", None, lambda rec, *a: f"weighted gradient sum: {layer(rec)}")
    _wrap(loop, "poisson_sample", "Poisson sampling")
    _wrap(base.ClientData, "batch", "batch gather (index_select)")
    _wrap(worker.ClientWorker, "load_params", "parameter copy-in")
    _wrap(loop, "parameter_delta", "update out (local − start)")
    _wrap(dp_fedavg, "dp_sgd_local_update", "client loop rest (SGD step, clones, Python)")
    _wrap(bk.BookkeepingClipping, "clipped_sum", "engine rest (weights, stats, Python)")
    # the noise draws and the update p -= (lr/B)(z + s); the engine's part nested (the
    # Linear layers add their weight sums into the noise inside the GEMM)
    _wrap(loop, "dp_sgd_step_", "update (1 add per tensor) and step rest")
    _wrap(dpsgd, "gaussian_like", "Gaussian noise (normal_)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--config", default=str(ROOT / "configs" / "w1.yaml"))
    ap.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. privacy.noise_sampler=boxmuller (the W1/W2 benchmarks')",
    )
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3")
    torch.set_num_threads(1)
    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment, run_experiment

    _instrument()
    overrides = ["runtime.backend=local", "runtime.cpus_per_worker=1", "runtime.threads=1"]
    overrides += ["runtime.device=cpu", f"algorithm.rounds={args.rounds}", *args.overrides]
    exp = build_experiment(load_config(args.config, overrides))
    stamps: list[float] = []
    usage: list[Any] = []

    def on_round(row: Any) -> None:
        stamps.append(time.perf_counter())
        usage.append(resource.getrusage(resource.RUSAGE_SELF))
        _counting[0] = 1 <= len(stamps) < args.rounds - 1  # rounds 2..R-1

    load_before = os.getloadavg()[0]
    run_experiment(exp, None, on_round)
    n = args.rounds - 2
    total = stamps[-2] - stamps[0]
    rows = sorted(_own.items(), key=lambda kv: -kv[1])
    rows.append(
        ("rest (server: selection, ledger, aggregation; dispatch)", total - sum(_own.values()))
    )
    print(
        f"{Path(args.config).stem}, local backend, 1 thread: {total / n:.3f} s/round over "
        f"rounds 2..{args.rounds - 1}"
        f" (1-min load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after)"
    )
    print("| part | s/round | % of round |\n| --- | ---: | ---: |")
    for k, v in rows:
        print(f"| {k} | {v / n:.3f} | {100 * v / total:.1f}% |")
    a, b = usage[0], usage[-2]
    print(
        f"minor page faults {(b.ru_minflt - a.ru_minflt) / n:,.0f}/round; CPU user "
        f"{(b.ru_utime - a.ru_utime) / n:.2f} s/round, "
        f"system {(b.ru_stime - a.ru_stime) / n:.2f} s/round"
    )


if __name__ == "__main__":
    main()
