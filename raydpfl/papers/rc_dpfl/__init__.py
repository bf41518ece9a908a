"""RC-DPFL (robust clustering) with its clustered baselines, local DP-SGD and MR-MTL:
see README.md here."""

from raydpfl import registry

#: Why the audit refuses these (the others run the shared DP-SGD loop, GMM stage included).
_NOT_AUDITED = {
    "mr_mtl": "its fused DP-SGD update never hands the noisy sum to the clipping engine",
    "f_cdpfl": "its initial cluster models are built before the audit's probe is added",
}


#: Where this paper's material lives outside this folder, relative to the repository root
#: (the presets, the reproduction runners, their notes, the tests, the record's figure):
#: the folder names it here, and tests/benchmarks/test_paper_material.py checks the shape.
MATERIAL: dict[str, str | tuple[str, ...]] = {
    "readme": "raydpfl/papers/rc_dpfl/README.md",
    "presets": ("configs/rc_dpfl",),
    "runners": ("benchmarks/repro/rc_dpfl.py",),
    "notes": (),
    "tests": ("tests/papers/rc_dpfl", "tests/benchmarks/test_rc_dpfl_runner.py"),
    "figure": "benchmarks/repro/figures/rc_dpfl.svg",
}


def register() -> None:
    """Registers RC-DPFL's algorithms and models (the ``raydpfl.plugins`` entry point
    calls it)."""
    # Imported here: the package itself stays importable from anywhere in raydpfl's own
    # import order (the registry calls this while `raydpfl.config` may be loading).
    from raydpfl.papers.rc_dpfl.options import MODEL_NAMES, NAMES, RcDpflConfig

    for name in NAMES:
        registry.register(
            "algorithm",
            name,
            "raydpfl.papers.rc_dpfl.builder:build",
            options=RcDpflConfig,
            builtin=True,
            section="rc_dpfl",
            tags=("audit:dp_sgd_loop",) if name not in _NOT_AUDITED else (),
            notes={"audit": _NOT_AUDITED[name]} if name in _NOT_AUDITED else None,
        )
    for name in MODEL_NAMES:
        registry.register("model", name, f"raydpfl.papers.rc_dpfl.models:{name}", builtin=True)
