"""One generalized likelihood-ratio test of a leak's creep against a composite leak-free null.

Data: the de-stepped release-floor blocks of a scale (times ``t``, floors ``y``). Both hypotheses have
Gaussian noise of one unknown SD:

- **null** (leak-free): the best of a constant; one level shift of any size at any block boundary,
  abrupt or spread over up to RAMP_BLOCKS blocks (a cache filled within a minute, a load straddling
  blocks); a
  saturating warm-up ``a (1 - exp(-(t - t0) / tau))`` from the series' start ``t0``, free ``a``, with
  ``tau <= tau_max`` (its slope decays at least as fast as ``exp(-t / tau_max)``). A level shift
  followed by a new warm-up is not in it: a warm-up that starts where a creep starts is
  indistinguishable from the creep for about ``tau_max``; a shift together with the warm-up from ``t0``
  is (a load at the start, a cache filled on top of the warm-up);
- **alternative** (a leak): the null's warm-up from ``t0`` plus a hinge creep ``r max(0, t - c)``,
  maximised over the knot ``c`` (a rise that spans at least the last quarter of the window).

The statistic is ``(SSE_null - SSE_alt) / s^2``: twice the log-likelihood ratio, with ``s`` the scale's
robust block noise, or the alternative's residual SD when that is wider (a floor that wanders is judged
at its own scale, an F-like ratio). Its threshold comes from a
Monte Carlo of the same maximum under pure noise (``bench/leak_glr_threshold.py``), with the tail
extrapolated exponentially, for a per-judgement false-alarm probability ``ALPHA``; docs/gpu.md derives
the rate per series-day.
"""

from __future__ import annotations

import math

import numpy as np

#: Warm-up time constants: a log grid of TAU_GRID points from TAU_MIN_SHARE x tau_max to tau_max,
#: then GOLDEN_STEPS of golden-section search around the best.
TAU_MIN_SHARE = 1 / 64
TAU_GRID = 13
GOLDEN_STEPS = 10
#: At most this many level-shift positions (a grid over the block boundaries).
MAX_STEPS = 24
#: A level shift of the null may take up to this many block spacings.
RAMP_BLOCKS = 3
#: The hinge's knot leaves at least this share of the data's span after it.
MIN_TAIL = 0.25

#: Monte Carlo thresholds: ``(n blocks, threshold)`` for the per-judgement false-alarm probability
#: ALPHA, from ``python bench/leak_glr_threshold.py --draws 6000`` (6,000 pure-noise draws per n, the top 2%
#: fitted by an exponential tail), measured before the null gained spread shifts and a shift with the
#: warm-up. A larger null can only lower the statistic under noise, so these are conservative: the
#: 6,000-draw rerun with the present null gives ((5, 0.27), (6, 0.62), (8, 1.28), (12, 2.0), (16, 3.15),
#: (24, 2.92), (32, 2.96), (48, 4.53), (64, 3.6)), but its 98th percentile is 0 at every n (the null fits
#: pure noise at least as well as the creep 98% of the time), so its exponential tail is fitted on a
#: few hundred non-zero values. Interpolated linearly in n, flat beyond the ends.
ALPHA = 1e-5
THRESHOLDS: tuple[tuple[int, float], ...] = ((8, 8.09), (12, 11.13), (16, 10.61), (24, 9.54), (32, 9.16),
                                             (48, 10.08), (64, 10.96))


#: Warm-up shapes of the null, each a rise from 0 to 1 over u = age / tau: ``exp`` (1 - exp(-u), a cache
#: filling at a falling rate) and ``s_curve`` (1 - (1 + u) exp(-u), traffic ramping up first); both
#: slopes decay at least as fast as exp(-t / tau_max) in the end for tau <= tau_max / 2.
SHAPES = ("exp", "s_curve")


def _rise(shape: str, u: np.ndarray) -> np.ndarray:
    if shape == "exp":
        return 1.0 - np.exp(-u)
    return 1.0 - (1.0 + u) * np.exp(-u)


def threshold(n: int) -> float:
    """The statistic's threshold for ``n`` blocks (THRESHOLDS, interpolated)."""
    ns = [a for a, _ in THRESHOLDS]
    vs = [b for _, b in THRESHOLDS]
    return float(np.interp(n, ns, vs))


def _sse(cols: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares (residual sum of squares, coefficients) of ``y`` on each design ``cols[b]`` (B x n x p)."""
    xtx = np.einsum("bnp,bnq->bpq", cols, cols)
    xty = np.einsum("bnp,n->bp", cols, y)
    # A tiny ridge keeps degenerate designs (a warm-up that is flat over the data) solvable.
    p = cols.shape[2]
    scale = np.maximum(np.einsum("bpp->bp", xtx).max(axis=1), 1e-300)
    beta = np.linalg.solve(xtx + 1e-12 * scale[:, None, None] * np.eye(p), xty[:, :, None])[:, :, 0]
    return np.maximum(0.0, float(y @ y) - np.einsum("bp,bp->b", beta, xty)), beta


def statistic(t: np.ndarray, y: np.ndarray, t0: float, tau_max: float, sigma: float) -> tuple[float, float]:
    """(GLR statistic, best knot) of floors ``y`` at ``t`` for a series that started at ``t0``.

    ``sigma``: the robust SD of a block's floor; the noise SD used is at least it.
    """
    n = len(t)
    span = float(t[-1] - t[0])
    if n < 5 or span <= 0:
        return 0.0, float(t[0]) if n else 0.0
    x = (t - t[0]) / span
    yc = (y - y.mean()) / max(sigma, 1e-300)
    ones = np.ones(n)
    age = np.maximum((t - t0) / span, 0.0)
    tau_hi = tau_max / span
    # Null 1: a saturating warm-up from t0 of each shape, its tau fitted continuously (a grid, then
    # golden-section in log tau around the best point: a large warm-up leaves a misfit of many SDs
    # between grid points).
    taus = tau_hi * np.exp(np.linspace(math.log(TAU_MIN_SHARE), 0.0, TAU_GRID))
    best_w, best_curve = math.inf, np.zeros(n)
    for shape in SHAPES:
        warm = _rise(shape, age[None, :] / taus[:, None])
        sse_w = _sse(np.stack([np.broadcast_to(ones, warm.shape), warm], axis=2), yc)[0]
        k = int(np.argmin(sse_w))
        if sse_w[k] < best_w:
            best_w, best_curve = float(sse_w[k]), warm[k]
        lo, hi = math.log(taus[max(0, k - 1)]), math.log(taus[min(len(taus) - 1, k + 1)])
        g = (math.sqrt(5) - 1) / 2
        for _ in range(GOLDEN_STEPS):
            m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
            pair = np.exp([m1, m2])
            w = _rise(shape, age[None, :] / pair[:, None])
            f = _sse(np.stack([np.broadcast_to(ones, w.shape), w], axis=2), yc)[0]
            if f[0] < f[1]:
                hi = m2
            else:
                lo = m1
            j = int(np.argmin(f))
            if f[j] < best_w:
                best_w, best_curve = float(f[j]), w[j]
    # Null 2: one level shift of any size at any block boundary (and the constant, a shift of 0).
    # A shift may take up to RAMP_BLOCKS blocks (a cache filled within a minute, a load straddling
    # blocks): a ramp from one level to the other over L block spacings, L = 0 (a jump) .. RAMP_BLOCKS.
    us = np.unique(np.linspace(1, n - 1, min(n - 1, MAX_STEPS)).astype(np.int64))
    dx = float(np.median(np.diff(x)))
    ramps = [(np.arange(n)[None, :] >= us[:, None]).astype(float)]  # S x n
    for ln in range(1, RAMP_BLOCKS + 1):
        ramps.append(np.clip((x[None, :] - x[us - 1][:, None]) / (ln * dx), 0.0, 1.0))
    step = np.concatenate(ramps)
    sse_s = _sse(np.stack([np.broadcast_to(ones, step.shape), step], axis=2), yc)[0]
    # Null 3: a shift and the warm-up together (a load at start, a fill, on top of the warm-up).
    bw = np.broadcast_to(best_curve, step.shape)
    sse_sw = _sse(np.stack([np.broadcast_to(ones, step.shape), step, bw], axis=2), yc)[0]
    sse0 = min(best_w, float(sse_s.min()), float(sse_sw.min()), float(((yc - yc.mean()) ** 2).sum()))
    # Alternative: the null's warm-up (or none) plus a hinge at each knot.
    knots = x[: max(1, int(np.searchsorted(x, 1 - MIN_TAIL, side="right")))]
    hinge = np.maximum(0.0, x[None, :] - knots[:, None])  # C x n
    wk = np.stack([best_curve, np.zeros(n)])  # 2 x n
    h3 = np.broadcast_to(hinge[:, None, :], (len(knots), 2, n))
    w3 = np.broadcast_to(wk[None, :, :], h3.shape)
    alt = np.stack([np.broadcast_to(ones, h3.shape), w3, h3], axis=3).reshape(-1, n, 3)
    sse1_all, beta = _sse(alt, yc)
    sse1_all = np.where(beta[:, 2] > 0, sse1_all, np.inf)  # a creep rises
    i = int(np.argmin(sse1_all))
    sse1 = float(sse1_all[i])
    if not math.isfinite(sse1):
        return 0.0, float(t[0])
    wk_n = 2
    # Known block noise (1 in these units) unless the alternative's own residuals are wider: then the
    # noise is profiled out (an F-like ratio), so a floor that wanders is judged at its own scale.
    v = max(1.0, sse1 / max(1, n - 4))
    return max(0.0, sse0 - sse1) / v, float(t[0] + knots[i // wk_n] * span)
