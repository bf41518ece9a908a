"""Every output of an interrupted and resumed run equals an uninterrupted run's, on both
backends, for each way a run can stop in order: Ctrl-C (KeyboardInterrupt), SIGTERM (the
CLI's `_Terminated`) and a failure that exits 1 (a lost worker). Real signals on a real
process: tests/cli/test_interrupt.py. The stop is raised where the CLI learns of a
finished round (the progress bar's update, in the driver on both backends), which is
where a signal lands while the server waits for the next round: the run then closes
its outputs in order, as it does after a signal.

Before: closing an interrupted run merged its per-round client files into
clients.parquet and deleted them, and the resume deleted clients.parquet as a stale
output: 600 of 900 rows came back. The hashes (model, ledger) did not cover it.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from raydpfl.cli import main as cli
from raydpfl.cli.main import main
from raydpfl.cli.progress import Progress
from raydpfl.simulation.backend import WorkerLostError
from tests.run_outputs import assert_same_outputs

RAW = {
    "experiment": {
        "name": "resume-outputs",
        "data": {"dataset": "digits", "num_clients": 5, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "hidden": 8},
        "algorithm": {
            "name": "dp_fedavg",
            "rounds": 7,
            "clients_per_round": 5,
            "local_steps": 2,
            "lr": 0.5,
            "eval_every": 1,
            "evaluate_clients": True,
        },
        "privacy": {"epsilon": 50.0, "delta": 1e-4, "noise_multiplier": 1.0},
    },
    "runtime": {"backend": "local", "seed": 3, "progress": False, "checkpoint_every": 2},
}

STOPS = {
    "sigint": (KeyboardInterrupt, 130),
    "sigterm": (cli._Terminated, 143),
    "exit-1 failure": (lambda: WorkerLostError("a client worker died (injected)"), 1),
}


def _stop_after(monkeypatch, round_no: int, error) -> None:
    """Raise `error()` once the CLI has been told of round `round_no`."""
    update = Progress.update

    def update_then_stop(self, row):
        update(self, row)
        if int(row["round"]) == round_no:
            raise error()

    monkeypatch.setattr(Progress, "update", update_then_stop)


def _config(tmp_path, backend: str):
    raw = json.loads(json.dumps(RAW))
    raw["runtime"]["backend"] = backend
    if backend == "ray":
        raw["runtime"].update({"workers": 1, "cpus_per_worker": 1})
    path = tmp_path / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _interrupt_resume_compare(tmp_path, monkeypatch, backend: str, stops) -> None:
    config = _config(tmp_path, backend)
    reference = tmp_path / "reference"
    assert main(["run", str(config), "--out", str(reference), "--no-progress"]) == 0
    for name in stops:
        error, code = STOPS[name]
        run_dir = tmp_path / name.replace(" ", "-")
        with monkeypatch.context() as patch:
            _stop_after(patch, 5, error)  # after the checkpoint of round 4, before round 6
            assert main(["run", str(config), "--out", str(run_dir), "--no-progress"]) == code
        assert not (run_dir / "summary.json").exists()
        assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
        assert json.loads((run_dir / "summary.json").read_text())["resumed_from_round"] == 4
        assert_same_outputs(run_dir, reference)
        shutil.rmtree(run_dir)


@pytest.mark.slow  # four local runs of 7 rounds: ~15 s on 2 cores
def test_every_output_survives_an_interruption_and_resume_locally(tmp_path, monkeypatch):
    _interrupt_resume_compare(tmp_path, monkeypatch, "local", list(STOPS))


def test_clients_parquet_keeps_the_rounds_before_the_checkpoint(tmp_path, monkeypatch):
    # The fast one, for the everyday subset: Ctrl-C, the local backend.
    _interrupt_resume_compare(tmp_path, monkeypatch, "local", ["sigint"])


# On Ray: tests/backends/test_ray_refusals.py (it needs the Ray session fixture).
