"""Shared by the skew tests: bench/skew.py (the data sets and the injector) loaded as a module."""

from __future__ import annotations

import sys
from types import ModuleType

from tests.helpers.imports import load_file
from tests.helpers.paths import BENCH


def load_bench() -> ModuleType:
    name = "bench_skew"
    if name in sys.modules:
        return sys.modules[name]
    return load_file(BENCH / "skew.py", name)
