"""FedFDP and FedFair with their baselines (FedProx, SCAFFOLD, FedDyn, q-FFL and their
DP versions): see README.md here."""

from raydpfl import registry

#: One averaged update per round: the server optimizer applies (FedAvg's Δ̄ with a prox term).
_SERVER_OPTIMIZER = ("fedprox", "dp_fedprox")


#: Where this paper's material lives outside this folder, relative to the repository root
#: (the presets, the reproduction runners, their notes, the tests, the record's figure):
#: the folder names it here, and tests/benchmarks/test_paper_material.py checks the shape.
MATERIAL: dict[str, str | tuple[str, ...]] = {
    "readme": "raydpfl/papers/fedfdp/README.md",
    "presets": ("configs/fedfdp", "configs/sweeps/fedfdp_lambda.yaml"),
    "runners": (
        "benchmarks/repro/fedfdp.py",
        "benchmarks/repro/authors_step_fedfdp.py",
        "benchmarks/repro/accumulator_ablation.py",
    ),
    "notes": ("benchmarks/repro/notes/authors_step_fedfdp_differences.md",),
    "tests": (
        "tests/papers/fedfdp",
        "tests/benchmarks/test_authors_step_fedfdp.py",
        "tests/benchmarks/test_accumulator_ablation.py",
    ),
    "figure": "benchmarks/repro/figures/fedfdp.svg",
}


def register() -> None:
    """Registers FedFDP's algorithms (the ``raydpfl.plugins`` entry point calls it)."""
    # Imported here: the package itself stays importable from anywhere in raydpfl's own
    # import order (the registry calls this while `raydpfl.config` may be loading).
    from raydpfl.config.schema import SERVER_OPTIMIZER_TAG
    from raydpfl.papers.fedfdp.options import NAMES, PRIVATE_NAMES, FedFdpConfig
    from raydpfl.registry.round_panels import RoundPanel, register_round_panel

    for name in NAMES:
        registry.register(
            "algorithm",
            name,
            "raydpfl.papers.fedfdp.builder:build",
            options=FedFdpConfig,
            builtin=True,
            section="fedfdp",
            tags=((SERVER_OPTIMIZER_TAG,) if name in _SERVER_OPTIMIZER else ())
            # Every private one runs the shared DP-SGD loop: the audit's record canaries.
            + (("audit:dp_sgd_loop",) if name in PRIVATE_NAMES else ()),
        )
    # round_metrics.png panels of FedFair's and FedFDP's own rounds.parquet columns
    register_round_panel(
        RoundPanel("Fairness weight λ", "λ", ("lambda", "lam", "lambda_star", "lambda_next"))
    )
    register_round_panel(RoundPanel("Ψ recorded by the algorithm", "Ψ", ("psi",)))
