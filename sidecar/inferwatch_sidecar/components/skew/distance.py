"""How far a feature's served distribution is from its offline one over the joined rows, as TFDV measures it.

The L-infinity distance of the category frequencies for a categorical feature; the Jensen-Shannon divergence
(base 2) of a common histogram for a numeric one. A one-point lag in a smooth feature barely moves it, which
is why :mod:`.diagnose` also compares the joined rows one by one.
"""

from __future__ import annotations

import numpy as np

#: Histogram bins of the Jensen-Shannon divergence.
_BINS = 32


def distance(kind: str, s: np.ndarray, o: np.ndarray) -> dict[str, float | None]:
    """The distance of the served values ``s`` from the offline values ``o`` of one feature.

    Args:
        kind: ``categorical`` (``s`` and ``o`` are category codes, -1 missing) or ``numeric`` (NaN missing).
        s: the served values of the joined rows.
        o: the offline values of the same rows.
    """
    if kind == "categorical":
        k = int(max(s.max(initial=-1), o.max(initial=-1))) + 2
        ps = np.bincount(s + 1, minlength=k) / max(len(s), 1)
        po = np.bincount(o + 1, minlength=k) / max(len(o), 1)
        return {"l_infinity": float(np.abs(ps - po).max()) if len(s) else None}
    s, o = s[np.isfinite(s)], o[np.isfinite(o)]
    if len(s) == 0 or len(o) == 0:
        return {"jensen_shannon_divergence": None}
    edges = np.unique(np.quantile(o, np.linspace(0, 1, _BINS + 1)))
    if len(edges) < 2:
        edges = np.array([o[0] - 0.5, o[0] + 0.5])
    inner = edges[1:-1]
    p = np.bincount(np.searchsorted(inner, o, side="right"), minlength=len(edges) - 1) / len(o)
    q = np.bincount(np.searchsorted(inner, s, side="right"), minlength=len(edges) - 1) / len(s)
    # Served values outside the offline range fall in the outer bins; add bins for them so they count.
    lo, hi = np.count_nonzero(s < edges[0]) / len(s), np.count_nonzero(s > edges[-1]) / len(s)
    q[0] -= lo
    q[-1] -= hi
    p = np.concatenate([[0.0], p, [0.0]])
    q = np.concatenate([[lo], q, [hi]])
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_p = np.where(p > 0, p * np.log2(p / m), 0.0).sum()
        kl_q = np.where(q > 0, q * np.log2(q / m), 0.0).sum()
    return {"jensen_shannon_divergence": float(max(0.0, (kl_p + kl_q) / 2))}
