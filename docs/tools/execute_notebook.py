"""Re-executes docs/tutorial.ipynb in place, so the committed notebook shows its outputs.

    pip install -e ".[docs]"
    python docs/tools/execute_notebook.py [--timeout 600]

It runs in a temporary folder (the run directories it writes are thrown away) with the
repository's `configs/` linked in, on a fresh kernel, cell by cell, and stops at the
first cell that raises. tests/test_docs.py runs the same cells (without a kernel) and
checks that every code cell of the committed file has been executed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "configs").symlink_to(ROOT / "configs")
        NotebookClient(
            nb, timeout=args.timeout, kernel_name="python3", resources={"metadata": {"path": tmp}}
        ).execute()
    for cell in nb.cells:  # outputs only; the run's own metadata would churn every commit
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, NOTEBOOK)
    print(f"executed {NOTEBOOK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
