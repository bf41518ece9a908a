"""RC-DPFL (robust clustering) with its clustered baselines, local DP-SGD and MR-MTL:
see README.md here."""

from raydpfl import registry


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
        )
    for name in MODEL_NAMES:
        registry.register("model", name, f"raydpfl.papers.rc_dpfl.models:{name}", builtin=True)
