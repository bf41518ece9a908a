"""Which config keys a resume may change: only those that cannot change the results.

A resumed run must end with the same model and ledger as an uninterrupted one, and its
ledger carries on from the charges already made to the same clients holding the same
records. So every key that reaches the data, the partition, the model, the algorithm, the
privacy settings, the random streams or the floating-point order of the computation is
fixed once the run has started. What is left is where and how the run is hosted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from raydpfl.config.schema import Config, ConfigError

#: Keys `raydpfl run --resume DIR --set KEY=VALUE` may change. Not in it, because they can
#: change results: `runtime.seed` (with `data.seed: null` it also regenerates the data and
#: the partition), `aggregation_groups` (the order of the float sums), `cpus_per_worker`
#: and `threads` (torch threads change float reduction order), `device`,
#: `gpus_per_worker` (with `device: auto` it decides the device), `engine` and
#: `vectorise_clients` (equal only up to float rounding).
RESUME_SAFE_KEYS: tuple[str, ...] = (
    "runtime.backend",
    "runtime.address",
    "runtime.workers",
    "runtime.round_timeout_s",
    "runtime.max_restarts",
    "runtime.output",
    "runtime.checkpoint_every",
    "runtime.progress",
    "runtime.callbacks",
)


def flatten(config: Config) -> dict[str, Any]:
    """Dotted key → value over the whole config tree."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(dataclasses.asdict(config), "")
    return out


def resume_differences(saved: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every key outside `RESUME_SAFE_KEYS` that differs."""
    a, b = flatten(saved), flatten(new)
    return [
        (key, a.get(key), b.get(key))
        for key in sorted(set(a) | set(b))
        if key not in RESUME_SAFE_KEYS and a.get(key) != b.get(key)
    ]


def check_resume_config(saved: Config, new: Config) -> None:
    """Raises `ConfigError` naming the first result-changing key where `new` differs.

    Args:
        saved: The config the run started with (its run directory's config.yaml).
        new: The config the resume would run with (overrides applied).
    """
    diffs = resume_differences(saved, new)
    if not diffs:
        return
    key, old, value = diffs[0]
    more = (
        f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])})"
        if len(diffs) > 1
        else ""
    )
    safe = ", ".join(k.split(".", 1)[1] for k in RESUME_SAFE_KEYS)
    raise ConfigError(
        key,
        f"is {old!r} in the run's config.yaml, {value!r} here{more}: a resume must not change "
        f"results; only runtime.{{{safe}}} may change",
    )
