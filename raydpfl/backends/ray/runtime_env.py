"""The Ray runtime environment of raydpfl's actors: the driver's own raydpfl, and the
driver's plug-in files.

Why. Ray puts the driver's working directory on every worker's ``sys.path``
(``JobConfig._py_driver_sys_path``), so a run started inside another checkout of
raydpfl imported that checkout's code in its actors while the driver ran the
installed package: two code versions in one run, silently. And a ``--plugin FILE``
outside the working directory could not be imported by the actors at all (the
objects it defines are pickled by reference to its module).

How. `runtime_env_for` ships, through Ray's ``py_modules`` (zipped once per content
hash, extracted on each node, put first on the workers' ``PYTHONPATH``):

- the raydpfl package directory the driver imported (`package_dir`), and
- each plug-in file, importable in the actors under the module name the CLI gave it
  (its stem, ``raydpfl.registry.plugin_files``).

``py_modules`` alone does not pin: Ray inserts the driver's directories at the front
of ``sys.path`` when a worker joins the job, after ``PYTHONPATH``. So the environment
also names a ``worker_process_setup_hook`` (`_pin_raydpfl`, shipped by value: it
imports only the standard library) that puts a finder first on ``sys.meta_path``:
``import raydpfl`` in a worker resolves to the shipped copy whatever ``sys.path`` says.
The hook first checks that copy against ``RAYDPFL_CODE_FINGERPRINT`` (the driver's
`code_fingerprint()`) and refuses to start the worker when they differ; every raydpfl
actor checks the code it runs once more (`check_same_code`, `CodeMismatchError`).

A Ray instance the caller started without this environment (a notebook's own
``ray.init()``) is not pinned: pass ``runtime_env=runtime_env_for([...])`` to it.

`runtime_env_for` is public: Tune trials (``raydpfl.tune``) use the same environment.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import os
import types
from collections.abc import Sequence
from pathlib import Path

#: The environment variable carrying the driver's `code_fingerprint()` to the actors.
FINGERPRINT_VAR = "RAYDPFL_CODE_FINGERPRINT"
#: Not shipped: byte-code caches (rebuilt on the node) and editor leftovers.
EXCLUDES = ["__pycache__", "*.pyc", "*.pyo", "*.swp"]


class CodeMismatchError(RuntimeError):
    """An actor imported raydpfl code that differs from the driver's."""


def package_dir() -> Path:
    """The directory of the raydpfl package this process imported."""
    return Path(__file__).resolve().parents[2]  # raydpfl/backends/ray/runtime_env.py


def _fingerprint_of(root: Path) -> str:
    """SHA-256 over the relative path and bytes of every ``.py`` file under `root`
    (sorted, caches skipped), first 16 hex digits: equal iff the code is the same.
    (`_pin_raydpfl` repeats these lines: it must not import raydpfl.)"""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def code_fingerprint() -> str:
    """The fingerprint of the imported raydpfl package (`_fingerprint_of`)."""
    return _fingerprint_of(package_dir())


def _pin_raydpfl() -> None:  # pragma: no cover - runs in Ray worker processes
    """Ray worker setup hook: ``import raydpfl`` resolves to the copy shipped in
    ``py_modules`` (the first ``PYTHONPATH`` entry holding ``raydpfl/__init__.py``), and
    the worker refuses to start if that copy is not the driver's code.

    Shipped by value (see `_setup_hook`), so it may use only the standard library,
    imported here, and no name of this module.
    """
    import hashlib
    import importlib.machinery
    import os
    import sys
    from pathlib import Path

    expected = os.environ.get("RAYDPFL_CODE_FINGERPRINT")
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    homes = [e for e in entries if (Path(e) / "raydpfl" / "__init__.py").is_file()]
    if not homes:
        raise RuntimeError("raydpfl: the runtime environment shipped no raydpfl package")
    home = homes[0]
    digest = hashlib.sha256()
    root = Path(home) / "raydpfl"
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    got = digest.hexdigest()[:16]
    if expected is not None and got != expected:
        raise RuntimeError(
            f"raydpfl: the shipped package {root} has code {got}, the driver's is {expected}"
        )

    class PinnedRaydpfl:
        """Finds the top-level ``raydpfl`` in `home` only (submodules follow its
        ``__path__``)."""

        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "raydpfl":
                return None
            return importlib.machinery.PathFinder.find_spec(name, [home])

    sys.meta_path.insert(0, PinnedRaydpfl)
    for name in [m for m in sys.modules if m == "raydpfl" or m.startswith("raydpfl.")]:
        del sys.modules[name]  # nothing of raydpfl runs before the hook; be sure


def _setup_hook() -> types.FunctionType:
    """`_pin_raydpfl` as a function of no module, so that cloudpickle ships its code
    by value instead of importing this module (from the wrong place) in the worker."""
    hook = types.FunctionType(
        _pin_raydpfl.__code__, {"__builtins__": builtins}, "raydpfl_pin_code"
    )
    hook.__module__ = "raydpfl_code_pin"  # not in sys.modules: pickled by value
    hook.__qualname__ = "raydpfl_pin_code"
    return hook


def runtime_env_for(plugin_files: Sequence[str | os.PathLike]) -> dict:
    """The runtime_env for raydpfl's Ray actors (and Tune trials).

    Args:
        plugin_files: The ``--plugin`` ``.py`` files the driver imported (any path; each
            becomes importable in the actors as its file stem, as in the driver).

    Returns:
        A dict for ``ray.init(runtime_env=...)`` or ``.options(runtime_env=...)``:
        ``py_modules`` (the driver's raydpfl package directory, then the plug-in files),
        ``excludes``, ``env_vars`` (``RAYDPFL_CODE_FINGERPRINT``) and
        ``worker_process_setup_hook`` (`_pin_raydpfl`). A job-level environment: Ray
        uploads local ``py_modules`` only for ``ray.init`` (and Tune's own init).

    Raises:
        FileNotFoundError: A plug-in file does not exist.
    """
    files = []
    for item in plugin_files:
        path = Path(item).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"--plugin: no such file {str(item)!r}")
        files.append(str(path))
    return {
        "py_modules": [str(package_dir()), *files],
        "excludes": list(EXCLUDES),
        "env_vars": {FINGERPRINT_VAR: code_fingerprint()},
        "worker_process_setup_hook": _setup_hook(),
    }


def check_same_code() -> None:
    """Raises `CodeMismatchError` if this process's raydpfl is not the driver's.

    Called first in every raydpfl actor's constructor; a process started without the
    variable (a user's own Ray task) is not checked.
    """
    expected = os.environ.get(FINGERPRINT_VAR)
    if expected is None or expected == code_fingerprint():
        return
    raise CodeMismatchError(
        f"this Ray actor imported raydpfl from {package_dir()} (code {code_fingerprint()}), "
        f"which differs from the driver's (code {expected}); run the driver and the cluster "
        "on the same raydpfl version"
    )
