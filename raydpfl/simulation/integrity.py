"""What makes a resumed run trustworthy: a hash-chained charge log, hashed checkpoints and
the ledger rebuilt from the log.

A resume continues a run from files on disk, so those files decide the ε it reports. Three
checks keep a damaged or edited file from turning into a wrong model or an under-reported ε:

- **The charge log is hash-chained.** Each line of ``ledger_log.jsonl`` carries
  ``chain = sha256(previous chain + "\\n" + canonical JSON of the line's round and
  charges)``, starting from `GENESIS`. An edited, removed or reordered line breaks the
  chain; a truncated log no longer reaches the chain value the checkpoint recorded.
- **Every checkpoint file is hashed.** ``checkpoint/manifest.json`` is written last
  (atomically, after the files it names are synced) and lists the sha256 of the run's
  ``config.yaml`` and of each checkpoint file; it is the checkpoint's commit point.
- **The ledger is rebuilt from the log** (the record of what was charged before dispatch)
  and must equal the checkpoint's copy exactly.

These catch accidents, crashes and hand edits. They are not a defence against someone who
rewrites the files *and* recomputes every hash (there is no secret key).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydpfl.privacy.accounting.client_level import ClientLevelLedger
from raydpfl.privacy.accounting.ledger import PrivacyCost, PrivacyLedger

#: The chain value before the first line of a charge log.
GENESIS = hashlib.sha256(b"raydpfl ledger_log v1").hexdigest()
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2


class ResumeError(ValueError):
    """A run directory that cannot be resumed safely (damaged, edited or incomplete)."""


class ResumeDivergedError(ResumeError, RuntimeError):
    """A replayed round made other charges than ledger_log.jsonl holds for it (a log edited
    and re-chained, other code or hardware): a `ResumeError` (one line, exit 2), and a
    RuntimeError as it always was."""


# ---- the charge log ------------------------------------------------------------------------
@dataclass(frozen=True)
class ChargeBatch:
    """One line of the charge log: the charges of one dispatch, in order."""

    round: int
    charges: list[list[Any]]  # [[client_id, PrivacyCost.to_dict()], ...]
    chain: str


def next_chain(previous: str, round_idx: int, charges: Sequence[Sequence[Any]]) -> str:
    """The chain value after a line holding `charges` of round `round_idx`."""
    body = json.dumps(
        {"round": int(round_idx), "charges": [list(c) for c in charges]},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(f"{previous}\n{body}".encode()).hexdigest()


def charge_log_line(previous: str, round_idx: int, charges: Sequence[Sequence[Any]]) -> str:
    """The JSON line (no newline) that appends `charges` after chain value `previous`."""
    charges = [[int(c), dict(d)] for c, d in charges]
    chain = next_chain(previous, round_idx, charges)
    return json.dumps({"round": int(round_idx), "charges": charges, "chain": chain})


def read_chained_log(path: Path) -> tuple[list[ChargeBatch], int]:
    """The verified batches of the charge log at `path`, and the byte length they span.

    A last line without its newline is what a crash mid-write leaves (the charge was never
    synced, so its tasks were never dispatched): it is not returned, and the caller may cut
    the file back to the returned length. Anything else that does not parse or does not
    continue the chain raises `ResumeError` naming the line.
    """
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    batches: list[ChargeBatch] = []
    chain, offset = GENESIS, 0
    for number, raw in enumerate(data.splitlines(keepends=True), start=1):
        if not raw.endswith(b"\n"):
            break  # cut short by a crash: never synced, never dispatched
        try:
            entry = json.loads(raw)
            batch = ChargeBatch(int(entry["round"]), entry["charges"], str(entry["chain"]))
        except (ValueError, KeyError, TypeError):
            raise ResumeError(
                f"{path.name} line {number} is not a charge record (damaged or edited); "
                "the log is the record of what was charged, so the run cannot be resumed"
            ) from None
        chain = next_chain(chain, batch.round, batch.charges)
        if batch.chain != chain:
            raise ResumeError(
                f"{path.name} line {number} breaks the log's hash chain (a line was edited, "
                "removed or reordered); the run cannot be resumed"
            )
        batches.append(batch)
        offset += len(raw)
    return batches, offset


def rebuild_ledger(
    template: PrivacyLedger | ClientLevelLedger, batches: Sequence[ChargeBatch]
) -> PrivacyLedger | ClientLevelLedger:
    """A ledger with `template`'s settings holding exactly the charges in `batches`.

    Charges are recorded as logged, without re-checking budgets: the log is the record of
    what was charged (each charge was checked against the budget before it was logged).
    A client-level run's `ClientLevelLedger` is rebuilt the same way, its population's
    charges logged under its one unit id.
    """
    ledger_type = type(template)
    parse_cost = (
        ClientLevelLedger.cost_from_dict
        if isinstance(template, ClientLevelLedger)
        else PrivacyCost.from_dict
    )
    snapshot = template.to_dict()
    clients: dict[int, list[dict[str, Any]]] = {}
    for batch in batches:
        for client_id, cost in batch.charges:
            parse_cost(cost)  # a malformed cost fails here, naming the field
            clients.setdefault(int(client_id), []).append(dict(cost))
    snapshot["clients"] = [
        {"client_id": cid, "entries": entries} for cid, entries in sorted(clients.items())
    ]
    return ledger_type.from_dict(snapshot)


def check_row_epsilons(
    template: PrivacyLedger | ClientLevelLedger | None,
    batches: Sequence[ChargeBatch],
    rows: Sequence[Mapping[str, Any]],
    num_units: int,
) -> None:
    """Checks the ε columns of the checkpoint's rows (what rounds.parquet reports for the
    rounds before the checkpoint) against the charge log: the charges of `batches` are
    replayed round by round into a fresh ledger with `template`'s settings, and after
    each row's round its ``epsilon_max`` and ``epsilon_mean`` must be the ε statistics
    the server would have reported (`EpsilonStats`). A non-private run's rows must report
    ε = inf. One accountant evaluation per charged client per round, at most: the
    accounting the original run did.

    Raises:
        ResumeError: The first round whose row disagrees (named, with both values).
    """
    from raydpfl.privacy.accounting.ledger_stats import EpsilonStats

    columns = ("epsilon_max", "epsilon_mean")
    if template is None:
        for row in rows:
            for key in columns:
                value = row.get(key)
                if not (isinstance(value, float) and math.isinf(value) and value > 0):
                    raise ResumeError(
                        f"the checkpoint's row of round {row.get('round')} reports {key}="
                        f"{value!r}, but the run is not private (inf); the run is not resumed"
                    )
        return
    ledger = rebuild_ledger(template, [])
    parse_cost = (
        ClientLevelLedger.cost_from_dict
        if isinstance(ledger, ClientLevelLedger)
        else PrivacyCost.from_dict
    )
    stats = EpsilonStats(ledger, num_units)
    pending = list(batches)
    for row in rows:
        round_idx = int(row["round"]) - 1
        charged: list[int] = []
        while pending and pending[0].round <= round_idx:
            for client_id, cost in pending.pop(0).charges:
                try:
                    ledger.charge(int(client_id), parse_cost(cost))
                except ValueError as e:  # over its budget: not what the run charged
                    raise ResumeError(
                        f"ledger_log.jsonl's charges of round {round_idx + 1} do not replay "
                        f"({e}); the run is not resumed"
                    ) from None
                charged.append(int(client_id))
        stats.update(charged, len(charged))
        for key, want in (("epsilon_max", stats.max()), ("epsilon_mean", stats.mean())):
            value = row.get(key)
            if not isinstance(value, (int, float)) or not math.isclose(
                float(value), float(want), rel_tol=1e-9, abs_tol=1e-12
            ):
                raise ResumeError(
                    f"the checkpoint's row of round {round_idx + 1} reports {key}={value!r}, "
                    f"but ledger_log.jsonl's charges give {float(want)!r}: the rows would "
                    "misreport the privacy spent, so the run is not resumed"
                )


def first_ledger_difference(logged: Mapping[str, Any], saved: Mapping[str, Any]) -> str | None:
    """Where two `PrivacyLedger.to_dict()` snapshots differ, in words (None: equal)."""
    for key in sorted(set(logged) | set(saved)):
        if key != "clients" and logged.get(key) != saved.get(key):
            return f"its setting {key!r} ({saved.get(key)!r} in the checkpoint)"
    charged = {c["client_id"]: c["entries"] for c in logged.get("clients", [])}
    recorded = {c["client_id"]: c["entries"] for c in saved.get("clients", [])}
    for cid in sorted(set(charged) | set(recorded)):
        a, b = charged.get(cid, []), recorded.get(cid, [])
        if a != b:
            steps_a = sum(int(e.get("steps", 0)) for e in a)
            steps_b = sum(int(e.get("steps", 0)) for e in b)
            return (
                f"client {cid}: {len(a)} charges ({steps_a} steps) in the log, "
                f"{len(b)} ({steps_b} steps) in the checkpoint"
            )
    return None


# ---- the checkpoint manifest -----------------------------------------------------------------
def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sync_file(path: Path) -> None:
    """Flushes a written file to disk (a manifest must never name bytes still in flight)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(
    run_dir: Path, rounds_completed: int, state_file: str, files: Sequence[str]
) -> None:
    """Hashes `files` (paths relative to `run_dir`), then atomically writes the manifest."""
    for rel in files:
        sync_file(run_dir / rel)
    manifest = {
        "format": MANIFEST_FORMAT,
        "rounds_completed": int(rounds_completed),
        "state_file": state_file,
        "files": {rel: file_sha256(run_dir / rel) for rel in files},
    }
    path = run_dir / "checkpoint" / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The verified manifest: every file it names exists and has its recorded sha256.

    Raises:
        FileNotFoundError: The run has no checkpoint.
        ResumeError: A checkpoint from before manifests existed, a damaged manifest, a
            missing file, or a file whose bytes changed (named in the message).
    """
    ckpt = run_dir / "checkpoint"
    path = ckpt / MANIFEST
    if not path.is_file():
        if (ckpt / "state.json").is_file():
            raise ResumeError(
                f"{ckpt} was written by an older raydpfl, without checksums; it cannot be "
                "verified, so it is not resumed (start the run again)"
            )
        raise FileNotFoundError(
            f"{run_dir} has no checkpoint (checkpoint/{MANIFEST}): runtime.checkpoint_every "
            "was null, or the run stopped before writing one"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = dict(manifest["files"])
        manifest["state_file"], int(manifest["rounds_completed"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ResumeError(f"{path} is damaged; the checkpoint cannot be verified") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ResumeError(f"{path}: unknown manifest format {manifest.get('format')!r}")
    for rel, expected in files.items():
        target = run_dir / rel
        if not target.is_file():
            raise ResumeError(f"checkpoint file {rel} is missing; refusing to resume")
        if file_sha256(target) != expected:
            raise ResumeError(
                f"{rel} does not match its sha256 in checkpoint/{MANIFEST} (changed or "
                "damaged since the checkpoint); refusing to resume"
            )
    return manifest


def has_checkpoint(run_dir: Path) -> bool:
    """Whether `run_dir` holds a checkpoint (verified only when it is read)."""
    ckpt = Path(run_dir) / "checkpoint"
    return (ckpt / MANIFEST).is_file() or (ckpt / "state.json").is_file()
