"""Importing what is not a package of ours: a script by its path, a third-party module whose import warns."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["load_file", "quiet_import"]


def load_file(path: Path, name: str | None = None) -> ModuleType:
    """Run the script at ``path`` (``bench/*.py``, ``scripts/*.py``) as the module ``name`` (its stem by default).

    The module is put in ``sys.modules`` before it runs, as an import would: its dataclasses look their module up
    there. Every call runs the file again.
    """
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def quiet_import(name: str) -> ModuleType:
    """Import a third-party module (Evidently) whose import emits deprecation warnings.

    pytest turns warnings into errors for our code; Evidently's own import-time
    warnings about numpy/pydantic internals are not ours to fix.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)
