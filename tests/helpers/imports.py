"""Importing third-party modules whose own import warns (pytest turns warnings into errors)."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType


def quiet_import(name: str) -> ModuleType:
    """Import a third-party module (Evidently) whose import emits deprecation warnings.

    pytest turns warnings into errors for our code; Evidently's own import-time
    warnings about numpy/pydantic internals are not ours to fix.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)
