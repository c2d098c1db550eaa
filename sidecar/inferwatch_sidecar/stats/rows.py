"""A batch's feature rows as a float64 matrix: in C (``_rows.c``) when it was built, else with numpy.

The wire decoder gives each record's numeric features as a tuple of floats; the drift windows read a
batch of them as one matrix. The compiled loop reads exact tuples of exact floats about 15 times faster
than ``np.fromiter`` over the chained tuples (bench/ingest.py's replica); rows of any other kind (lists,
ints, from the HTTP JSON ingest or a test) are read by numpy, to the same matrix.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

try:
    from inferwatch_sidecar.stats._rows import stack_floats as _stack  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # built without a C compiler: numpy reads every batch
    _stack = None

#: Whether the compiled loop was built (tests/stats/test_rows.py requires it in CI).
COMPILED = _stack is not None


def float_rows(rows: list[Any], width: int) -> np.ndarray:
    """``rows`` (sequences of ``width`` numbers each) as an ``(len(rows), width)`` float64 matrix.

    Raises:
        ValueError, TypeError: as numpy does, for a row of another length or a value that is no number.
    """
    n = len(rows)
    if _stack is not None and type(rows) is list:
        out = np.empty((n, width), dtype=np.float64)
        if _stack(rows, width, out):
            return out
    if all(type(r) is tuple for r in rows):
        flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64)
        if flat.size == n * width:
            return flat.reshape(n, width)
    return np.array(rows, dtype=np.float64).reshape(n, width)
