"""W1 and W3 on one GPU: the Ray worker pool on fractional GPUs against the in-process
vectorised clients, with the GPU's utilisation and memory sampled throughout.

    bash benchmarks/gpu_ray.sh [options]      # on the GPU machine: kit install + this script
    python benchmarks/gpu_ray.py [options]    # Ray, Opacus, dp-accounting importable already

Starts one local Ray instance declaring one GPU (``ray.init(num_gpus=1)``; on a machine
without one, ``--fake-gpus`` declares it all the same and trains on the CPU: the rehearsal),
then runs, per workload (configs/w1.yaml, configs/w3.yaml), each case in its own
``run_experiment`` with a run directory, clients vectorised (``vectorise_clients=on``):

- ``ray_1x1``, ``ray_2x0.5``, ``ray_4x0.25``: the Ray backend, 1, 2 or 4 worker actors
    holding ``gpus_per_worker`` 1, 0.5 or 0.25 of the one GPU, with as many aggregation
    groups as workers (README: on a GPU, one vectorised call per worker and round);
- ``local_g1``, ``local_g2``, ``local_g4``: the local backend, in this process, with 1, 2
    or 4 groups: the in-process vectorised throughput, and each Ray case's reference for
    the bit-for-bit check (the same groups, so the same sums in the same order);
- ``ray_4x0.25_g8`` (and its reference ``local_g8``): the default 8 groups, 2 per worker;
- ``local_gN_repeat``: ``local_gN`` again, only where a Ray case's model differs from it:
    whether the GPU's kernels give the same bits twice.

Figures per case: seconds per round (the driver's clock between rounds; the median over
the timed rounds: the first, warm-up, and with 4 or more rounds the last, which evaluates,
are left out), client-steps and samples per second, the GPU's utilisation (NVML, else
``nvidia-smi``; the share of each sample period in which a kernel ran) and memory used,
sampled every ``--sample-ms`` and averaged over the timed rounds, and the final model
against its reference's (sha256; the largest absolute difference where they differ).
Targets (issue 38), judged strictly: the faster Ray pool on fractional GPUs (2 x 0.5 or
4 x 0.25) >= 0.8x the fastest in-process vectorised run (any groups) on W1 and W3, and the
GPU busy >= 80% during W1's rounds on that pool.

Data: Fashion-MNIST where its files are found (``--data-root``, raydpfl's default root,
``/usr/share/datasets/fashion-mnist``); else (the GPU machine: the 30 MB of images do not
fit the 64 MiB a call carries beside Ray) a stand-in of the same shape: the real labels
from the kit (``.gpukit/data/``), so the same Dirichlet partition, Poisson batches and
work, with seeded pixels (a class template plus noise). Throughput and the bit-for-bit
check do not depend on the pixels; accuracy does (stand-in accuracy is not Fashion-MNIST's).

The whole run keeps to ``--budget-s`` (default 400 s): a case that would not finish in
what is left (judged by the workload's last case) is skipped and listed. The JSON (written
after every case) and a Markdown table go to ``--out`` (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: the package need not be installed
    sys.path.insert(0, str(ROOT))

KIT = ROOT / ".gpukit"
RESULTS_DIR = ROOT / "benchmarks" / "results"
WORKLOADS = {"w1": ROOT / "configs" / "w1.yaml", "w3": ROOT / "configs" / "w3.yaml"}
TARGET_THROUGHPUT = 0.8  # Ray pool on fractional GPUs / in-process vectorised
TARGET_BUSY = 0.8  # GPU busy during W1's rounds


@dataclass(frozen=True)
class Case:
    name: str
    backend: str
    workers: int = 1
    gpus_per_worker: float = 0.0
    groups: int = 8

    def overrides(self, device: str, cpus_per_worker: float) -> list[str]:
        out = [
            f"runtime.backend={self.backend}",
            f"runtime.device={device}",
            "runtime.vectorise_clients=on",
            f"runtime.aggregation_groups={self.groups}",
            f"runtime.cpus_per_worker={cpus_per_worker:g}",
            "runtime.checkpoint_every=null",
            "runtime.progress=false",
            "runtime.address=null",
            # the only sampler that runs on a GPU (the others draw on the CPU)
            "experiment.privacy.noise_sampler=torch",
        ]
        if self.backend == "ray":
            out += [
                f"runtime.workers={self.workers}",
                f"runtime.gpus_per_worker={self.gpus_per_worker:g}",
            ]
        return out

    @property
    def reference(self) -> str | None:
        """The in-process case that must give the same bits (same groups)."""
        return f"local_g{self.groups}" if self.backend == "ray" else None


CASES = {
    c.name: c
    for c in (
        *(
            Case(f"local_g{g}{tail}", "local", groups=g)
            for g in (1, 2, 4, 8)
            for tail in ("", "_repeat")
        ),
        Case("ray_1x1", "ray", 1, 1.0, groups=1),
        Case("ray_2x0.5", "ray", 2, 0.5, groups=2),
        Case("ray_4x0.25", "ray", 4, 0.25, groups=4),
        Case("ray_4x0.25_g8", "ray", 4, 0.25, groups=8),
    )
}
#: The main cases run first (every workload), then the rest; references come along.
DEFAULT_CASES = ("ray_4x0.25", "ray_2x0.5", "ray_1x1", "ray_4x0.25_g8")
MAIN_CASES = ("ray_4x0.25", "ray_2x0.5", "ray_1x1")


# -------------------------------------------------------------------------- sampling
class GpuSampler:
    """Samples the GPU's utilisation (%) and memory used (MiB) in a thread.

    Backends: ``nvml`` (pynvml, from nvidia-ml-py or Ray's vendored copy), ``smi`` (one
    long-running ``nvidia-smi --query-gpu ... -lms`` whose lines are read), ``none``. A
    sampler that fails never stops the benchmark: it records why and goes quiet.
    """

    def __init__(self, kind: str = "auto", interval_s: float = 0.1, smi: str = "nvidia-smi"):
        self.interval_s = interval_s
        self.smi = smi
        self.samples: list[tuple[float, float, float]] = []  # (perf_counter, util %, MiB)
        self.error: str | None = None
        self.kind = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._nvml: Any = None
        self.info: dict[str, Any] = {}
        order = {"auto": ("nvml", "smi"), "nvml": ("nvml",), "smi": ("smi",), "none": ()}[kind]
        errors = []
        for candidate in order:
            try:
                getattr(self, f"_open_{candidate}")()
                self.kind = candidate
                break
            except Exception as e:
                errors.append(f"{candidate}: {type(e).__name__}: {e}")
        if self.kind == "none" and errors:
            self.error = "; ".join(errors)

    # -- backends
    def _open_nvml(self) -> None:
        try:
            import pynvml
        except ImportError:
            from ray._private.thirdparty import pynvml  # Ray's vendored copy
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        self.info = {
            "name": name.decode() if isinstance(name, bytes) else name,
            "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
        }
        self._nvml = (pynvml, handle)
        self._read_nvml()  # fails here, not in the thread, if reading does not work

    def _read_nvml(self) -> tuple[float, float]:
        pynvml, handle = self._nvml
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        return float(util), pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20

    def _open_smi(self) -> None:
        exe = shutil.which(self.smi) or (self.smi if os.access(self.smi, os.X_OK) else None)
        if exe is None:
            raise FileNotFoundError(f"{self.smi} not found")
        query = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        ms = max(int(self.interval_s * 1000), 10)
        self._proc = subprocess.Popen(
            [exe, *query, f"--loop-ms={ms}", "--id=0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    # -- life cycle
    def start(self) -> GpuSampler:
        if self.kind == "none":
            return self
        target = self._loop_nvml if self.kind == "nvml" else self._loop_smi
        self._thread = threading.Thread(target=target, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop_nvml(self) -> None:
        while not self._stop.is_set():
            try:
                util, mem = self._read_nvml()
            except Exception as e:
                self.error = f"nvml: {type(e).__name__}: {e}"
                return
            self.samples.append((time.perf_counter(), util, mem))
            self._stop.wait(self.interval_s)

    def _loop_smi(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            sample = parse_smi_line(line)
            if sample is not None:
                self.samples.append((time.perf_counter(), *sample))
            if self._stop.is_set():
                break

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml[0].nvmlShutdown()

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Utilisation and memory of the samples taken in [t0, t1]."""
        return summarise_samples([s for s in self.samples if t0 <= s[0] <= t1], self.kind)


def parse_smi_line(line: str) -> tuple[float, float] | None:
    """``"87, 1234"`` -> (87.0, 1234.0); None for anything else ("[N/A]", headers)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 2:
        return None
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        return None


def summarise_samples(samples: Sequence[tuple[float, float, float]], kind: str) -> dict[str, Any]:
    if not samples:
        return {
            "sampler": kind,
            "samples": 0,
            "busy_mean": None,
            "busy_median": None,
            "busy_max": None,
            "memory_used_max_mib": None,
        }
    utils = [s[1] for s in samples]
    return {
        "sampler": kind,
        "samples": len(samples),
        "busy_mean": statistics.fmean(utils) / 100,
        "busy_median": statistics.median(utils) / 100,
        "busy_max": max(utils) / 100,
        "memory_used_max_mib": max(s[2] for s in samples),
    }


# ------------------------------------------------------------------------------ data
def _write_idx(path: Path, array: Any) -> None:
    import numpy as np

    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    path.write_bytes(header + array.tobytes())


def make_standin(
    dest: Path, labels_dir: Path | None, seed: int = 0, size: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Writes a Fashion-MNIST-shaped stand-in (IDX files) into `dest`.

    Labels: the real ones from `labels_dir` (``train-/t10k-labels-idx1-ubyte[.gz]``) when
    there, else seeded draws. Pixels: per class a seeded template, half of each image, plus
    seeded noise: 60,000 + 10,000 28x28 uint8 images (`size`: the first (train, test) of
    them only, for quick tests).
    """
    import numpy as np

    from raydpfl.data.datasets import read_idx

    rng = np.random.default_rng(seed)
    dest.mkdir(parents=True, exist_ok=True)
    labels: dict[str, Any] = {}
    source = "seeded draws (no label files found)"
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        name = f"{split}-labels-idx1-ubyte"
        found = (
            [
                p
                for p in (labels_dir / name, labels_dir / f"{name}.gz")
                if labels_dir is not None and p.is_file()
            ]
            if labels_dir
            else []
        )
        if found:
            labels[split] = read_idx(found[0])[: None if size is None else size[split != "train"]]
            source = f"Fashion-MNIST's own ({labels_dir})"
        else:
            n = n if size is None else size[split != "train"]
            labels[split] = rng.integers(0, 10, size=n, dtype=np.uint8)
        _write_idx(dest / name, labels[split])
    templates = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint16)
    for split in ("train", "t10k"):
        y = labels[split].astype(np.int64)
        noise = rng.integers(0, 256, size=(len(y), 28, 28), dtype=np.uint16)
        _write_idx(
            dest / f"{split}-images-idx3-ubyte", ((templates[y] + noise) // 2).astype(np.uint8)
        )
    return {
        "kind": "stand-in",
        "root": str(dest),
        "labels": source,
        "pixels": f"seeded (seed {seed}): class template + noise, 28x28 uint8",
    }


def prepare_data(
    choice: str,
    data_root: Path | None,
    tmp: Path,
    kit: Path,
    size: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Where the workloads read Fashion-MNIST: real files, or a stand-in made in `tmp`."""
    from raydpfl.data.datasets import DatasetNotFoundError, find_dataset_files

    if choice in ("auto", "real"):
        try:
            files = find_dataset_files("fashion_mnist", data_root)
            root = files["train_images"].parent
            return {
                "kind": "real",
                "root": str(root),
                "labels": "Fashion-MNIST's own",
                "pixels": "Fashion-MNIST's own",
            }
        except DatasetNotFoundError as e:
            if choice == "real":
                raise SystemExit(f"--data real: {e}") from None
    labels_dir = kit / "data" if (kit / "data").is_dir() else None
    if labels_dir is None and data_root is not None:
        labels_dir = data_root
    return make_standin(tmp / "fashion_mnist", labels_dir, size=size)


# ------------------------------------------------------------------------------- Ray
@contextlib.contextmanager
def ray_session(num_gpus: float, num_cpus: int, tmp: Path) -> Iterator[dict[str, Any]]:
    """One local Ray instance for every Ray case: loopback only, a private temp dir, its
    processes ended when this process is (raydpfl's reaper), shut down afterwards."""
    import ray

    from raydpfl.backends.ray.loopback import LOOPBACK, loopback_only
    from raydpfl.backends.ray.reaper import descendants, start_reaper

    t = time.perf_counter()
    with loopback_only():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            logging_level="WARNING",
            _node_ip_address=LOOPBACK,
            _temp_dir=str(tmp),
        )
    reaper = start_reaper(os.getpid(), descendants(os.getpid()))
    info = {
        "ray_version": ray.__version__,
        "ray_init_seconds": time.perf_counter() - t,
        "cluster_resources": {
            k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")
        },
    }
    try:
        yield info
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.terminate()
            reaper.wait(timeout=10)


# ------------------------------------------------------------------------------ cases
@dataclass
class RunResult:
    record: dict[str, Any]
    params: dict[str, Any] | None = field(default=None, repr=False)


def timed_rounds(rounds: int) -> list[int]:
    """Rounds whose time counts: not the first (warm-up); not the last, which evaluates,
    when four or more ran."""
    if rounds < 2:
        return [0]
    return list(range(1, rounds - 1)) if rounds >= 4 else list(range(1, rounds))


def run_case(
    workload: str,
    case: Case,
    rounds: int,
    device: str,
    data_root: str,
    cpus_per_worker: float,
    sampler: GpuSampler,
    run_dir: Path,
    extra: Sequence[str] = (),
) -> RunResult:
    import torch

    from raydpfl.config import load_config
    from raydpfl.experiment.build import build_experiment, run_experiment
    from raydpfl.simulation.outputs import prepare_run_dir

    overrides = [
        *case.overrides(device, cpus_per_worker),
        f"algorithm.rounds={rounds}",
        f"data.root={data_root}",
        *extra,
    ]
    t_start = time.perf_counter()
    exp = build_experiment(load_config(WORKLOADS[workload], overrides))
    t_built = time.perf_counter()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    stamps: list[float] = []
    rows: list[dict[str, Any]] = []

    def on_round(row: Mapping[str, Any]) -> None:
        stamps.append(time.perf_counter())
        rows.append(dict(row))

    summary = run_experiment(exp, prepare_run_dir(run_dir), on_round)
    t_end = time.perf_counter()
    if summary["rounds_completed"] != rounds:
        raise RuntimeError(f"{workload}/{case.name} stopped early: {summary['stop_reason']}")
    server = [r["wall_seconds"] for r in rows]
    driver = [server[0]] + [b - a for a, b in itertools.pairwise(stamps)]
    timed = timed_rounds(rounds)
    # round i ran from stamps[i-1] (round 0: its server time before stamps[0]) to stamps[i]
    starts = [stamps[0] - server[0], *stamps[:-1]]
    window = sampler.window(starts[timed[0]], stamps[timed[-1]])
    per_round = statistics.median(driver[i] for i in timed)
    client_steps = statistics.median(
        rows[i]["clients_trained"] * rows[i]["local_steps"] for i in timed
    )
    samples = [
        rows[i]["mean_batch_size"] * rows[i]["clients_trained"] * rows[i]["local_steps"]
        for i in timed
    ]
    whole = sampler.window(t_built, t_end)
    record = {
        "workload": workload,
        "case": case.name,
        "backend": case.backend,
        "workers": case.workers if case.backend == "ray" else 1,
        "gpus_per_worker": case.gpus_per_worker if case.backend == "ray" else None,
        "aggregation_groups": case.groups,
        "overrides": overrides,
        "rounds": rounds,
        "timed_rounds": [i + 1 for i in timed],
        "round_seconds": driver,
        "round_seconds_server": server,
        "s_per_round": per_round,
        "client_steps_per_s": client_steps / per_round,
        "samples_per_s": statistics.median(
            s / driver[i] for s, i in zip(samples, timed, strict=True)
        ),
        "build_seconds": t_built - t_start,
        "setup_seconds": stamps[0] - t_built - server[0],  # Ray: server and worker start
        "wall_seconds": t_end - t_start,
        "gpu_rounds": window,
        "gpu_whole_run": whole,
        "torch_peak_allocated_mib": (
            torch.cuda.max_memory_allocated() / 2**20
            if device.startswith("cuda") and case.backend == "local"
            else None
        ),
        "clients_per_round": rows[-1]["clients_trained"],
        "test_accuracy": summary.get("final_test_accuracy"),
        "model_sha256": summary["model_sha256"],
    }
    params = torch.load(run_dir / "model.pt", weights_only=True)
    del exp
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return RunResult(record, params)


def compare_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Largest absolute and relative difference between two state dicts of one model."""
    import torch

    if a.keys() != b.keys():
        return {"same_keys": False}
    diff = max((float((a[k].double() - b[k].double()).abs().max()) for k in a), default=0.0)
    scale = max((float(a[k].double().abs().max()) for k in a), default=0.0)
    equal = all(torch.equal(a[k], b[k]) for k in a)
    return {
        "same_keys": True,
        "bit_equal": equal,
        "max_abs_diff": diff,
        "max_rel_diff": diff / scale if scale else None,
    }


# ---------------------------------------------------------------------------- report
def ratios_and_targets(
    records: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Throughput ratios to the in-process runs, and the issue's targets, met or missed."""
    ratios: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []
    for workload in dict.fromkeys(r["workload"] for r in records):
        local = {
            r["case"]: r["client_steps_per_s"]
            for r in records
            if r["workload"] == workload
            and r["backend"] == "local"
            and not r["case"].endswith("_repeat")
        }
        best_local = max(local.items(), key=lambda kv: kv[1]) if local else None
        ratios[workload] = {}
        for r in records:
            if r["workload"] != workload or r["backend"] != "ray":
                continue
            ratios[workload][r["case"]] = {
                f"vs_{c}": r["client_steps_per_s"] / v for c, v in local.items()
            }
            if best_local is not None:
                ratios[workload][r["case"]]["vs_best_in_process"] = (
                    r["client_steps_per_s"] / best_local[1]
                )
            ref = CASES[r["case"]].reference
            if ref in local:
                ratios[workload][r["case"]]["vs_reference"] = r["client_steps_per_s"] / local[ref]
        fractional = [
            r
            for r in records
            if r["workload"] == workload and r["backend"] == "ray" and r["gpus_per_worker"] < 1
        ]
        best = max(fractional, key=lambda r: r["client_steps_per_s"]) if fractional else None
        if best is not None and best_local is not None:
            value = best["client_steps_per_s"] / best_local[1]
            targets.append(
                {
                    "target": f"{workload.upper()}: Ray pool on fractional GPUs >= "
                    f"{TARGET_THROUGHPUT}x in-process vectorised throughput",
                    "value": value,
                    "met": value >= TARGET_THROUGHPUT,
                    "how": f"{best['case']} (the faster fractional pool) / {best_local[0]} "
                    "(the faster in-process run), client-steps per second",
                }
            )
        else:
            targets.append(
                {
                    "target": f"{workload.upper()}: Ray pool >= {TARGET_THROUGHPUT}x in-process",
                    "value": None,
                    "met": None,
                    "how": "not run",
                }
            )
        if workload == "w1":
            busy = best["gpu_rounds"]["busy_mean"] if best is not None else None
            targets.append(
                {
                    "target": f"W1: GPU busy >= {TARGET_BUSY:.0%} during the rounds",
                    "value": busy,
                    "met": None if busy is None else busy >= TARGET_BUSY,
                    "how": (
                        f"{best['case']}: mean utilisation ({best['gpu_rounds']['sampler']}) over "
                        "the timed rounds"
                        if best is not None
                        else "not run"
                    )
                    + ("" if busy is not None else "; no GPU samples"),
                }
            )
    return ratios, targets


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: Mapping[str, Any]) -> str:
    lines = [
        f"# Ray on one GPU: W1 and W3 ({report['utc']})",
        "",
        f"Device: {report['device_name']} ({report['mode']}); torch {report['torch']}, "
        f"Ray {(report.get('ray') or {}).get('ray_version', '-')}, "
        f"Python {report['python']}. "
        f"Data: {report['data']['kind']} ({report['data']['labels']} labels). "
        f"Wall time {report['elapsed_seconds']:.0f} s "
        f"of a {report['budget_seconds']:.0f} s budget.",
        "",
        "| workload | case | workers x GPU | groups | s/round | client-steps/s "
        "| x reference | x best in-process | GPU busy (rounds) | GPU MiB max | setup s "
        "| model = reference |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if report["mode"] != "GPU":
        lines[2] += (
            " CPU rehearsal: 'GPU busy' and 'GPU MiB' come from the sampler's source "
            f"({report['gpu_sampler']}; the fake nvidia-smi reports CPU busy and RAM used)."
        )
    ratios = report["ratios"]
    for r in report["cases"]:
        share = (
            f"{r['workers']} x {r['gpus_per_worker']:g}" if r["backend"] == "ray" else "in-process"
        )
        rat = ratios.get(r["workload"], {}).get(r["case"], {})
        eq = r.get("vs_reference") or {}
        if not eq:
            same = "-" if r["backend"] == "ray" or r["case"].endswith("_repeat") else ""
        elif eq.get("bit_equal"):
            same = f"{r['reference']}: bit for bit"
        else:
            same = f"{r['reference']}: max abs diff {_fmt(eq.get('max_abs_diff'), '.2e')}"
        g = r["gpu_rounds"]
        lines.append(
            f"| {r['workload']} | {r['case']} | {share} | {r['aggregation_groups']} | "
            f"{r['s_per_round']:.3f} | {r['client_steps_per_s']:.1f} | "
            f"{_fmt(rat.get('vs_reference'), '.2f')} | "
            f"{_fmt(rat.get('vs_best_in_process'), '.2f')} | {_fmt(g['busy_mean'], '.0%')} | "
            f"{_fmt(r['gpu_whole_run']['memory_used_max_mib'], '.0f')} | "
            f"{r['setup_seconds']:.1f} | {same} |"
        )
    lines += ["", "Targets:", ""]
    for t in report["targets"]:
        if "rehearsal_value" in t:
            lines.append(
                f"- {t['target']}: not judged on the CPU rehearsal (its CPU figure: "
                f"{_fmt(t['rehearsal_value'], '.2f')}; {t['how']})"
            )
            continue
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"- {t['target']}: {_fmt(t['value'], '.2f')} -> **{verdict}** ({t['how']})")
    if report["skipped"]:
        lines += [
            "",
            "Skipped: "
            + "; ".join(f"{s['workload']}/{s['case']} ({s['why']})" for s in report["skipped"]),
        ]
    for note in report.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


def host_info(device: str, sampler: GpuSampler) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "device_name": (
            torch.cuda.get_device_name()
            if device.startswith("cuda")
            else f"CPU ({platform.processor() or platform.machine()})"
        ),
        "gpu_sampler": sampler.kind,
        "gpu_sampler_error": sampler.error,
        "gpu_sampler_info": sampler.info,
    }
    manifest = KIT / "MANIFEST.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        info["kit"] = {k: m.get(k) for k in ("built_utc", "kit_bytes", "pins")}
    return info


# ------------------------------------------------------------------------------ main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", nargs="+", choices=tuple(WORKLOADS), default=["w1", "w3"])
    ap.add_argument(
        "--cases",
        nargs="+",
        choices=[c for c in CASES if not c.endswith("_repeat")],
        default=list(DEFAULT_CASES),
        help="Ray cases bring their in-process reference (local_gN, N = groups) along",
    )
    ap.add_argument("--rounds-w1", type=int, default=20, help="W1 rounds (config: 20)")
    ap.add_argument("--rounds-w3", type=int, default=5, help="W3 rounds (config: 5)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --fake-gpus")
    ap.add_argument(
        "--fake-gpus",
        action="store_true",
        help="declare one GPU to Ray on a machine without one (the CPU rehearsal)",
    )
    ap.add_argument("--cpus-per-worker", type=float, default=1.0)
    ap.add_argument("--data", choices=("auto", "real", "standin"), default="auto")
    ap.add_argument("--data-root", type=Path, help="where Fashion-MNIST's files are")
    ap.add_argument(
        "--standin-size",
        type=int,
        nargs=2,
        metavar=("TRAIN", "TEST"),
        help="a smaller stand-in: its first TRAIN and TEST records (quick tests only)",
    )
    ap.add_argument("--sampler", choices=("auto", "nvml", "smi", "none"), default="auto")
    ap.add_argument("--smi", default="nvidia-smi", help="the nvidia-smi executable")
    ap.add_argument("--sample-ms", type=int, default=100)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=400.0,
        help="stop starting cases past this (seconds since start)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the JSON and .md")
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every case (after the case's own; repeatable)",
    )
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and args.fake_gpus:
        ap.error("--fake-gpus trains on the CPU: add --device cpu")
    for name in ("rounds_w1", "rounds_w3"):
        if getattr(args, name) < 2:
            ap.error(f"--{name.replace('_', '-')} must be at least 2 (the first warms up)")
    return args


def reference_of(name: str) -> str | None:
    """The case whose final model `name`'s must equal bit for bit (None: none)."""
    return name.removesuffix("_repeat") if name.endswith("_repeat") else CASES[name].reference


def plan(workloads: Sequence[str], cases: Sequence[str]) -> list[tuple[str, str]]:
    """(workload, case) in run order: each Ray case just after its reference; the main
    cases of every workload first, then the others."""

    def with_refs(names: Sequence[str]) -> list[str]:
        out: list[str] = []
        for c in names:
            out += [r for r in (CASES[c].reference, c) if r is not None]
        return list(dict.fromkeys(out))

    main = with_refs([c for c in cases if c in MAIN_CASES])
    rest = [c for c in with_refs([c for c in cases if c not in MAIN_CASES]) if c not in main]
    return [(w, c) for w in workloads for c in main] + [(w, c) for w in workloads for c in rest]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            "no CUDA device is visible: on the CPU rehearse with --fake-gpus --device cpu"
        )
    sampler = GpuSampler(args.sampler, args.sample_ms / 1000, args.smi).start()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / f"gpu-ray-{stamp}.json", args.out / f"gpu-ray-{stamp}.md"
    tmp = Path(tempfile.mkdtemp(prefix="gpuray-", dir="/tmp"))  # short: Ray's socket paths
    rounds = {"w1": args.rounds_w1, "w3": args.rounds_w3}
    report: dict[str, Any] = {
        "utc": stamp,
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "mode": "fake GPUs: CPU rehearsal" if args.fake_gpus else "GPU",
        "device": args.device,
        **host_info(args.device, sampler),
        "budget_seconds": args.budget_s,
        "rounds": rounds,
        "extra_overrides": args.extra,
        "cases": [],
        "skipped": [],
        "notes": [],
    }
    params: dict[tuple[str, str], Any] = {}
    last_wall: dict[str, float] = {}

    def save() -> None:
        report["elapsed_seconds"] = time.perf_counter() - t0
        report["ratios"], report["targets"] = ratios_and_targets(report["cases"])
        if args.fake_gpus:  # CPU figures: the targets are the GPU's, so none is judged
            for t in report["targets"]:
                t["rehearsal_value"], t["value"], t["met"] = t["value"], None, None
        json_path.write_text(json.dumps(report, indent=2, default=str))
        md_path.write_text(markdown(report))

    try:
        report["data"] = prepare_data(
            args.data, args.data_root, tmp, KIT, tuple(args.standin_size or ()) or None
        )
        print(f"data: {report['data']['kind']} at {report['data']['root']}", flush=True)
        need = max(CASES[c].workers * args.cpus_per_worker for c in args.cases)
        num_cpus = max(os.cpu_count() or 1, int(need + 0.999))
        with (
            ray_session(1, num_cpus, tmp / "ray")
            if any(CASES[c].backend == "ray" for c in args.cases)
            else contextlib.nullcontext({})
        ) as ray_info:
            report["ray"] = ray_info
            if ray_info:
                print(
                    f"ray {ray_info['ray_version']}: {ray_info['cluster_resources']} "
                    f"in {ray_info['ray_init_seconds']:.1f} s",
                    flush=True,
                )
            todo = plan(args.workload, args.cases)
            while todo:
                workload, name = todo.pop(0)
                elapsed = time.perf_counter() - t0
                estimate = last_wall.get(workload, 0.0)
                if elapsed + estimate > args.budget_s:
                    report["skipped"].append(
                        {
                            "workload": workload,
                            "case": name,
                            "why": f"budget: {elapsed:.0f} s spent, the last "
                            f"{workload} case took {estimate:.0f} s",
                        }
                    )
                    print(f"skip {workload}/{name}: budget", flush=True)
                    continue
                run_dir = tmp / "runs" / f"{workload}-{name}"
                try:
                    res = run_case(
                        workload,
                        CASES[name],
                        rounds[workload],
                        args.device,
                        report["data"]["root"],
                        args.cpus_per_worker,
                        sampler,
                        run_dir,
                        args.extra,
                    )
                except Exception as e:
                    report["skipped"].append(
                        {
                            "workload": workload,
                            "case": name,
                            "why": f"failed: {type(e).__name__}: {e}",
                        }
                    )
                    print(f"FAILED {workload}/{name}: {type(e).__name__}: {e}", flush=True)
                    save()
                    continue
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
                rec = res.record
                rec["reference"] = reference_of(name)
                last_wall[workload] = rec["wall_seconds"]
                params[(workload, name)] = res.params
                report["cases"].append(rec)
                for other in report["cases"]:  # compare every pair now complete
                    key = (other["workload"], other["reference"])
                    if "vs_reference" in other or key not in params:
                        continue
                    other["vs_reference"] = compare_params(
                        params[key], params[(other["workload"], other["case"])]
                    )
                    repeat = (other["workload"], f"{other['reference']}_repeat")
                    if (
                        other["backend"] == "ray"
                        and not other["vs_reference"].get("bit_equal")
                        and repeat not in todo
                        and repeat not in params
                    ):
                        todo.append(repeat)  # is the GPU itself deterministic?
                g = rec["gpu_rounds"]
                eq = rec.get("vs_reference", {})
                print(
                    f"{workload} {name:16s} {rec['s_per_round']:7.3f} s/round "
                    f"{rec['client_steps_per_s']:8.1f} client-steps/s  GPU busy "
                    f"{_fmt(g['busy_mean'], '.0%')}  setup {rec['setup_seconds']:.1f} s"
                    + ("" if not eq else f"  = {rec['reference']}: {eq.get('bit_equal')}"),
                    flush=True,
                )
                save()
        report["notes"] += determinism_notes(report["cases"])
    finally:
        sampler.stop()
        save()
        shutil.rmtree(tmp, ignore_errors=True)
    print(markdown(report))
    print(f"wrote {json_path} and {md_path}")
    failed = [s for s in report["skipped"] if s["why"].startswith("failed")]
    return 1 if failed else 0


def determinism_notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the bit-for-bit check found, per workload, in one sentence each."""
    notes = []
    for workload in dict.fromkeys(r["workload"] for r in records):
        rays = [
            r
            for r in records
            if r["workload"] == workload and r["backend"] == "ray" and "vs_reference" in r
        ]
        if not rays:
            continue
        if all(r["vs_reference"].get("bit_equal") for r in rays):
            notes.append(
                f"{workload}: every Ray case's final model equals its in-process reference's "
                "(the same aggregation groups) bit for bit."
            )
            continue
        worst = max(r["vs_reference"].get("max_abs_diff") or 0.0 for r in rays)
        repeats = [
            r
            for r in records
            if r["workload"] == workload and r["case"].endswith("_repeat") and "vs_reference" in r
        ]
        if not repeats:
            why = (
                "no in-process reference was repeated (budget), so the GPU's own run-to-run "
                "spread is unknown"
            )
        elif all(r["vs_reference"].get("bit_equal") for r in repeats):
            why = (
                "the in-process reference repeated gives the same bits, so the GPU is "
                "deterministic here and the difference is the backend's: a bug to chase"
            )
        else:
            spread = max(r["vs_reference"].get("max_abs_diff") or 0.0 for r in repeats)
            why = (
                f"the in-process reference repeated differs from itself by up to {spread:.2e}: "
                "the GPU's kernels are not deterministic run to run (e.g. atomics in "
                "cuDNN/cuBLAS reductions), so Ray = local holds only to that tolerance"
            )
        notes.append(
            f"{workload}: Ray vs its in-process reference differ by up to {worst:.2e} "
            f"(max abs, final parameters); {why}."
        )
    return notes


if __name__ == "__main__":
    raise SystemExit(main())
