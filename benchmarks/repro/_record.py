"""The reproduction record: one JSON line per (paper, table, dataset, setting, method, ε, seed).

Every reproduction runner (``ali_dpfl.py``, ``fedfdp.py``, ``dpfl_bcs.py``, ``rc_dpfl.py``,
``accumulator_ablation.py``, ``ali_tau_budget.py``) appends its rows here through
:func:`append_rows`, beside its own outputs; ``record.py`` turns the file into
REPRODUCTION.md. The file is ``benchmarks/repro/results.jsonl`` unless the environment
variable ``RAYDPFL_REPRO_RESULTS`` names another (tests, scratch runs); ``--no-record`` on a
runner skips it. A runner that records refuses to start from a tree whose tracked files
differ from HEAD (`check_tree`): a row must name a commit that reproduces it, so long runs
go from a ``git worktree`` of a commit; ``--allow-dirty`` records anyway, and the rows'
``commit`` then reads ``<hash>+dirty``.

Row fields (``ROW_FIELDS``; every row has all of them, ``None`` where not applicable):

- ``paper``: ``ali_dpfl`` | ``fedfdp`` | ``dpfl_bcs`` | ``rc_dpfl``;
- ``table``: the paper's table (``"II"``, ``"6"``, ...) or figure (``"Fig. 2"``);
- ``dataset``, ``setting`` (the table's column: ``"Rc/2"``, ``"dir0.05"``, ``"All"``, ...);
- ``method``: the runner's method key (``tau1``, ``fedavg``, ``rc_dpfl``, ...);
- ``epsilon``: the cell's ε (``None`` for non-private cells), ``seed``;
- ``ours``: our figure, in the paper's unit (accuracy in %, or test MSE), ``metric`` saying
  which (``best_accuracy``, ``final_accuracy``, ``mean_accuracy_all`` ...);
- ``paper_value``: the paper's figure for the cell (``None`` where it gives none);
- ``rounds_run``, ``rounds_paper``: rounds we ran and the rounds of the paper's schedule;
  ``schedule``: ``full`` (the paper's schedule) or ``reduced`` (fewer rounds, fewer records
  or another change of schedule, said in ``note``);
- ``dp``: False for a run that is not differentially private: a non-private method of the
  paper (FedFair's Table 4, FedSGD) with ``variant`` empty, or, with ``variant`` set, an
  explicitly non-DP ablation (a published step that is not DP, shown as *not DP*);
- ``variant``: ``""`` for the paper's configuration, otherwise what was changed (a study,
  an ablation);
- ``commit``, ``command``, ``wall_s``, ``date`` (UTC), ``source`` (``run`` for a row written
  by a runner of raydpfl's engine; ``authors' code`` for a row written by
  ``authors_step.py`` or ``authors_step_fedfdp.py``, the re-implementations of a paper's
  published code, shown beside
  ours, never pooled with it; ``README (commit ...)`` for a number taken from the docs),
  ``note``,
  ``extra`` (a dict of anything else the runner measured).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = ROOT / "benchmarks" / "repro" / "results.jsonl"
ENV_VAR = "RAYDPFL_REPRO_RESULTS"
PAPERS = ("ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl")
ROW_FIELDS = (
    "paper",
    "table",
    "dataset",
    "setting",
    "method",
    "epsilon",
    "seed",
    "ours",
    "metric",
    "paper_value",
    "rounds_run",
    "rounds_paper",
    "schedule",
    "dp",
    "variant",
    "commit",
    "command",
    "wall_s",
    "date",
    "source",
    "note",
    "extra",
)
REQUIRED = ("paper", "table", "dataset", "setting", "method", "ours", "metric", "dp")
#: Sources of rows that a runner writes (commit, command and date are filled in):
#: raydpfl's engine, and the re-implementation of a paper's published code.
RUN_SOURCES = ("run", "authors' code")


def results_path() -> Path:
    """Where rows go: ``$RAYDPFL_REPRO_RESULTS`` or benchmarks/repro/results.jsonl."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_RESULTS


#: What recording itself writes: a run's own rows do not make its tree dirty (otherwise the
#: second row of a batch from a clean worktree would be refused or marked +dirty).
RECORD_OUTPUTS = (
    "benchmarks/repro/results.jsonl",
    "REPRODUCTION.md",
    "benchmarks/results",
    "benchmarks/repro/figures",  # the record's figures and their data (record.py)
    "benchmarks/repro/provenance.json",  # a dirty row accepted (--allow-dirty runs)
    "raydpfl/papers/*/README.md",  # the papers' record sections (record.py)
)


def git_commit() -> str:
    """HEAD's short hash, with ``+dirty`` when tracked files other than the record's own
    outputs (`RECORD_OUTPUTS`) differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                *(f":(exclude){path}" for path in RECORD_OUTPUTS),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def add_record_args(parser: Any) -> None:
    """The recording options every runner takes: ``--no-record`` and ``--allow-dirty``."""
    parser.add_argument(
        "--no-record", action="store_true", help="skip benchmarks/repro/results.jsonl"
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="record rows from a tree whose tracked files differ from HEAD (their commit "
        "then reads <hash>+dirty: no commit reproduces them)",
    )


def check_tree(args: Any) -> None:
    """Refuses, before any work, to record rows from an uncommitted tree: a row must name
    a commit that produces it. One line on stderr and exit 2, unless ``--no-record`` (no
    row is written), ``--allow-dirty`` (the rows say ``+dirty``) or a mode that runs
    nothing (``--list``, ``--write-configs``)."""
    if any(getattr(args, k, False) for k in ("no_record", "allow_dirty", "list", "write_configs")):
        return
    if os.environ.get(ENV_VAR, "").lower() == "off":
        return
    commit = git_commit()
    if commit.endswith("+dirty"):
        print(
            f"{Path(sys.argv[0]).name}: error: the tree has uncommitted changes to tracked "
            f"files ({commit}); commit them and run from a worktree of that commit "
            "(git worktree add ../run <commit>), or pass --allow-dirty to record rows marked "
            "+dirty, or --no-record",
            file=sys.stderr,
        )
        raise SystemExit(2)


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as typed from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        script_s = str(script.relative_to(ROOT))
    except ValueError:
        script_s = argv[0] if argv else "?"
    return shlex.join(["python", script_s, *argv[1:]])


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_row(**fields: Any) -> dict[str, Any]:
    """A complete row: the given fields, defaults for the rest, checked."""
    missing = [k for k in REQUIRED if fields.get(k) is None]
    if missing:
        raise ValueError(f"row lacks {missing}")
    unknown = set(fields) - set(ROW_FIELDS)
    if unknown:
        raise ValueError(f"unknown row field(s) {sorted(unknown)}")
    if fields["paper"] not in PAPERS:
        raise ValueError(f"paper must be one of {PAPERS}, not {fields['paper']!r}")
    defaults: dict[str, Any] = {
        "epsilon": None,
        "seed": None,
        "paper_value": None,
        "rounds_run": None,
        "rounds_paper": None,
        "schedule": "full",
        "variant": "",
        "commit": None,
        "command": None,
        "wall_s": None,
        "date": None,
        "source": "run",
        "note": "",
        "extra": {},
    }
    row = {k: fields.get(k, defaults.get(k)) for k in ROW_FIELDS}
    if row["source"] in RUN_SOURCES:
        row["commit"] = row["commit"] or git_commit()
        row["command"] = row["command"] or command_line()
        row["date"] = row["date"] or utc_now()
    if row["schedule"] not in ("full", "reduced"):
        raise ValueError("schedule must be 'full' or 'reduced'")
    for key in ("ours", "paper_value", "epsilon", "wall_s"):
        if row[key] is not None:
            row[key] = float(row[key])
    row["dp"] = bool(row["dp"])
    return row


def append_rows(rows: Iterable[dict[str, Any]], path: Path | None = None) -> Path:
    """Appends complete rows (see :func:`make_row`) to the results file, one per line."""
    path = path or results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(make_row(**row), sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path


def append_json(path: Path, entry: dict[str, Any]) -> None:
    """Adds `entry` to the JSON list in `path` (a runner's own dump under
    benchmarks/results/), reading the file just before writing it: runners that run at
    the same time keep each other's entries (a list read once at start and rewritten after
    every run dropped them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*done, entry], indent=1))


def record(**fields: Any) -> None:
    """Appends one row unless recording is off (``RAYDPFL_REPRO_RESULTS=off``)."""
    if os.environ.get(ENV_VAR, "").lower() == "off":
        return
    path = append_rows([fields])
    if path.resolve() == DEFAULT_RESULTS.resolve():
        # REPRODUCTION.md follows the committed record at once (a test checks that they
        # agree), so a runner's new row never leaves the two out of step.
        import record as _regenerate  # sibling module; imported here: it imports this one

        # a +dirty row exists only because the runner was told --allow-dirty: that is the
        # ask record.py needs before it accepts a row no commit reproduces
        dirty = str(load_rows(path)[-1].get("commit") or "").endswith("+dirty")
        _regenerate.main(["--accept-dirty"] if dirty else [])


def load_rows(path: Path | None = None) -> list[dict[str, Any]]:
    """Every row of a results file (blank lines skipped)."""
    path = path or results_path()
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
    return rows
