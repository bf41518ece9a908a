"""Comparing two run directories output by output (not only their hashes).

Shared by the interruption and resume tests: an interrupted run, resumed, must end with
every output table and file of an uninterrupted run of the same config, except what
measures the wall clock or says that it was resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch

#: summary.json keys that describe how the run went, not what it computed.
HOW_IT_RAN = {"wall_seconds", "resumed_from_round", "rounds_per_second", "run_dir"}


def _timing(column: str) -> bool:
    return "seconds" in column or column.endswith("_s") or "per_second" in column


def assert_same_outputs(resumed: Path, reference: Path) -> None:
    """Every output of `resumed` equals `reference`'s (timings left out)."""
    for name in ("rounds.parquet", "clients.parquet"):
        a, b = pd.read_parquet(resumed / name), pd.read_parquet(reference / name)
        keep = [c for c in b.columns if not _timing(c)]
        assert [c for c in a.columns if not _timing(c)] == keep, name
        assert len(a) == len(b), f"{name}: {len(a)} rows, the uninterrupted run has {len(b)}"
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True, obj=name)
    for name in ("ledger.json", "config.yaml", "ledger_log.jsonl"):
        assert (resumed / name).read_text() == (reference / name).read_text(), name
    got, want = (json.loads((d / "summary.json").read_text()) for d in (resumed, reference))
    assert {k: v for k, v in got.items() if k not in HOW_IT_RAN} == {
        k: v for k, v in want.items() if k not in HOW_IT_RAN
    }
    a_model = torch.load(resumed / "model.pt", weights_only=True)
    b_model = torch.load(reference / "model.pt", weights_only=True)
    assert a_model.keys() == b_model.keys()
    for key in b_model:
        assert torch.equal(a_model[key], b_model[key]), key
    leftovers = {"clients.parts", "error.log"} & {p.name for p in resumed.iterdir()}
    assert leftovers <= {"error.log"}, leftovers
