"""Reading detector state back: arrays from ``to_state()`` documents, checked before use.

Every drift detector's ``from_state`` reads its arrays through
:func:`state_array`, so a tampered or truncated checkpoint is refused with a
message instead of corrupting a window.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def state_array(state: dict[str, Any], key: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The array ``state[key]`` as ``dtype``, checked: it must have ``shape`` and valid values.

    Integer arrays hold non-negative integers that fit ``dtype``; float arrays
    hold finite numbers. A checkpoint is read back through this check.

    Raises:
        ValueError: the entry is missing, has another shape, or holds invalid values.
    """
    raw = state.get(key)
    if raw is None:
        raise ValueError(f"array {key} is missing")
    try:
        a = np.asarray(raw)
    except ValueError:
        raise ValueError(f"array {key} is not a regular array") from None
    if a.shape != shape:
        raise ValueError(f"array {key} has shape {a.shape}, expected {shape}")
    want = np.dtype(dtype)
    if a.size and (a.dtype.kind not in "iuf" or not np.all(np.isfinite(a))):
        raise ValueError(f"array {key} holds invalid values")
    if a.size and want.kind in "iu" and (a.dtype.kind == "f" or a.min() < 0 or a.max() > np.iinfo(want).max):
        raise ValueError(f"array {key} holds invalid values")
    return a.astype(want)
