"""How well the leak detector's creep rate (``glr.creep_rate``) generalizes to warm-ups of other shapes.

A creep's rate at detection is the floor's slope after the change point net of a warm-up of the null's prior
(three shapes from the series' start, tau up to ``tau_max``), kept only where it fits the blocks after the knot
about as well as their own line does (``glr.POST_MISFIT``). This draws, for each warm-up shape, series of
one-minute floor blocks: a warm-up of 1-6 GiB from the process start, a creep of 0.5-4 GiB/h from a knot, 5-20 MiB
of noise, and 15-50 minutes of data after the knot (when a detection reads its rate). It compares the rate with
the least-squares slope of the blocks after the knot alone (what the detector read before the eleventh pass).

Shapes, x the time since the start:
- ``prior``: one of the null's own (``exp``, ``s_curve``, ``root``), tau 5-15 min;
- ``two_exp``: two exponentials mixed, tau 1-7 min and 8-25 min;
- ``logistic``: 1 / (1 + exp(-(x - c) / s)), c 5-20 min, s 1-5 min (a warm-up that starts late and steep);
- ``power``: (x / T)^p up to its plateau at T, p 0.25-0.8, T 10-40 min;
- ``ramp``: x / T up to T, 5-25 min (a fill at a constant rate that stops).

Regimes: ``during`` (the knot at 20-60% of the warm-up's duration) and ``after`` (at 60-120%).

Usage:
    python bench/leak_rate_shapes.py              # 200 series per shape and regime (a few seconds)
    python bench/leak_rate_shapes.py --n 1000 --seed 3
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inferwatch_sidecar.components.gpu import glr  # noqa: E402

MiB, GiB = 2**20, 2**30
SHAPES = ("prior", "two_exp", "logistic", "power", "ramp")
REGIMES = ("during", "after")
TAU_MAX = 1200.0


def warm_up(rng: np.random.Generator, shape: str, t: np.ndarray) -> tuple[np.ndarray, float]:
    """A warm-up rising from 0 to about 1 at times ``t``, and the time by which it is (about) over."""
    if shape == "prior":
        tau, kind = float(rng.uniform(300, 900)), str(rng.choice(glr.SHAPES))
        return glr._rise(kind, t / tau), {"exp": 3.0, "s_curve": 4.7, "root": 4.0}[kind] * tau
    if shape == "two_exp":
        t1, t2, f = float(rng.uniform(60, 420)), float(rng.uniform(480, 1500)), float(rng.uniform(0.2, 0.8))
        return f * (1 - np.exp(-t / t1)) + (1 - f) * (1 - np.exp(-t / t2)), 3.0 * t2
    if shape == "logistic":
        c, s = float(rng.uniform(300, 1200)), float(rng.uniform(60, 300))
        return 1 / (1 + np.exp(-(t - c) / s)) - 1 / (1 + math.exp(c / s)), c + 3 * s
    if shape == "power":
        end, p = float(rng.uniform(600, 2400)), float(rng.uniform(0.25, 0.8))
        return np.minimum(1.0, (t / end) ** p), end
    if shape == "ramp":
        end = float(rng.uniform(300, 1500))
        return np.minimum(1.0, t / end), end
    raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")


def draw(rng: np.random.Generator, shape: str, regime: str
         ) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    """(block times, floor, knot, rate, noise) of one series."""
    t = np.arange(30.0, 6 * 3600.0, 60.0)
    w, over = warm_up(rng, shape, t)
    lo, hi = (0.2, 0.6) if regime == "during" else (0.6, 1.2)
    knot = max(300.0, float(rng.uniform(lo, hi)) * over)
    keep = t <= knot + float(rng.uniform(900, 3000))
    t, w = t[keep], w[keep]
    rate = float(rng.uniform(0.5, 4)) * GiB / 3600
    noise = float(rng.uniform(5, 20)) * MiB
    y = (20 * GiB + float(rng.uniform(1, 6)) * GiB * w + rate * np.maximum(0.0, t - knot)
         + rng.normal(0.0, noise, len(t)))
    return t, y, knot, rate, noise


def slope_after(t: np.ndarray, y: np.ndarray, knot: float) -> float:
    after = t >= knot
    tc = t[after] - t[after].mean()
    return float((tc * (y[after] - y[after].mean())).sum() / (tc * tc).sum())


def measure(n: int, seed: int) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """Relative errors (estimate / rate - 1) of both estimates, per shape and regime."""
    out = {}
    for shape in SHAPES:
        for regime in REGIMES:
            rng = np.random.default_rng([seed, SHAPES.index(shape), REGIMES.index(regime)])
            e_slope, e_net = np.empty(n), np.empty(n)
            for i in range(n):
                t, y, knot, rate, noise = draw(rng, shape, regime)
                e_slope[i] = slope_after(t, y, knot) / rate - 1
                e_net[i] = glr.creep_rate(t, y, 0.0, TAU_MAX, noise, knot)[0] / rate - 1
            out[shape, regime] = {"slope": e_slope, "net": e_net}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="series per shape and regime (default 200)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.n < 1:
        ap.error("--n must be at least 1")
    res = measure(a.n, a.seed)
    print(f"{a.n} series per row; off by more than 20% (median |error|): slope after the knot alone -> creep_rate")
    print(f"{'shape':9s} {'knot':7s} {'slope after knot':>18s} {'creep_rate':>18s}")
    worse = []
    for (shape, regime), e in res.items():
        cells = []
        for k in ("slope", "net"):
            err = np.abs(e[k])
            cells.append(f"{int((err > 0.2).sum()):4d} ({100 * float(np.median(err)):5.1f}%)")
        print(f"{shape:9s} {regime:7s} {cells[0]:>18s} {cells[1]:>18s}")
        if (np.abs(e["net"]) > 0.2).sum() > (np.abs(e["slope"]) > 0.2).sum() + max(3, a.n // 20):
            worse.append(f"{shape}/{regime}")
    print("creep_rate worse than the slope after the knot (by more than 5% of the series) on: "
          + (", ".join(worse) if worse else "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
