"""The Python API: `raydpfl.run_simulation` with configs and with the user's own objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import raydpfl
from raydpfl.algorithms import DPFedAvg, FedAvg
from raydpfl.cli.main import main
from raydpfl.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
FAST = [
    "runtime.backend=local",
    "algorithm.rounds=2",
    "data.num_clients=8",
    "algorithm.clients_per_round=3",
]
DIGITS = {
    "experiment": {
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "algorithm": {"rounds": 2, "clients_per_round": 3, "eval_every": 2},
        "privacy": {"epsilon": 8.0, "delta": 1e-4, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local", "seed": 0, "progress": False},
}


def test_the_api_and_the_cli_run_the_same_simulation(tmp_path):
    result = raydpfl.run_simulation(QUICKSTART, overrides=FAST)
    out = tmp_path / "cli"
    cli_args = [a for o in FAST for a in ("--set", o)]
    assert main(["run", str(QUICKSTART), *cli_args, "--out", str(out), "--no-progress"]) == 0

    cli = json.loads((out / "summary.json").read_text())
    assert result.model_sha256 == cli["model_sha256"]
    assert result.summary["ledger_sha256"] == cli["ledger_sha256"]
    assert result.run_dir is None and "run_dir" not in result.summary
    assert result.history.num_rows == 2
    assert result.history.column("round").to_pylist() == [1, 2]
    assert result.ledger is not None and result.ledger.sha256() == cli["ledger_sha256"]
    assert result.epsilon == pytest.approx(cli["epsilon_max"])
    saved = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.equal(result.params[n], saved[n]) for n in saved)


def test_a_run_dir_is_kept_and_refused_when_not_empty(tmp_path):
    run_dir = tmp_path / "run"
    result = raydpfl.run_simulation(QUICKSTART, overrides=FAST, run_dir=run_dir)
    assert result.run_dir == run_dir and (run_dir / "summary.json").exists()
    with pytest.raises(FileExistsError, match="not empty"):
        raydpfl.run_simulation(QUICKSTART, overrides=FAST, run_dir=run_dir)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _dp_fedavg(**kw) -> DPFedAvg:
    args = dict(
        clients_per_round=3,
        local_steps=2,
        lr=0.5,
        clip_norm=1.0,
        noise_multiplier=1.0,
        sampling_rate=0.2,
    )
    return DPFedAvg(**{**args, **kw})


def test_a_user_model_and_algorithm_run_and_are_charged(tmp_path):
    result = raydpfl.run_simulation(DIGITS, model=TinyNet, algorithm=_dp_fedavg())
    assert set(result.params) == {"fc.weight", "fc.bias"}  # the user's model, not the zoo's
    assert result.summary["algorithm"] == "dp_fedavg"
    assert result.summary["epsilon_unit"] == "record"
    assert 0 < result.epsilon <= 8.0
    # Same objects, same seed: the same model.
    again = raydpfl.run_simulation(DIGITS, model=TinyNet, algorithm=_dp_fedavg())
    assert again.model_sha256 == result.model_sha256
    # A non-private user algorithm gets no ledger and reports epsilon as infinite.
    plain = raydpfl.run_simulation(
        DIGITS,
        model=TinyNet,
        algorithm=FedAvg(clients_per_round=3, local_steps=2, lr=0.5, batch_size=16),
    )
    assert plain.ledger is None and plain.summary["private"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": 3}, r"^config: must be a raydpfl.config.Config, a mapping"),
        ({"overrides": "runtime.seed=1"}, r"^overrides: must be a list"),
        ({"algorithm": DPFedAvg}, r"^algorithm: must be a .*Algorithm instance \(an instance"),
        ({"model": nn.Linear(64, 10)}, None),  # a Module instance is callable: see below
        ({"model": 5}, r"^model: must be a callable with no arguments"),
        ({"model": lambda: "not a module"}, r"^model: the factory .* must return a torch"),
        ({"dataset": [1, 2]}, r"^dataset: must be a raydpfl.data.FederatedDataset"),
        ({"run_dir": None, "overrides": ["runtime.seed=x"]}, r"^runtime\.seed: must be an int"),
    ],
)
def test_bad_arguments_are_one_clear_error_naming_the_argument(kwargs, message):
    kwargs = {"config": DIGITS, **kwargs}
    if message is None:  # calling a Module instance runs forward(): refused as not a factory
        with pytest.raises(ConfigError, match=r"^model: "):
            raydpfl.run_simulation(**kwargs)
        return
    with pytest.raises(ConfigError, match=message):
        raydpfl.run_simulation(**kwargs)


def test_importing_raydpfl_stays_cheap():
    code = "import sys, raydpfl; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert callable(raydpfl.run_simulation)


@pytest.mark.ray
@pytest.mark.slow
def test_the_worked_example_gives_one_model_hash_on_local_and_on_ray():
    """examples/: a new DP algorithm and model in one file, run on both backends."""
    example = ROOT / "examples" / "dp_fedavg_server_momentum.py"
    assert len(example.read_text().splitlines()) <= 150
    out = subprocess.run(
        [sys.executable, str(example)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if "model " in line]
    assert [line.split(":")[0].strip() for line in lines] == ["local", "ray"]
    hashes = {line.rsplit("model ", 1)[1] for line in lines}
    assert len(hashes) == 1, out.stdout


def test_every_public_name_resolves_and_importing_stays_cheap():
    """`import raydpfl` exposes the run API, the algorithm contract and the privacy kernel
    by name; each resolves to the object of the module it names, on first access."""
    import importlib
    import subprocess
    import sys

    import raydpfl

    for name, module in raydpfl._EXPORTS.items():
        assert getattr(raydpfl, name) is getattr(importlib.import_module(module), name), name
    assert {"Algorithm", "ClientTask", "SubsampledGaussian", "uses"} <= set(dir(raydpfl))
    probe = "import raydpfl, sys; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_an_unknown_algorithm_name_hints_at_plugins_and_hf_loader_is_exported():
    """A plug-in's name without its file loaded is refused with a hint how to load it;
    the Hugging Face loader is on `raydpfl.data` beside the other loaders."""
    from raydpfl.config import ConfigError, config_from_dict
    from raydpfl.data import load_hf_dataset
    from raydpfl.data.hf import load_hf_dataset as direct

    assert load_hf_dataset is direct
    with pytest.raises(ConfigError, match=r"got 'my_algo' \(your own algorithm\? .*--plugin FILE"):
        config_from_dict({"experiment": {"algorithm": {"name": "my_algo"}}})
