"""Where each row of the record can be reproduced from: its commit, and whether that
commit holds the script that made it.

A row's ``commit`` ending in ``+dirty`` was made from an uncommitted tree: no commit
reproduces it. A row whose command names a script (``python <path> ...``) that its commit
does not contain was made by code committed later (or never): it is not reproducible from
the commit it names either. Both are flagged in every table and kept out of the headline
means. The facts that need git (which scripts each commit holds) are kept in
benchmarks/repro/provenance.json, written by ``record.py --provenance`` from the
repository's history, so that REPRODUCTION.md depends on the committed files only;
provenance.json also lists the dirty rows the record accepted (by digest): a new dirty row
is refused by ``record.py`` unless ``--accept-dirty`` is given.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROVENANCE = HERE / "provenance.json"
ABOUT = (
    "Provenance facts for the reproduction record, written by `python "
    "benchmarks/repro/record.py --provenance` (git) and `--accept-dirty`: script_absent "
    "lists '<commit>:<script>' pairs where a row names a commit that does not contain the "
    "script its command ran; accepted_dirty lists the digests of the +dirty rows the record "
    "accepted (any other dirty row is refused)."
)


def is_dirty(row: dict[str, Any]) -> bool:
    return str(row.get("commit") or "").endswith("+dirty")


def base_commit(row: dict[str, Any]) -> str | None:
    commit = row.get("commit")
    return str(commit).removesuffix("+dirty") if commit else None


def script_of(row: dict[str, Any]) -> str | None:
    """The script a row's command ran (``python <script> ...``), relative to the root."""
    command = row.get("command")
    if not command:
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) >= 2 and argv[0].startswith("python") and argv[1].endswith(".py"):
        return argv[1]
    return None


def pair(row: dict[str, Any]) -> str | None:
    """``"<commit>:<script>"`` for a row that names both, else None."""
    commit, script = base_commit(row), script_of(row)
    return f"{commit}:{script}" if commit and script and commit != "unknown" else None


def digest(row: dict[str, Any]) -> str:
    """A short, stable name of one row (its whole content)."""
    text = json.dumps(row, sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def load(path: Path = PROVENANCE) -> dict[str, Any]:
    if not path.exists():
        return {"_about": ABOUT, "script_absent": [], "accepted_dirty": []}
    return json.loads(path.read_text(encoding="utf-8"))


def save(doc: dict[str, Any], path: Path = PROVENANCE) -> None:
    doc = {
        "_about": ABOUT,
        "script_absent": sorted(set(doc.get("script_absent", []))),
        "accepted_dirty": sorted(set(doc.get("accepted_dirty", []))),
    }
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def commit_has(repo: Path, commit: str, script: str) -> bool | None:
    """Whether `commit` holds `script` (None: the commit is not in `repo`'s history)."""

    def ok(*args: str) -> bool:
        return (
            subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False).returncode
            == 0
        )

    if not ok("cat-file", "-e", f"{commit}^{{commit}}"):
        return None
    return ok("cat-file", "-e", f"{commit}:{script}")


def absent_scripts(rows: list[dict[str, Any]], repo: Path) -> tuple[list[str], list[str]]:
    """(pairs whose commit lacks the script, pairs whose commit git does not know)."""
    absent, unknown = [], []
    for p in sorted({p for r in rows if (p := pair(r))}):
        commit, script = p.split(":", 1)
        has = commit_has(repo, commit, script)
        if has is None:
            unknown.append(p)
        elif not has:
            absent.append(p)
    return absent, unknown


def unaccepted_dirty(rows: list[dict[str, Any]], doc: dict[str, Any]) -> list[dict[str, Any]]:
    accepted = set(doc.get("accepted_dirty", []))
    return [r for r in rows if is_dirty(r) and digest(r) not in accepted]


def reproducible(row: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Whether the commit a row names reproduces it: clean, and holding its script."""
    return not is_dirty(row) and pair(row) not in set(doc.get("script_absent", []))
