"""The `raydpfl run` progress bar: rounds, the latest test accuracy, the largest ε spent."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class Progress:
    """A tqdm bar over rounds.

    - It follows each row's round number, so a resumed run starts at its checkpoint round
      and rounds replayed after a server restart are not counted twice.
    - Its clock starts when the first round starts, not when the bar is drawn: starting
      Ray and the workers takes tens of seconds that would otherwise count as round 1
      (the rate and ETA would be wrong for the whole run). Each row says how long its
      round took (`wall_seconds`), so the clock is moved to the first round's start.
    - Rounds that are not evaluated (`eval_every` > 1) show the latest evaluated accuracy;
      before the first evaluation no accuracy is shown.
    """

    def __init__(self, total: int, enabled: bool, start: int = 0) -> None:
        self.bar: Any = None
        self.first = True
        self.last_acc = math.nan
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=start,
                desc="starting",
                unit="round",
                dynamic_ncols=True,
            )

    def update(self, row: Mapping[str, Any]) -> None:
        acc = row.get("test_accuracy")
        if isinstance(acc, (int, float)) and math.isfinite(acc):
            self.last_acc = float(acc)
        if self.bar is None:
            return
        if self.first:
            self.first = False
            self._start_clock_at_round_start(row)
            self.bar.set_description("rounds", refresh=False)
        self.bar.set_postfix(self.postfix(row), refresh=False)
        self.bar.update(max(0, int(row.get("round", self.bar.n + 1)) - self.bar.n))

    def postfix(self, row: Mapping[str, Any]) -> dict[str, str]:
        """The fields shown after the bar."""
        out = {}
        if math.isfinite(self.last_acc):
            out["acc"] = f"{self.last_acc:.4f}"
        eps = row.get("epsilon_max", math.inf)
        out["eps"] = "inf" if eps == math.inf else f"{eps:.3f}"
        return out

    def _start_clock_at_round_start(self, row: Mapping[str, Any]) -> None:
        seconds = row.get("wall_seconds")
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            return
        now = self.bar._time()
        # tqdm's rate: n / (now - start_t), smoothed over updates since last_print_t.
        self.bar.start_t = self.bar.last_print_t = now - float(seconds)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
