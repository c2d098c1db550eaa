"""Shared by the skew tests: bench/skew.py (the data sets and the injector) loaded as a module."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.paths import BENCH

BENCH = BENCH / "skew.py"


def load_bench() -> ModuleType:
    name = "bench_skew"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
