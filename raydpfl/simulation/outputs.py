"""The run directory: resolved config, per-round and per-client tables, ledger, summary.

Layout (see README "Outputs"):

    config.yaml       the resolved config, written before the first round
    rounds.parquet    one row per round (rewritten atomically after every round)
    clients.parquet   one row per client per evaluated round (without per-client scoring:
                      one row per client for the last round, its ε and size)
    ledger.json       every privacy charge, per client (JSON, never pickle)
    summary.json      final figures and the privacy statement
    model.pt          the final global parameters (a plain state dict)
    ledger_log.jsonl  every charge batch, appended and synced before its tasks run; each
                      line carries a hash chain over all lines before it
    checkpoint/       state-NNNNNNN.json + params-NNNNNNN.pt (+ algorithm-NNNNNNN.pt, the
                      algorithm's tensor state, when it has any) at the start and every
                      `runtime.checkpoint_every` rounds, and manifest.json (written last:
                      the sha256 of each of them and of config.yaml). `raydpfl run
                      --resume RUN_DIR` verifies them and continues from it
    clients.parts/    per-round client tables while the run is going (merged at the end)
    run.lock          while a process runs in the directory: its pid; flock-ed for the
                      run's life, so a second process is refused (`run_lock`)

Tables are written as they grow, so an interrupted run keeps every finished round.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from raydpfl.simulation.integrity import (
    GENESIS,
    ChargeBatch,
    ResumeError,
    charge_log_line,
    read_chained_log,
    read_manifest,
    write_manifest,
)
from raydpfl.simulation.run_lock import LOCK_FILE, check_not_busy

#: Per-round client tables until the run closes, the charge log and the checkpoint folder.
CLIENT_PARTS = "clients.parts"
CHARGE_LOG = "ledger_log.jsonl"
CHECKPOINT_DIR = "checkpoint"
#: The state.json key naming the algorithm's tensor-state file (absent: no tensor state).
TENSORS_KEY = "algorithm_tensors_file"

CLIENT_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("client_id", pa.int32()),
        ("test_accuracy", pa.float64()),
        ("test_loss", pa.float64()),
        ("epsilon", pa.float64()),
        ("num_examples", pa.int64()),
        ("num_test_examples", pa.int64()),
    ]
)


def read_charge_log(run_dir: Path) -> dict[int, list[list[Any]]]:
    """round → the charge batches `run_dir`'s ledger_log.jsonl holds for it, in order
    (complete lines only; the hash chain is verified: `ResumeError` if it breaks)."""
    out: dict[int, list[list[Any]]] = {}
    for batch in read_chained_log(Path(run_dir) / CHARGE_LOG)[0]:
        out.setdefault(batch.round, []).append(batch.charges)
    return out


def check_run_dir_free(path: str | Path) -> Path:
    """Raises FileExistsError if `path` exists and is not an empty directory (a lock file
    left by a run that died before writing anything does not count), `RunDirBusyError` if
    another process is running in it."""
    p = Path(path)
    if p.is_dir():
        check_not_busy(p)
    if p.exists() and (not p.is_dir() or any(q.name != LOCK_FILE for q in p.iterdir())):
        raise FileExistsError(f"output directory {str(p)!r} already exists and is not empty")
    return p


def prepare_run_dir(path: str | Path) -> Path:
    """Creates the run directory; refuses one that already holds files (nothing is lost)."""
    p = check_run_dir_free(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def model_sha256(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over parameter names, dtypes, shapes and bytes, in order."""
    h = hashlib.sha256()
    for name, t in params.items():
        c = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{c.dtype}|{tuple(c.shape)}".encode())
        h.update(c.numpy().tobytes())
    return h.hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Writes JSON atomically (temp file + rename); non-finite floats become null."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(
        json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n", encoding="utf-8"
    )
    os.replace(tmp, path)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """torch.save of detached CPU copies via a temp file and a rename (atomic).

    Copies, so that tensors sharing storage (views) are saved, and later loaded, as
    independent tensors of their own size."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({n: t.detach().to("cpu").clone() for n, t in tensors.items()}, tmp)
    os.replace(tmp, path)


def _checked_tensor_dict(loaded: Any, path: Path) -> dict[str, torch.Tensor]:
    """`loaded` if it is a flat ``{str: Tensor}`` dict; ValueError naming the bad entry."""
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a dict of tensors, not {type(loaded).__name__}")
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{path}: entry {key!r} must map a string to a tensor, "
                f"not to {type(value).__name__}"
            )
    return loaded


class RunWriter:
    """Writes a run's tables and files as the run goes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.round_rows: list[dict[str, Any]] = []
        # The chain value after each line of the charge log (None until read or written).
        self._log_chains: list[str] | None = None

    def write_config(self, text: str) -> None:
        """Saves the resolved config YAML."""
        (self.run_dir / "config.yaml").write_text(text, encoding="utf-8")

    def add_round(self, row: Mapping[str, Any]) -> None:
        """Appends one round's row and rewrites rounds.parquet atomically."""
        self.round_rows.append(dict(row))
        self._write_rounds()

    def replace_last_round(self, row: Mapping[str, Any]) -> None:
        """Replaces the last round's row (e.g. once its model has been scored)."""
        self.round_rows[-1] = dict(row)
        self._write_rounds()

    def _write_rounds(self) -> None:
        # Columns from every row (from_pylist takes the first row's keys only, and later
        # rows add keys: evaluation metrics on evaluated rounds, an algorithm's own).
        keys = dict.fromkeys(k for row in self.round_rows for k in row)
        table = pa.Table.from_pydict({k: [row.get(k) for row in self.round_rows] for k in keys})
        tmp = self.run_dir / "rounds.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.run_dir / "rounds.parquet")

    def add_clients(self, rows: Mapping[str, list[Any]]) -> None:
        """Appends one evaluated round's per-client rows (merged into clients.parquet at
        `close`; until then each round is its own complete file, so a crash loses none)."""
        schema = CLIENT_SCHEMA
        if "client_name" in rows:  # natural clients: dictionary-encoded in the merged file
            schema = schema.append(pa.field("client_name", pa.string()))
        table = pa.Table.from_pydict(dict(rows), schema=schema)
        parts = self.run_dir / CLIENT_PARTS
        parts.mkdir(exist_ok=True)
        round_no = int(rows["round"][0]) if len(rows["round"]) else 0
        tmp = parts / f"round-{round_no:07d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, parts / f"round-{round_no:07d}.parquet")

    def log_charges(self, round_idx: int, charges: list[tuple[int, Mapping[str, Any]]]) -> None:
        """Appends one batch of ledger charges to ledger_log.jsonl and syncs it to disk.

        Written before the tasks are dispatched: whatever happens next, the charge is on
        disk. A resumed run replays the rounds after its checkpoint and checks that it
        makes exactly these charges again. Each line continues the log's hash chain.
        """
        chains = self._chains()
        line = charge_log_line(chains[-1] if chains else GENESIS, round_idx, charges)
        with open(self.run_dir / CHARGE_LOG, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        chains.append(json.loads(line)["chain"])

    def _chains(self) -> list[str]:
        if self._log_chains is None:
            self.charge_batches()  # continue the chain of a log already on disk
        assert self._log_chains is not None
        return self._log_chains

    def charge_batches(self) -> list[ChargeBatch]:
        """The charge log's verified batches, in order (`ResumeError` if the chain breaks).

        A last line cut short by a crash (never synced, so never dispatched) is cut off
        the file, so that the next line appended starts on a line of its own.
        """
        path = self.run_dir / CHARGE_LOG
        batches, length = read_chained_log(path)
        if path.exists() and path.stat().st_size > length:
            os.truncate(path, length)
        self._log_chains = [b.chain for b in batches]
        return batches

    def write_checkpoint(
        self,
        rounds_completed: int,
        params: Mapping[str, torch.Tensor],
        state: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor] | None = None,
        log_entries: int | None = None,
    ) -> None:
        """Atomically records the server after `rounds_completed` rounds.

        The parameters (and the algorithm's `tensors`, if any) and the JSON state go to
        round-stamped files; `manifest.json`, which names them with their sha256 (and
        config.yaml's), is replaced last: a crash at any point leaves the previous
        checkpoint or the new one, never a mix. The state records how many lines of the
        charge log the checkpointed ledger holds (`log_entries`, default all of them) and
        the chain value after them, so a resume can tell a truncated or edited log.
        Formats: JSON and tensors-only torch files. Without tensors, the state names no
        tensor file, which reads as empty.
        """
        ckpt = self.run_dir / CHECKPOINT_DIR
        ckpt.mkdir(exist_ok=True)
        chains = self._chains()
        entries = len(chains) if log_entries is None else int(log_entries)
        log = {"entries": entries, "chain": chains[entries - 1] if entries else GENESIS}
        stamp = f"{rounds_completed:07d}"
        files = {"params_file": f"params-{stamp}.pt"}
        _save_tensors(params, ckpt / files["params_file"])
        if tensors:
            files[TENSORS_KEY] = f"algorithm-{stamp}.pt"
            _save_tensors(tensors, ckpt / files[TENSORS_KEY])
        state_file = f"state-{stamp}.json"
        write_json(ckpt / state_file, {**state, **files, "ledger_log": log})
        hashed = [f"{CHECKPOINT_DIR}/{n}" for n in (state_file, *files.values())]
        if (self.run_dir / "config.yaml").is_file():
            hashed.insert(0, "config.yaml")
        write_manifest(self.run_dir, rounds_completed, state_file, hashed)
        keep = {state_file, *files.values()}
        for pattern in ("params-*.pt", "algorithm-*.pt", "state-*.json", "state.json"):
            for old in ckpt.glob(pattern):
                if old.name not in keep:
                    old.unlink()

    def read_checkpoint(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The last checkpoint's state and parameters, every file verified against the
        manifest first (`ResumeError` on a mismatch; `weights_only` loading)."""
        manifest = read_manifest(self.run_dir)
        state_path = self.run_dir / CHECKPOINT_DIR / str(manifest["state_file"])
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
            params_path = self.run_dir / CHECKPOINT_DIR / str(state["params_file"])
        except (ValueError, KeyError, TypeError):
            raise ResumeError(f"{state_path} is not a checkpoint state") from None
        if f"{CHECKPOINT_DIR}/{params_path.name}" not in manifest["files"]:
            raise ResumeError(f"{state_path} names {params_path.name}, which is not hashed")
        try:
            params = torch.load(params_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ResumeError(f"{params_path} cannot be read ({type(exc).__name__})") from None
        return state, _checked_tensor_dict(params, params_path)

    def read_checkpoint_tensors(self, state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The algorithm's tensor state named by the checkpoint `state` (CPU tensors).

        A checkpoint that names no tensor file has none: {}. A named file that is missing,
        or that holds anything but a flat ``{str: Tensor}`` dict, raises (the checkpoint
        is incomplete or was altered); `weights_only` loading never runs pickled code.
        """
        name = state.get(TENSORS_KEY)
        if name is None:
            return {}
        path = self.run_dir / CHECKPOINT_DIR / str(name)
        if not path.is_file():
            raise FileNotFoundError(
                f"checkpoint state.json names {TENSORS_KEY}={name!r}, but {path} is missing"
            )
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # e.g. UnpicklingError: pickled code, a damaged file
            exc.add_note(f"while reading the algorithm's checkpoint tensor state {path}")
            raise
        return _checked_tensor_dict(tensors, path)

    def prepare_resume(self, rounds_completed: int, rows: list[dict[str, Any]]) -> None:
        """Drops outputs of rounds after the checkpoint (they will be re-run)."""
        self.round_rows = []
        for row in rows:
            self.add_round(row)
        if not rows:
            (self.run_dir / "rounds.parquet").unlink(missing_ok=True)
        self._split_merged_clients(rounds_completed)
        for part in (self.run_dir / CLIENT_PARTS).glob("round-*.parquet*"):
            if not part.name.endswith(".parquet") or int(part.stem.split("-")[1]) > (
                rounds_completed
            ):
                part.unlink()
        for stale in ("clients.parquet", "summary.json", "model.pt"):
            (self.run_dir / stale).unlink(missing_ok=True)

    def _split_merged_clients(self, rounds_completed: int) -> None:
        """Puts the rounds up to `rounds_completed` of a clients.parquet that an orderly
        stop (Ctrl-C, SIGTERM, a failure) merged back into per-round files.

        `close` merges the per-round files and deletes them, so that an interrupted run
        leaves a readable clients.parquet; the resume then deletes that table as stale.
        Without this, the rounds before the checkpoint were lost (after SIGKILL, `close`
        never ran and the files survived). A round that still has its own file keeps it.
        """
        merged = self.run_dir / "clients.parquet"
        if not merged.is_file():
            return
        try:
            table = pq.read_table(merged)
            rounds = table.column("round").to_pylist()
        except (OSError, KeyError, pa.ArrowException) as exc:
            raise ResumeError(f"{merged} cannot be read ({type(exc).__name__})") from None
        parts = self.run_dir / CLIENT_PARTS
        parts.mkdir(exist_ok=True)
        for round_no in sorted(set(rounds)):
            target = parts / f"round-{int(round_no):07d}.parquet"
            if int(round_no) > rounds_completed or target.exists():
                continue
            mask = pc.equal(table.column("round"), pa.scalar(round_no, pa.int32()))
            tmp = target.with_name(target.name + ".tmp")
            pq.write_table(table.filter(mask), tmp)
            os.replace(tmp, target)

    def write_ledger(self, ledger_dict: Mapping[str, Any]) -> None:
        """Saves the privacy ledger as JSON."""
        write_json(self.run_dir / "ledger.json", ledger_dict)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Saves summary.json."""
        write_json(self.run_dir / "summary.json", summary)

    def write_model(self, params: Mapping[str, torch.Tensor]) -> None:
        """Saves the final parameters; load with ``torch.load(path, weights_only=True)``."""
        torch.save({n: t.detach().cpu() for n, t in params.items()}, self.run_dir / "model.pt")

    def close(self) -> None:
        """Merges the per-round client files into clients.parquet (an empty table if no
        client was evaluated)."""
        parts_dir = self.run_dir / CLIENT_PARTS
        parts = sorted(parts_dir.glob("round-*.parquet")) if parts_dir.exists() else []
        tables = [pq.read_table(p) for p in parts]
        table = pa.concat_tables(tables) if tables else CLIENT_SCHEMA.empty_table()
        tmp = self.run_dir / "clients.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.run_dir / "clients.parquet")
        for p in parts:
            p.unlink()
        if parts_dir.exists():
            parts_dir.rmdir()
