"""The GLR's warm-up null between the points of its tau grid (``glr._exact_shift_sse``, ``glr._near``)."""

from __future__ import annotations

import math

import numpy as np

from inferwatch_sidecar.components.gpu import glr

MiB = 2**20
GiB = 2**30

# The detector's three scales: (block spacing, window) in seconds.
SCALES = ((20.0, 900.0), (30.0, 1800.0), (60.0, 3600.0))


def _warm_up(rng: np.random.Generator, after: float = 0.0) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Floor blocks of one window of a leak-free warm-up drawn at random within the prior (any shape, tau 1-20
    minutes, 0.5-6 GiB), with 2-10 MiB of block noise (a large warm-up seen with little noise), and its tau.
    ``after``: the window starts at least this many seconds after the series' start."""
    shape = str(rng.choice(glr.SHAPES))
    tau = math.exp(rng.uniform(math.log(60), math.log(1200)))
    amp, noise = rng.uniform(0.5, 6) * GiB, rng.uniform(2, 10) * MiB
    block, window = SCALES[int(rng.integers(len(SCALES)))]
    now = max(rng.uniform(window / 2, 2 * window), after + window)
    t = np.arange(block, now, block)
    t = t[t >= now - window]
    y = 10 * GiB + amp * glr._rise(shape, t / tau) + rng.normal(0, noise, len(t))
    return t, y, noise, tau


def test_a_large_warm_up_between_the_grid_s_taus_is_refitted_and_not_taken_for_a_creep() -> None:
    """On the grid alone (taus 9% apart) a warm-up of several GiB with a few MiB of noise misfits by many SDs,
    which the hinge takes up; over the threshold, the null's best warm-ups are refitted on a grid eight times
    finer around them, and none of 200 random warm-ups passes."""
    rng = np.random.default_rng(11)
    coarse_over, worst = 0, 0.0
    for _ in range(200):
        t, y, noise, _ = _warm_up(rng)
        thr = glr.threshold(len(t))
        coarse, _ = glr.statistic(t, y, 0.0, 1200.0, noise, cache=False)
        refit, _ = glr.statistic(t, y, 0.0, 1200.0, noise, cache=False, exact_above=thr)
        coarse_over += coarse > thr
        worst = max(worst, refit / thr)
    assert coarse_over >= 5, coarse_over  # what the grid alone called a creep
    assert worst < 1.0, worst


def test_a_creep_on_a_large_warm_up_still_passes_the_refitted_null() -> None:
    """The refit takes only what a warm-up explains: a 2 GiB/h creep over the last 60% of a window on the same
    random warm-ups passes every time, its knot within a fifth of the window of the truth, once the prior's
    slowest S-shaped warm-up no longer bends upwards (two tau_max from the start; before, a creep is a warm-up
    still speeding up, with the grid or without)."""
    rng = np.random.default_rng(12)
    for _ in range(40):
        t, y, noise, _ = _warm_up(rng, after=2 * 1200.0)
        knot = t[0] + 0.4 * (t[-1] - t[0])
        y = y + 2 * GiB / 3600 * np.maximum(0.0, t - knot)
        thr = glr.threshold(len(t))
        stat, at = glr.statistic(t, y, 0.0, 1200.0, noise, cache=False, exact_above=thr)
        assert stat > thr, (stat, thr)
        assert abs(at - knot) <= 0.2 * (t[-1] - t[0])


def test_the_benchmark_s_root_warm_up_is_refitted_at_the_shortest_of_its_equal_fits() -> None:
    """Seed 14's leak trace 117, its second process (idle all along: 2.1 GiB of square-root warm-up, tau 435 s,
    to its plateau at 29 minutes), the one-hour window's 60 s floor blocks at 31 minutes (MiB, de-stepped). On the
    grid it scored 7.4 (threshold 5.5) and raised an alarm. A root warm-up whose plateau lies past the data fits
    alike at every longer tau: the refit starts from the shortest of those, whose neighbours bend inside the
    data."""
    t = np.r_[30.0, np.arange(150.0, 1831.0, 60.0)]
    y = np.array([0, 254, 374, 466, 584, 652, 722, 792, 878, 922, 986, 1066, 1114, 1172, 1214, 1270, 1326, 1354,
                  1424, 1460, 1476, 1534, 1580, 1614, 1664, 1706, 1740, 1714, 1802, 1818], dtype=float) * MiB
    sigma, loads = 14.7 * MiB, (30.0,)
    thr = glr.threshold(len(t))
    assert glr.statistic(t, y, 0.0, 1200.0, sigma, False, loads)[0] > thr
    assert glr.statistic(t, y, 0.0, 1200.0, sigma, False, loads, exact_above=thr)[0] < 0.8 * thr


def test_the_finer_columns_around_a_grid_point_hold_it_at_their_centre() -> None:
    t = np.arange(400.0, 1300.0, 20.0)
    grid = glr.warm_columns(t, 0.0, 1200.0)
    for k in (0, 20, glr.TAU_GRID - 1, glr.TAU_GRID + 7, 2 * glr.TAU_GRID + 30):
        near = glr._near(t, 0.0, 1200.0, k)
        assert near.shape == (2 * glr.FINE + 1, len(t))
        assert np.allclose(near[glr.FINE], grid[k], atol=1e-4 * max(1e-9, float(np.abs(grid[k]).max())))
    # No tau over the prior's: the longest grid point's upper neighbours repeat it.
    top = glr._near(t, 0.0, 1200.0, glr.TAU_GRID - 1)
    assert np.allclose(top[glr.FINE:], top[glr.FINE])
