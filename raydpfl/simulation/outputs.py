"""The run directory: resolved config, per-round and per-client tables, ledger, summary.

Layout (see README "Outputs"):

    config.yaml       the resolved config, written before the first round
    rounds.parquet    one row per round (rewritten atomically after every round)
    clients.parquet   one row per client per evaluated round
    ledger.json       every privacy charge, per client (JSON, never pickle)
    summary.json      final figures and the privacy statement
    model.pt          the final global parameters (a plain state dict)

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
import pyarrow.parquet as pq
import torch

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


def check_run_dir_free(path: str | Path) -> Path:
    """Raises FileExistsError if `path` exists and is not an empty directory."""
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
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


class RunWriter:
    """Writes a run's tables and files as the run goes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.round_rows: list[dict[str, Any]] = []
        self._clients: pq.ParquetWriter | None = None

    def write_config(self, text: str) -> None:
        """Saves the resolved config YAML."""
        (self.run_dir / "config.yaml").write_text(text, encoding="utf-8")

    def add_round(self, row: Mapping[str, Any]) -> None:
        """Appends one round's row and rewrites rounds.parquet atomically."""
        self.round_rows.append(dict(row))
        table = pa.Table.from_pylist(self.round_rows)
        tmp = self.run_dir / "rounds.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.run_dir / "rounds.parquet")

    def add_clients(self, rows: Mapping[str, list[Any]]) -> None:
        """Appends one evaluated round's per-client rows to clients.parquet."""
        table = pa.Table.from_pydict(dict(rows), schema=CLIENT_SCHEMA)
        if self._clients is None:
            self._clients = pq.ParquetWriter(self.run_dir / "clients.parquet", CLIENT_SCHEMA)
        self._clients.write_table(table)

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
        """Finalises clients.parquet (an empty table if no client was evaluated)."""
        if self._clients is None:
            pq.write_table(CLIENT_SCHEMA.empty_table(), self.run_dir / "clients.parquet")
        else:
            self._clients.close()
            self._clients = None
