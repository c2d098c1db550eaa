"""Quantiles: of a binned histogram, and of the standard normal distribution.

- :func:`binned_quantile`: the ``q`` quantile of counts over bins with upper ``edges``, interpolated
  geometrically inside its bin (latency bins are log-spaced, so a geometric interpolation is exact for a
  log-uniform density within a bin).
- :func:`norm_ppf`: the inverse standard normal CDF (``scipy.special.ndtri``: full double precision), for
  z-scores and confidence intervals.
"""

from __future__ import annotations

import numpy as np

__all__ = ["binned_quantile", "norm_ppf"]


def norm_ppf(p: float) -> float:
    """The standard normal quantile of ``p`` in (0, 1): ``norm_ppf(0.975)`` is 1.959963984540054."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"norm_ppf: p must lie in (0, 1), got {p!r}")
    from scipy import special  # here: scipy is 26+ MiB that an idle sidecar need not hold

    return float(special.ndtri(p))


def binned_quantile(counts: np.ndarray, edges: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile of a histogram; None when it is empty.

    Args:
        counts: ``len(edges) + 1`` counts: bin 0 holds values up to ``edges[0]`` (the underflow bin), bin
            ``i`` values in ``(edges[i-1], edges[i]]``, the last one values above ``edges[-1]``.
        edges: strictly increasing, positive bin bounds.
        q: the quantile, in [0, 1].

    The underflow and overflow bins have no finite bound to interpolate with, so a quantile that falls in
    them is the nearest edge.
    """
    n = float(counts.sum())
    if n <= 0:
        return None
    cum = np.cumsum(counts)
    rank = q * n
    i = int(np.searchsorted(cum, rank, side="left"))
    i = min(i, counts.size - 1)
    hi = float(edges[min(i, edges.size - 1)])
    if i == 0 or i >= edges.size:
        return hi
    lo = float(edges[i - 1])
    below = float(cum[i - 1])
    frac = (rank - below) / float(counts[i]) if counts[i] else 1.0
    return float(lo * (hi / lo) ** min(max(frac, 0.0), 1.0))
