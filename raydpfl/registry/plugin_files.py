"""Importing ``--plugin`` modules and files, and remembering the files.

A plug-in ``.py`` file is imported under its stem as module name, from any path; the
files imported in this process are remembered (`plugin_files`) so that the Ray backend
can ship them to its actors (``raydpfl.backends.ray.runtime_env``), where the objects
they define are unpickled by reference to that module name.

A plug-in is trusted code (it runs in the driver and in every actor), but its failures
must still read as one line: whatever its import raises (an ImportError, a SyntaxError,
any exception, even ``sys.exit``) becomes `PluginImportError` naming the plug-in and
the original error.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

#: The plug-in files imported in this process, resolved, in import order.
_FILES: list[Path] = []


class PluginImportError(Exception):
    """A ``--plugin`` module or file could not be imported."""

    def __init__(self, plugin: str, reason: str) -> None:
        super().__init__(f"cannot import {plugin!r}: {reason}")
        self.plugin = plugin


def import_plugin(plugin: str) -> None:
    """Imports `plugin`: a ``.py`` file (as module `stem`) or a module name.

    Raises:
        PluginImportError: The file does not exist, or importing it raised anything
            (``SystemExit`` included: a plug-in cannot end the command).
    """
    try:
        if plugin.endswith(".py"):
            path = Path(plugin)
            if not path.is_file():
                raise PluginImportError(plugin, "no such file")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None:
                raise PluginImportError(plugin, "not a Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(path.stem, None)
                raise
            resolved = path.resolve()
            if resolved not in _FILES:
                _FILES.append(resolved)
        else:
            importlib.import_module(plugin)
    except PluginImportError:
        raise
    except SyntaxError as e:
        where = f" (line {e.lineno})" if e.lineno else ""
        raise PluginImportError(plugin, f"SyntaxError: {e.msg}{where}") from None
    except SystemExit as e:
        raise PluginImportError(plugin, f"it called sys.exit({e.code!r}) on import") from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        text = " ".join(str(e).split())
        raise PluginImportError(
            plugin, f"{type(e).__name__}: {text}" if text else type(e).__name__
        ) from None


def remember_plugin_file(path: str | Path) -> None:
    """Records a plug-in file imported by other means (an ``import`` of the same file), so
    that the Ray actors' runtime environment ships it too."""
    resolved = Path(path).resolve()
    if resolved not in _FILES:
        _FILES.append(resolved)


def plugin_files() -> tuple[Path, ...]:
    """The plug-in files imported so far in this process (resolved paths)."""
    return tuple(_FILES)
