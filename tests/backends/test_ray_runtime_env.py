"""Ray actors run the driver's raydpfl and import its `--plugin` files from any path.

Before: Ray puts the driver's working directory first on every worker's sys.path, so a
run started inside another checkout imported that checkout's raydpfl in its actors;
and a `--plugin FILE` outside the working directory could not be imported by them (the
run ended blaming a missing checkpoint; the ModuleNotFoundError was only in Ray's logs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from raydpfl.backends.ray.runtime_env import (
    FINGERPRINT_VAR,
    _fingerprint_of,
    code_fingerprint,
    package_dir,
    runtime_env_for,
)
from tests.cli.test_resume_outputs import RAW

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_PLUGIN = REPO / "examples" / "dp_fedavg_server_momentum.py"


def _plugin_config(tmp_path: Path, backend: str) -> Path:
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["algorithm"].update(
        {"name": "dp_fedavg_server_momentum", "options": {"momentum": 0.5}, "rounds": 2}
    )
    raw["experiment"]["model"] = {"name": "small_cnn"}
    raw["runtime"].update({"backend": backend, "workers": 1, "cpus_per_worker": 1})
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _fake_checkout(root: Path, marker: Path) -> Path:
    """Another 'checkout' whose raydpfl leaves `marker` when imported, then fails."""
    package = root / "raydpfl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('the wrong raydpfl')\n"
    )
    return root


def test_the_environment_ships_the_drivers_package_and_the_plugin_files(tmp_path):
    plugin = tmp_path / "somewhere" / "my_plugin.py"
    plugin.parent.mkdir()
    plugin.write_text("X = 1\n")
    env = runtime_env_for([str(plugin)])
    assert env["py_modules"] == [str(package_dir()), str(plugin.resolve())]
    assert Path(env["py_modules"][0], "backends", "ray", "runtime_env.py").is_file()
    assert env["env_vars"] == {FINGERPRINT_VAR: code_fingerprint()}
    assert "__pycache__" in env["excludes"]
    with pytest.raises(FileNotFoundError, match=r"no_such\.py"):
        runtime_env_for([tmp_path / "no_such.py"])


def test_the_fingerprint_changes_with_one_byte_of_code(tmp_path):
    copy = tmp_path / "raydpfl"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert _fingerprint_of(copy) == code_fingerprint()
    target = copy / "simulation" / "server.py"
    target.write_text(target.read_text() + "\n")
    assert _fingerprint_of(copy) != code_fingerprint()


def _run_hook(
    tmp_path: Path, shipped: Path, cwd: Path, fingerprint: str
) -> subprocess.CompletedProcess:
    """Runs the setup hook as a Ray worker would (shipped copy first on PYTHONPATH, the
    driver's cwd put first on sys.path afterwards), then imports raydpfl."""
    code = textwrap.dedent(
        f"""
        import pickle, sys
        hook = pickle.loads({runtime_env_hook_bytes()!r})
        hook()
        sys.path.insert(0, {str(cwd)!r})  # what Ray does when the worker joins the job
        import raydpfl
        print(raydpfl.__file__)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(shipped), FINGERPRINT_VAR: fingerprint}
    return subprocess.run(
        [sys.executable, "-P", "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )


def runtime_env_hook_bytes() -> bytes:
    import cloudpickle

    return cloudpickle.dumps(runtime_env_for([])["worker_process_setup_hook"])


def test_the_setup_hook_pins_raydpfl_to_the_shipped_copy_or_refuses(tmp_path):
    shipped = tmp_path / "shipped"
    shutil.copytree(
        package_dir(), shipped / "raydpfl", ignore=shutil.ignore_patterns("__pycache__")
    )
    marker = tmp_path / "imported-the-other-checkout"
    other = _fake_checkout(tmp_path / "other", marker)

    done = _run_hook(tmp_path, shipped, other, code_fingerprint())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(shipped / "raydpfl" / "__init__.py")
    assert not marker.exists()

    stale = _run_hook(tmp_path, shipped, other, "0123456789abcdef")
    assert stale.returncode != 0
    assert "the driver's is 0123456789abcdef" in stale.stderr
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_a_run_inside_another_checkout_with_a_plugin_elsewhere_runs_the_drivers_code(tmp_path):
    marker = tmp_path / "imported-the-other-checkout"
    other = _fake_checkout(tmp_path / "other", marker)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    plugin = plugins / "momentum_plugin.py"
    shutil.copy(EXAMPLE_PLUGIN, plugin)
    config = _plugin_config(tmp_path, "ray")
    out = tmp_path / "run"
    # -P: the driver imports this checkout's raydpfl (PYTHONPATH), not the cwd's.
    code = "import sys; from raydpfl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            code,
            "run",
            str(config),
            "--plugin",
            str(plugin),
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=other,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), "an actor imported the working directory's raydpfl"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "dp_fedavg_server_momentum"
    assert summary["rounds_completed"] == 2


@pytest.fixture
def forget_plugins(monkeypatch):
    """Plug-ins this test imports are forgotten afterwards (names and recorded files)."""
    from raydpfl import registry
    from raydpfl.registry import plugin_files

    before = {kind: set(registry.names(kind)) for kind in registry.KINDS}
    monkeypatch.setattr(plugin_files, "_FILES", [])
    yield
    for kind in registry.KINDS:
        for name in set(registry.names(kind)) - before[kind]:
            registry.unregister(kind, name)


@pytest.mark.ray
def test_a_plugin_the_actors_cannot_import_is_one_line_naming_it(
    ray_session, tmp_path, capsys, forget_plugins
):
    # The test session's Ray was started without raydpfl's runtime environment, so the
    # plug-in is not shipped: the server actor cannot unpickle what the plug-in defines.
    from raydpfl.cli.main import main

    plugin = tmp_path / "unshipped_plugin.py"
    shutil.copy(EXAMPLE_PLUGIN, plugin)
    config = _plugin_config(tmp_path, "ray")
    code = main(
        [
            "run",
            str(config),
            "--plugin",
            str(plugin),
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ]
    )
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "raydpfl:" in ln]
    assert code == 2, err
    assert len(err) == 1, err
    assert "ModuleNotFoundError: No module named 'unshipped_plugin'" in err[0]
    assert "unshipped_plugin.py" in err[0]
    assert "checkpoint" not in err[0]
    assert re.match(r"^raydpfl: error: the Ray server actor could not start", err[0])


def test_an_auth_token_our_ray_init_created_is_made_owner_only(tmp_path):
    from raydpfl.backends.ray.runner import make_private

    folder = tmp_path / ".ray"
    folder.mkdir(mode=0o755)
    token = folder / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)  # as Ray writes it under umask 022
    make_private(token, folder)
    assert token.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    make_private(tmp_path / "missing", None)  # nothing there: nothing to do
