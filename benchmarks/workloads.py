"""Workload benchmarks W1–W3: raydpfl (local and Ray backends) against like-for-like
floors and the best-configured peers.

W1 and W2 (shared/workloads.md; configs/w1.yaml, configs/w2.yaml) are DP-FedAvg on
Fashion-MNIST with FedAvgCNN and τ = 5 DP-SGD steps per client: W1 has 100 clients,
20 per round, 20 rounds; W2 has 1,000 clients, 100 per round, 5 rounds. W3
(configs/w3.yaml) has 10,000 clients of ~6 records, 1,000 per round, one full-batch
step each (q = 1, τ = 1) with the 4,266-parameter MNIST CNN, 5 rounds. The raydpfl
runners and the floors do exactly the same work (same cohorts, same Poisson batches,
same noise where private, same model and initialisation), each in its own subprocess,
whose whole process tree is sampled for memory and CPU time (`_proctree.py`). Every
process runs one torch thread by default (`--threads 1`):

- raydpfl_local:          the simulator, local backend: 1 process × T torch threads.
- raydpfl_ray:            the simulator, Ray backend: W worker actors × 1 thread, a
                          server actor and an idle driver; Ray startup timed apart.
- floor_nonprivate:       plain forward + backward + SGD on the same batches, 1 process.
- floor_nonprivate_pool:  the same in W one-thread processes, each training the clients
                          the Ray pool's matching worker trains (the like-for-like floor
                          of raydpfl_ray).
- floor_vectorised_pool:  the same steps vectorised over clients (W3's floor).
- floor_per_sample:       vmap-of-grad DP-SGD on the same batches and noise.
- flower_opacus[_ghost]:  the peer, Flower's simulation with Opacus clients in Opacus'
                          hooks or ghost-clipping mode (`peers/flower_opacus.py`).
- opacus_alone[_ghost]:   Opacus without a framework, 1 process (`peers/opacus_alone.py`).
The peers run in their own virtual environment (`bash benchmarks/peers/setup_env.sh`)
with raydpfl's allocator settings, on the same clients, cohorts, initial model and
hyperparameters but Opacus' own Poisson batches; without the environment they are
skipped, saying so.

Usage (from the repository root):

    python benchmarks/workloads.py [--workload w1 w2 w3] [--rounds R] [--threads T]
                                   [--ray-workers W] [--repeats K] [--runners a,b,...]
                                   [--no-peers] [--noise-sampler torch|ziggurat|boxmuller]

Prints a report per workload and writes benchmarks/results/<workload>-<UTC>.json and
.txt. See README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: the package need not be installed
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _proctree import TreeSampler  # noqa: E402

from raydpfl.privacy.noise.noise_samplers import NOISE_SAMPLERS  # noqa: E402

THIS = Path(__file__).resolve()
#: raydpfl's fastest ``privacy.noise_sampler`` per workload (`--noise-sampler` overrides):
#: Box-Muller draws W1/W2's 582,026-value noise tensors 2x faster than torch; W3's
#: clients draw 8 tensors of 4,266 values in all, where a numba call's fixed cost (~6.6
#: against torch's ~2.3 us per tensor) outweighs its speed, so torch's generator is faster.
NOISE_SAMPLER_DEFAULT = {"w1": "boxmuller", "w2": "boxmuller", "w3": "torch"}
WORKLOADS = {
    "w1": ROOT / "configs" / "w1.yaml",
    "w2": ROOT / "configs" / "w2.yaml",
    "w3": ROOT / "configs" / "w3.yaml",
}
RUNNERS = (
    "raydpfl_local",
    "raydpfl_ray",
    "floor_nonprivate",
    "floor_nonprivate_pool",
    "floor_vectorised_pool",
    "floor_per_sample",
)
#: Floors that run in the Ray pool's layout: W one-thread processes, Ray's client split.
POOL_FLOORS = ("floor_nonprivate_pool", "floor_vectorised_pool")
#: The peers, each run where its virtual environment exists (see `peer_python`):
#: name -> (script in benchmarks/peers/, Opacus grad_sample_mode).
PEERS = {
    "flower_opacus": ("flower_opacus.py", "hooks"),
    "flower_opacus_ghost": ("flower_opacus.py", "ghost"),
    "opacus_alone": ("opacus_alone.py", "hooks"),
    "opacus_alone_ghost": ("opacus_alone.py", "ghost"),
}
#: Derived figures: the faster of a peer's two Opacus modes ("its best configuration").
BEST = {
    "flower_opacus_best": ("flower_opacus", "flower_opacus_ghost"),
    "opacus_alone_best": ("opacus_alone", "opacus_alone_ghost"),
}
ALIASES = {"raydpfl": "raydpfl_local"}  # the runner's name before the Ray runner existed
RAYDPFL = ("raydpfl_local", "raydpfl_ray")
#: Runners each workload runs by default (peers are added where their environment
#: exists). W1/W2 are one client after another: the client-vectorised floor is W3's
#: (its stacked 582k-parameter copies would not pay on W1/W2). W3's Flower peer spends
#: minutes starting 10,000 SuperNodes, so it runs in Opacus' faster mode there only
#: (hooks: ghost clipping was 1.7x slower on W3's conv-heavy model, peers/README.md).
_ONE_CLIENT_AT_A_TIME = (
    "raydpfl_local",
    "raydpfl_ray",
    "floor_nonprivate",
    "floor_nonprivate_pool",
    "floor_per_sample",
)
DEFAULT_RUNNERS = {
    "w1": (*_ONE_CLIENT_AT_A_TIME, *PEERS),
    "w2": (*_ONE_CLIENT_AT_A_TIME, *PEERS),
    "w3": (
        "raydpfl_local",
        "raydpfl_ray",
        "floor_nonprivate",
        "floor_nonprivate_pool",
        "floor_vectorised_pool",
        "floor_per_sample",
        "opacus_alone",
        "opacus_alone_ghost",
        "flower_opacus",
    ),
}
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: Every process of every runner runs one torch thread: a like-for-like comparison
#: (the Ray backend's workers and the pool floors run one thread per process).
DEFAULT_THREADS = 1
DEFAULT_RAY_WORKERS = 2
SAMPLE_INTERVAL_S = 0.2
#: glibc allocator settings raydpfl applies to its own training processes
#: (`raydpfl.backends.allocator`); given to the floors' and the peers' processes too,
#: so that every runner has the same allocator.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}

#: s/round ratios reported, numerator over denominator, when both runners ran.
RATIOS = (
    # like for like: the same processes and threads, the same clients per process
    ("raydpfl_ray", "floor_nonprivate_pool"),
    ("raydpfl_ray", "floor_vectorised_pool"),
    ("raydpfl_local", "floor_nonprivate"),  # per core: one process, one thread each
    ("raydpfl_local", "floor_per_sample"),
    ("raydpfl_ray", "raydpfl_local"),  # 2 workers against 1 process: ideal 1/W
    ("floor_nonprivate_pool", "floor_nonprivate"),  # the floor's own scaling
    ("raydpfl_ray", "flower_opacus_best"),
    ("raydpfl_ray", "flower_opacus"),
    ("raydpfl_ray", "flower_opacus_ghost"),
    ("raydpfl_local", "opacus_alone_best"),  # per core: both sequential, one thread
    ("raydpfl_local", "opacus_alone"),
    ("raydpfl_local", "opacus_alone_ghost"),
)
#: (workload, figure, bound, direction, what it says). Issue 20's targets: like-for-like
#: floors and best-configured peers, every runner at the same threads per process.
TARGETS = (
    *(
        (
            wl,
            "raydpfl_ray/floor_nonprivate_pool",
            1.3,
            "<=",
            "Ray backend <= 1.3 x the non-private floor on the same 2 processes x 1 thread",
        )
        for wl in ("w1", "w2")
    ),
    *(
        (
            wl,
            "raydpfl_ray/flower_opacus_best",
            1 / 5,
            "<=",
            "Ray backend >= 5 x Flower+Opacus in its best configuration",
        )
        for wl in ("w1", "w2")
    ),
    *(
        (
            wl,
            "ray_efficiency",
            0.9,
            ">=",
            "two-worker efficiency: local s/round / (W x Ray s/round), 1 thread per process",
        )
        for wl in ("w1", "w2")
    ),
    (
        "w3",
        "raydpfl_ray/flower_opacus_best",
        1 / 10,
        "<=",
        "Ray backend >= 10 x Flower+Opacus in its best configuration",
    ),
    (
        "w1",
        "raydpfl_local/floor_per_sample",
        1 / 2.5,
        "<=",
        "per core: >= 2.5 x the per-sample floor (workloads.md)",
    ),
)
#: Targets from workloads.md this benchmark cannot check, and why.
UNCHECKED = {
    "w1": ("W1 on a GPU (vectorisation >= 3x, >= 50% busy): this benchmark runs on the CPU",),
    "w2": (),
    "w3": (
        "memory grows with data, not with clients: benchmarks/run_all.py compares peak "
        "memory at 10,000 and 1,000 clients",
    ),
}


def peer_python() -> Path:
    """The peer environment's interpreter (`benchmarks/peers/setup_env.sh` makes it)."""
    default = Path.home() / ".cache" / "raydpfl" / "peers-venv"
    return Path(os.environ.get("RAYDPFL_PEERS_VENV", default)) / "bin" / "python"


def thread_layout(runner: str, threads: int, ray_workers: int) -> str:
    """How a runner uses the cores, stated beside its figures for fairness."""
    if runner.startswith("flower_opacus"):
        return (
            f"Flower's Ray with {ray_workers} CPUs: {ray_workers} concurrent clients x 1 "
            "torch thread + ServerApp in the driver"
        )
    if runner.startswith("opacus_alone"):
        return "1 process x 1 torch thread, clients one after another"
    if runner == "raydpfl_ray":
        return (
            f"{ray_workers} worker processes x 1 torch thread + server actor (1 thread) "
            "+ driver (idle)"
        )
    if runner in POOL_FLOORS:
        return (
            f"{ray_workers} worker processes x 1 torch thread (the Ray pool's clients per "
            f"worker) + server process ({ray_workers} threads, while the workers wait)"
        )
    return f"1 process x {threads} torch threads"


def cores(runner: str, threads: int, ray_workers: int) -> int:
    """Cores a runner trains on: the denominator of its per-core figures."""
    if runner.startswith("flower_opacus") or runner == "raydpfl_ray" or runner in POOL_FLOORS:
        return ray_workers
    if runner.startswith("opacus_alone"):
        return 1
    return threads


# ---- child: one runner, one process ---------------------------------------------------
def run_child(
    runner: str,
    config: Path,
    rounds: int | None,
    threads: int,
    ray_workers: int,
    engine: str = "auto",
    peer_data: Path | None = None,
    noise_sampler: str = "torch",
) -> dict[str, Any]:
    """Runs one runner in this process and returns its raw per-round record."""
    if runner in PEERS:
        if peer_data is None:
            raise SystemExit(f"--runner {runner} needs --peer-data (the workload's export)")
        return _run_peer(runner, peer_data, rounds, ray_workers)
    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment

    torch.set_num_threads(threads)
    if runner == "raydpfl_ray":
        # Each worker trains with max(1, floor(cpus_per_worker)) = 1 torch thread; the
        # server actor evaluates with the node's cores (runtime.threads unset).
        overrides = [
            "runtime.backend=ray",
            f"runtime.workers={ray_workers}",
            "runtime.cpus_per_worker=1",
            "runtime.address=null",
        ]
    else:
        # The local backend's one worker trains with floor(cpus_per_worker) threads.
        overrides = [
            "runtime.backend=local",
            f"runtime.cpus_per_worker={threads}",
            f"runtime.threads={threads}",
        ]
    overrides += ["runtime.device=cpu", f"runtime.engine={engine}"]
    # raydpfl's Gaussian sampler; the floors read it from the config and replay it
    overrides.append(f"experiment.privacy.noise_sampler={noise_sampler}")
    if rounds is not None:
        overrides.append(f"algorithm.rounds={rounds}")
    exp = build_experiment(load_config(config, overrides))
    total_rounds = exp.config.experiment.algorithm.rounds

    if runner in RAYDPFL:
        out = _run_raydpfl(runner, exp)
    else:
        import _floors

        def progress(round_idx: int, seconds: float) -> None:
            done = f"{round_idx + 1}/{total_rounds}"
            print(f"  [{runner}] round {done}: {seconds:.2f} s", flush=True)

        # One thread in the pre-pass: the pool floors fork their workers after it (and
        # set their own threads); the one-process floors keep `threads`.
        torch.set_num_threads(1 if runner in POOL_FLOORS else threads)
        plan = _floors.record_batches(exp, total_rounds, workers=ray_workers)  # untimed
        floor = {
            "floor_nonprivate": _floors.run_nonprivate,
            "floor_nonprivate_pool": _floors.run_nonprivate,
            "floor_vectorised_pool": _floors.run_vectorised_nonprivate,
            "floor_per_sample": _floors.run_per_sample,
        }[runner]
        processes = ray_workers if runner in POOL_FLOORS else 1
        result = floor(plan, progress, processes=processes)
        out = {
            "round_seconds": result.round_seconds,
            "round_clients": [len(clients) for clients in plan.rounds],
            "round_samples": plan.round_samples(),
            "test_accuracy": result.test_accuracy,
        }
    return {
        "runner": runner,
        "thread_layout": thread_layout(runner, threads, ray_workers),
        "cores": cores(runner, threads, ray_workers),
        "local_steps": exp.algorithm.local_steps,
        **out,
    }


def _run_raydpfl(runner: str, exp: Any) -> dict[str, Any]:
    """raydpfl's `run_experiment`, in memory, on the backend the config names.

    Round times are taken twice: by the server (each row's ``wall_seconds``, inside the
    server actor on Ray) and here on the driver, between consecutive ``on_round``
    calls; the driver's figure is the primary one, as it includes Ray's dispatch and
    transfer of the row. Round 1's driver time cannot be told apart from the worker
    pool's start, so it is the server's (round 1 is warm-up and left out of the rates);
    the rest of the time to the first row is reported as ``setup_seconds``.
    """
    from raydpfl.experiment.build import run_experiment

    total_rounds = exp.config.experiment.algorithm.rounds
    rows: list[dict[str, Any]] = []
    stamps: list[float] = []

    def on_round(row: Mapping[str, Any]) -> None:
        stamps.append(time.perf_counter())
        rows.append(dict(row))
        driver = stamps[-1] - stamps[-2] if len(stamps) > 1 else row["wall_seconds"]
        print(
            f"  [{runner}] round {row['round']}/{total_rounds}: {driver:.2f} s "
            f"(server {row['wall_seconds']:.2f} s)",
            flush=True,
        )

    startup: dict[str, float] = {}
    ray_started = False
    if exp.config.runtime.backend == "ray":
        import ray

        from raydpfl.backends.ray.runner import connect  # the same ray.init as a real run

        t = time.perf_counter()
        ray_started = connect(exp.config.runtime.address)
        startup["ray_init_seconds"] = time.perf_counter() - t
    try:
        t0 = time.perf_counter()
        summary = run_experiment(exp, None, on_round)
        startup["finish_seconds"] = time.perf_counter() - stamps[-1]
    finally:
        if ray_started:
            t = time.perf_counter()
            ray.shutdown()
            startup["ray_shutdown_seconds"] = time.perf_counter() - t
    if summary["rounds_completed"] != total_rounds:
        raise RuntimeError(f"raydpfl stopped early: {summary['stop_reason']}")
    server = [row["wall_seconds"] for row in rows]
    startup["setup_seconds"] = stamps[0] - t0 - server[0]
    return {
        "round_seconds": [server[0]] + [b - a for a, b in itertools.pairwise(stamps)],
        "round_seconds_server": server,
        "startup": startup,
        "round_clients": [row["clients_trained"] for row in rows],
        # mean_batch_size is a mean over clients of a mean over steps, every client
        # running the same τ steps, so this product is the round's total exactly.
        "round_samples": [
            round(row["mean_batch_size"] * row["clients_trained"] * row["local_steps"])
            for row in rows
        ],
        "test_accuracy": summary["final_test_accuracy"],
        "model_sha256": summary["model_sha256"],
    }


def export_for_peer(config: Path, rounds: int | None, out: Path) -> Path:
    """Writes the workload's export for the peer (`peers/export_workload.py`; untimed, and
    in its own process, so its memory is not counted as the peer's)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers" / "export_workload.py")]
    cmd += [str(config), "--out", str(out)]
    if rounds is not None:
        cmd += ["--rounds", str(rounds)]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return out


def _run_peer(runner: str, data: Path, rounds: int | None, ray_workers: int) -> dict[str, Any]:
    """A peer (`peers/flower_opacus.py` or `peers/opacus_alone.py`, in its own
    environment, with the same allocator settings as raydpfl) on `data`, the export of
    this workload."""
    script, mode = PEERS[runner]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(peer_python()), str(ROOT / "benchmarks" / "peers" / script), str(data)]
        cmd += ["--grad-sample-mode", mode, "--allocator", "tuned", "--out-dir", tmp]
        if script.startswith("flower"):
            cmd += ["--cpus", str(ray_workers)]
        if rounds is not None:
            cmd += ["--rounds", str(rounds)]
        subprocess.run(cmd, cwd=ROOT, check=True)
        (result,) = Path(tmp).glob("*.json")
        peer = json.loads(result.read_text())
    fig = peer["figures"]
    startup_keys = ("ray_init_seconds", "launch_to_round1_seconds", "shutdown_seconds")
    return {
        "runner": runner,
        "thread_layout": thread_layout(runner, 1, ray_workers),
        "cores": cores(runner, 1, ray_workers),
        "local_steps": peer["hyperparameters"]["local_steps"],
        "round_seconds": peer["round_seconds"],
        "round_clients": peer["round_clients"],
        "round_samples": peer["round_samples"],
        "test_accuracy": fig["test_accuracy"],
        "startup": {k: fig[k] for k in startup_keys if k in fig},
        "versions": peer.get("versions", {}),
        "grad_sample_mode": peer.get("grad_sample_mode", mode),
        "allocator": peer.get("allocator"),
    }


# ---- parent: figures ------------------------------------------------------------------
def figures(run: dict[str, Any]) -> dict[str, float]:
    """One run's figures; rates use rounds 2..R (round 1 is warm-up)."""
    secs = run["round_seconds"]
    timed = range(1, len(secs))
    per_round = statistics.median(secs[i] for i in timed)
    client_steps = statistics.median(run["round_clients"][i] * run["local_steps"] for i in timed)
    out = {
        "seconds_per_round": per_round,
        "cores": run.get("cores"),
        "client_steps_per_second": client_steps / per_round,
        "client_steps_per_second_per_core": client_steps / per_round / run.get("cores", 1),
        "samples_per_second": statistics.median(run["round_samples"][i] / secs[i] for i in timed),
        "peak_rss_mib": run["process_tree"]["peak_rss_mib"],
        "peak_pss_mib": run["process_tree"]["peak_pss_mib"],
        "test_accuracy": run["test_accuracy"],
    }
    if "round_seconds_server" in run:
        out["server_seconds_per_round"] = statistics.median(
            run["round_seconds_server"][i] for i in timed
        )
    for key, value in run.get("startup", {}).items():
        out[key] = value
    return out


def check_same_work(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Asserts every run trained the same clients on the same number of records per round.

    raydpfl's count comes from its own ``mean_batch_size`` metric; the floors' from the
    batches recorded by replaying raydpfl's RNG streams. A replay that drifted from
    raydpfl's draw order would give different Poisson batches, hence different totals.
    """
    # RUNNERS replay raydpfl's exact Poisson batches; the peers draw their own.
    same = {name: r for name, r in runs.items() if name in RUNNERS} or runs
    (ref_name, ref_runs), *_ = same.items()
    ref = ref_runs[0]
    for name, name_runs in runs.items():
        # The peer trains the same cohorts on batches Opacus draws itself.
        keys = ("round_clients", "round_samples") if name in same else ("round_clients",)
        for k, run in enumerate(name_runs):
            for key in keys:
                if run[key] != ref[key]:
                    raise SystemExit(
                        f"batch check failed: {name} (repeat {k + 1}) {key} = {run[key]}, "
                        f"but {ref_name} has {ref[key]}"
                    )
    return {
        "round_clients": ref["round_clients"],
        "round_samples": ref["round_samples"],
        "total_samples": sum(ref["round_samples"]),
    }


def machine_info() -> dict[str, Any]:
    """What the figures depend on: hardware, library versions."""
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu_model = models[0].split(":", 1)[1].strip() if models else ""
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "ray": ray_version,
    }


def source_info() -> dict[str, Any]:
    """The commit measured and the files that differ from it (read-only git calls)."""

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.rstrip("\n")

    try:
        return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--porcelain")}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "changed": None}


def _median_figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    per_repeat = [figures(run) for run in runs]
    return {key: _median_or_none([f[key] for f in per_repeat]) for key in per_repeat[0]}


def best_of(figs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """For each derived peer in `BEST`: the runner (mode) with the lower s/round."""
    out = {}
    for best, modes in BEST.items():
        ran = [m for m in modes if m in figs]
        if ran:
            out[best] = min(ran, key=lambda m: figs[m]["seconds_per_round"])
    return out


def _median_or_none(values: list[Any]) -> Any:
    """The median of the values that exist; None when none does (e.g. the test accuracy
    of a config without a central test set). Counts (ints: cores, MiB) take the lower
    median, one of the values, so they stay ints ("d" in the report)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return statistics.median_low(present)
    return statistics.median(present)


def _fmt(value: float | None, spec: str) -> str:
    """`value` formatted with `spec`, or '-' when it is missing."""
    return "-" if value is None else format(value, spec)


def _ratios(
    figs: dict[str, dict[str, float]], runs: dict[str, list], ray_workers: int = 2
) -> dict[str, Any]:
    """s/round of each pair in RATIOS: of the medians, and per repeat; a peer's `BEST`
    is the faster of its modes (named in ``best``); plus the Ray pool's efficiency."""
    best = best_of(figs)
    alias = {**{n: n for n in figs}, **best}
    out: dict[str, Any] = {}
    for a, b in RATIOS:
        if a in alias and b in alias:
            fa, fb = figs[alias[a]], figs[alias[b]]
            out[f"{a}/{b}"] = {
                "seconds_per_round": fa["seconds_per_round"] / fb["seconds_per_round"],
                "per_repeat": [
                    figures(x)["seconds_per_round"] / figures(y)["seconds_per_round"]
                    for x, y in zip(runs[alias[a]], runs[alias[b]], strict=True)
                ],
                **({"best": alias[b]} if b in best else {}),
            }
    if all(name in figs for name in RAYDPFL):  # also from inside the server actor
        out["raydpfl_ray/raydpfl_local"]["server_side"] = (
            figs["raydpfl_ray"]["server_seconds_per_round"]
            / figs["raydpfl_local"]["server_seconds_per_round"]
        )
        # Ideal W-worker speed-up over one process of the same threads is W; the local
        # runner's threads must be the workers' one thread for this to mean anything.
        local_cores = figs["raydpfl_local"].get("cores")
        if local_cores == 1:
            ratio = out["raydpfl_ray/raydpfl_local"]["seconds_per_round"]
            out["ray_efficiency"] = {"seconds_per_round": 1.0 / (ray_workers * ratio)}
    return out


def _targets(workload: str, ratios: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for wl, key, bound, direction, what in TARGETS:
        if wl != workload or key not in ratios:
            continue
        value = ratios[key]["seconds_per_round"]
        met = value <= bound if direction == "<=" else value >= bound
        out.append(
            {
                "ratio": key,
                "bound": bound,
                "direction": direction,
                "what": what,
                "value": value,
                "met": met,
                **({"best": ratios[key]["best"]} if "best" in ratios[key] else {}),
            }
        )
    return out


def report_lines(
    workload: str,
    figs: dict[str, dict[str, float]],
    ratios: dict[str, Any],
    targets: list[dict[str, Any]],
    work: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    args: Any,
) -> list[str]:
    """The report, as quoted."""
    rounds = len(work["round_samples"])
    clients = work["round_clients"][0]
    peers = [name for name in figs if name in PEERS]
    peer = f" except the peers ({', '.join(peers)}), which draw their own" if peers else ""
    lines = [
        f"{workload.upper()}: {rounds} rounds, {clients} clients/round, {work['total_samples']} "
        f"sampled records in all (identical across runners{peer}: batch check passed)",
        f"repeats: {args.repeats}"
        f"{' (figures are medians across repeats)' if args.repeats > 1 else ''}; "
        f"rates use rounds 2..{rounds}; s/round of raydpfl runners is measured on the driver; "
        f"raydpfl's noise sampler: {getattr(args, 'noise_sampler', 'torch')}",
    ]
    header = (
        f"{'runner':<22}{'s/round':>9}{'server s/r':>11}{'cores':>6}{'client-steps/s':>15}"
        f"{'per core':>9}{'samples/s':>10}{'peak RSS MiB':>13}{'peak PSS MiB':>13}"
        f"{'test acc':>9}"
    )
    lines += [header, "-" * len(header)]
    for name, f in figs.items():
        server = f.get("server_seconds_per_round")
        lines.append(
            f"{name:<22}{f['seconds_per_round']:>9.3f}"
            f"{(f'{server:.3f}' if server is not None else '-'):>11}"
            f"{_fmt(f.get('cores'), 'd'):>6}"
            f"{f['client_steps_per_second']:>15.1f}"
            f"{_fmt(f.get('client_steps_per_second_per_core'), '.1f'):>9}"
            f"{f['samples_per_second']:>10.0f}"
            f"{f['peak_rss_mib']:>13.0f}{f['peak_pss_mib']:>13.0f}"
            f"{_fmt(f['test_accuracy'], '.4f'):>9}"
        )
    lines.append("threads:")
    lines += [f"  {name:<22}{runs[name][0]['thread_layout']}" for name in figs]
    for name in peers:
        f = figs[name]
        start = ", ".join(
            f"{label} {f[key]:.1f} s"
            for key, label in (
                ("ray_init_seconds", "ray.init"),
                ("launch_to_round1_seconds", "to round 1"),
            )
            if f.get(key) is not None
        )
        versions = ", ".join(f"{k} {v}" for k, v in runs[name][0].get("versions", {}).items())
        lines.append(f"{name} startup (not in s/round): {start}; {versions}")
    if "raydpfl_ray" in figs:
        f = figs["raydpfl_ray"]
        lines.append(
            f"ray startup (not in s/round): ray.init {f['ray_init_seconds']:.1f} s, worker "
            f"pool and data {f['setup_seconds']:.1f} s, finish {f['finish_seconds']:.1f} s, "
            f"ray.shutdown {f['ray_shutdown_seconds']:.1f} s"
        )
    lines.append("CPU over the whole run, by process name (user + sys s, minor page faults):")
    for name in figs:
        lines.append(f"  {name:<22}{_cpu_summary(runs[name][0]['process_tree']['cpu_by_name'])}")
    lines.append("ratios of s/round (same invocation):")
    for key, r in ratios.items():
        extra = f"  (server-side: {r['server_side']:.3f})" if "server_side" in r else ""
        extra += f"  (best mode: {r['best']})" if "best" in r else ""
        lines.append(f"  {key:<42}{r['seconds_per_round']:>7.3f}{extra}")
    lines += ["targets:"] if targets or UNCHECKED[workload] else []
    for t in targets:
        verdict = "MET" if t["met"] else "NOT MET (missed)"
        lines.append(
            f"  {t['ratio']} = {t['value']:.3f} {t['direction']} {t['bound']:.2f}: {verdict}"
            f"  [{t['what']}]"
        )
    lines += [f"  not checked: {note}" for note in UNCHECKED[workload]]
    for wl, key, _, _, what in TARGETS:
        if wl == workload and key not in ratios:
            lines.append(f"  not checked (a runner did not run): {key}  [{what}]")
    if not peers:
        lines.append(
            "  peers not run (--no-peers, or no environment: `bash benchmarks/peers/setup_env.sh`)"
        )
    # Same batches, same noise: raydpfl's two backends compute the same arithmetic, and
    # the per-sample floor too up to summation order; a gap means different arithmetic.
    if all(name in figs for name in RAYDPFL):
        hashes = {runs[name][0]["model_sha256"] for name in RAYDPFL}
        same = "identical" if len(hashes) == 1 else "DIFFERENT"
        if len(hashes) > 1 and args.threads != 1:
            # Ray workers run 1 torch thread; intra-op reductions split differently.
            same += f" (expected: {args.threads} vs 1 torch threads; --threads 1 matches)"
        lines.append(f"final model (sha256), raydpfl_ray vs raydpfl_local: {same}")
    for name in RAYDPFL:
        if name in figs and "floor_per_sample" in figs:
            ours, floor = figs[name]["test_accuracy"], figs["floor_per_sample"]["test_accuracy"]
            if ours is None or floor is None:  # no central test set
                continue
            gap = ours - floor
            lines.append(f"test accuracy, {name} - floor_per_sample: {gap:+.4f} (expect ~0)")
    return lines


def _cpu_summary(by_name: dict[str, dict[str, float]], top: int = 3) -> str:
    """The `top` process names by CPU time, then the rest together."""
    items = sorted(by_name.items(), key=lambda kv: -(kv[1]["user_s"] + kv[1]["sys_s"]))
    rest = items[top:]
    if rest:
        keys = ("processes", "user_s", "sys_s", "minor_faults")
        items = [*items[:top], ("other", {k: sum(d[k] for _, d in rest) for k in keys})]
    return "; ".join(
        f"{name} x{d['processes']:.0f} {d['user_s']:.0f} + {d['sys_s']:.0f} s, "
        f"{d['minor_faults'] / 1e6:.1f} M"
        for name, d in items
    )


# ---- parent: orchestration --------------------------------------------------------------
def runners_for(workload: str, runner_list: list[str] | None, no_peers: bool = False) -> list[str]:
    """The runners to run: those asked for, else the workload's defaults (the peers only
    where their environment exists, and not with `no_peers`)."""
    if runner_list is not None:
        return list(runner_list)
    have_peers = peer_python().exists() and not no_peers
    return [r for r in DEFAULT_RUNNERS[workload] if r not in PEERS or have_peers]


def run_workload(workload: str, config: Path, args: argparse.Namespace) -> None:
    """Runs every runner (interleaved per repeat), reports and writes the results."""
    args = argparse.Namespace(
        **{
            **vars(args),
            "runner_list": runners_for(workload, args.runner_list, args.no_peers),
            "noise_sampler": args.noise_sampler or NOISE_SAMPLER_DEFAULT[workload],
        }
    )
    started = datetime.now(timezone.utc)
    load_start = os.getloadavg()
    source = source_info()  # before the runs: others may edit the tree meanwhile
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.runner_list}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / f"{workload}-{started.strftime('%Y%m%dT%H%M%SZ')}"
    partial = stem.with_suffix(".runs.json")  # every finished run, written as it ends
    with tempfile.TemporaryDirectory() as tmp:
        if any(name in PEERS for name in args.runner_list):
            print(f"{workload}: exporting the workload for the peers (untimed)", flush=True)
            peer_data = export_for_peer(config, args.rounds, Path(tmp) / "peer-workload.npz")
        # Runners interleave within each repeat, so slow drift of the machine spreads
        # over all of them instead of biasing one.
        for k in range(args.repeats):
            for name in args.runner_list:
                out = Path(tmp) / f"{name}-{k}.json"
                cmd = [sys.executable, str(THIS), "--workload", workload, "--runner", name]
                cmd += ["--json", str(out)]
                cmd += ["--threads", str(args.threads), "--ray-workers", str(args.ray_workers)]
                cmd += ["--engine", args.engine, "--noise-sampler", args.noise_sampler]
                cmd += ["--config", str(config)]
                if args.rounds is not None:
                    cmd += ["--rounds", str(args.rounds)]
                if name in PEERS:
                    cmd += ["--peer-data", str(peer_data)]
                print(f"{workload} repeat {k + 1}/{args.repeats}: {name}", flush=True)
                # Other work on a shared machine skews the figures; the 1-minute load
                # average around each run makes that visible in the JSON.
                load_before = os.getloadavg()[0]
                # raydpfl tunes its own allocator; the floors and peers get the same.
                env = os.environ if name in RAYDPFL else {**os.environ, **ALLOCATOR_ENV}
                proc = subprocess.Popen(cmd, env=env)
                with TreeSampler(proc.pid, SAMPLE_INTERVAL_S) as sampler:
                    code = proc.wait()
                if code != 0:
                    raise SystemExit(f"{name} failed with exit code {code}")
                record = json.loads(out.read_text())
                record["process_tree"] = vars(sampler.result)
                record["loadavg_1min"] = [load_before, os.getloadavg()[0]]
                runs[name].append(record)
                partial.write_text(json.dumps({"source": source, "runs": runs}, indent=2))

    work = check_same_work(runs)
    figs = {name: _median_figures(name_runs) for name, name_runs in runs.items()}
    ratios = _ratios(figs, runs, args.ray_workers)
    targets = _targets(workload, ratios)
    report = {
        "workload": workload.upper(),
        "utc": started.isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "config": str(config),
        "machine": machine_info(),
        "loadavg_1min": {"start": load_start[0], "end": os.getloadavg()[0]},
        "source": source,
        "settings": {
            "rounds": len(work["round_samples"]),
            "threads": args.threads,
            "engine": args.engine,
            "noise_sampler": args.noise_sampler,
            "ray_workers": args.ray_workers,
            "repeats": args.repeats,
            "runners": args.runner_list,
            "sample_interval_s": SAMPLE_INTERVAL_S,
            "allocator_env_of_floors_and_peers": ALLOCATOR_ENV,
        },
        "best_peer_modes": best_of(figs),
        "batch_check": work,
        "figures": figs,
        "ratios": ratios,
        "targets": targets,
        "runs": runs,
    }
    # The figures are written before the text report is formatted, so a formatting error
    # can never lose them; the per-run file is then redundant.
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    partial.unlink(missing_ok=True)
    lines = report_lines(workload, figs, ratios, targets, work, runs, args)
    print("\n" + "\n".join(lines))
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {stem.relative_to(ROOT)}.json and .txt", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workload",
        nargs="+",
        choices=sorted(WORKLOADS),
        default=sorted(WORKLOADS),
        help="workloads to run, in order (default: all)",
    )
    p.add_argument("--rounds", type=int, help="rounds (default: each config's: 20 W1, 5 W2)")
    p.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"torch threads of the single-process runners (default {DEFAULT_THREADS}: the "
        "threads of every Ray worker and pool-floor process, for like-for-like figures)",
    )
    p.add_argument(
        "--ray-workers",
        type=int,
        default=DEFAULT_RAY_WORKERS,
        help=f"Ray worker actors, 1 CPU and 1 thread each (default {DEFAULT_RAY_WORKERS})",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "bookkeeping", "vmap"),
        default="auto",
        help="raydpfl's per-sample clipping engine (runtime.engine; default auto)",
    )
    p.add_argument(
        "--runners",
        default=None,
        help="comma-separated, run in order (default: each workload's DEFAULT_RUNNERS; the "
        "peers where their environment exists; "
        "where its environment exists)",
    )
    p.add_argument("--no-peers", action="store_true", help="leave the peers out of the defaults")
    p.add_argument(
        "--noise-sampler",
        choices=NOISE_SAMPLERS,
        help="raydpfl's privacy.noise_sampler (default: the workload's fastest, "
        "NOISE_SAMPLER_DEFAULT: boxmuller for W1/W2, torch for W3; the "
        "floors replay the same streams)",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per runner; figures are medians")
    p.add_argument("--config", type=Path, help="config file (one workload only; default its own)")
    # Child mode, used by the parent: run one runner and write its record to --json.
    p.add_argument("--runner", choices=(*RUNNERS, *PEERS), help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--peer-data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds is not None and args.rounds < 2:
        p.error("--rounds must be >= 2: round 1 is warm-up and left out of the figures")
    if min(args.threads, args.ray_workers, args.repeats) < 1:
        p.error("--threads, --ray-workers and --repeats must be >= 1")
    if args.config is not None and len(args.workload) > 1:
        p.error("--config needs a single --workload")
    if args.runners is None:
        args.runner_list = None  # each workload's DEFAULT_RUNNERS (`runners_for`)
        return args
    names = [ALIASES.get(r.strip(), r.strip()) for r in args.runners.split(",") if r.strip()]
    args.runner_list = list(dict.fromkeys(names))
    unknown = sorted(set(args.runner_list) - {*RUNNERS, *PEERS})
    if unknown or not args.runner_list:
        p.error(f"--runners: unknown {unknown}; choose from {', '.join((*RUNNERS, *PEERS))}")
    missing = [name for name in args.runner_list if name in PEERS]
    if missing and not peer_python().exists():
        p.error(f"--runners: {missing} need {peer_python()} (bash benchmarks/peers/setup_env.sh)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.runner is not None:
        if args.json is None or args.config is None:
            raise SystemExit("--runner needs --json and --config")
        record = run_child(
            args.runner,
            args.config,
            args.rounds,
            args.threads,
            args.ray_workers,
            args.engine,
            args.peer_data,
            args.noise_sampler or NOISE_SAMPLER_DEFAULT[args.workload[0]],
        )
        args.json.write_text(json.dumps(record))
        return
    for workload in args.workload:
        run_workload(workload, args.config or WORKLOADS[workload], args)


if __name__ == "__main__":
    main()
