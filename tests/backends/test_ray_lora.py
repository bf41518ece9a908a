"""The LoRA preset (configs/shakespeare_lora.yaml) runs end to end on both backends with
equal model and ledger hashes: the adapters are the only parameters that travel, are
clipped, noised and aggregated, and the frozen base is loaded from a local checkpoint on
every worker."""

from __future__ import annotations

from pathlib import Path

import pytest

import raydpfl
from tests.models.test_char_transformer import _write_shakespeare
from tests.models.test_lora import _pretrain_on_public_split

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PRESET = Path(__file__).resolve().parents[2] / "configs" / "shakespeare_lora.yaml"


def test_the_lora_preset_is_bit_identical_on_ray_and_local(ray_session, tmp_path):
    _write_shakespeare(tmp_path)
    checkpoint, _ = _pretrain_on_public_split(tmp_path)
    small = [
        f"experiment.data.root={tmp_path}",
        "experiment.data.num_clients=3",
        "experiment.data.client_test_fraction=0.25",
        f"experiment.model.options.checkpoint={checkpoint}",
        "experiment.model.options.rank=4",
        "experiment.model.options.width=16",
        "experiment.model.options.heads=2",
        "experiment.model.options.layers=1",
        "experiment.algorithm.rounds=2",
        "experiment.algorithm.clients_per_round=3",
        "experiment.algorithm.local_steps=2",
        "experiment.privacy.epsilon=50.0",
        "experiment.privacy.delta=0.001",
        "experiment.privacy.sampling_rate=0.5",
        "runtime.progress=false",
        "runtime.workers=2",
    ]
    summaries = {}
    for backend in ("local", "ray"):
        result = raydpfl.run_simulation(
            str(PRESET),
            overrides=[*small, f"runtime.backend={backend}"],
            run_dir=str(tmp_path / backend),
        )
        summaries[backend] = result.summary
        assert result.summary["rounds_completed"] == 2
        names = set(result.params)
        assert names and all(".lora_a." in n or ".lora_b." in n for n in names)
    assert summaries["ray"]["model_sha256"] == summaries["local"]["model_sha256"]
    assert summaries["ray"]["ledger_sha256"] == summaries["local"]["ledger_sha256"]
