"""Each trial's status as Tune last saw it, for the sweep's table.

A trial's run directory cannot tell a trial that ASHA stopped from one that was running
when the sweep was interrupted, nor (when its first attempt was set aside) one that never
started; Tune's trial status can. `TrialStatusRecorder` is a Tune callback that copies
the statuses after every step of Tune's loop into `LAST_SEEN`, a module-level table, so
the driver reads them after `fit()` whichever copy of the callback Tune ran (a restored
sweep unpickles its own). The copy is taken before Tune's clean-up, which marks every
trial it stops as terminated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ray.tune import Callback

#: trial key (its directory name) → Tune status (PENDING, RUNNING, PAUSED, TERMINATED,
#: ERROR) after the latest step of the latest sweep run in this process.
LAST_SEEN: dict[str, str] = {}


def _key(trial: Any) -> str:
    return str(getattr(trial, "custom_dirname", None) or trial.trial_id)


class TrialStatusRecorder(Callback):
    """Copies each trial's status into `LAST_SEEN` after every step of Tune's loop, and
    into the sweep's own state file (`raydpfl.tune.state.SweepState`), which `--resume`
    reads instead of Tune's pickled state."""

    def __init__(self, state: Any = None) -> None:
        self.state = state

    def setup(self, **info: Any) -> None:
        LAST_SEEN.clear()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        statuses = {_key(trial): trial.status for trial in trials}
        LAST_SEEN.update(statuses)
        if self.state is not None:
            self.state.set_statuses(statuses)


class SweepProgress(Callback):
    """Tells `on_progress` how far the sweep is, after each step in which it moved:
    ``{"done", "total", "running", "failed", "best"}`` (best: the best metric reported
    so far by any trial, None before the first)."""

    def __init__(self, on_progress: Callable[[Mapping[str, Any]], None], spec: Any, total: int):
        self.on_progress = on_progress
        self.metric, self.mode, self.total = spec.metric, spec.mode, total
        self.best: float | None = None
        self.last: tuple[Any, ...] | None = None

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any
    ) -> None:
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            better = self.best is None or (
                value > self.best if self.mode == "max" else value < self.best
            )
            if better:
                self.best = float(value)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
        running = sum(t.status == "RUNNING" for t in trials)
        failed = sum(t.status == "ERROR" for t in trials)
        now = (done, running, failed, self.best)
        if now != self.last:
            self.last = now
            self.on_progress(
                {
                    "done": done,
                    "total": self.total,
                    "running": running,
                    "failed": failed,
                    "best": self.best,
                    "metric": self.metric,
                }
            )


def sweep_status(
    tune_status: str | None, error: bool, completed: bool, ran: bool, interrupted: bool
) -> str:
    """The status a trial gets in results.parquet.

    completed: its run finished; error: it failed; stopped_early: the scheduler stopped
    it; interrupted: it was running when the sweep was interrupted (`--resume` continues
    it from its last checkpoint); not_started: it never ran (`--resume` starts it).
    """
    if error:
        return "error"
    if completed:
        return "completed"
    if tune_status in ("RUNNING", "PAUSED"):
        return "interrupted"
    if not ran:
        return "not_started"
    # Waiting to continue an earlier attempt (a resumed sweep interrupted again), or
    # unknown to the callback while the sweep was interrupted: the files say it ran.
    if tune_status == "PENDING" or (tune_status is None and interrupted):
        return "interrupted"
    return "stopped_early"
