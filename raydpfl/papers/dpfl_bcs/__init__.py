"""DPFL-BCS (biased client selection) with PRIVATEFL and the uniform-selection
baselines: see README.md here."""

from raydpfl import registry

#: Why the audit refuses every private algorithm here.
_NOT_AUDITED = "its full-batch noisy step (Laplace or Gaussian) is not the DP-SGD loop"

#: Where this paper's material lives outside this folder, relative to the repository root
#: (the presets, the reproduction runners, their notes, the tests, the record's figure):
#: the folder names it here, and tests/benchmarks/test_paper_material.py checks the shape.
MATERIAL: dict[str, str | tuple[str, ...]] = {
    "readme": "raydpfl/papers/dpfl_bcs/README.md",
    "presets": ("configs/dpfl_bcs",),
    "runners": ("benchmarks/repro/dpfl_bcs.py",),
    "notes": ("benchmarks/repro/notes/dpfl_bcs_laplace.md",),
    "tests": ("tests/papers/dpfl_bcs", "tests/benchmarks/test_dpfl_bcs_runner.py"),
    "figure": "benchmarks/repro/figures/dpfl_bcs.svg",
}


def register() -> None:
    """Registers DPFL-BCS's algorithms and models (the ``raydpfl.plugins`` entry point
    calls it). Every algorithm here has an MSE client step for a regression dataset."""
    # Imported here: the package itself stays importable from anywhere in raydpfl's own
    # import order (the registry calls this while `raydpfl.config` may be loading).
    from raydpfl.config.schema import REGRESSION_TAG
    from raydpfl.papers.dpfl_bcs.options import (
        MODEL_NAMES,
        NAMES,
        REGRESSION_MODELS,
        DpflBcsConfig,
    )

    for name in NAMES:
        registry.register(
            "algorithm",
            name,
            "raydpfl.papers.dpfl_bcs.builder:build",
            options=DpflBcsConfig,
            builtin=True,
            section="dpfl_bcs",
            tags=(REGRESSION_TAG,),
            notes=None if name == "bcs_fedsgd" else {"audit": _NOT_AUDITED},
        )
    for name in MODEL_NAMES:
        registry.register(
            "model",
            name,
            f"raydpfl.papers.dpfl_bcs.models:{name}",
            builtin=True,
            tags=(REGRESSION_TAG,) if name in REGRESSION_MODELS else (),
        )
