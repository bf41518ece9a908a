"""ALI-DPFL (seed 002) with its baselines PE-DPFL and Adap DP-FL: see README.md here."""

from raydpfl import registry

_BUILD = "raydpfl.papers.ali_dpfl.builder:build"


#: Where this paper's material lives outside this folder, relative to the repository root
#: (the presets, the reproduction runners, their notes, the tests, the record's figure):
#: the folder names it here, and tests/benchmarks/test_paper_material.py checks the shape.
MATERIAL: dict[str, str | tuple[str, ...]] = {
    "readme": "raydpfl/papers/ali_dpfl/README.md",
    "presets": ("configs/ali_dpfl",),
    "runners": (
        "benchmarks/repro/ali_dpfl.py",
        "benchmarks/repro/authors_step.py",
        "benchmarks/repro/ali_tau_budget.py",
    ),
    "notes": (
        "benchmarks/repro/notes/ali_dpfl_authors_code.md",
        "benchmarks/repro/notes/authors_step_differences.md",
    ),
    "tests": (
        "tests/papers/ali_dpfl",
        "tests/benchmarks/test_ali_dpfl_runner.py",
        "tests/benchmarks/test_authors_step.py",
    ),
    "figure": "benchmarks/repro/figures/ali_dpfl.svg",
}


def register() -> None:
    """Registers ALI-DPFL's algorithms (the ``raydpfl.plugins`` entry point calls it)."""
    # Imported here: the package itself stays importable from anywhere in raydpfl's own
    # import order (the registry calls this while `raydpfl.config` may be loading).
    from raydpfl.papers.ali_dpfl.options import AdapDpFlConfig, AliDpflConfig, PeDpflConfig
    from raydpfl.papers.ali_dpfl.theory import paper_compat_iteration_budget
    from raydpfl.privacy.accounting.step_budget import register_step_budget_mode
    from raydpfl.registry.round_panels import RoundPanel, register_round_panel

    # R_c as the authors' code computes it (rc_mode: paper_compat, and `raydpfl privacy
    # steps --mode paper_compat`)
    register_step_budget_mode("paper_compat", paper_compat_iteration_budget)

    loop = ("audit:dp_sgd_loop",)  # the shared DP-SGD loop: the audit's record canaries
    for name in ("ali_dpfl", "dp_fedavg_fixed_tau"):  # the fixed-τ baseline reads R_c's too
        registry.register(
            "algorithm",
            name,
            _BUILD,
            options=AliDpflConfig,
            builtin=True,
            section="ali_dpfl",
            tags=loop,
        )
    registry.register(
        "algorithm",
        "pe_dpfl",
        _BUILD,
        options=PeDpflConfig,
        builtin=True,
        section="pe_dpfl",
        notes={"audit": "it perturbs the output of non-private local training, not DP-SGD steps"},
    )
    registry.register(
        "algorithm",
        "adap_dp_fl",
        _BUILD,
        options=AdapDpFlConfig,
        builtin=True,
        section="adap_dp_fl",
        tags=loop,
    )
    # round_metrics.png panels of ALI-DPFL's own rounds.parquet columns; τ is drawn with
    # the local steps of every run
    register_round_panel(
        RoundPanel(
            "Local steps per round (τ for ALI-DPFL)",
            "local DP-SGD steps",
            ("local_steps", "tau", "tau_raw", "tau_next"),
            names={
                "local_steps": "steps run",
                "tau": "τ used",
                "tau_raw": "τ* (unrounded)",
                "tau_next": "τ planned next",
            },
            log_ok=False,
        )
    )
    register_round_panel(RoundPanel("Smoothness estimate μ (ALI-DPFL)", "μ", ("mu",)))
    register_round_panel(RoundPanel("γ (ALI-DPFL)", "γ", ("gamma",)))
    register_round_panel(
        RoundPanel(
            "DP-SGD iterations (ALI-DPFL)",
            "iterations",
            ("iterations_done", "tau_T"),
            names={"iterations_done": "done", "tau_T": "total T"},
            log_ok=False,
        )
    )
