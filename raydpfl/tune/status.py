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

from typing import Any

from ray.tune import Callback

#: trial id → Tune status (PENDING, RUNNING, PAUSED, TERMINATED, ERROR) after the latest
#: step of the latest sweep run in this process.
LAST_SEEN: dict[str, str] = {}


class TrialStatusRecorder(Callback):
    """Copies each trial's status into `LAST_SEEN` after every step of Tune's loop."""

    def setup(self, **info: Any) -> None:
        LAST_SEEN.clear()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        for trial in trials:
            LAST_SEEN[trial.trial_id] = trial.status


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
