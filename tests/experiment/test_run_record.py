"""config.yaml and summary.json say what ran: an algorithm or model given from Python is
recorded by its name and actual parameters, or marked as a Python object; a start
refused before training leaves a directory that the same --out accepts again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import raydpfl
from raydpfl import registry
from raydpfl.algorithms import DPFedAvg
from raydpfl.callbacks import Callback
from raydpfl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = {
    "experiment": {
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "model": {"name": "logreg"},
        "algorithm": {"rounds": 2, "clients_per_round": 3, "local_steps": 1, "lr": 0.5},
        "privacy": {"epsilon": 20.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.1},
    },
    "runtime": {"backend": "local", "seed": 2},
}


class MyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _readme_algorithm(cls=DPFedAvg) -> DPFedAvg:
    return cls(
        clients_per_round=4,
        local_steps=2,
        lr=0.1,
        clip_norm=0.8,
        noise_multiplier=1.1,
        sampling_rate=0.05,
    )


def test_the_readme_snippet_is_recorded_by_name_with_its_actual_parameters(tmp_path):
    run_dir = tmp_path / "run"

    result = raydpfl.run_simulation(
        CONFIG, algorithm=_readme_algorithm(), model=MyNet, run_dir=run_dir
    )

    recorded = load_config(run_dir / "config.yaml")
    algo, privacy = recorded.experiment.algorithm, recorded.experiment.privacy
    assert (algo.name, algo.clients_per_round, algo.local_steps, algo.lr) == (
        "dp_fedavg",
        4,
        2,
        0.1,
    )
    assert (privacy.clip_norm, privacy.noise_multiplier, privacy.sampling_rate) == (0.8, 1.1, 0.05)
    text = (run_dir / "config.yaml").read_text()
    assert text.startswith("# What ran differs from the config")
    assert f"the Python object {__name__}.MyNet ran (650 parameters)" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == "dp_fedavg"
    assert summary["algorithm_params"]["sampling_rate"] == 0.05
    assert summary["model"] == f"python:{__name__}.MyNet"
    assert summary["model_params"] == {"num_parameters": 650}
    # The ground truth: config.yaml alone (with the same model) runs the same algorithm.
    again = raydpfl.run_simulation(recorded, model=MyNet)
    assert again.model_sha256 == result.model_sha256


def test_an_unregistered_class_is_marked_as_a_python_object_with_its_parameters(tmp_path):
    class LocalVariant(DPFedAvg):
        pass

    raydpfl.run_simulation(
        CONFIG, algorithm=_readme_algorithm(LocalVariant), run_dir=tmp_path / "r"
    )

    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    name = f"{__name__}.{LocalVariant.__qualname__}"
    assert name.endswith("<locals>.LocalVariant")
    assert summary["algorithm"] == f"python:{name}"
    assert summary["algorithm_params"]["lr"] == 0.1
    text = (tmp_path / "r" / "config.yaml").read_text()
    assert f"experiment.algorithm: the Python object {name} ran (" in text
    assert "lr=0.1" in text and "the name below is the config's, not what ran" in text


@dataclass(frozen=True)
class BoostOptions:
    boost: float = 1.0


def test_a_registered_class_is_recorded_by_its_name_and_options(tmp_path):
    @raydpfl.register_algorithm("boosted_dpfedavg", options=BoostOptions)
    class Boosted(DPFedAvg):
        def __init__(self, *, boost: float = 1.0, **kw):
            super().__init__(**kw)
            self.boost = boost

    try:
        algorithm = Boosted(
            boost=2.5,
            clients_per_round=3,
            local_steps=1,
            lr=0.2,
            clip_norm=1.0,
            noise_multiplier=1.0,
            sampling_rate=0.2,
        )
        raydpfl.run_simulation(CONFIG, algorithm=algorithm, run_dir=tmp_path / "r")
        recorded = load_config(tmp_path / "r" / "config.yaml")
    finally:
        registry.unregister("algorithm", "boosted_dpfedavg")

    assert recorded.experiment.algorithm.name == "boosted_dpfedavg"
    assert recorded.experiment.algorithm.options == {"boost": 2.5}
    assert recorded.experiment.algorithm.lr == 0.2


def test_without_python_objects_config_yaml_is_the_config(tmp_path):
    raydpfl.run_simulation(CONFIG, run_dir=tmp_path / "r")

    text = (tmp_path / "r" / "config.yaml").read_text()
    assert not text.startswith("#")
    assert load_config(tmp_path / "r" / "config.yaml").experiment.algorithm.lr == 0.5


class RefuseAtStart(Callback):
    def on_run_start(self, info) -> None:
        raise ConfigError("runtime.callbacks", "refused before training")


def test_a_start_refused_before_training_leaves_a_directory_run_dir_accepts_again(tmp_path):
    run_dir = tmp_path / "r"

    with pytest.raises(ConfigError, match="refused before training"):
        raydpfl.run_simulation(CONFIG, run_dir=run_dir, callbacks=[RefuseAtStart()])

    assert not run_dir.exists() or not any(p.name != "run.lock" for p in run_dir.iterdir())
    raydpfl.run_simulation(CONFIG, run_dir=run_dir)  # the same directory, accepted
    assert (run_dir / "summary.json").exists()


@pytest.mark.slow  # starts Ray (tens of seconds on 2 cores)
@pytest.mark.ray
def test_more_workers_than_cores_is_refused_and_the_same_out_is_accepted_again(tmp_path):
    config = tmp_path / "c.yaml"
    import yaml

    config.write_text(yaml.safe_dump({**CONFIG, "runtime": {"backend": "ray", "seed": 2}}))
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    def run(*sets: str) -> subprocess.CompletedProcess:
        args = [
            sys.executable,
            "-m",
            "raydpfl",
            "run",
            str(config),
            "--out",
            str(out),
            "--no-progress",
        ]
        for s in sets:
            args += ["--set", s]
        return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)

    refused = run(f"runtime.workers={4 * (os.cpu_count() or 2)}")

    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.count("\n") == 1 and "runtime.cpus_per_worker" in refused.stderr
    assert not out.exists() or not any(p.name != "run.lock" for p in out.iterdir())
    accepted = run("runtime.backend=local")
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert f"raydpfl report {out}" in accepted.stdout
