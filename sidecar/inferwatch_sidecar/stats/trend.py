"""Robust trend estimators for a series ``y`` over times ``t``.

- :func:`theil_sen`: the Theil-Sen slope (the median of the pairwise slopes) and Sen's distribution-free
  confidence interval, from ``scipy.stats.theilslopes``.
- :func:`mann_kendall`: the Mann-Kendall statistic ``S`` and its z-score under no trend, with the tie
  correction of the variance (quantised series, such as allocator memory in 2 MiB blocks, have many equal
  values) and, by default, the continuity correction.

Both are O(n^2) in the number of points: meant for tens to a few thousand points (bins, floors), not raw
streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MannKendall", "TheilSen", "mann_kendall", "theil_sen"]


@dataclass(frozen=True)
class TheilSen:
    """A Theil-Sen fit: ``slope`` with Sen's ``[lower, upper]`` interval, and ``intercept`` (median of ``y - slope t``)."""

    slope: float
    intercept: float
    lower: float
    upper: float


@dataclass(frozen=True)
class MannKendall:
    """The Mann-Kendall test: ``s`` (concordant minus discordant pairs), its variance, ``z`` and the two-sided p."""

    s: float
    var_s: float
    z: float
    p_value: float


def theil_sen(t: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> TheilSen:
    """The Theil-Sen slope of ``y`` over ``t`` and Sen's ``confidence`` interval (at least 2 points)."""
    if len(t) != len(y) or len(y) < 2:
        raise ValueError("theil_sen: t and y need the same length, at least 2")
    from scipy import stats as sps  # here: scipy.stats is 70+ MiB that an idle sidecar need not hold

    res = sps.theilslopes(np.asarray(y, dtype=float), np.asarray(t, dtype=float), alpha=confidence)
    return TheilSen(float(res[0]), float(res[1]), float(res[2]), float(res[3]))


def mann_kendall(y: np.ndarray, *, continuity: bool = True) -> MannKendall:
    """The Mann-Kendall trend test of ``y`` in its order (the times only order the points)."""
    y = np.asarray(y, dtype=float)
    n = y.size
    if n < 2:
        raise ValueError("mann_kendall: at least 2 points")
    i, j = np.triu_indices(n, k=1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1].astype(float)
    var_s = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    if var_s <= 0 or s == 0:
        return MannKendall(s, var_s, 0.0, 1.0)
    num = s - math.copysign(1.0, s) if continuity else s
    z = num / math.sqrt(var_s)
    from scipy import stats as sps

    return MannKendall(s, var_s, z, float(2.0 * sps.norm.sf(abs(z))))
