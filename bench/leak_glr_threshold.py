"""The GLR leak test's thresholds, by Monte Carlo of its statistic under the null (pure block noise).

For each number of floor blocks n (equally spaced, unit noise), the statistic of
``components/gpu/glr.py`` is computed on ``--draws`` draws of noise, in two layouts: a series whose
warm-up is over (the null and the alternative hold no warm-up) and a young one (its start drawn between
the window's start and two windows before it, tau_max between a twentieth and twice the window).
Under the null the statistic is 0 most of the time (a shift fits noise as well as a creep does), so
its tail is what matters: the exceedances over the 99.5th percentile are fitted by a generalized
Pareto distribution (``scipy.stats.genpareto``, location at the percentile) with its shape held at 0
(an exponential tail: the statistic is a difference of maxima of chi-square terms, and a free shape
fitted on a few hundred exceedances swings the extrapolation by a factor of five from one n to the
next; the free fit's shape is printed beside it) and the threshold is the fitted ``1 - glr.ALPHA``
quantile; the larger of the two layouts' is kept, and the table is made non-increasing in n from the
largest (more blocks never need a higher threshold than fewer: a conservative envelope).

Prints the ``THRESHOLDS`` table to paste into glr.py, and for each n the empirical 99.9th and 99.99th
percentiles next to the fitted tail's, so the fit can be checked where the draws reach.

Usage:
    python bench/leak_glr_threshold.py [--draws 100000] [--seed 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from scipy import stats

from inferwatch_sidecar.components.gpu import glr

NS = (8, 12, 16, 24, 32, 48, 64)
TAIL = 0.005
BATCH = 5000


def draws(n: int, k: int, rng: np.random.Generator, young: bool) -> np.ndarray:
    """``k`` values of the statistic on n blocks of pure unit noise."""
    t = np.arange(n, dtype=float)
    span = float(n - 1)
    out = []
    for lo in range(0, k, BATCH):
        m = min(BATCH, k - lo)
        if young:
            # A few layouts per batch (the design is shared within one).
            for part in np.array_split(np.arange(m), 10):
                t0 = -float(rng.uniform(0, 2 * span))
                tau = float(rng.uniform(0.05, 2) * span)
                out.append(glr.statistic_batch(t, rng.normal(0, 1, (len(part), n)), t0, tau, 1.0)[0])
        else:
            out.append(glr.statistic_batch(t, rng.normal(0, 1, (m, n)), -1e12, span, 1.0)[0])
    return np.concatenate(out)


def tail_threshold(v: np.ndarray, alpha: float) -> tuple[float, float, tuple[float, float]]:
    """(threshold at alpha, the tail's base percentile u, the fitted GPD's (shape, scale))."""
    u = float(np.quantile(v, 1 - TAIL))
    exc = v[v > u] - u
    if len(exc) < 20:
        raise ValueError(f"only {len(exc)} exceedances over the {100 * (1 - TAIL):g}th percentile: draw more")
    c_free = float(stats.genpareto.fit(exc, floc=0.0)[0])
    c, _loc, scale = stats.genpareto.fit(exc, f0=0.0, floc=0.0)
    p_u = float(np.mean(v > u))
    return u + float(stats.genpareto.ppf(1 - alpha / p_u, c, loc=0.0, scale=scale)), u, (c_free, float(scale))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    t0 = time.monotonic()
    for n in NS:
        best = 0.0
        for young in (False, True):
            v = draws(n, args.draws, rng, young)
            thr, u, (c, scale) = tail_threshold(v, glr.ALPHA)
            emp = np.quantile(v, [0.999, 0.9999])
            fit = [u + float(stats.genpareto.ppf(1 - a / float(np.mean(v > u)), 0.0, scale=scale)) for a in (1e-3, 1e-4)]
            print(f"n {n:>3} {'young' if young else 'old  '}: 99.5% {u:6.2f}, free GPD shape {c:5.2f}, "
                  f"exponential scale {scale:5.2f}; "
                  f"99.9% {emp[0]:6.2f} (fit {fit[0]:6.2f}), 99.99% {emp[1]:6.2f} (fit {fit[1]:6.2f}); "
                  f"threshold at alpha {glr.ALPHA:g}: {thr:6.2f}")
            best = max(best, thr)
        rows.append((n, best))
    # Non-increasing in n: each n's threshold is at least that of every larger n.
    env = np.maximum.accumulate(np.array([b for _, b in rows])[::-1])[::-1]
    rows = [(n, round(float(b), 2)) for (n, _), b in zip(rows, env, strict=True)]
    print(f"\nTHRESHOLDS = {tuple(rows)}  # {args.draws} draws per n and layout, seed {args.seed}, "
          f"{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
