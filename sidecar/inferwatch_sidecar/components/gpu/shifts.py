"""The level shifts among a series' floor blocks that the GLR method takes out of its floor (``trend._destep``).

Split out of ``trend.py``: which block-to-block changes are loads, unloads and caches filled or emptied
(rises and falls far beyond the floor's own climb around them), which of them are a creep's or a transient's
and stay, and which falls are taken out with the rise they give back. docs/gpu.md describes
the rules; ``trend._destep`` sizes what they mark and takes it out.
"""

from __future__ import annotations

import numpy as np

MiB = 2**20
#: Smallest block-to-block rise ever treated as a level shift.
STEP_UP_MIN = 32 * MiB
#: The GLR takes out falls from this size (trend._destep): a load's, the smallest that loadlog.LOAD_MIN names.
LOAD_FALL_MIN = 256 * MiB


def robust_sd(x: np.ndarray) -> float:
    """1.4826 x the median absolute deviation of ``x``: the SD of Gaussian data, unmoved by a few outliers."""
    return 1.4826 * float(np.median(np.abs(x - np.median(x))))


def _row_nanmedian(m: np.ndarray) -> np.ndarray:
    """``np.nanmedian(m, axis=1)`` for rows with at least one value (a sort, not numpy.ma's slow path)."""
    srt = np.sort(np.where(np.isnan(m), np.inf, m), axis=1)
    cnt = (~np.isnan(m)).sum(axis=1)
    r = np.arange(len(m))
    out: np.ndarray = 0.5 * (srt[r, np.maximum(cnt - 1, 0) // 2] + srt[r, cnt // 2])
    return out


def _with_neighbours(mask: np.ndarray, also: np.ndarray) -> np.ndarray:
    """``mask`` with the changes next to a marked one added where ``also`` holds (one shift over two)."""
    near = np.zeros_like(mask)
    near[1:] |= mask[:-1]
    near[:-1] |= mask[1:]
    return mask | (near & also)


def _neighbour_median(d: np.ndarray, skip: np.ndarray | None = None, k: int = 3) -> np.ndarray:
    """Per change, the median of the ``k`` on each side (without those ``skip`` marks; 0 where none is left)."""
    x = d if skip is None else np.where(skip, np.nan, d)
    nb = np.lib.stride_tricks.sliding_window_view(np.r_[np.full(k, np.nan), x, np.full(k, np.nan)], 2 * k + 1).copy()
    nb[:, k] = np.nan
    out = _row_nanmedian(nb)
    return np.where(np.isfinite(out), out, 0.0)


def _glr_changes(d: np.ndarray, step_k: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """The GLR's shifts among the floor changes ``d``: (rises, falls, each change less its neighbours' climb,
    that climb, the changes' robust SD).

    Against the neighbouring changes (three on each side): a warm-up's changes fall smoothly and none stands
    out from its neighbours, while a shift is one change far above both sides. On a climbing floor a rise must
    also add more than the neighbours' own climb: a fast leak's block changes vary by as much as they climb (one
    release in a block, or two), and the flat blocks elsewhere in the windows make the spread small.

    Falls too (an unload, a cache emptied when traffic stops): the GLR's alternative holds no level shift, so
    a fall kept in the floor left every window that held one unable to show a creep. Only falls the size of a
    load: a small one is as likely a floor sample read high falling back (the rise to it too small to be a
    shift), and taking it out alone would leave a climb.

    The climb is measured twice: the second time without the neighbours the first found to be shifts. A flat
    change beside a fall of GiBs, measured against it, read as a rise of GiBs (de-stepped as a load that never
    happened), and a shift beside another made a climb of hundreds of MiB a block of a flat floor.
    """
    local = _neighbour_median(d)
    dev = d - local
    sd = robust_sd(dev)
    up_min, fall_min = max(STEP_UP_MIN, step_k * sd), max(LOAD_FALL_MIN, step_k * sd)
    first = (dev > np.maximum(up_min, local)) | (dev < -fall_min)
    if first.any():
        local = _neighbour_median(d, first)
        dev = d - local
    return dev > np.maximum(up_min, local), dev < -fall_min, dev, local, sd


def _falls_that_give_back(jump: np.ndarray, sizes: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """The shifts with only the falls kept that give back a rise taken out before them: (jump, sizes).

    An unload after its load, a cache emptied when traffic stops after it filled: taken out with the rise,
    the floor goes on at its level. Any other fall stays in the floor: a sawtooth's release after a climb read
    as floor (the first teeth after an idle spell, before the releases are logged again), a leak's memory
    freed. Taken out, those turned each tooth into a step of a staircase, a creep. A fall gives back a rise
    when it is within a quarter of its size (or ``noise``), the latest rise not yet given back first, and
    then takes out exactly that rise: each size measured alone left its error in the floor, and a day of
    busy/idle swings added them up to a creep.
    """
    jump, sizes = jump.copy(), sizes.copy()
    idx = np.flatnonzero(jump)
    if not len(idx):
        return jump, sizes
    open_rises: list[float] = []
    for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        lo, hi = int(run[0]), int(run[-1])
        size = float(sizes[lo])
        if size >= 0:
            if size > 0:
                open_rises.append(size)
            continue
        match = next((k for k in range(len(open_rises) - 1, -1, -1)
                      if abs(size + open_rises[k]) <= max(0.25 * open_rises[k], noise)), None)
        if match is None:
            jump[lo: hi + 1] = False
            sizes[lo] = 0.0
        else:
            sizes[lo] = -open_rises.pop(match)  # exactly: the two estimates' errors would stay in the floor
    return jump, sizes


def _transients_out(d: np.ndarray, jump: np.ndarray, sizes: np.ndarray, noise: float) -> np.ndarray:
    """``sizes`` with the runs of shifts that go both ways and net less than ``noise`` set to 0: a floor
    sample read far off and the next one back (a dip or a spike over a block or two) is no level shift; the
    level difference around it is noise, and taken out it stays in the de-stepped floor for good."""
    out = sizes.copy()
    idx = np.flatnonzero(jump)
    if not len(idx):
        return out
    for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        lo, hi = int(run[0]), int(run[-1])
        ch = d[lo: hi + 1]
        if (ch > 0).any() and (ch < 0).any() and abs(out[lo]) < noise:
            out[lo] = 0.0
    return out


#: A run of at least CREEP_RUN rising shifts over at least CREEP_RUN_S that climbs steadily (:func:`_steady`) is a
#: creep however it ends: a shift of the null spreads over at most glr.RAMP_MAX_S (240 s).
CREEP_RUN = 3
CREEP_RUN_S = 480.0


def _steady(d: np.ndarray, dt: np.ndarray, small: float) -> bool:
    """Whether the changes ``d`` over ``dt`` (a run of shifts) climb steadily: a creep's, not a load's ramp.

    The changes after the first rise beyond ``small`` at between half and twice their rate per second; the
    first may rise by less (a creep that began within its gap: seed 14's 4 GiB/h leak on a process gone idle,
    266 MiB and then 754, 746 and 756 over 660 s blocks), never faster than twice that rate (a load)."""
    if len(d) < CREEP_RUN or float(dt.sum()) < CREEP_RUN_S or (dt <= 0).any() or d[0] <= 0 or (d[1:] <= small).any():
        return False
    rate = float(d[1:].sum()) / float(dt[1:].sum())
    ratio = (d / dt) / rate
    return bool(ratio[0] <= 2.0 and ((ratio[1:] >= 0.5) & (ratio[1:] <= 2.0)).all())


def _creeps_on(d: np.ndarray, dt: np.ndarray, jump: np.ndarray, small: float) -> np.ndarray:
    """The changes among ``jump`` (runs of adjacent ones) that the floor's next change carries on: a creep.

    A level shift (a load, a cache filling within a minute) leaves the floor flat after it; a creep goes on
    at its own rate. Where floor samples come minutes apart (release-aligned ones under a slow or random
    sawtooth), one change of a fast creep is hundreds of MiB, as large as a load: de-stepped, it took the
    leak out (a 4 GiB/h leak under a random 254 s sawtooth went unseen for 24 minutes). A run of shifts is
    a creep when the change after it rises by more than ``small`` (beyond the changes' noise) at between
    half and twice the run's rate per second. The newest run has no change after it yet and
    stays a shift until the next floor sample.
    """
    out = np.zeros(len(jump), dtype=bool)
    idx = np.flatnonzero(jump)
    if not len(idx):
        return out
    for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        lo, hi = int(run[0]), int(run[-1])
        if _steady(d[lo: hi + 1], dt[lo: hi + 1], small):
            out[lo: hi + 1] = True
            continue
        nxt = hi + 1
        if nxt >= len(d) or d[nxt] <= small or dt[nxt] <= 0:
            continue
        span = float(dt[lo: hi + 1].sum())
        if span <= 0:
            continue
        ratio = (float(d[nxt]) / float(dt[nxt])) / (float(d[lo: hi + 1].sum()) / span)
        if 0.5 <= ratio <= 2.0:
            out[lo: hi + 1] = True
    return out
