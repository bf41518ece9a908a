"""Inputs that used to end in a traceback (or a silent exit 0) now end in one line and
exit 2, before any training: each case below printed 48 to ~3,000 lines before."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from raydpfl.cli.main import main
from tests.cli.test_resume_outputs import RAW


def _config(tmp_path: Path, text: str | None = None, **runtime) -> Path:
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["algorithm"]["rounds"] = 2
    raw["runtime"].update(runtime)
    path = tmp_path / "config.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(raw))
    return path


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = yaml.safe_dump(json.loads(json.dumps(RAW)))
    assert old in text
    return _config(tmp_path, text.replace(old, new))


def _exit_code(argv: list[str]) -> int:
    """`main`'s exit status, argparse's own exits (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def _one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-5:]
    assert len(err) == 1, err[:5]
    assert "Traceback" not in err[0]
    return err[0]


@pytest.fixture
def forget_plugins(monkeypatch):
    from raydpfl import registry
    from raydpfl.registry import plugin_files

    before = {kind: set(registry.names(kind)) for kind in registry.KINDS}
    monkeypatch.setattr(plugin_files, "_FILES", [])
    yield
    for kind in registry.KINDS:
        for name in set(registry.names(kind)) - before[kind]:
            registry.unregister(kind, name)


def test_yaml_nested_900_deep(tmp_path, capsys):
    path = _config(tmp_path, "experiment: " + "[" * 900 + "]" * 900 + "\n")
    assert "nested too deeply" in _one_line(capsys, main(["validate", str(path)]))
    deep = _config(tmp_path, "experiment: " + "[" * 100 + "]" * 100 + "\n")  # parses
    assert "nested more than 64 levels" in _one_line(capsys, main(["validate", str(deep)]))
    args = ["validate", str(_config(tmp_path)), "--set", "seed=" + "[" * 900 + "]" * 900]
    assert "nested too deeply" in _one_line(capsys, main(args))


def test_a_5000_digit_integer(tmp_path, capsys):
    path = _edited(tmp_path, "seed: 3", "seed: " + "9" * 5000)
    assert "more than 4300 digits" in _one_line(capsys, main(["validate", str(path)]))
    path = _edited(tmp_path, "seed: 3", "seed: " + "9" * 4000)  # parses; too large
    line = _one_line(capsys, main(["validate", str(path)]))
    assert "runtime.seed: must be at most 2147483647" in line and len(line) < 200
    path = _edited(tmp_path, "lr: 0.5", "lr: " + "9" * 400)  # an int past float's range
    assert "experiment.algorithm.lr: must be a finite number" in _one_line(
        capsys, main(["validate", str(path)])
    )


def test_lr_1e308(tmp_path, capsys):
    path = _edited(tmp_path, "lr: 0.5", "lr: 1e308")
    line = _one_line(capsys, main(["validate", str(path)]))
    assert "experiment.algorithm.lr: must be at most 3.403e+38 in size (float32)" in line


def test_privacy_epsilon_with_sigma_1e308(capsys):
    args = ["privacy", "epsilon", "--sigma", "1e308", "--q", "0.01", "--steps", "100"]
    assert "must be in [0.01, 1e+06]" in _one_line(capsys, _exit_code(args))


def _png_declaring(path: Path, width: int, height: int) -> None:
    """A 200-byte PNG whose header declares width x height pixels (a decompression bomb:
    its pixels would be inflated from almost nothing)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("side", [30_000, 9_000])  # past Pillow's own limit; past ours
def test_a_decompression_bomb_png_in_an_image_folder(tmp_path, capsys, side):
    pil = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for name in ("cats", "dogs"):
        folder = tmp_path / "images" / name
        folder.mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            pil.fromarray(pixels).save(folder / f"{i}.png")
    _png_declaring(tmp_path / "images" / "cats" / "zz.png", side, side)
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["data"] = {
        "dataset": "image_folder",
        "root": str(tmp_path / "images"),
        "num_clients": 2,
        "partition": {"kind": "iid"},
        "options": {"size": 8},
    }
    raw["experiment"]["algorithm"]["clients_per_round"] = 2
    path = _config(tmp_path, yaml.safe_dump(raw))
    line = _one_line(capsys, main(["validate", str(path)]))
    assert "zz.png" in line and "bomb" in line


def test_out_under_proc(tmp_path, capsys):
    if not Path("/proc/self").exists():
        pytest.skip("needs /proc")
    args = ["run", str(_config(tmp_path)), "--out", "/proc/x", "--no-progress"]
    line = _one_line(capsys, main(args))
    assert "--out: cannot create the run directory '/proc/x'" in line


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("raise RuntimeError('no licence server')\n", "RuntimeError: no licence server"),
        ("def broken(:\n    pass\n", "SyntaxError: invalid syntax (line 1)"),
        ("import no_such_module_for_raydpfl\n", "ModuleNotFoundError: No module named"),
        ("import sys\nsys.exit(0)\n", "it called sys.exit(0) on import"),
    ],
)
def test_a_plugin_that_fails_on_import_is_one_line_naming_it(
    tmp_path, capsys, forget_plugins, source, expected
):
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(source)
    code = main(["validate", str(_config(tmp_path)), "--plugin", str(plugin)])
    line = _one_line(capsys, code)  # exit 2: sys.exit(0) cannot make validate pass
    assert f"--plugin: cannot import {str(plugin)!r}: {expected}" in line


BUFFER_PLUGIN = """
import torch
import raydpfl

class RunningMean(torch.nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)
        self.register_buffer("running", torch.zeros(()))

    def forward(self, x):
        self.running.mul_(0.9).add_(x.detach().mean())  # a buffer written in forward
        return self.linear(x.flatten(1))

@raydpfl.register_model("running_mean_linear")
def running_mean_linear(input_shape, num_classes):
    return RunningMean(num_classes)
"""


def test_a_model_that_writes_a_buffer_runs_or_is_one_line(tmp_path, capsys, forget_plugins):
    plugin = tmp_path / "buffer_plugin.py"
    plugin.write_text(BUFFER_PLUGIN)
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["model"] = {"name": "running_mean_linear"}
    raw["experiment"]["algorithm"]["rounds"] = 1
    raw["runtime"].update({"aggregation_groups": 1, "vectorise_clients": "on"})
    path = _config(tmp_path, yaml.safe_dump(raw))
    args = ["run", str(path), "--plugin", str(plugin), "--no-progress"]
    line = _one_line(capsys, main([*args, "--out", str(tmp_path / "on")]))
    assert "runtime.vectorise_clients: on, but the model has buffers (running)" in line
    # auto (the default) trains it one client at a time, as `off` does (the plug-in is
    # imported in this process already).
    auto = ["run", str(path), "--no-progress", "--out", str(tmp_path / "auto")]
    auto += ["--set", "runtime.vectorise_clients=auto"]
    assert main(auto) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["rounds_completed"] == 1
