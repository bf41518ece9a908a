"""Layering rules of design.md §2, checked on the source."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raydpfl"
RAY_FREE = ["algorithms", "privacy", "config", "simulation", "data", "models"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", RAY_FREE)
def test_pure_packages_never_import_ray(package):
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / package).rglob("*.py")
        if any(n == "ray" or n.startswith("ray.") for n in _imports(p))
    ]

    assert offenders == []


@pytest.mark.parametrize("package", ["algorithms", "privacy", "data", "models"])
def test_lower_layers_do_not_import_config_or_orchestration(package):
    forbidden = ("raydpfl.config", "raydpfl.simulation", "raydpfl.backends", "raydpfl.cli")

    offenders = [
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / package).rglob("*.py")
        if any(n.startswith(forbidden) for n in _imports(p))
    ]

    assert offenders == []


def test_importing_the_package_and_cli_imports_neither_ray_nor_torchvision():
    code = (
        "import sys, raydpfl, raydpfl.cli.main, raydpfl.experiment.build; "
        "print('ray' in sys.modules, 'torchvision' in sys.modules)"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.split() == ["False", "False"]


def _calls(path: Path) -> list[ast.Call]:
    return [
        n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Call)
    ]


def test_nothing_is_unpickled_from_user_paths():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if {"pickle", "cPickle", "dill", "cloudpickle"} & _imports(path):
            offenders.append(f"{path.name}: imports a pickle module")
        for call in _calls(path):
            name = ast.unparse(call.func)
            if name.endswith("torch.load"):
                safe = any(
                    k.arg == "weights_only" and ast.unparse(k.value) == "True"
                    for k in call.keywords
                )
                if not safe:
                    offenders.append(
                        f"{path.name}:{call.lineno}: {name} without weights_only=True"
                    )
            if name in {"yaml.load", "yaml.unsafe_load", "np.load", "numpy.load"}:
                offenders.append(f"{path.name}:{call.lineno}: {name}")

    assert offenders == []


# ---- imports only point down (docs/architecture.md, "Layers") -----------------------------
#: Each package's layer; a module may import its own package and packages of lower layers
#: only. Packages on one layer do not import each other.
LAYERS = {
    "registry": 0,
    "config": 1,
    "privacy": 1,
    "data": 1,
    "models": 1,
    "callbacks": 1,
    "algorithms": 2,
    "simulation": 3,
    "backends": 4,
    "experiment": 5,
    "tune": 6,
    "report": 6,
    "audit": 6,
    # The seed papers are plug-ins on top of the core (they use `raydpfl.experiment` the
    # way a user's package does); the core imports none of them.
    "papers": 6,
    "cli": 7,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _edges(name: str) -> set[str]:
    """The raydpfl modules `name` imports, at any depth of its code (lazy imports too).
    ``from pkg import sub`` is an edge to ``pkg.sub`` when ``sub`` is a module."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            if subs:
                out |= subs
            elif node.module in MODULES:
                out.add(node.module)
    out.discard(name)
    return out


def _cycles() -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    graph = {m: _edges(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str | None:
    """The sub-package `module` lives in; None for the top level (`raydpfl`, its
    `__main__` and `api`), which sits above every package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else None


def test_no_import_circle_between_modules():
    assert _cycles() == []


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_imports_only_point_down():
    upward = []
    for module in MODULES:
        here = _package(module)
        if here is None:
            continue  # the top-level API sits above every package
        for target in _edges(module):
            there = _package(target)
            if there is None:
                upward.append(f"{module} -> {target} (the top-level package)")
            elif there != here and LAYERS[there] >= LAYERS[here]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def _paper(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "papers" else None


def test_no_paper_imports_another_paper():
    crossing = [
        f"{m} -> {t}"
        for m in MODULES
        if _paper(m)
        for t in _edges(m)
        if _paper(t) and _paper(t) != _paper(m)
    ]
    assert crossing == []


def test_the_core_imports_no_paper():
    core = [
        f"{m} -> {t}"
        for m in MODULES
        if _package(m) not in (None, "papers")
        for t in _edges(m)
        if _package(t) == "papers"
    ]
    assert core == []


@pytest.mark.parametrize("paper", ["ali_dpfl", "fedfdp", "dpfl_bcs", "rc_dpfl"])
def test_every_paper_is_a_folder_with_a_readme_linking_its_record(paper):
    folder = PACKAGE / "papers" / paper
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "REPRODUCTION.md" in readme and f"benchmarks/repro/{paper}.py" in readme
    # Each module the README's table names exists.
    for name in ("algorithm.py", "options.py", "builder.py"):
        assert (folder / name).exists() and f"`{name}`" in readme
