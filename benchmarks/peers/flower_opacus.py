"""Peer benchmark: Flower's simulation engine with Opacus DP-SGD clients on W1 / W2 / W3.

Runs in the isolated venv made by `setup_env.sh` (Flower pins its own Ray); it never
imports raydpfl. It reads the export written by `export_workload.py` (the pool,
raydpfl's partition, raydpfl's initial model and raydpfl's cohorts) and runs:

- Flower `run_simulation` with a message-API `ServerApp` / `ClientApp`, one virtual
  SuperNode per client (partition-id = raydpfl's client id), Ray backend with
  2 CPUs, each ClientApp 1 CPU and 1 torch thread (so 2 concurrent clients, as raydpfl's
  Ray backend runs 2 workers x 1 thread).
- Client: a fresh model (the export's: FedAvgCNN for fedavg_cnn, BcsMnistCnn for
  bcs_mnist_cnn, plain torch.nn) loaded with the global model, SGD(lr), Opacus
  `PrivacyEngine.make_private` (noise_multiplier sigma, max_grad_norm C, default "mean"
  loss reduction, `grad_sample_mode` from `--grad-sample-mode`: "hooks", per-sample
  gradients, or "ghost", Opacus's fast gradient / ghost clipping, where the loss comes
  from the criterion `make_private` returns and its `.backward()` runs both backward
  passes) over an Opacus `DPDataLoader` with Poisson rate q; exactly tau steps
  (tau Poisson batches, an empty batch still a step; at q = 1, W3, Opacus's Poisson
  sampler keeps every record, so each step is full-batch). The optimizer's
  `expected_batch_size` is set to q*|D_i| (Opacus would use int(q*|D_i|)), so the noised
  sum is divided by the workload's expected batch.
- Server: Flower's message-API `FedAvg` (weighted by "num-examples" = |D_i|), with
  `configure_train` sending round r to the SuperNodes of raydpfl's round-r cohort. The
  node-id -> partition-id map is learned once by a QUERY to every node before round 1
  (timed apart, as startup; Ray itself is started by this script just before
  `run_simulation`, which then reuses it, so `ray.init` is timed apart too). No
  federated evaluation; the final global model is scored on the exported test set
  after the last round, outside the round times.

Allocator (`--allocator`, default "tuned"): every process of the run (the driver, which
holds the ServerApp, and each ClientApp actor) gets glibc's malloc settings that raydpfl
gives its own training processes (`raydpfl/backends/allocator.py`: mmap threshold
64 MiB, trim threshold 256 MiB), as the environment variables MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_, which glibc reads at process start: the driver re-executes
itself with them, and Ray's runtime_env passes them to the actors. "default" runs every
process with glibc's defaults (the variables removed). Each client reports whether its
actor has them; the JSON's "allocator" says so.

Round time = wall clock between consecutive round starts (`configure_train` calls) on
the server; the last round ends when its aggregation returns. Seconds per round =
median over rounds 2..R.

Usage (from the repository root):

    $RAYDPFL_PEERS_VENV/bin/python benchmarks/peers/flower_opacus.py \
        ~/.cache/raydpfl/peers-data/w1.npz [--rounds R] [--cpus 2] \
        [--grad-sample-mode {hooks,ghost}] [--allocator {tuned,default}] [--out-dir DIR]

Writes benchmarks/results/peers/flower_opacus[-ghost]-<workload>-<UTC>.json (exactly one
file per run; "-ghost" with `--grad-sample-mode ghost`), prints a table, and prints
`wrote <path>` as the last line of stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# Before torch / Ray start: one thread per process unless told otherwise; no telemetry.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "benchmarks" / "results" / "peers"

GRAD_SAMPLE_MODES = ("hooks", "ghost")
ALLOCATOR_MODES = ("tuned", "default")
#: glibc malloc settings that raydpfl gives its training processes
#: (raydpfl/backends/allocator.py: MMAP_THRESHOLD = 64 MiB, TRIM_THRESHOLD = 256 MiB, set
#: there with mallopt). glibc reads these variables once, at process start.
ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(64 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
}
_REEXEC_MARK = "RAYDPFL_PEERS_ALLOCATOR_REEXEC"


def _environ_at_start() -> dict[str, str] | None:
    """The environment this process was started with (`/proc/self/environ`: what glibc
    read), or None without procfs."""
    try:
        raw = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)


def allocator_env_ok(mode: str) -> bool:
    """True when this process runs with `mode`'s allocator: "tuned", both ALLOCATOR_ENV
    values in `os.environ` and in the environment the process started with; "default",
    neither variable in either."""
    envs: list[Any] = [os.environ]
    start = _environ_at_start()
    if start is not None:
        envs.append(start)
    if mode == "tuned":
        return all(env.get(k) == v for env in envs for k, v in ALLOCATOR_ENV.items())
    return not any(k in env for env in envs for k in ALLOCATOR_ENV)


def reexec_for_allocator(mode: str) -> None:
    """Makes this process's environment match `mode`, re-executing the script once (same
    interpreter, same arguments) when the variables must be added ("tuned") or removed
    ("default"): glibc reads them only at process start."""
    if allocator_env_ok(mode):
        os.environ.pop(_REEXEC_MARK, None)
        return
    if os.environ.get(_REEXEC_MARK):
        raise SystemExit(f"--allocator {mode}: the environment is still wrong after re-exec")
    if mode == "tuned":
        os.environ.update(ALLOCATOR_ENV)
    else:
        for k in ALLOCATOR_ENV:
            os.environ.pop(k, None)
    os.environ[_REEXEC_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


# ---- model: raydpfl's fedavg_cnn, same parameter names ---------------------------------
class FedAvgCNN(nn.Module):
    """Conv(c->32,5) ReLU MaxPool2 -> Conv(32->64,5) ReLU MaxPool2 -> FC(.->512) ReLU -> FC."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        flat = 64 * (((height - 4) // 2 - 4) // 2) * (((width - 4) // 2 - 4) // 2)
        self.fc1 = nn.Linear(flat, 512)
        self.fc = nn.Linear(512, num_classes)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc(self.relu(self.fc1(x)))


# ---- model: raydpfl's bcs_mnist_cnn, same parameter names ------------------------------
class BcsMnistCnn(nn.Module):
    """Conv(c->4,3,pad 1) ReLU MaxPool2 -> Conv(4->8,3,pad 1) ReLU MaxPool2 -> Linear.

    The DPFL-BCS MNIST CNN (4,266 parameters on 1x28x28, 10 classes), written as a Flower
    user would: plain `torch.nn` (raydpfl's copy uses its own channels-last MaxPool2d,
    which computes the same values). Parameter names as raydpfl's: features.{0,3}.*,
    classifier.*.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(8 * (height // 2 // 2) * (width // 2 // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODELS: dict[str, type[nn.Module]] = {"fedavg_cnn": FedAvgCNN, "bcs_mnist_cnn": BcsMnistCnn}


# ---- the export, loaded once per process -----------------------------------------------
class Workload:
    """The exported workload: pool, partition, cohorts, initial model, hyperparameters."""

    def __init__(self, path: str) -> None:
        with np.load(path) as f:
            self.x = torch.from_numpy(f["x"])
            self.y = torch.from_numpy(f["y"])
            self.x_test = torch.from_numpy(f["x_test"])
            self.y_test = torch.from_numpy(f["y_test"])
            self.offsets = f["client_offsets"]
            self.rows = f["client_rows"]
            self.cohorts = f["cohorts"]
            names = [str(n) for n in f["param_names"]]
            self.init_params = {
                n: torch.from_numpy(f[f"param_{k}"].copy()) for k, n in enumerate(names)
            }
            self.meta = json.loads(str(f["meta"]))

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.rows[self.offsets[cid] : self.offsets[cid + 1]])
        return self.x[idx], self.y[idx]

    def build_model(self) -> nn.Module:
        """The export's model (meta "model"; exports from before W3 lack it: fedavg_cnn)."""
        name = self.meta.get("model", "fedavg_cnn")
        if name not in MODELS:
            raise SystemExit(f"no peer model for {name!r}; known: {sorted(MODELS)}")
        return MODELS[name](tuple(self.meta["input_shape"]), self.meta["num_classes"])


_WORKLOADS: dict[str, Workload] = {}


def load_workload(path: str) -> Workload:
    """The export at `path`, read once per process (each Ray actor keeps its copy)."""
    if path not in _WORKLOADS:
        _WORKLOADS[path] = Workload(path)
    return _WORKLOADS[path]


def evaluate_accuracy(wl: Workload, state: dict[str, torch.Tensor]) -> float:
    """Accuracy of the model with parameters `state` on the export's test set."""
    model = wl.build_model()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(wl.x_test[i : i + 2048]).argmax(1) == wl.y_test[i : i + 2048]).sum())
            for i in range(0, wl.x_test.shape[0], 2048)
        )
    return correct / wl.x_test.shape[0]


def _max_rss_kib() -> int:
    """This process's peak resident set size in KiB (Linux ru_maxrss)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


# ---- Opacus --------------------------------------------------------------------------------
def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    *,
    mode: str,
    noise_multiplier: float,
    clip_norm: float,
) -> tuple[Any, Any, Any, Any]:
    """Opacus's `PrivacyEngine.make_private` in `mode` ("hooks" or "ghost") over an
    existing Poisson `DPDataLoader`; returns (model, optimizer, criterion, loader).

    The criterion is cross entropy with "mean" reduction. In "ghost" mode it is Opacus's
    wrapper whose loss's `.backward()` runs ghost clipping's two backward passes.
    """
    from opacus import PrivacyEngine

    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode {mode!r}; known: {GRAD_SAMPLE_MODES}")
    criterion = nn.CrossEntropyLoss()  # "mean", Opacus's default loss reduction
    kwargs = {
        "module": model,
        "optimizer": optimizer,
        "data_loader": loader,
        "noise_multiplier": noise_multiplier,
        "max_grad_norm": clip_norm,
        "poisson_sampling": False,  # the loader is already Opacus's Poisson DPDataLoader
        "grad_sample_mode": mode,
    }
    engine = PrivacyEngine(accountant="rdp")
    if mode == "ghost":
        model, optimizer, criterion, loader = engine.make_private(criterion=criterion, **kwargs)
    else:
        model, optimizer, loader = engine.make_private(**kwargs)
    return model, optimizer, criterion, loader


def quiet_opacus() -> None:
    """Silences Opacus's known, harmless per-step notices (inputs need no grad; an empty
    first Poisson batch), so that log shipping does not cost the driver CPU."""
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    logging.getLogger("opacus.data_loader").setLevel(logging.ERROR)


def run_local_steps(
    model: nn.Module, optimizer: Any, criterion: Any, loader: Any, steps: int
) -> int:
    """Exactly `steps` DP-SGD steps, one per Poisson batch of `loader` (a new pass when
    it ends: never for tau <= 1/q; q = 1 is one full batch per pass); returns the records
    sampled. The loss is cross entropy, "mean" (Opacus's default reduction); in ghost mode
    `criterion` is Opacus's DPLossFastGradientClipping, whose loss's backward() runs both
    backward passes."""
    batches = iter(loader)
    samples = 0
    for _ in range(steps):
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = iter(loader)
            xb, yb = next(batches)
        samples += int(xb.shape[0])
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
    return samples


# ---- ClientApp ---------------------------------------------------------------------------
def _make_client_app() -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Tells the server which client (partition) this SuperNode is."""
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"node": ConfigRecord({"partition-id": pid})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        from opacus.data_loader import DPDataLoader
        from torch.utils.data import TensorDataset

        torch.set_num_threads(1)
        quiet_opacus()
        cfg = msg.content["config"]
        wl = load_workload(str(cfg["export"]))
        cid = int(context.node_config["partition-id"])
        q = float(cfg["sampling-rate"])
        x, y = wl.client_data(cid)
        n = int(x.shape[0])
        mode = str(cfg["grad-sample-mode"])

        model = wl.build_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
        loader = DPDataLoader(TensorDataset(x, y), sample_rate=q)  # Poisson sampling, rate q
        model, optimizer, criterion, loader = make_private(
            model,
            optimizer,
            loader,
            mode=mode,
            noise_multiplier=float(cfg["noise-multiplier"]),
            clip_norm=float(cfg["clip-norm"]),
        )
        # Opacus divides the noised sum by int(q * |D_i|); the workload by q * |D_i|.
        # (DPOptimizer.scale_grad reads it at each step, in both modes: the ghost-mode
        # DPOptimizerFastGradientClipping inherits scale_grad.)
        optimizer.expected_batch_size = q * n
        model.train()
        samples = run_local_steps(model, optimizer, criterion, loader, int(cfg["local-steps"]))
        state = {k: v.detach() for k, v in model._module.state_dict().items()}
        metrics = {
            "num-examples": n,
            "samples": samples,
            "actor-max-rss-kib": _max_rss_kib(),
            "actor-allocator-ok": int(allocator_env_ok(str(cfg["allocator"]))),
        }
        content = RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)

    return app


# ---- ServerApp -----------------------------------------------------------------------------
def _make_cohort_fedavg() -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import FedAvg

    class CohortFedAvg(FedAvg):
        """FedAvg whose round-r cohort is raydpfl's; records the round times."""

        def __init__(self, cohorts: np.ndarray, node_of: dict[int, int]) -> None:
            super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1)
            self.cohorts = cohorts
            self.node_of = node_of
            self.round_starts: list[float] = []
            self.round_ends: list[float] = []
            self.round_samples: list[int] = []
            self.round_clients: list[int] = []
            self.actor_max_rss_kib = 0
            self.allocator_checks: list[int] = []  # one per trained client: 1 = as asked

        def configure_train(
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> Iterable[Message]:
            self.round_starts.append(time.perf_counter())
            config["server-round"] = server_round
            nodes = [self.node_of[int(c)] for c in self.cohorts[server_round - 1]]
            record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
            return self._construct_messages(record, nodes, MessageType.TRAIN)

        def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
            replies = list(replies)
            out = super().aggregate_train(server_round, replies)
            ok = [m for m in replies if not m.has_error()]
            self.round_clients.append(len(ok))
            self.round_samples.append(sum(int(m.content["metrics"]["samples"]) for m in ok))
            self.actor_max_rss_kib = max(
                [self.actor_max_rss_kib]
                + [int(m.content["metrics"]["actor-max-rss-kib"]) for m in ok]
            )
            self.allocator_checks += [int(m.content["metrics"]["actor-allocator-ok"]) for m in ok]
            self.round_ends.append(time.perf_counter())
            return out

    return CohortFedAvg


RESULT: dict[str, Any] = {}  # filled by the ServerApp thread (same process as the driver)


def _make_server_app(
    export: str, rounds: int, t_launch: float, grad_sample_mode: str, allocator: str
) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()
    cohort_fedavg = _make_cohort_fedavg()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        t_main = time.perf_counter()
        wl = load_workload(export)
        meta = wl.meta
        # Which SuperNode is which client: one QUERY to every node (startup, untimed).
        node_ids = list(grid.get_node_ids())
        queries = [
            Message(RecordDict(), dst_node_id=nid, message_type=MessageType.QUERY)
            for nid in node_ids
        ]
        replies = grid.send_and_receive(queries, timeout=3600)
        node_of = {}
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"query failed: {reply.error.reason}")
            node_of[int(reply.content["node"]["partition-id"])] = reply.metadata.src_node_id
        if len(node_of) != meta["num_clients"]:
            raise RuntimeError(f"{len(node_of)} nodes answered, {meta['num_clients']} expected")
        t_mapped = time.perf_counter()

        strategy = cohort_fedavg(wl.cohorts[:rounds], node_of)
        train_config = ConfigRecord(
            {
                "export": export,
                "lr": float(meta["lr"]),
                "sampling-rate": float(meta["sampling_rate"]),
                "clip-norm": float(meta["clip_norm"]),
                "noise-multiplier": float(meta["noise_multiplier"]),
                "local-steps": int(meta["local_steps"]),
                "grad-sample-mode": grad_sample_mode,
                "allocator": allocator,
            }
        )
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(wl.init_params),
            num_rounds=rounds,
            train_config=train_config,
        )
        t_done = time.perf_counter()
        # Central evaluation of the final global model, outside the round times.
        accuracy = evaluate_accuracy(wl, result.arrays.to_torch_state_dict())
        starts, ends = strategy.round_starts, strategy.round_ends
        RESULT.update(
            round_seconds=[b - a for a, b in itertools.pairwise(starts)] + [ends[-1] - starts[-1]],
            round_seconds_server=[e - s for s, e in zip(starts, ends, strict=True)],
            round_clients=strategy.round_clients,
            round_samples=strategy.round_samples,
            test_accuracy=accuracy,
            evaluation_seconds=time.perf_counter() - t_done,
            startup={
                "launch_to_serverapp_seconds": t_main - t_launch,
                "node_query_seconds": t_mapped - t_main,
                "launch_to_round1_seconds": starts[0] - t_launch,
            },
            t_rounds_done=t_done,
            actor_max_rss_mib=strategy.actor_max_rss_kib / 1024,
            allocator_checks=strategy.allocator_checks,
        )

    return app


# ---- driver --------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import flwr
    import opacus
    import ray

    return {
        "python": platform.python_version(),
        "flwr": flwr.__version__,
        "opacus": opacus.__version__,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "numpy": np.__version__,
    }


def _machine() -> dict[str, Any]:
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    # Not `nproc`: it reports OMP_NUM_THREADS when set, and this script sets it to 1.
    nproc = len(os.sched_getaffinity(0))
    return {"nproc": nproc, "cpu_model": cpu, "platform": platform.platform()}


RUNNERS = {"hooks": "flower_opacus", "ghost": "flower_opacus_ghost"}


def run(
    export: str,
    rounds: int | None,
    cpus: int,
    grad_sample_mode: str = "hooks",
    allocator: str = "tuned",
) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    # The driver's own module (not __main__) holds the apps, so Ray pickles them by
    # reference and each actor keeps its loaded workload between messages.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import flower_opacus as mod

    wl = load_workload(export)
    meta = wl.meta
    rounds = int(rounds or meta["rounds"])
    if rounds > len(wl.cohorts):
        raise SystemExit(f"the export has {len(wl.cohorts)} cohorts; asked for {rounds} rounds")
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "num_gpus": 0},  # unused: Ray is started below
    }
    load_before = os.getloadavg()
    # Ray is started here, as Flower's Ray backend would (it skips ray.init when Ray is
    # already up), so that its start is timed apart from Flower's own startup.
    import ray

    pythonpath = os.pathsep.join([*sys.path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ["PYTHONPATH"] = pythonpath
    env_vars = {"PYTHONPATH": pythonpath}
    if allocator == "tuned":  # the actors' environment at their start (what glibc reads)
        env_vars.update(ALLOCATOR_ENV)
    driver_allocator_ok = allocator_env_ok(allocator)
    t_ray = time.perf_counter()
    ray.init(
        num_cpus=cpus,
        num_gpus=0,
        include_dashboard=False,
        runtime_env={"env_vars": env_vars},
    )
    ray_init_seconds = time.perf_counter() - t_ray
    t_launch = time.perf_counter()
    run_simulation(
        server_app=mod._make_server_app(export, rounds, t_launch, grad_sample_mode, allocator),
        client_app=mod._make_client_app(),
        num_supernodes=meta["num_clients"],
        backend_config=backend_config,
    )
    t_end = time.perf_counter()
    res = dict(mod.RESULT)
    if not res or len(res["round_seconds"]) != rounds:
        raise SystemExit("the ServerApp did not finish; see the log above")
    load_after = os.getloadavg()
    secs = res["round_seconds"]
    timed = secs[1:] if len(secs) > 1 else secs
    per_round = statistics.median(timed)
    cpr = statistics.median(res["round_clients"][1:] or res["round_clients"])
    # From the last round's end to run_simulation's return, less the final evaluation.
    res["startup"]["shutdown_seconds"] = (
        t_end - res.pop("t_rounds_done") - res["evaluation_seconds"]
    )
    res["startup"]["ray_init_seconds"] = ray_init_seconds
    if ray.is_initialized():
        ray.shutdown()
    checks = res["allocator_checks"]
    return {
        "runner": RUNNERS[grad_sample_mode],
        "workload": meta["workload"],
        "export": export,
        "rounds": rounds,
        "cohorts": "exact (raydpfl's cohorts, by partition-id)",
        "model": meta.get("model", "fedavg_cnn"),
        "num_params": meta.get("num_params"),
        "num_supernodes": meta["num_clients"],
        "client_loader": "Opacus DPDataLoader, Poisson rate q (q = 1: every record, full batch)",
        "thread_layout": f"Flower Ray backend: {cpus} CPUs, ClientApp 1 CPU x 1 torch thread "
        f"({cpus} concurrent clients); ServerApp in the driver",
        "hyperparameters": {
            k: meta[k]
            for k in ("local_steps", "lr", "sampling_rate", "clip_norm", "noise_multiplier")
        },
        "figures": {
            "seconds_per_round": per_round,
            "seconds_per_round_min": min(timed),
            "seconds_per_round_max": max(timed),
            "client_steps_per_second": cpr * meta["local_steps"] / per_round,
            "samples_per_second": statistics.median(
                s / t for s, t in zip(res["round_samples"][1:], timed, strict=False)
            )
            if len(secs) > 1
            else res["round_samples"][0] / secs[0],
            "test_accuracy": res["test_accuracy"],
            "total_wall_seconds": t_end - t_ray,
            "rounds_wall_seconds": sum(secs),
            **res["startup"],
            "evaluation_seconds": res["evaluation_seconds"],
        },
        "memory": {
            "driver_max_rss_mib": _max_rss_kib() / 1024,
            "client_actor_max_rss_mib": res["actor_max_rss_mib"],
            "note": "peak RSS (ru_maxrss): the driver holds Flower's in-memory SuperLink, "
            "the ServerApp and one copy of the export; each of the --cpus ClientApp actors "
            "holds one copy of the export",
        },
        "grad_sample_mode": grad_sample_mode,
        "allocator": {
            "mode": allocator,
            "env": dict(ALLOCATOR_ENV) if allocator == "tuned" else {},
            "driver_env_ok": driver_allocator_ok,
            "actor_env_ok": bool(checks) and all(checks),
            "clients_checked": len(checks),
            "note": "ok: the process started with the MALLOC_* variables (tuned) or "
            "without them (default); checked in the driver and in every client's actor",
        },
        "round_seconds": secs,
        "round_seconds_server": res["round_seconds_server"],
        "round_clients": res["round_clients"],
        "round_samples": res["round_samples"],
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "machine": _machine(),
        "versions": _versions(),
    }


def result_stem(runner: str) -> str:
    """The results file's stem for a runner: "flower_opacus_ghost" -> "flower_opacus-ghost"."""
    return runner.replace("_ghost", "-ghost")


def write_result(out: dict[str, Any], out_dir: Path) -> Path:
    """Stamps `out` with the UTC time and writes it as the run's one JSON file,
    `<runner stem>-<workload>-<UTC>.json` in `out_dir`; returns its path."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out["utc"] = stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result_stem(out['runner'])}-{out['workload']}-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def add_peer_options(parser: argparse.ArgumentParser, allocator_help: str) -> None:
    """The options both peers take: the export, --rounds, --out-dir, --grad-sample-mode
    and --allocator (`allocator_help` says which processes get the settings)."""
    parser.add_argument("export", help="the .npz written by export_workload.py")
    parser.add_argument("--rounds", type=int, default=None, help="default: the workload's")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--grad-sample-mode",
        choices=GRAD_SAMPLE_MODES,
        default="hooks",
        help="Opacus make_private's grad_sample_mode: hooks (per-sample gradients) or "
        "ghost (fast gradient / ghost clipping)",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATOR_MODES,
        default="tuned",
        help=f"tuned: {allocator_help} raydpfl's glibc malloc thresholds "
        f"({', '.join(f'{k}={v}' for k, v in ALLOCATOR_ENV.items())}); default: glibc's",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_peer_options(parser, "every process gets")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs given to Flower's Ray")
    args = parser.parse_args()
    reexec_for_allocator(args.allocator)  # returns only once the environment is right
    logging.getLogger("flwr").setLevel(logging.WARNING)

    out = run(
        str(Path(args.export).resolve()),
        args.rounds,
        args.cpus,
        args.grad_sample_mode,
        args.allocator,
    )
    path = write_result(out, args.out_dir)

    fig = out["figures"]
    alloc = out["allocator"]
    print()
    print(f"Flower+Opacus on {out['workload']}: {out['rounds']} rounds, {out['thread_layout']}")
    print(
        f"  grad_sample_mode {out['grad_sample_mode']}; allocator {alloc['mode']} "
        f"(driver ok: {alloc['driver_env_ok']}, actors ok: {alloc['actor_env_ok']})"
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
        ("ray.init (s)", f"{fig['ray_init_seconds']:.2f}"),
        ("launch -> ServerApp (s)", f"{fig['launch_to_serverapp_seconds']:.2f}"),
        ("node query + actor start (s)", f"{fig['node_query_seconds']:.2f}"),
        ("run_simulation -> round 1 (s)", f"{fig['launch_to_round1_seconds']:.2f}"),
        ("shutdown (s)", f"{fig['shutdown_seconds']:.2f}"),
        ("total wall (s)", f"{fig['total_wall_seconds']:.2f}"),
        ("test accuracy", f"{fig['test_accuracy']:.4f}"),
        (
            "peak RSS driver / actor (MiB)",
            f"{out['memory']['driver_max_rss_mib']:.0f} / "
            f"{out['memory']['client_actor_max_rss_mib']:.0f}",
        ),
        (
            "load avg before / after",
            " / ".join(f"{out[k][0]:.2f}" for k in ("load_average_before", "load_average_after")),
        ),
    ]
    for k, v in rows:
        print(f"  {k:<32} {v}")
    v = out["versions"]
    print(f"  flwr {v['flwr']}, opacus {v['opacus']}, torch {v['torch']}, ray {v['ray']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
