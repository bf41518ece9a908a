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
        "import sys, raydpfl, raydpfl.cli.main, raydpfl.simulation.build; "
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
