"""Every privacy unit's ε as one array, kept current from the charged units only.

The server reports ε max and mean over all N clients every round. Recomputing every
client's ε for that (a Python call per client, most of them never charged) made the
server's round cost grow with N rather than with the cohort (issue 19: ~75% of a round
at 100,000 clients). `EpsilonStats` holds the N values in one float64 array instead:

- a unit's ε changes only when it is charged, so after a batch of charges only the
  charged units are re-read from the ledger (`update`), whose ε the ledger has just
  computed and cached (one accountant evaluation per distinct charge history: the
  accountants memoise on the history, so a cohort that shares one history costs one);
- the maximum is maintained from the updated values (ε never decreases under a charge;
  if a value ever did, the maximum is recomputed from the array, so it stays exact), with
  the first index holding it (``np.argmax``'s choice);
- the mean is ``array.mean()``: one vectorised pass (about a millisecond at a million
  clients, no Python per client), so the reported figure has exactly the bits of the
  full recomputation ``np.mean([ledger.epsilon(c) for c in range(N)])`` it replaces.

A unit never charged has ε 0 (empty history). A client-level ledger (one population
unit whose ε is every client's) fills the whole array with its ε. The statistics check
themselves against the ledger: if the ledger object or its number of charges is not the
one they were last brought up to date with (a charge the caller did not report, a ledger
rebuilt on resume), they are rebuilt from the ledger. This module imports neither torch
nor ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from raydpfl.privacy.accounting.client_level import ClientLevelLedger

__all__ = ["EpsilonStats"]


class EpsilonStats:
    """ε of units ``0 .. num_units - 1`` of `ledger`, with their max and mean.

    Args:
        ledger: A `PrivacyLedger` or `ClientLevelLedger`.
        num_units: N, the number of clients.
    """

    def __init__(self, ledger: Any, num_units: int) -> None:
        if int(num_units) < 0:
            raise ValueError(f"num_units must be >= 0, got {num_units!r}")
        self._n = int(num_units)
        self.ledger = ledger
        self._eps = np.zeros(self._n, dtype=np.float64)
        self._top = 0
        self._charges = -1
        self.rebuilds = 0  # how often the array was rebuilt from the ledger (diagnostics)
        self._rebuild()

    # ---- keeping current ---------------------------------------------------------------
    def _rebuild(self) -> None:
        """Re-reads every charged unit from the ledger (start, resume, or out of step)."""
        self.rebuilds += 1
        ledger = self.ledger
        self._eps[:] = 0.0
        if isinstance(ledger, ClientLevelLedger):
            self._eps[:] = ledger.epsilon()
        else:
            ids = np.fromiter(
                (c for c in ledger.charged_clients() if 0 <= c < self._n), dtype=np.int64
            )
            if ids.size:
                self._eps[ids] = ledger.epsilons(ids.tolist())
        self._top = int(np.argmax(self._eps)) if self._n else 0
        self._charges = ledger.num_charges

    def sync(self, ledger: Any | None = None) -> None:
        """Rebuilds if `ledger` (default: the current one) is not the one the statistics
        follow or has charges they were not told about."""
        if ledger is not None and ledger is not self.ledger:
            self.ledger = ledger
            self._rebuild()
        elif self.ledger.num_charges != self._charges:
            self._rebuild()

    def update(self, client_ids: Iterable[int], charges: int) -> None:
        """Re-reads the ε of `client_ids` after the caller charged them `charges` times.

        If the ledger holds other charges than those reported, everything is rebuilt.
        """
        ledger = self.ledger
        if ledger.num_charges != self._charges + charges:
            self._rebuild()
            return
        self._charges = ledger.num_charges
        if isinstance(ledger, ClientLevelLedger):
            self._eps[:] = ledger.epsilon()
            self._top = 0
            return
        ids = np.unique(np.fromiter(client_ids, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < self._n)]
        if not ids.size:
            return
        old_top_value = self._eps[self._top]
        new = np.asarray(ledger.epsilons(ids.tolist()), dtype=np.float64)
        if np.any(new < self._eps[ids]) and self._top in set(ids.tolist()):
            self._eps[ids] = new  # the maximum may have dropped: recompute it exactly
            self._top = int(np.argmax(self._eps))
            return
        self._eps[ids] = new
        best = int(np.argmax(new))  # first index of the largest new value (ids sorted)
        value = new[best]
        if value > old_top_value or (value == old_top_value and ids[best] < self._top):
            self._top = int(ids[best])

    # ---- the figures -------------------------------------------------------------------
    @property
    def values(self) -> np.ndarray:
        """The N epsilons (a read-only view)."""
        view = self._eps.view()
        view.flags.writeable = False
        return view

    def max(self) -> float:
        """Largest ε (0.0 for no units)."""
        return float(self._eps[self._top]) if self._n else 0.0

    def argmax(self) -> int:
        """The first unit holding the largest ε (``np.argmax`` of the array)."""
        return self._top

    def mean(self) -> float:
        """Mean ε over all N units (``array.mean()``, the full recomputation's bits)."""
        return float(self._eps.mean())
