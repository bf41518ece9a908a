"""Ctrl-C and SIGTERM during a sweep: Ray Tune's own graceful stop, told in our words.

Tune already knows how to stop well: it leaves its trial loop, saves the experiment state
(with the running trials still marked unfinished, so `--resume` continues them) and
stops the trials. But it reacts only to SIGINT (and SIGUSR1), logs `Tuner.restore(...)`
as the way back, and returns as if the sweep had finished. `SweepInterrupt`:

- takes SIGINT and SIGTERM itself (Tune's SIGINT handler is switched off with its
  documented `TUNE_DISABLE_SIGINT_HANDLER`), remembers which came, and asks Tune to stop
  through the handler Tune registers for SIGUSR1 (the same function as its SIGINT one);
- stops at once on a second signal, or when Tune's loop is not running yet (Ray is still
  starting: there is nothing to save);
- keeps Tune's own resume hint and its "trials did not complete" error off the terminal:
  the CLI prints the `raydpfl tune --resume` command instead.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import Any

#: Tune's log lines that `raydpfl tune` replaces with its own words (or, for the last
#: one, that warn about what the sweep does on purpose: see `sweep._search`).
_TUNE_LINES = (
    "Tuner.restore(",
    "Trials did not complete",
    "Stop signal received",
    "`max_concurrent_trials` will be ignored",
)


class SweepInterrupted(KeyboardInterrupt):
    """The sweep was stopped at once (a second signal, or before Tune's loop ran)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _DropTuneLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in _TUNE_LINES)


class SweepInterrupt:
    """Context manager around `Tuner.fit()`; `record` says what stopped the sweep."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.at: str | None = None
        self._previous: dict[int, Any] = {}
        self._usr1_before: Any = None
        self._env: str | None = None
        self._filter = _DropTuneLines()

    def __enter__(self) -> SweepInterrupt:
        logging.getLogger("ray.tune.tune").addFilter(self._filter)
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only; Tune's defaults apply
        self._env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        self._usr1_before = signal.getsignal(signal.SIGUSR1)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("ray.tune.tune").removeFilter(self._filter)
        if not self._previous:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        # Tune leaves its SIGUSR1 handler behind after fit(); it would act on a dead loop.
        signal.signal(signal.SIGUSR1, self._usr1_before)
        if self._env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = self._env
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            raise SweepInterrupted(signum)  # asked twice: stop without saving
        self.signal = signal.Signals(signum).name
        self.at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if not callable(tune_stop) or tune_stop is self._usr1_before:
            raise SweepInterrupted(signum)  # Tune's loop has not started
        print(
            f"raydpfl: {self.signal} received: stopping the sweep after saving its state "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        tune_stop(signal.SIGUSR1, frame)

    def record(self) -> dict[str, Any] | None:
        """What `sweep_summary.json` says about the interruption (None: there was none)."""
        if self.signal is None:
            return None
        return {"signal": self.signal, "at": self.at}
