"""The GLR leak test's thresholds, by Monte Carlo of its statistic under the null (pure block noise).

For each number of floor blocks n (equally spaced, unit noise, the series' start drawn between the
window's start and two windows before it, tau_max drawn between a twentieth and twice the window), the
statistic of ``components/gpu/glr.py`` is computed on ``--draws`` draws of noise. Its tail above the
98th percentile is fitted by an exponential (the maximum of chi-square-like terms; the mean excess is
its scale's MLE) and extrapolated to the per-judgement false-alarm probability ``glr.ALPHA``.

Prints the ``THRESHOLDS`` table to paste into glr.py, and for each n the empirical quantiles next to the
fitted tail's, so the fit can be checked where the draws reach.

Usage:
    python bench/leak_glr_threshold.py [--draws 20000] [--seed 3]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from inferwatch_sidecar.components.gpu import glr

NS = (5, 6, 8, 12, 16, 24, 32, 48, 64)
TAIL = 0.02


def draws(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` values of the statistic on n blocks of pure unit noise."""
    t = np.arange(n, dtype=float)
    span = float(n - 1)
    out = np.empty(k)
    for i in range(k):
        t0 = -rng.uniform(0, 2 * span)
        out[i] = glr.statistic(t, rng.normal(0, 1, n), t0, float(rng.uniform(0.05, 2) * span), 1.0)[0]
    return out


def tail_threshold(v: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(threshold at alpha, the 98th percentile, the exponential tail's scale)."""
    q = float(np.quantile(v, 1 - TAIL))
    scale = float((v[v > q] - q).mean())
    return q + scale * math.log(TAIL / alpha), q, scale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    t0 = time.monotonic()
    for n in NS:
        v = draws(n, args.draws, rng)
        thr, q, scale = tail_threshold(v, glr.ALPHA)
        emp = np.quantile(v, [0.99, 0.999])
        fit = [q + scale * math.log(TAIL / a) for a in (0.01, 0.001)]
        print(f"n {n:>3}: 98% {q:6.2f}, tail scale {scale:5.2f}; 99% {emp[0]:6.2f} (fit {fit[0]:6.2f}), "
              f"99.9% {emp[1]:6.2f} (fit {fit[1]:6.2f}); threshold at alpha {glr.ALPHA:g}: {thr:6.2f}")
        rows.append((n, round(thr, 2)))
    print(f"\nTHRESHOLDS = {tuple(rows)}  # {args.draws} draws per n, seed {args.seed}, "
          f"{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
