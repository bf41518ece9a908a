"""Running an experiment on Ray: the driver starts things and streams progress; a
server actor runs the rounds.

    driver ──ray.put(dataset)──► object store (once; zero-copy numpy on each node)
       │
       └──► ServerHost actor (pinned to the driver's node, so the run directory is local)
               ├─ Server: round loop, ledger, aggregation, evaluation, outputs
               └─ RayBackend ──► ClientWorker actors (CPU / fractional GPU each)

Ray is started only if it is not running yet, and shut down only if we started it,
so a run inside a Tune trial or an existing session leaves Ray alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydpfl.backends.allocator import tune_allocator
from raydpfl.backends.ray.backend import RayBackend
from raydpfl.backends.ray.reaper import RELEASE, descendants, start_reaper
from raydpfl.backends.ray.runtime_env import CodeMismatchError, check_same_code, runtime_env_for
from raydpfl.config.schema import ConfigError, RuntimeConfig
from raydpfl.privacy.mechanisms.kernel import PrivacyContractError
from raydpfl.registry.plugin_files import plugin_files
from raydpfl.simulation.backend import ServerLostError, ServerStartError
from raydpfl.simulation.experiment import Experiment, make_server
from raydpfl.simulation.integrity import ResumeError, has_checkpoint
from raydpfl.simulation.outputs import RunWriter

log = logging.getLogger(__name__)


class ServerHost:
    """The server actor: owns the `Server` and the worker pool for one run.

    A failure while starting (a resume refused: a broken or deleted charge log, a
    checkpoint that disagrees with it, unreadable weights; a privacy contract broken) is
    kept and raised by the first call, `next_round`, instead of by the constructor: an
    exception in an actor's constructor reaches the driver as the actor's *death*, which
    the driver would retry `max_restarts` times and then report as a crash. Raised by a
    method, it arrives as itself (`_unwrap`), so the CLI says it in one line, exit 2,
    as the local backend does.
    """

    def __init__(
        self, exp: Experiment, dataset_box: list[Any], run_dir: str | None, resume: bool = False
    ) -> None:
        self.backend: RayBackend | None = None
        self.server: Any = None
        self.refusal: BaseException | None = None
        try:
            self._start(exp, dataset_box, run_dir, resume)
        except ray.exceptions.RayError:
            raise  # Ray's own (an object lost with its node): a death, retried as one
        except Exception as e:  # raised by next_round (see the class docstring)
            self.refusal = e
            if self.backend is not None:
                self.backend.close()
                self.backend = None

    def _start(
        self, exp: Experiment, dataset_box: list[Any], run_dir: str | None, resume: bool
    ) -> None:
        check_same_code()  # this actor runs the driver's raydpfl (`runtime_env`)
        rt = exp.config.runtime
        # Aggregation and the algorithm's server step run here while the workers wait
        # (evaluation runs on the workers, `RayBackend.evaluate_central`): the node's cores.
        torch.set_num_threads(rt.threads or len(os.sched_getaffinity(0)))
        tune_allocator()
        dataset_ref = dataset_box[0]  # boxed so it arrives as a reference, not a copy
        exp = dataclasses.replace(exp, dataset=ray.get(dataset_ref))
        self.backend = RayBackend(
            (
                exp.algorithm,
                exp.model_spec,
                [dataset_ref],
                rt.seed,
                rt.device,
                rt.engine,
                rt.vectorise_clients,
            ),
            exp.dataset.train_sizes(),
            num_workers=rt.workers,
            cpus_per_worker=rt.cpus_per_worker,
            gpus_per_worker=rt.gpus_per_worker,
            max_restarts=rt.max_restarts,
            round_timeout_s=rt.round_timeout_s,
        )
        writer = RunWriter(Path(run_dir)) if run_dir is not None else None
        self.server = make_server(exp, writer, resume=resume)
        self.server.checkpoint_start()  # nothing is lost if this actor dies in round 1

    def next_round(self) -> int:
        """The index of the first round to run (> 0 after a resume); raises what stopped
        the constructor, if anything did."""
        if self.refusal is not None:
            raise self.refusal
        return self.server.rounds_completed

    def run_round(self, round_idx: int) -> dict[str, Any] | None:
        """Runs one round; returns its row, or None when the run must stop."""
        if not self.server.run_round(self.backend, round_idx):
            return None
        return self.server.rows[-1]

    def finish(self) -> dict[str, Any]:
        """Closes the outputs and returns the summary."""
        return self.server.finish()

    def placements(self) -> list[dict[str, Any]]:
        """Where each worker runs."""
        return self.backend.placements()

    def worker_handles(self) -> list[Any]:
        """The worker actors (for fault-injection tests)."""
        return list(self.backend.workers)

    def close(self) -> None:
        """Stops the workers and finalises the outputs written so far."""
        if self.server is not None:
            self.server.close_outputs()
        self.close_workers()

    def close_workers(self) -> None:
        """Stops the workers."""
        if self.backend is not None:
            self.backend.close()


RemoteServerHost = ray.remote(ServerHost)


def connect(address: str | None) -> bool:
    """Starts or joins Ray unless it is already initialised; True if we started it.

    The dashboard stays off (it would listen on the network); Ray's own token
    authentication (on by default since Ray 2.52) is left on. A locally started instance
    listens on 127.0.0.1 only (`loopback.loopback_only`: Ray 2.60 binds its gRPC servers
    to the node address, which it would otherwise set to the host's reachable one), and
    is watched by `reaper`: a driver killed outright leaves no Ray process. The job's
    runtime environment is `runtime_env.runtime_env_for` the loaded plug-in files: the
    actors run the driver's raydpfl code and import its plug-ins from any path.
    """
    if ray.is_initialized():
        return False
    # The actors run the driver's raydpfl and can import its plug-in files (`runtime_env`).
    env = runtime_env_for([f for f in plugin_files() if f.is_file()])
    # ray.init puts a C++ SIGTERM handler in place of Python's, which aborts the process
    # (printing a stack) instead of letting the CLI stop in order (exit 143, the resume
    # command): a Python handler installed before is put back afterwards.
    sigterm = signal.getsignal(signal.SIGTERM)
    token = ray_token_path()
    token_existed, folder_existed = token.exists(), token.parent.exists()
    if address in (None, "local"):
        from raydpfl.backends.ray.loopback import LOOPBACK, loopback_only

        # address="local" starts a fresh instance even when RAY_ADDRESS points elsewhere.
        with loopback_only():
            ray.init(
                address="local",
                include_dashboard=False,
                logging_level="WARNING",
                _node_ip_address=LOOPBACK,
                runtime_env=env,
            )
        # If this process is killed outright, end the Ray processes it started (Ray 2.60
        # leaves its agents behind otherwise).
        global _reaper
        _reaper = start_reaper(os.getpid(), descendants(os.getpid()))
    else:
        ray.init(address=address, logging_level="WARNING", runtime_env=env)
    if callable(sigterm) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm)
    if not token_existed:
        make_private(token, folder=None if folder_existed else token.parent)
    return True


def ray_token_path() -> Path:
    """Where Ray 2.60 keeps the token of its token authentication (``~/.ray/auth_token``)."""
    return Path.home() / ".ray" / "auth_token"


def make_private(token: Path, folder: Path | None) -> None:
    """Owner-only permissions for an authentication token that our `ray.init` created
    (Ray writes it with the process umask: world-readable under the usual 022), and for
    its folder when that was created too. Anyone who reads the token can submit jobs to
    the cluster. Someone else's files, or ones that existed before, are left alone."""
    for path, mode in ((token, 0o600), (folder, 0o700)):
        if path is None:
            continue
        try:
            st = path.stat()
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                path.chmod(mode)
        except OSError:
            pass


#: The watcher of the Ray instance `connect` started (see `reaper`), if any.
_reaper: Any = None


def disconnect() -> None:
    """Shuts down the Ray instance `connect` started, and its watcher."""
    global _reaper
    ray.shutdown()
    if _reaper is not None:
        # Not terminated: told to end, after its grace, whatever of Ray's processes the
        # shutdown left (none, unless the GCS or a raylet was killed), then to exit.
        with contextlib.suppress(ProcessLookupError):
            _reaper.send_signal(RELEASE)
        _released.append(_reaper)
        _released[:] = [p for p in _released if p.poll() is None]  # reap the finished
        _reaper = None


#: Watchers told to end (`disconnect`), kept until they have exited.
_released: list[Any] = []


def check_resources(rt: RuntimeConfig) -> None:
    """Fails fast when the cluster cannot fit the worker pool (actors would wait forever)."""
    have = ray.cluster_resources()
    cpus, gpus = rt.workers * rt.cpus_per_worker, rt.workers * rt.gpus_per_worker
    if cpus > have.get("CPU", 0) + 1e-9:
        raise ConfigError(
            "runtime.cpus_per_worker",
            f"{rt.workers} workers x {rt.cpus_per_worker} CPUs = {cpus:g} CPUs, but the Ray "
            f"cluster has {have.get('CPU', 0):g}; lower runtime.workers or cpus_per_worker",
        )
    if gpus > have.get("GPU", 0) + 1e-9:
        raise ConfigError(
            "runtime.gpus_per_worker",
            f"{rt.workers} workers x {rt.gpus_per_worker} GPUs = {gpus:g} GPUs, but the Ray "
            f"cluster has {have.get('GPU', 0):g}",
        )


def start_server(exp: Experiment, run_dir: Path | None, resume: bool = False) -> tuple[Any, Any]:
    """Puts the dataset in the object store and starts the server actor.

    Returns:
        The server actor handle and the dataset reference (keep it alive for the run).
    """
    rt = exp.config.runtime
    check_resources(rt)
    dataset_ref = ray.put(exp.dataset)
    options: dict[str, Any] = {"num_cpus": 0}
    if not (rt.address or "").startswith("ray://"):
        # Pin the server to the driver's node so the run directory is written here.
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
    host = RemoteServerHost.options(**options).remote(
        dataclasses.replace(exp, dataset=None),
        [dataset_ref],
        str(run_dir.resolve()) if run_dir is not None else None,
        resume,
    )
    return host, dataset_ref


def run_on_ray(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None = None,
    resume: bool = False,
    server_in_process: bool = False,
) -> dict[str, Any]:
    """Runs `exp` on Ray; same results as the local backend for the same seed.

    If the server actor dies (its process killed, its node lost), the driver starts a new
    one that resumes from the run's last checkpoint, up to ``runtime.max_restarts`` times:
    the replayed rounds are the same computation and are checked against the charges
    logged before the death, so the run ends as an uninterrupted one would.

    With `server_in_process`, the server runs in this process instead of an actor (a
    Tune trial: an actor pinned to a node would leave the trial's placement group, and
    the workers a task starts are captured by its group; the trial is Tune's to restart).
    """
    if server_in_process:
        return _serve_in_process(exp, run_dir, on_round, resume)
    rt = exp.config.runtime
    started = connect(rt.address)
    try:
        restarts = 0
        while True:
            try:
                return _drive_server(exp, run_dir, on_round, resume)
            except ray.exceptions.RayActorError as e:
                if getattr(e, "actor_init_failed", False):
                    # Its constructor could not even run (its arguments could not be
                    # unpickled: a module missing on the node): the same every time.
                    raise ServerStartError(_start_failure(e)) from None
                if run_dir is None or not has_checkpoint(run_dir):
                    raise ServerLostError(
                        f"the server actor died ({type(e).__name__}) and the run has no "
                        "checkpoint to continue from (runtime.checkpoint_every is null, or no "
                        "run directory)"
                    ) from None
                if restarts >= rt.max_restarts:
                    raise ServerLostError(
                        f"the server actor died {restarts + 1} times "
                        f"(runtime.max_restarts={rt.max_restarts})"
                    ) from None
                restarts += 1
                resume = True
                log.warning(
                    "raydpfl: the server actor died (%s); restarting it from the last "
                    "checkpoint (%d of %d restarts)",
                    type(e).__name__,
                    restarts,
                    rt.max_restarts,
                )
    finally:
        if started:
            disconnect()


def _serve_in_process(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None,
    resume: bool,
) -> dict[str, Any]:
    """The server in this process (Ray already running), its workers as Ray actors."""
    host = ServerHost(exp, [ray.put(exp.dataset)], str(run_dir) if run_dir else None, resume)
    if host.refusal is not None:
        raise host.refusal
    host.server.on_round = on_round
    try:
        return host.server.run(host.backend)
    finally:
        host.close_workers()


def _drive_server(
    exp: Experiment,
    run_dir: Path | None,
    on_round: Callable[[Mapping[str, Any]], None] | None,
    resume: bool,
) -> dict[str, Any]:
    """Starts a server actor and drives its rounds to the summary."""
    host, _dataset_ref = start_server(exp, run_dir, resume)
    try:
        first = _unwrap(lambda: ray.get(host.next_round.remote()))
        for round_idx in range(first, exp.config.experiment.algorithm.rounds):
            row = _unwrap(lambda r=round_idx: ray.get(host.run_round.remote(r)))
            if row is None:
                break
            if on_round is not None:
                on_round(row)
        return _unwrap(lambda: ray.get(host.finish.remote()))
    finally:
        try:
            ray.get(host.close.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            pass  # it died: nothing left to close (its workers died with it)
        finally:
            ray.kill(host, no_restart=True)


def _start_failure(e: BaseException) -> str:
    """One line for a server actor that could not be created: the exception its creation
    task raised (the last ``Name: message`` line of the remote traceback), and the
    plug-in files shipped to it."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    named = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", ln)]
    cause = named[-1] if named else (lines[-1] if lines else type(e).__name__)
    files = [Path(f).name for f in plugin_files()]
    shipped = (
        f"plug-in files shipped to the actors: {', '.join(files)}"
        if files
        else ("no plug-in file was shipped to the actors")
    )
    hint = ""
    if cause.startswith("ModuleNotFoundError"):
        hint = (
            "; a module named in the experiment (a --plugin, or one it imports) must be "
            "importable on every Ray node"
        )
    return f"the Ray server actor could not start: {cause} ({shipped}{hint})"


def _unwrap(call: Callable[[], Any]) -> Any:
    """Re-raises an error from inside an actor as its own type (not RayTaskError); a
    refusal whose message is its whole story (a broken privacy contract, a resume
    refused) as the original exception, without the remote traceback in its text."""
    try:
        return call()
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, (PrivacyContractError, ResumeError, CodeMismatchError)):
            raise e.cause from None
        raise e.as_instanceof_cause() from None
