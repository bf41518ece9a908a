"""Every shipped config loads and validates; ALI-DPFL's presets match the paper's caps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from raydpfl.config import ConfigError, load_config
from raydpfl.tune.sweep import load_sweep_file

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "configs").rglob("*.yaml"))


def _repro():
    spec = importlib.util.spec_from_file_location(
        "ali_repro", ROOT / "benchmarks/repro/ali_dpfl.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_shipped_config_validates(path):
    if "tune" in yaml.safe_load(path.read_text()):  # a sweep file: every trial value checked
        load_sweep_file(path)
        with pytest.raises(ConfigError, match="raydpfl tune"):
            load_config(path)
    else:
        load_config(path)


def test_ali_dpfl_presets_are_written_by_the_repro_script_and_match_the_paper():
    repro = _repro()
    paper_rc = {1.55: 79, 1.75: 177, 2.0: 317, 2.5: 598, 2.75: 775, 3.25: 1123}
    for dataset in repro.DATASETS:
        for cell in repro.cells_for(dataset):
            path = repro.preset_path(dataset, cell)
            config = load_config(path)
            r_c, r_s = cell.budgets()
            assert config.experiment.algorithm.rounds == r_s
            assert config.experiment.privacy.epsilon == cell.epsilon
            if cell.epsilon in paper_rc:  # the paper's text gives these R_c exactly (§4.7)
                assert r_c == paper_rc[cell.epsilon]
    assert len(list((ROOT / "configs/ali_dpfl").rglob("*.yaml"))) == 3 * 12 + 4
