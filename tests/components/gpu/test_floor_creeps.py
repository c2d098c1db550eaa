"""De-stepping and floor samples of the GLR method (``components/gpu/shifts.py``, ``trend.py``): which floor changes
are a creep, the bar they are judged against, and the floor bounds inside a sawtooth's long open segment."""

from __future__ import annotations

import numpy as np
import pytest

MiB = 2**20
GiB = 2**30


def test_a_steady_run_of_rises_is_a_creep_and_a_loads_ramp_is_not() -> None:
    """A run of shifts that climbs at one rate per second over more than twice the null's longest ramp is a
    creep however it ends (seed 15's 4 GiB/h leak under a random 580 s sawtooth: 276, 766 and 504 MiB over
    430, 1015 and 480 s); a load's ramp over a few minutes, or changes far from one rate, stay shifts."""
    from inferwatch_sidecar.components.gpu.shifts import CREEP_RUN_S, _creeps_on, _steady

    small = 32 * MiB
    d = np.array([276.0, 766.0, 504.0]) * MiB
    dt = np.array([430.0, 1015.0, 480.0])
    assert _steady(d, dt, small)
    assert _creeps_on(d, dt, np.ones(3, dtype=bool), small).all()
    assert not _steady(d, dt * (CREEP_RUN_S / 2) / dt.sum(), small)  # the same rises within four minutes
    assert not _steady(d[:2], dt[:2], small)  # two changes: a shift straddling blocks
    assert not _steady(np.array([2048.0, 40.0, 40.0]) * MiB, dt, small)  # a load and a fill after it
    assert not _steady(np.array([276.0, 766.0, 20.0]) * MiB, dt, small)  # one change within the noise


def test_a_creep_sampled_at_irregular_times_is_not_taken_for_a_load() -> None:
    """Release floors of seed 15's 4 GiB/h leak under a random 546 s sawtooth (30 MiB sample noise): the creep's
    changes vary with the gaps between releases (196 to 1,520 MiB). Their spread, counted as noise, held the next
    change under the creep check's bar, and the 1,520 MiB change was taken out as a load (whose own warm-up then
    held the creep for an hour). The bar is now the changes' spread net of the floor's climb over each gap where
    that is below the deviations' spread from their neighbours."""
    from inferwatch_sidecar.components.gpu.trend import _destep, _net_of_climb

    ft = np.array([3022, 3853, 4353, 5564, 6348, 7248, 7701, 9008, 9332], dtype=float)
    fy = np.array([32220, 32242, 32206, 32244, 32224, 32216, 32412, 33932, 34246.0]) * MiB
    jump, g, _ = _destep(fy, True, 5.0, 30 * MiB, 0.3, ft)
    assert not jump.any() and (g == fy).all()

    def spread(x: np.ndarray) -> float:
        return 1.4826 * float(np.median(np.abs(x - np.median(x))))

    # A creep of 4 GiB/h over 12 gaps drawn as a random sawtooth's (30 MiB noise): its changes spread with the
    # gaps, net of the climb they spread with the noise; on a flat floor at the same times, as before.
    rng = np.random.default_rng(3)
    none = np.zeros(12, dtype=bool)
    ratios, flat = [], []
    for _ in range(200):
        t = np.cumsum(rng.exponential(546, 13))
        y = rng.normal(0, 30 * MiB, 13)
        d = np.diff(y + 4 * GiB / 3600 * t)
        ratios.append(spread(_net_of_climb(d, np.diff(t), none)) / spread(d))
        flat.append(spread(_net_of_climb(np.diff(y), np.diff(t), none)) / spread(np.diff(y)))
    assert float(np.median(ratios)) < 0.5
    assert float(np.median(flat)) == pytest.approx(1.0, abs=0.05)


def test_a_long_open_segment_bounds_the_floor_from_below_by_its_tallest_tooth() -> None:
    """Inside a sawtooth segment that has not released for long, the memory less the tallest tooth is a lower
    bound on the floor: none is added while the cache stalls at its top, and they climb with a leak's floor."""
    from inferwatch_sidecar.components.gpu.trend import CEILING_GROWTH, CEILING_K, _ceiling_floors

    amp, noise, rate = 1.0 * GiB, 20 * MiB, 4 * GiB / 3600
    r = np.array([0.0, 400, 900, 1500, 1900, 2400])  # median gap 500 s; the last opens at 2400 s
    t = np.arange(5.0, 2400 + 2400, 10.0)
    seg = np.searchsorted(r, t, side="right") - 1
    cache = amp * np.minimum(1.0, (t - r[seg]) / 500)
    for leak in (0.0, rate):
        floor = 20 * GiB + leak * np.maximum(0.0, t - 2400)
        y = floor + cache
        bt, by = _ceiling_floors(t, y, seg, r, 20 * GiB, noise)
        if leak == 0.0:
            assert len(bt) == 0
            continue
        # Parts of half a gap from one gap after the release; each bound at the floor then (within what the
        # 10 s bins miss of a tooth's top), and never above it by more.
        assert len(bt) >= 3 and (np.diff(bt) >= 250).all() and (np.diff(by) > 0).all()
        assert (np.abs(by - (20 * GiB + leak * (bt - 2400))) <= 0.03 * amp).all()
        # Each added bound clears the trough by the tooth's growth allowance and the noise.
        assert (by - 20 * GiB > CEILING_GROWTH * amp * 0.99 + CEILING_K * noise).all()
    # Too few teeth to know the cache's height: nothing.
    assert len(_ceiling_floors(t, y, seg, r[:3], 20 * GiB, noise)[0]) == 0
