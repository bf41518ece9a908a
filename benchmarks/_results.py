"""Where the small benchmark scripts write their JSON: benchmarks/results/<name>-<UTC>.json."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def write_result(root: Path, name: str, record: dict[str, Any]) -> Path:
    """Writes `record` to `root`/benchmarks/results/`name`-<UTC stamp>.json, says so, and
    returns the path."""
    results = root / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = results / f"{name}-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path.relative_to(root)}")
    return path
