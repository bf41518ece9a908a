"""`raydpfl` command line: run, validate, audit, tune, privacy, data, report.

Bad input (config, arguments, missing dataset files) exits with status 2 and one line
on stderr, before any training starts; nothing already on disk is overwritten.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from raydpfl.cli.progress import Progress
from raydpfl.cli.ray_logs import quiet_ray
from raydpfl.config import as_config_error
from raydpfl.config.schema import ConfigError
from raydpfl.simulation.backend import RoundTimeoutError, ServerLostError, WorkerLostError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _user_errors() -> tuple[type[BaseException], ...]:
    from raydpfl.backends.ray.runtime_env import CodeMismatchError
    from raydpfl.data.datasets import DatasetNotFoundError, DownloadError
    from raydpfl.privacy.mechanisms.kernel import PrivacyContractError
    from raydpfl.simulation.backend import ServerStartError
    from raydpfl.simulation.finite import NonFiniteModelError
    from raydpfl.simulation.integrity import ResumeError
    from raydpfl.simulation.run_lock import RunDirBusyError

    return (
        CodeMismatchError,
        ConfigError,
        DatasetNotFoundError,
        DownloadError,
        FileExistsError,
        NonFiniteModelError,
        PrivacyContractError,
        ResumeError,
        RunDirBusyError,
        ServerStartError,
    )


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interruption so that outputs are closed the same way."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `raydpfl` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    quiet_ray()  # before any command imports Ray
    previous = _install_sigterm()
    try:
        return int(args.handler(args) or 0)
    except _user_errors() as e:
        print(f"raydpfl: error: {_one_line(e)}", file=sys.stderr)
        _log_refusal(args, e)
        return EXIT_USAGE
    except (RoundTimeoutError, WorkerLostError, ServerLostError) as e:
        log = _log_failure(args, e)
        where = f" (details in {log})" if log is not None else ""
        print(f"raydpfl: run failed: {_short_line(e)}{where}", file=sys.stderr)
        print(f"raydpfl: {_how_to_resume(args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # A sweep stopped at once says which signal stopped it (`signum`).
        terminated = isinstance(e, _Terminated) or getattr(e, "signum", None) == signal.SIGTERM
        return _interrupted(args, "SIGTERM" if terminated else "SIGINT")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupted(args: argparse.Namespace, signal_name: str) -> int:
    """Says what was kept and how to continue; 143 after SIGTERM, 130 after Ctrl-C."""
    what = "terminated" if signal_name == "SIGTERM" else "interrupted"
    print(f"raydpfl: {what}; {_how_to_resume(args)}", file=sys.stderr)
    return 143 if signal_name == "SIGTERM" else 130


def _install_sigterm() -> Any:
    """Handles SIGTERM like Ctrl-C (main thread only); returns the previous handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _on_sigterm)


def _how_to_resume(args: argparse.Namespace) -> str:
    """What was kept and the exact command that continues the run."""
    sweep_dir = getattr(args, "sweep_dir", None)
    if sweep_dir is not None:
        if not (Path(sweep_dir) / "sweep_state.json").is_file():
            return "nothing was started"  # stopped in the pre-flight, before its directory
        return f"continue the sweep with: raydpfl tune --resume {shlex.quote(str(sweep_dir))}"
    run_dir = getattr(args, "run_dir", None)
    if run_dir is None:
        return "nothing was started"
    from raydpfl.simulation.integrity import has_checkpoint

    if has_checkpoint(run_dir):
        return (
            f"finished rounds are kept in {run_dir}; continue with: "
            f"raydpfl run --resume {shlex.quote(str(run_dir))}"
        )
    return (
        f"finished rounds are kept in {run_dir}, but it has no checkpoint to resume from "
        "(runtime.checkpoint_every is null)"
    )


#: Terminal colour codes (Ray colours the remote tracebacks it embeds in its errors).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: The longest failure line printed; the whole text goes to the run's error.log.
SHORT_LINE = 240
#: A failed run's full error text, appended in its run (or sweep) directory.
ERROR_LOG = "error.log"


def _one_line(e: BaseException) -> str:
    # An error raised inside a Ray actor arrives as RayTaskError's copy of it, whose text
    # is the whole remote traceback: the message is the original exception's.
    text = _ANSI.sub("", str(_unwrapped(e))).strip() or type(e).__name__
    return " ".join(text.split())


def _unwrapped(e: BaseException) -> BaseException:
    while _ray_wrapped(e):
        e = e.cause  # type: ignore[attr-defined]
    return e


def _short_line(e: BaseException) -> str:
    """The error's first line, without colour codes, cut at `SHORT_LINE` characters: a
    lost worker's message embeds Ray's whole remote traceback."""
    text = _ANSI.sub("", str(_unwrapped(e))).strip()
    first = " ".join(text.splitlines()[0].split()) if text else type(e).__name__
    if len(first) > SHORT_LINE:
        first = first[: SHORT_LINE - 3].rstrip() + "..."
    return first


def _log_failure(args: argparse.Namespace, e: BaseException) -> Path | None:
    """Appends the failure's whole text and traceback (colour codes removed) to the run's
    (or sweep's) error.log; returns its path, or None when there is no such directory."""
    import traceback

    folder = getattr(args, "sweep_dir", None) or getattr(args, "run_dir", None)
    if folder is None or not Path(folder).is_dir():
        return None
    path = Path(folder) / ERROR_LOG
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = "".join(traceback.format_exception(e))
    cause = _unwrapped(e)
    if cause is not e:
        text += "".join(traceback.format_exception(cause))
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"---- {stamp} {' '.join(sys.argv)}\n{_ANSI.sub('', text)}\n")
    except OSError:
        return None
    return path


def _log_refusal(args: argparse.Namespace, e: BaseException) -> None:
    """A refused resume, or a server that could not start, is also written to the run
    directory's error.log (a run directory: it has a config.yaml; never another folder)."""
    from raydpfl.simulation.backend import ServerStartError
    from raydpfl.simulation.integrity import ResumeError

    run_dir = getattr(args, "run_dir", None)
    refusal = isinstance(_unwrapped(e), (ResumeError, ServerStartError))
    if refusal and run_dir is not None and (Path(run_dir) / "config.yaml").is_file():
        _log_failure(args, e)


def _ray_wrapped(e: BaseException) -> bool:
    cause = getattr(e, "cause", None)
    names = {c.__name__ for c in type(e).__mro__}
    return isinstance(cause, BaseException) and cause is not e and "RayTaskError" in names


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raydpfl", description="Differentially-private federated learning simulator.")
    # The parent package is always imported before its cli; reading its __version__ from
    # sys.modules adds no upward import (tests/test_architecture.py).
    version = sys.modules["raydpfl"].__version__
    p.add_argument("--version", action="version", version=f"raydpfl {version}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    # One helper per subcommand, in the order `raydpfl --help` lists them.
    _add_run_command(sub)
    _add_validate_command(sub)
    _add_audit_command(sub)
    _add_privacy_command(sub)
    _add_data_command(sub)
    _add_tune_command(sub)
    _add_report_command(sub)
    return p


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl run`: one simulation from a config, or a resumed one."""
    run = sub.add_parser("run", help="run a simulation from a YAML config")
    run.add_argument("config", nargs="?", help="path to the YAML config")
    _add_set(run)
    _add_plugin(run)
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted run from its last checkpoint, with its own config.yaml "
        "(a CONFIG given too must equal it); --set may change only runtime.backend, address, "
        "workers, round_timeout_s, max_restarts, output, checkpoint_every, progress, "
        "callbacks",
    )
    run.add_argument(
        "--out",
        help="run directory (must not exist or be empty); "
        "default runtime.output/<name>-<utc time>",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(handler=_cmd_run)


def _add_validate_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl validate`: check a config and print it resolved."""
    val = sub.add_parser("validate", help="check a config and print it resolved")
    val.add_argument("config")
    _add_set(val)
    _add_plugin(val)
    val.add_argument(
        "--no-data",
        dest="no_data",
        action="store_true",
        help="do not open the data (a config meant for another machine): skips the "
        "dataset's files and contents, the partition, the model and the algorithm, which "
        "are checked by default as run checks them before training",
    )
    val.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="print every section, also the options blocks of algorithms the config does "
        "not use (by default they are left out when they hold only defaults)",
    )
    val.set_defaults(handler=_cmd_validate)


def _add_audit_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl audit`: one run with canaries and its empirical epsilon bound."""
    aud = sub.add_parser(
        "audit",
        help="run once with canaries: the empirical epsilon lower bound beside the "
        "accountant's epsilon (Steinke, Nasr & Jagielski 2023)",
    )
    aud.add_argument(
        "config",
        help="a config of dp_fedavg_client (client level), dp_fedavg or an algorithm of the "
        "shared DP-SGD loop such as ali_dpfl, fedfdp, rc_dpfl (record level)",
    )
    _add_set(aud)
    _add_plugin(aud)
    aud.add_argument("--canaries", type=int, default=1000, help="m (default 1000)")
    aud.add_argument("--mode", default="white-box", help="white-box (default) or black-box")
    aud.add_argument("--confidence", type=float, default=0.95, help="in (0, 1); default 0.95")
    aud.add_argument(
        "--k-plus",
        dest="k_plus",
        type=int,
        default=None,
        help="guesses 'in' (highest scores); default m/10",
    )
    aud.add_argument(
        "--k-minus",
        dest="k_minus",
        type=int,
        default=None,
        help="guesses 'out' (lowest scores); default m/10",
    )
    aud.add_argument("--score", default="lr", help="white-box scoring: lr (default) or sum")
    aud.add_argument("--out", help="keep the audited run and audit.json in this directory")
    aud.set_defaults(handler=_cmd_audit)


def _add_privacy_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl privacy QUESTION`: the record- and client-level calculators."""
    priv = sub.add_parser(
        "privacy",
        help="privacy calculator: DP-SGD (record level) and DP-FedAvg (client-* questions)",
    )
    psub = priv.add_subparsers(dest="question", required=True, parser_class=_Parser)
    _add_record_level_questions(psub)
    _add_client_level_questions(psub)


def _add_record_level_questions(psub: argparse._SubParsersAction) -> None:
    """DP-SGD questions: epsilon, noise, steps."""
    eps = psub.add_parser("epsilon", help="epsilon spent by `steps` steps of (sigma, q)")
    _add_privacy_args(eps, sigma=True, steps=True)
    eps.set_defaults(handler=_cmd_privacy_epsilon)
    noise = psub.add_parser("noise", help="smallest sigma that keeps `steps` steps within epsilon")
    _add_privacy_args(noise, epsilon=True, steps=True)
    noise.set_defaults(handler=_cmd_privacy_noise)
    steps = psub.add_parser("steps", help="most steps of (sigma, q) within epsilon")
    _add_privacy_args(steps, epsilon=True, sigma=True)
    steps.add_argument(
        "--mode",
        choices=("exact", "paper_compat"),
        default="exact",
        help="exact: largest count within epsilon under --accountant (default); "
        "paper_compat: ALI-DPFL's Algorithm 3 as its authors coded it (classic RDP "
        "conversion, integer orders, bisection to 0.01: may exceed epsilon by <= 0.01)",
    )
    steps.set_defaults(handler=_cmd_privacy_steps)


def _add_client_level_questions(psub: argparse._SubParsersAction) -> None:
    """DP-FedAvg questions: client-epsilon, client-noise, client-rounds."""
    # Client-level DP-FedAvg (the unit is one client; README "Client-level DP (DP-FedAvg)").
    c_eps = psub.add_parser(
        "client-epsilon", help="client-level epsilon of `rounds` DP-FedAvg rounds at sigma"
    )
    _add_client_level_args(c_eps, sigma=True, rounds=True)
    c_eps.set_defaults(handler=_cmd_privacy_client_epsilon)
    c_noise = psub.add_parser(
        "client-noise", help="smallest sigma keeping `rounds` DP-FedAvg rounds within epsilon"
    )
    _add_client_level_args(c_noise, epsilon=True, rounds=True)
    c_noise.set_defaults(handler=_cmd_privacy_client_noise)
    c_rounds = psub.add_parser(
        "client-rounds", help="most DP-FedAvg rounds at sigma within a client-level epsilon"
    )
    _add_client_level_args(c_rounds, epsilon=True, sigma=True)
    c_rounds.set_defaults(handler=_cmd_privacy_client_rounds)


def _add_data_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl data download|stats`."""
    data = sub.add_parser("data", help="datasets: download files, partition statistics")
    dsub = data.add_subparsers(dest="action", required=True, parser_class=_Parser)
    dl = dsub.add_parser("download", help="download a dataset and verify its checksums")
    dl.add_argument("name", help="mnist, fashion_mnist, cifar10, cifar100 or digits")
    dl.add_argument(
        "--root", help="target folder (default $RAYDPFL_DATA or ~/.cache/raydpfl/data)"
    )
    dl.set_defaults(handler=_cmd_data_download)
    st = dsub.add_parser("stats", help="partition statistics of a config's federated dataset")
    st.add_argument("config")
    _add_set(st)
    st.set_defaults(handler=_cmd_data_stats)


def _add_tune_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl tune`: a Ray Tune sweep."""
    tun = sub.add_parser(
        "tune",
        help="hyperparameter sweep with Ray Tune (a config with a tune: section)",
        description="Runs one simulation per trial of the tune: section's search space "
        "(see configs/sweeps/). Writes SWEEP_DIR/results.parquet, best_config.yaml and "
        "sweep_summary.json (with the privacy cost of picking the best trial).",
    )
    tun.add_argument("config", nargs="?", help="path to the sweep file")
    _add_set(tun)
    _add_plugin(tun)
    tun.add_argument("--out", help="sweep directory (default runtime.output/<name>-sweep-<time>)")
    tun.add_argument(
        "--resume",
        metavar="SWEEP_DIR",
        help="continue an interrupted sweep (from raydpfl's own JSON state; Ray Tune's "
        "pickled state is never loaded); its plug-ins are imported again",
    )
    tun.add_argument("--quiet", action="store_true", help="no progress line")
    tun.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="Ray Tune's own status tables and trial errors instead of the progress line "
        "(-vv: more detail)",
    )
    tun.set_defaults(handler=_cmd_tune)


def _add_report_command(sub: argparse._SubParsersAction) -> None:
    """`raydpfl report`: figures and report.md of runs or sweeps."""
    rep = sub.add_parser(
        "report", help="figures and a Markdown summary of run or sweep directories"
    )
    rep.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directory written by `raydpfl run`, or a sweep directory holding run "
        "directories",
    )
    rep.add_argument(
        "--out",
        help="output directory (new, empty or an earlier report's); "
        "default RUN_DIR/report for one directory, required for several",
    )
    rep.set_defaults(handler=_cmd_report)


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set privacy.epsilon=2 (repeatable)",
    )


def _add_plugin(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a module (my_pkg.algos) or a .py file first, so that the algorithms, "
        "models and datasets it registers can be named in the config (repeatable; "
        "installed packages register through entry points without it)",
    )


def _import_plugins(plugins: Sequence[str]) -> None:
    """Imports each plugin module or file (their `raydpfl.register_*` calls run); any
    failure of one, even ``sys.exit``, is one line naming it (`PluginImportError`)."""
    from raydpfl.registry.plugin_files import PluginImportError, import_plugin

    for plugin in plugins:
        try:
            import_plugin(plugin)
        except PluginImportError as e:
            raise ConfigError("--plugin", str(e)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _sigma(text: str) -> float:
    from raydpfl.config.schema import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER

    value = _positive_float(text)
    if not MIN_NOISE_MULTIPLIER <= value <= MAX_NOISE_MULTIPLIER:
        raise argparse.ArgumentTypeError(
            f"must be in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}] "
            f"(as privacy.noise_multiplier), got {text}"
        )
    return value


def _rate(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _delta(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_sigma(p: argparse.ArgumentParser, help_text: str) -> None:
    """The required noise multiplier, --sigma or --noise-multiplier (record or client level)."""
    p.add_argument(
        "--sigma", "--noise-multiplier", dest="sigma", type=_sigma, required=True, help=help_text
    )


def _add_privacy_args(
    p: argparse.ArgumentParser, *, epsilon: bool = False, sigma: bool = False, steps: bool = False
) -> None:
    from raydpfl.privacy.accounting.accountants import ACCOUNTANTS

    if epsilon:
        p.add_argument("--epsilon", type=_positive_float, required=True, help="target epsilon")
    if sigma:
        _add_sigma(p, "noise multiplier (noise std / clip norm)")
    p.add_argument(
        "--q", "--sampling-rate", dest="q", type=_rate, required=True, help="Poisson sampling rate"
    )
    if steps:
        p.add_argument("--steps", type=_nonneg_int, required=True, help="number of DP-SGD steps")
    p.add_argument("--delta", type=_delta, default=1e-5, help="target delta (default 1e-5)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp", help="default rdp (opacus)")


def _positive_int(text: str) -> int:
    value = _nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _add_client_level_args(
    p: argparse.ArgumentParser, *, epsilon: bool = False, sigma: bool = False, rounds: bool = False
) -> None:
    from raydpfl.privacy.accounting.accountants import ACCOUNTANTS

    if epsilon:
        p.add_argument(
            "--epsilon", type=_positive_float, required=True, help="client-level target epsilon"
        )
    if sigma:
        _add_sigma(p, "noise multiplier: the aggregate's noise std over the update clip norm S")
    p.add_argument(
        "--population", type=_positive_int, required=True, help="N, the number of clients"
    )
    p.add_argument(
        "--sampling",
        choices=("poisson", "fixed", "tree"),
        default="poisson",
        help="poisson: each client with rate --q (add/remove one client); fixed: --cohort "
        "clients without replacement (replace one client); tree: DP-FTRL, --cohort clients "
        "per round, each client once per epoch of N // K rounds (zero-out one client)",
    )
    p.add_argument("--q", type=_rate, help="client sampling rate (poisson)")
    p.add_argument("--cohort", type=_positive_int, help="K, the cohort size (fixed)")
    if rounds:
        p.add_argument("--rounds", type=_nonneg_int, required=True, help="number of rounds")
    p.add_argument("--delta", type=_delta, default=1e-5, help="target delta (default 1e-5)")
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default="rdp",
        help="default rdp; fixed sampling: rdp or dp_rdp (dp-accounting RDP, replace-one)",
    )


def _client_round(args: argparse.Namespace, sigma: float = 0.0):
    """One round's `ClientLevelCost` from the flags (a bad combination: one line)."""
    from raydpfl.privacy.accounting.client_level import (
        ClientLevelCost,
        check_client_level_accountant,
    )

    if args.delta >= 1.0 / args.population:  # as a client-level run refuses it
        raise ConfigError(
            "--delta",
            f"must be < 1/N = {1.0 / args.population:.3g} at the client level "
            f"({args.population} clients); got {args.delta:g}",
        )
    if args.sampling == "poisson":
        if args.q is None or args.cohort is not None:
            raise ConfigError("--q", "poisson sampling needs --q (and no --cohort)")
        cost = ClientLevelCost(sigma, "poisson", args.population, sampling_rate=args.q)
    else:
        if args.cohort is None or args.q is not None:
            raise ConfigError(
                "--cohort", f"{args.sampling} sampling needs --cohort K (and no --q)"
            )
        if args.cohort > args.population:
            raise ConfigError(
                "--cohort", f"K={args.cohort} is larger than the population {args.population}"
            )
        tree = args.population // args.cohort if args.sampling == "tree" else None
        cost = ClientLevelCost(
            sigma, args.sampling, args.population, cohort_size=args.cohort, tree_rounds=tree
        )
    with as_config_error("--accountant"):
        check_client_level_accountant(args.accountant, args.sampling)
    return cost


def _client_words(args: argparse.Namespace) -> str:
    how = f"q={args.q}" if args.sampling == "poisson" else f"K={args.cohort}"
    if args.sampling == "tree":
        how += f", epochs of {args.population // args.cohort} rounds"
    return (
        f"N={args.population}, {args.sampling} sampling {how}, delta={args.delta:g}, "
        f"accountant={args.accountant}, at the client level"
    )


# ---- handlers ---------------------------------------------------------------------------
def _load(args: argparse.Namespace):
    from raydpfl.config.load import load_config

    _import_plugins(getattr(args, "plugins", ()))
    return load_config(args.config, args.overrides)


def _unread_sections(args: argparse.Namespace) -> list[str]:
    """The option sections the config file (with its overrides) gives for algorithms other
    than the one it runs: validated, then left out of the resolved config."""
    from raydpfl.config.load import apply_override, read_yaml
    from raydpfl.config.schema import unread_sections

    raw = read_yaml(Path(args.config))
    for item in args.overrides:
        apply_override(raw, item)
    algorithm = (raw.get("experiment") or {}).get("algorithm") if isinstance(raw, dict) else None
    return [f"experiment.algorithm.{k}" for k in unread_sections(algorithm)]


def _cmd_validate(args: argparse.Namespace) -> int:
    from raydpfl.cli.config_view import render
    from raydpfl.experiment.build import NOT_CHECKED_BEFORE_LOADING, build_experiment, preflight

    config = _load(args)
    if args.no_data:
        # The checks that need no data; the dataset's files may be on another machine.
        preflight(config, dataset_given=True)
        checked = (
            "--no-data: the data was not opened; not checked: the dataset's files and "
            f"contents, {NOT_CHECKED_BEFORE_LOADING}"
        )
    else:
        # Everything `run` checks before training (no Ray): the pre-flight check, then
        # the data opened and partitioned as `data stats` does, the model and algorithm.
        exp = build_experiment(config)
        ds = exp.dataset
        checked = (
            f"its data was opened and partitioned as run does: {ds.num_clients} clients, "
            f"{int(ds.train_sizes().sum())} train records, {len(ds.y_test)} central test "
            "records; the model and the algorithm were built"
        )
    text, hidden = render(config, everything=args.everything)
    sys.stdout.write(text)
    if hidden:
        print(
            f"# not shown (unused by {config.experiment.algorithm.name}, all defaults; "
            f"--all prints them): {', '.join(hidden)}"
        )
    unread = _unread_sections(args)
    if unread:
        print(
            f"# checked, not read by {config.experiment.algorithm.name} (another "
            f"algorithm's options): {', '.join(unread)}"
        )
    print(f"# ok: {args.config} is valid ({checked})", file=sys.stderr)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from raydpfl.experiment.build import build_experiment, run_experiment
    from raydpfl.simulation.outputs import check_run_dir_free, prepare_run_dir
    from raydpfl.simulation.run_lock import run_dir_lock

    if args.resume:
        return _resume(args)
    if args.config is None:
        raise ConfigError("config", "give a config file, or --resume RUN_DIR")
    config = _load(args)
    unread = _unread_sections(args)
    if unread:  # a preset for one algorithm run as another: say what it leaves out
        print(
            f"raydpfl: note: checked, not read by {config.experiment.algorithm.name} "
            f"(another algorithm's options): {', '.join(unread)}",
            file=sys.stderr,
        )
    run_dir = (
        Path(args.out)
        if args.out
        else _default_run_dir(config.runtime.output, config.experiment.name)
    )
    check_run_dir_free(run_dir)  # before loading any data; checked again on creation
    exp = build_experiment(config)
    _make_out_dir(run_dir)
    with run_dir_lock(run_dir):  # one process per run directory, for the run's life
        prepare_run_dir(run_dir)
        args.run_dir = run_dir
        progress = Progress(
            config.experiment.algorithm.rounds,
            enabled=config.runtime.progress and not args.no_progress,
        )
        try:
            summary = run_experiment(exp, run_dir, on_round=progress.update)
        finally:
            progress.close()
    return _report_run(summary)


def _make_out_dir(run_dir: Path) -> None:
    """Creates the run directory, or says in one line why it cannot be (``--out /proc/x``,
    a read-only disk, a file in the way)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            "--out", f"cannot create the run directory {str(run_dir)!r}: {e.strerror or e}"
        ) from None


def _resume(args: argparse.Namespace) -> int:
    from raydpfl.config.load import load_config
    from raydpfl.experiment.build import build_experiment, check_resume, run_experiment
    from raydpfl.simulation.run_lock import run_dir_lock

    run_dir = Path(args.resume)
    if args.out:
        raise ConfigError("resume", f"--resume continues in {run_dir} itself; drop --out")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("resume", f"{run_dir} is not a run directory (no config.yaml)")
    args.run_dir = run_dir  # a refusal is also written to its error.log (`_log_refusal`)
    source = args.config if args.config is not None else run_dir / "config.yaml"
    _import_plugins(args.plugins)
    config = load_config(source, args.overrides)
    # One process per run directory, for the run's life; before any data or Ray.
    with run_dir_lock(run_dir, create=False):
        check_resume(run_dir, config)  # before any data is loaded or Ray started
        args.run_dir = run_dir
        exp = build_experiment(config)
        progress = Progress(
            config.experiment.algorithm.rounds,
            enabled=config.runtime.progress and not args.no_progress,
            start=_checkpoint_round(run_dir),
        )
        try:
            summary = run_experiment(exp, run_dir, on_round=progress.update, resume=True)
        finally:
            progress.close()
    return _report_run(summary)


def _checkpoint_round(run_dir: Path) -> int:
    """The round the run's checkpoint was written after (0 if it cannot be read)."""
    import json

    try:
        manifest = json.loads((run_dir / "checkpoint" / "manifest.json").read_text())
        return int(manifest["rounds_completed"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _cmd_privacy_epsilon(args: argparse.Namespace) -> int:
    from raydpfl.privacy.accounting.accountants import compute_epsilon

    eps = compute_epsilon([(args.sigma, args.q, args.steps)], args.delta, args.accountant)
    print(
        f"epsilon = {eps:.6g}  (sigma={args.sigma}, q={args.q}, steps={args.steps}, "
        f"delta={args.delta:g}, accountant={args.accountant})"
    )
    return 0


def _cmd_privacy_noise(args: argparse.Namespace) -> int:
    from raydpfl.config.schema import MIN_NOISE_MULTIPLIER
    from raydpfl.privacy.accounting.calibration import noise_multiplier_for

    with as_config_error(""):
        sigma = noise_multiplier_for(args.epsilon, args.delta, args.q, args.steps, args.accountant)
    if 0 < sigma < MIN_NOISE_MULTIPLIER:  # as a run refuses it (`check_calibrated_floor`)
        raise ConfigError(
            "--epsilon",
            f"calibrates sigma to {sigma:.3g}, below the floor {MIN_NOISE_MULTIPLIER:g} "
            "of privacy.noise_multiplier (no useful privacy); a run refuses it",
        )
    print(
        f"noise_multiplier = {sigma:.6g}  (epsilon<={args.epsilon}, q={args.q}, "
        f"steps={args.steps}, delta={args.delta:g}, accountant={args.accountant})"
    )
    return 0


def _cmd_privacy_steps(args: argparse.Namespace) -> int:
    from raydpfl.privacy.accounting.step_budget import iteration_budget

    with as_config_error(""):
        steps = iteration_budget(
            args.epsilon,
            args.delta,
            args.q,
            args.sigma,
            mode=args.mode,
            accountant=args.accountant,
        )
    how = (
        "ALI-DPFL paper_compat: classic conversion, may exceed epsilon by <= 0.01"
        if args.mode == "paper_compat"
        else f"accountant={args.accountant}"
    )
    print(
        f"steps = {steps}  (epsilon<={args.epsilon}, sigma={args.sigma}, q={args.q}, "
        f"delta={args.delta:g}, {how})"
    )
    return 0


def _cmd_privacy_client_epsilon(args: argparse.Namespace) -> int:
    from raydpfl.privacy.accounting.client_level import client_level_epsilon, rounds_history

    history = rounds_history(_client_round(args, args.sigma), args.rounds)
    eps = client_level_epsilon(history, args.delta, args.accountant)
    print(
        f"epsilon = {eps:.6g}  (sigma={args.sigma}, rounds={args.rounds}, {_client_words(args)})"
    )
    return 0


def _cmd_privacy_client_noise(args: argparse.Namespace) -> int:
    from raydpfl.privacy.accounting.client_level import client_level_noise_multiplier

    cost = _client_round(args)
    if args.rounds == 0:
        sigma = 0.0
    else:
        with as_config_error(""):
            sigma = client_level_noise_multiplier(
                args.epsilon, args.delta, cost, args.rounds, args.accountant
            )
    print(
        f"noise_multiplier = {sigma:.6g}  (epsilon<={args.epsilon}, rounds={args.rounds}, "
        f"{_client_words(args)})"
    )
    return 0


def _cmd_privacy_client_rounds(args: argparse.Namespace) -> int:
    from raydpfl.privacy.accounting.client_level import client_level_max_rounds

    rounds = client_level_max_rounds(
        args.epsilon, args.delta, _client_round(args, args.sigma), args.accountant
    )
    print(
        f"rounds = {rounds}  (epsilon<={args.epsilon}, sigma={args.sigma}, {_client_words(args)})"
    )
    return 0


def _cmd_data_download(args: argparse.Namespace) -> int:
    from raydpfl.data.datasets import DATASETS, download_dataset
    from raydpfl.data.readers import DOWNLOADABLE

    allowed = (*DATASETS, *DOWNLOADABLE)
    if args.name not in allowed:
        raise ConfigError("name", f"unknown dataset {args.name!r}; allowed: {', '.join(allowed)}")
    fetch = DOWNLOADABLE.get(args.name, download_dataset)
    path = fetch(args.name, args.root) if fetch is download_dataset else fetch(args.root)
    print(f"{args.name}: ready in {path}")
    return 0


def _cmd_data_stats(args: argparse.Namespace) -> int:
    from raydpfl.experiment.build import load_federated

    config = _load(args)
    ds = load_federated(config.experiment.data, config.runtime.seed)
    print(
        f"{ds.name}: {ds.num_clients} clients, {int(ds.train_sizes().sum())} train records, "
        f"{len(ds.y_test)} central test records"
    )
    print(ds.stats().summary())
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from raydpfl.tune.sweep import execute_sweep, load_sweep_file, resume_sweep

    if args.quiet and args.verbose:
        raise ConfigError("--quiet", "--quiet and --verbose exclude each other")
    progress = None if args.quiet or args.verbose else _SweepLine()
    on_progress = None if progress is None else progress.update
    try:
        if args.resume:
            if args.config is not None or args.out or args.overrides:
                raise ConfigError(
                    "resume", "--resume takes the sweep's own sweep.yaml and directory"
                )
            args.sweep_dir = Path(args.resume)
            summary = resume_sweep(
                args.sweep_dir, args.verbose, tuple(args.plugins), on_progress=on_progress
            )
        else:
            if args.config is None:
                raise ConfigError("config", "give a sweep file, or --resume SWEEP_DIR")
            _import_plugins(args.plugins)
            sweep = load_sweep_file(args.config, tuple(args.overrides), tuple(args.plugins))
            out = (
                Path(args.out)
                if args.out
                else _default_run_dir(
                    sweep.base.runtime.output, f"{sweep.base.experiment.name}-sweep"
                )
            )
            args.sweep_dir = out
            summary = execute_sweep(sweep, out, verbose=args.verbose, on_progress=on_progress)
    finally:
        if progress is not None:
            progress.close()
    _print_sweep(summary)
    if summary.get("interrupted"):  # Tune stopped gracefully; its state is saved
        return _interrupted(args, summary["interrupted"]["signal"])
    return _sweep_failures(summary)


class _SweepLine:
    """The sweep's progress as one tqdm bar over trials (Tune's tables stay off)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def update(self, p: Mapping[str, Any]) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=p["total"], desc="trials", unit="trial", dynamic_ncols=True)
        post = {"running": p["running"], "failed": p["failed"]}
        if p.get("best") is not None:
            post[f"best {p['metric']}"] = f"{p['best']:.4f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(max(0, p["done"] - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _sweep_failures(summary: Mapping[str, Any]) -> int:
    """Exit 1 when every trial failed, saying how many and where the first error is; a
    note when some did."""
    failed = [r for r in summary["rows"] if r["status"] == "error"]
    if not failed:
        return 0
    first = failed[0]
    where = Path(summary["sweep_dir"]) / (first.get("error_file") or first["run_dir"])
    error = first.get("error") or "unknown"
    line = f"first error ({first['trial_id']}): {error}; traceback in {where}"
    if len(failed) == len(summary["rows"]):
        print(f"raydpfl: sweep failed: all {len(failed)} trials failed; {line}", file=sys.stderr)
        return 1
    print(
        f"raydpfl: note: {len(failed)} of {len(summary['rows'])} trials failed; {line}",
        file=sys.stderr,
    )
    return 0


def _print_sweep(summary: Mapping[str, Any]) -> None:
    rows = summary["rows"]
    counts = [
        f"{summary[key]} {words}"
        for key, words in (
            ("trials_completed", "completed"),
            ("trials_stopped_early", "stopped early"),
            ("trials_failed", "failed"),
            ("trials_interrupted", "interrupted"),
            ("trials_not_started", "not started"),
        )
        if summary.get(key) or key in ("trials_completed", "trials_failed")
    ]
    planned = summary.get("trials_planned") or summary["trials"]
    of = f" of {planned}" if planned > summary["trials"] else ""
    print(
        f"sweep: {summary['trials']}{of} trials ({', '.join(counts)}); "
        f"{summary['mode']} {summary['metric']}"
    )
    for r in rows:
        metric = "-" if r["metric_last"] is None else f"{r['metric_last']:.4f}"
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()
        )
        print(
            f"  {r['trial_id']}  {r['status']:<13} rounds {r['rounds_completed']:>4}  "
            f"{summary['metric']} {metric}  {params}"
        )
    if summary["best_trial"] is not None:
        print(f"best: {summary['best_trial']} {summary['metric']}={summary['best_metric']:.4f}")
    privacy = summary.get("privacy")
    if privacy:
        for key in ("epsilon_per_trial_max", "epsilon_sweep"):
            eps = privacy.get(key)
            if eps is not None:
                label = privacy[key.replace("_max", "") + "_label"]
                print(f"{key} = {eps:.4g} ({label})")
    print(f"sweep directory: {summary['sweep_dir']}")
    print(f"figures and report.md: raydpfl report {shlex.quote(str(summary['sweep_dir']))}")


def _cmd_report(args: argparse.Namespace) -> int:
    from raydpfl.report import ReportError, build_report

    try:
        report = build_report(args.run_dirs, args.out)
    except ReportError as e:
        raise ConfigError("", str(e)) from None
    print(
        f"report of {len(report.runs)} run{'s' if len(report.runs) != 1 else ''}: "
        f"{report.markdown} ({len(report.figures)} figures)"
    )
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from raydpfl.audit import audit

    _import_plugins(args.plugins)
    result = audit(
        args.config,
        overrides=args.overrides,
        canaries=args.canaries,
        mode=args.mode,
        confidence=args.confidence,
        k_plus=args.k_plus,
        k_minus=args.k_minus,
        score=args.score,
        run_dir=args.out,
    )
    print(result.line())
    if args.out:
        print(f"outputs: {args.out} (audit.json)")
    return 0


# ---- output -----------------------------------------------------------------------------
def _default_run_dir(output: str, name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(output) / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _report_run(summary: Mapping[str, Any]) -> int:
    """Prints the summary (exit 0), or, for a run that ended without training a single
    round (every client's budget spent before its first task, an algorithm that stopped
    at once), one line on stderr and exit 2: such a run is not a result."""
    if summary.get("rounds_completed") == 0 and summary.get("rounds_planned"):
        where = f"; its outputs are in {summary['run_dir']}" if "run_dir" in summary else ""
        print(
            f"raydpfl: error: no round was trained ({summary.get('stop_reason')}){where}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    _print_summary(summary)
    return 0


def _print_summary(summary: Mapping[str, Any]) -> None:
    acc = summary.get("final_test_accuracy")
    best = summary.get("best_test_accuracy")
    line = [f"rounds {summary['rounds_completed']}/{summary['rounds_planned']}"]
    if acc is not None:
        line.append(f"final accuracy {acc:.4f} (best {best:.4f})")
    if summary.get("private"):
        line.append(_epsilon_words(summary))
    else:
        line.append("non-private (epsilon = inf)")
    print("; ".join(line))
    if summary.get("stop_reason") != "completed all rounds":
        print(f"stopped early: {summary['stop_reason']}")
    if "run_dir" in summary:
        print(f"outputs: {summary['run_dir']}")
        print(f"figures and report.md: raydpfl report {shlex.quote(str(summary['run_dir']))}")


def _epsilon_words(summary: Mapping[str, Any]) -> str:
    """ε max with the δ that client holds at, its unit and accountant: a pair some client
    really has (with heterogeneous budgets, the δ is that client's own)."""
    who = ""
    if summary.get("epsilon_max_client") is not None:
        who = f" (client {summary['epsilon_max_client']}; each client's own delta in ledger.json)"
    unit = summary.get("epsilon_unit") or "record"
    return (
        f"epsilon_max {summary['epsilon_max']:.4f} at delta {summary['delta']:g}{who}, "
        f"at the {unit} level ({summary['accountant']})"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
