"""benchmarks/dp_step.py: its three kinds of step do what its report calls them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from raydpfl.privacy.per_sample import dpsgd

ROOT = Path(__file__).resolve().parents[2]


def _module():
    name = "benchmarks_dp_step"
    if name not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # for its `_results` import
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "dp_step.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_dp_and_dp_gemm_take_their_paths_and_the_report_is_written(monkeypatch, tmp_path):
    """`dp` adds a small batch's Linear weight sums with the noise (``add_low_rank``),
    `dp_gemm` by a GEMM (the kernel never called); the threshold is restored after each
    step; a tiny run writes its figures with the load average."""
    from raydpfl.privacy.noise.boxmuller import BoxMullerGenerator

    bench = _module()
    x, y = torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,))
    steps = bench._stepper(3, x, y)
    calls = []
    kernel = BoxMullerGenerator.add_low_rank

    def spy(*args):
        calls.append(args[3].shape)
        kernel(*args)

    monkeypatch.setattr(BoxMullerGenerator, "add_low_rank", staticmethod(spy))
    steps["dp"]()
    assert calls == [(3, 512), (3, 10)]  # fc1 and fc: (B, q) factors
    steps["dp_gemm"]()
    steps["sgd"]()
    assert calls == [(3, 512), (3, 10)]
    assert dpsgd.LOW_RANK_MAX_BATCH == bench.DEFAULT_LOW_RANK_MAX
    monkeypatch.undo()

    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "_images", lambda n: (x, y, "random (test)"))
    bench.main(["--batches", "2", "--steps", "10"])
    (written,) = (tmp_path / "benchmarks" / "results").glob("dp_step-*.json")
    report = json.loads(written.read_text())
    figures = report["figures"]["2"]
    assert set(figures) == {"sgd", "dp", "dp_gemm", "ratios", "dp_gemm_minus_dp_ms"}
    assert figures["dp"]["median_ms"] > 0 and len(report["loadavg_1min"]) == 2
