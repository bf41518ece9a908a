"""Experiment trackers as callbacks: TensorBoard, MLflow, Weights & Biases.

Each tracker is imported only when a run uses it, so none is a dependency of the package
(TensorBoard files are written with ``tensorboardX``, which Ray Tune already installs,
or with ``torch.utils.tensorboard`` when the ``tensorboard`` package is there).
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raydpfl.callbacks.base import Callback, RunInfo, numeric_metrics


class TensorBoardCallback(Callback):
    """Scalars per round (every numeric column of the row, step = round) and the config
    as text, in TensorBoard event files.

    Args:
        log_dir: Where the event files go; None: ``<run dir>/tensorboard``. A run that
            keeps no run directory (`run_simulation` without `run_dir`) refuses a
            callback without `log_dir` before any work, rather than write the files into
            a temporary directory and delete them.
    """

    def __init__(self, log_dir: str | Path | None = None) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer: Any = None

    def on_run_start(self, info: RunInfo) -> None:
        log_dir = self.log_dir
        if log_dir is None:
            if info.run_dir is None:
                raise ValueError(
                    "TensorBoardCallback: this run keeps no run directory to write event "
                    "files into; give the run a run_dir, or the callback a log_dir"
                )
            log_dir = info.run_dir / "tensorboard"
        self._writer = _summary_writer()(str(log_dir))
        self.log_dir = log_dir
        text = json.dumps(dict(info.config), indent=1, sort_keys=True, default=str)
        # Markdown code block: TensorBoard renders text summaries as Markdown.
        self._writer.add_text("config", "```\n" + text + "\n```", 0)
        self._writer.add_text("epsilon_unit", info.epsilon_unit, 0)

    def on_round_end(self, row: Mapping[str, Any]) -> None:
        step = int(row["round"])
        for key, value in numeric_metrics(row).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # a round is minutes of work: make it visible now

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _summary_writer() -> Callable[[str], Any]:
    """torch.utils.tensorboard's SummaryWriter if the tensorboard package is installed,
    else tensorboardX's (the same event-file format and API)."""
    if importlib.util.find_spec("tensorboard") is not None:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    from tensorboardX import SummaryWriter

    return SummaryWriter


class MLflowCallback(Callback):
    """One MLflow run per simulation: the flat config as params, the row's numeric
    columns as metrics per round (step = round), the summary's headline figures at the
    end. The tracking server is MLflow's own setting (``MLFLOW_TRACKING_URI``; default:
    a local store in the working directory).

    Args:
        experiment: The MLflow experiment; None: ``experiment.name`` of the config.
        tracking_uri: Overrides ``MLFLOW_TRACKING_URI``.
    """

    #: MLflow's log_batch takes at most 100 params per call.
    PARAMS_PER_BATCH = 100

    def __init__(self, experiment: str | None = None, tracking_uri: str | None = None) -> None:
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self._client: Any = None
        self.run_id: str | None = None
        self._entities: Any = None

    def on_run_start(self, info: RunInfo) -> None:
        from mlflow import entities
        from mlflow.tracking import MlflowClient

        self._entities = entities
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        name = self.experiment or info.name
        found = self._client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else None
        if experiment_id is None:
            experiment_id = self._client.create_experiment(name)
        tags = {"raydpfl.epsilon_unit": info.epsilon_unit, "raydpfl.resumed": str(info.resumed)}
        if info.run_dir is not None:
            tags["raydpfl.run_dir"] = str(info.run_dir)
        run_name = info.run_dir.name if info.run_dir is not None else info.name
        run = self._client.create_run(experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        params = [entities.Param(k, str(v)) for k, v in sorted(info.config.items())]
        for start in range(0, len(params), self.PARAMS_PER_BATCH):
            self._client.log_batch(
                self.run_id, params=params[start : start + self.PARAMS_PER_BATCH]
            )

    def on_round_end(self, row: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        step = int(row["round"])
        metrics = [self._entities.Metric(k, v, now, step) for k, v in numeric_metrics(row).items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def on_run_end(self, summary: Mapping[str, Any]) -> None:
        self._client.set_tag(self.run_id, "raydpfl.stop_reason", str(summary.get("stop_reason")))
        self._client.set_terminated(self.run_id, "FINISHED")
        self.run_id = None

    def close(self) -> None:
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id, "KILLED")  # ended by an error or signal
            self.run_id = None


class WandbCallback(Callback):
    """A Weights & Biases run: the flat config, the row's numeric columns per round
    (step = round) and the summary's numbers. Project and entity follow W&B's own
    settings (``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE=offline``).

    Args:
        project: Overrides ``WANDB_PROJECT`` (default: ``raydpfl``).
    """

    def __init__(self, project: str | None = None) -> None:
        self.project = project
        self._run: Any = None

    def on_run_start(self, info: RunInfo) -> None:
        import os

        import wandb

        self._run = wandb.init(
            project=self.project or os.environ.get("WANDB_PROJECT", "raydpfl"),
            name=info.run_dir.name if info.run_dir is not None else info.name,
            config=dict(info.config),
            dir=str(info.run_dir) if info.run_dir is not None else None,
            tags=[f"epsilon_unit:{info.epsilon_unit}"],
        )

    def on_round_end(self, row: Mapping[str, Any]) -> None:
        self._run.log(numeric_metrics(row), step=int(row["round"]))

    def on_run_end(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(numeric_metrics(summary))
        self._run.finish(exit_code=0)
        self._run = None

    def close(self) -> None:
        if self._run is not None:
            self._run.finish(exit_code=1)
            self._run = None


#: Callback names for ``runtime.callbacks``: (class, the module it needs).
CALLBACKS: dict[str, tuple[type[Callback], str]] = {
    "tensorboard": (TensorBoardCallback, "tensorboardX"),
    "mlflow": (MLflowCallback, "mlflow"),
    "wandb": (WandbCallback, "wandb"),
}


def parse_callback_names(text: str) -> list[str]:
    """``"tensorboard, mlflow"`` → ``["tensorboard", "mlflow"]`` (empty: none)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def check_callback_names(names: Sequence[str]) -> None:
    """Raises ValueError (one line) for an unknown name, a repeated one, or a tracker
    whose package is not installed."""
    seen = set()
    for name in names:
        if name not in CALLBACKS:
            raise ValueError(f"unknown callback {name!r}; allowed: {', '.join(CALLBACKS)}")
        if name in seen:
            raise ValueError(f"callback {name!r} is named twice")
        seen.add(name)
        module = CALLBACKS[name][1]
        needed = [module] if name != "tensorboard" else ["tensorboardX", "tensorboard"]
        if all(importlib.util.find_spec(m) is None for m in needed):
            raise ValueError(f"callback {name!r} needs the {module} package: pip install {module}")


def callbacks_from_names(names: Sequence[str]) -> list[Callback]:
    """One fresh callback per name (checked first)."""
    check_callback_names(names)
    return [CALLBACKS[name][0]() for name in names]
