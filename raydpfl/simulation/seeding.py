"""Deterministic RNG streams derived from (run seed, round, client, purpose).

Every random draw in a run comes from a stream named by where it is used. Streams
do not depend on how many workers run or in which order clients are trained, so a
run is reproducible on any backend. Purposes are hashed with CRC32 (stable across
Python processes, unlike ``hash``).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

#: Marks a stream that belongs to no round (model initialisation, partitioning).
NO_ROUND = -1
#: Marks a stream that belongs to no client (server-side draws such as cohort selection).
SERVER = -1


def derive_seed(run_seed: int, round_idx: int, client_id: int, purpose: str) -> int:
    """Returns a 63-bit seed for the stream (run_seed, round_idx, client_id, purpose).

    Args:
        run_seed: The run's seed (``runtime.seed``).
        round_idx: 0-based round, or ``NO_ROUND``.
        client_id: Client id, or ``SERVER``.
        purpose: What the stream is for, e.g. ``"train"``, ``"select"``, ``"init"``.
    """
    tag = zlib.crc32(purpose.encode("utf-8"))
    # SeedSequence mixes the entropy words thoroughly; +1 keeps the sentinels non-negative.
    seq = np.random.SeedSequence([int(run_seed), round_idx + 1, client_id + 1, tag])
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def numpy_rng(run_seed: int, round_idx: int, client_id: int, purpose: str) -> np.random.Generator:
    """A numpy Generator on the derived stream (see `derive_seed`)."""
    return np.random.default_rng(derive_seed(run_seed, round_idx, client_id, purpose))


def torch_generator(
    run_seed: int, round_idx: int, client_id: int, purpose: str, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A torch Generator on the derived stream (see `derive_seed`)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(run_seed, round_idx, client_id, purpose))
    return gen
