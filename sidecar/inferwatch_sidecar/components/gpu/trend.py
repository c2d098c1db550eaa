"""The statistics of the leak detector's release floor: floor bins per scale, de-stepping, trend tests.

Split out of ``detector.py`` (issue 23), which re-exports every name: ``detector.py``'s module docstring
describes the method; these are its numeric parts, free of the detector's state (the one exception,
:class:`_Scale`, is one scale's bins and slope history).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from inferwatch_sidecar.components.gpu.shifts import (
    STEP_UP_MIN,
    _creeps_on,
    _falls_that_give_back,
    _glr_changes,
    _neighbour_median,
    _transients_out,
    _with_neighbours,
    robust_sd,
)

MiB = 2**20
#: Releases are drops of at least this much below the peak since the previous release, and of
#: RELEASE_K per-sample SDs (the peak is the highest of many noisy samples, 4-5 SDs up by itself).
RELEASE_MIN = 64 * MiB
RELEASE_K = 12.0
#: At most this many floor blocks per window (bounds the O(n^2) Theil-Sen pass).
MAX_BLOCKS = 60
#: A window is judged once the series also holds this share of a window before it, so that the
#: deceleration test sees a warm-up's curvature (from the series' first sample on, a warm-up's rise
#: looks straight over one window).
PRE_WINDOW = 0.5
#: The null spread of a scale's slope is measured over this many of its windows of history ...
HIST_WINDOWS = 12
#: ... once the judgements that ended at least one window ago span this many windows.
HIST_MIN_WINDOWS = 2
#: Fewer falling windows than this in the history: the floor has only risen, there is no background
#: spread to measure (the parametric standard error alone applies).
HIST_MIN_FALLS = 10
#: The spread is this quantile of the falling windows' |slope| over the half-normal's quantile.
HIST_Q = 0.9
HIST_Q_Z = 1.645

_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    p = _PAIRS.get(n)
    if p is None:
        p = _PAIRS[n] = np.triu_indices(n, k=1)
    return p


def _norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (scipy's ``ndtri``)."""
    from scipy.special import ndtri  # here: scipy is 26+ MiB that an idle sidecar need not hold

    return float(ndtri(p))


def sen_mann_kendall(t: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float, float]:
    """Theil-Sen slope, Sen's ``confidence`` interval, and the Mann-Kendall z of ``y`` over ``t``."""
    n = len(y)
    i, j = _pairs(n)
    dy = y[j] - y[i]
    slopes = dy / (t[j] - t[i])
    npairs = len(slopes)
    s = float(np.sign(dy).sum())
    # Variance of S with the tie correction: allocator memory is quantised (2 MiB
    # blocks), so equal floors are common and ignoring ties would inflate z.
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1].astype(float)
    var_s = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    sd = math.sqrt(var_s) if var_s > 0 else 0.0
    z = (s - math.copysign(1.0, s)) / sd if sd > 0 and s != 0 else 0.0
    # Sen's interval: ranks (N -+ C)/2 of the sorted pairwise slopes.
    c = _norm_ppf(0.5 + confidence / 2) * sd
    lo_rank = max(0, int(math.floor((npairs - c) / 2)))
    hi_rank = min(npairs - 1, int(math.ceil((npairs + c) / 2)))
    # A partial sort (O(N)) is enough: only the median and the two ranks are needed.
    mid = [npairs // 2] if npairs % 2 else [npairs // 2 - 1, npairs // 2]
    part = np.partition(slopes, sorted({lo_rank, hi_rank, *mid}))
    slope = float(part[mid].mean())
    lower, upper = float(part[lo_rank]), float(part[hi_rank])
    return slope, lower, upper, z


@dataclass(frozen=True)
class TrendResult:
    """The statistics of one scale at one evaluation.

    Attributes:
        window_s: the scale's window.
        block_s: the floor block length used (at least one release per block).
        n: floor blocks in the window.
        slope: Theil-Sen slope of the de-stepped floor, bytes/s.
        lower: lower bound of its interval (slope -+ q x spread), bytes/s.
        upper: upper bound, bytes/s.
        z: slope over its spread under the background (``LeakDetector._null_spread``).
        steps: level shifts removed in the window and the one before.
        quarter_share: largest share of the window's rise carried by one quarter.
        decel_ratio: end slope over start slope of a quadratic fit over the window and the half window
            before (None when the fit is not concave).
        passed: whether every leak condition held.
        onset: hinge-fit onset estimate (only when passed).
        rate: hinge-fit slope after the onset, bytes/s (only when passed).
        rate_lower: lower bound of its interval (only when passed).
        rate_upper: upper bound (only when passed).
        floor: the latest raw floor block, bytes.
        base: the lowest raw floor since the onset estimate (only when passed).
    """

    window_s: float
    block_s: float
    n: int
    slope: float
    lower: float
    upper: float
    z: float
    steps: int
    quarter_share: float
    decel_ratio: float | None
    passed: bool
    onset: float | None
    rate: float | None
    rate_lower: float | None
    rate_upper: float | None
    floor: float
    base: float | None
    #: the GLR statistic and its threshold (method ``glr`` only)
    glr: float | None = None
    glr_threshold: float | None = None
    #: the median of the scale's last three raw floor samples, and the block noise SD (bytes): what the
    #: release check compares (one floor sample carries the sawtooth's sampling phase)
    level: float | None = None
    sigma: float | None = None


def _slope(t: np.ndarray, y: np.ndarray, sigma: float) -> tuple[float, float]:
    """Theil-Sen slope of ``y`` over ``t`` and its standard error for independent noise of SD ``sigma``."""
    n = len(t)
    if n < 2:
        return 0.0, math.inf
    i, j = _pairs(n)
    slope = float(np.median((y[j] - y[i]) / (t[j] - t[i])))
    sxx = float(((t - t.mean()) ** 2).sum())
    return slope, sigma / math.sqrt(sxx)


def _shift_sizes(fy: np.ndarray, jump: np.ndarray, m: int = 4, climb: np.ndarray | None = None) -> np.ndarray:
    """Size of each level shift (``jump[i]``: between blocks i and i+1), else 0.

    The size is the median of up to ``m`` blocks after the shift minus that of up to ``m`` before
    (not crossing another shift): the change between the two adjacent blocks alone would carry
    their noise into the de-stepped level for good. ``climb`` (per change, bytes per block): the
    floor's own climb around each change, taken out of the difference over the blocks between the
    two medians (on a climbing floor the difference of levels holds that climb too).
    """
    out = np.zeros(len(jump))
    idx = np.flatnonzero(jump)
    if not len(idx):
        return out
    runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)  # adjacent changes form one shift
    bounds = [(int(r[0]), int(r[-1])) for r in runs]
    for k, (lo, hi) in enumerate(bounds):
        left = bounds[k - 1][1] + 1 if k else 0
        right = bounds[k + 1][0] if k + 1 < len(bounds) else len(fy) - 1
        b0, a1 = max(left, lo + 1 - m), min(right + 1, hi + 1 + m)
        before, after = fy[b0: lo + 1], fy[hi + 1: a1]
        out[lo] = float(np.median(after)) - float(np.median(before))
        if climb is not None:
            out[lo] -= float(climb[lo]) * ((hi + 1 + a1 - 1) / 2 - (b0 + lo) / 2)
    return out


def _decel(t: np.ndarray, y: np.ndarray) -> float | None:
    """Slope at the end over slope at the start of a quadratic fit, when its curvature is negative (else None)."""
    if len(t) < 5:
        return None
    x = (t - t[0]) / (t[-1] - t[0])
    xx = np.stack([np.ones_like(x), x, x * x], axis=1)
    c0, c1, c2 = np.linalg.inv(xx.T @ xx) @ (xx.T @ y)
    if c2 >= 0:
        return None
    start, end = float(c1), float(c1 + 2 * c2)
    return end / start if start > 0 else 0.0


def _best_hinge(t: np.ndarray, g: np.ndarray, last_knot: float) -> tuple[float, float, float, np.ndarray]:
    """Least-squares ``g = a + r * max(0, t - c)`` over knots ``c`` at the block times up to ``last_knot``.

    Returns (c, r, the sum of squares of the centred hinge regressor, the residuals).
    """
    n = len(t)
    knots = t[: max(1, min(n - 4, int(np.searchsorted(t, last_knot, side="right"))))]
    x = np.maximum(0.0, t[None, :] - knots[:, None])
    xm = x.mean(axis=1, keepdims=True)
    gm = g.mean()
    sxx = ((x - xm) ** 2).sum(axis=1)
    sxy = ((x - xm) * (g - gm)[None, :]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(sxx > 0, sxy / sxx, 0.0)
    sse = ((g - gm) ** 2).sum() - r * sxy
    i = int(np.argmin(sse))
    return float(knots[i]), float(r[i]), float(sxx[i]), (g - gm) - r[i] * (x[i] - xm[i])


def _hinge(t: np.ndarray, g: np.ndarray, sigma: float, q: float, last_knot: float) -> tuple[float, float, float, float]:
    """Fit ``g = a + r * max(0, t - c)`` over knots ``c`` at the block times up to ``last_knot``: (c, r, r - q SE, r + q SE)."""
    c, r, sxx, _ = _best_hinge(t, g, last_knot)
    se = sigma / math.sqrt(sxx) if sxx > 0 else 0.0
    return c, r, r - q * se, r + q * se


def _ar1_inflation(t: np.ndarray, g: np.ndarray, last_knot: float) -> float:
    """sqrt((1 + rho) / (1 - rho)): how much serial correlation widens a trend slope's standard error.

    ``rho`` is the lag-1 autocorrelation (0 to 0.9) of the residuals of the best hinge (flat, then a
    slope) over the blocks: a leak's own onset is fitted and does not count; a warm-up's curvature, a
    fill below the shift threshold, or a slow wander leaves correlated residuals.
    """
    if len(t) < 5:
        return 1.0
    res = _best_hinge(t, g, last_knot)[3]
    den = float((res * res).sum())
    if den <= 0:
        return 1.0
    rho = min(0.9, max(0.0, float((res[1:] * res[:-1]).sum()) / den))
    return math.sqrt((1 + rho) / (1 - rho))


def _hist_spread(sc: _Scale, now: float) -> float | None:
    """Spread of the scale's window slope under the series' own background, from its falls; None: too little history.

    The judgements used ended at least a window ago (they do not overlap the one being judged) and must
    span HIST_MIN_WINDOWS windows. A stationary background lowers its floor as often and as fast as it
    raises it, while a leak only adds rises: the spread is read off the falling windows, which a leak
    cannot inflate: the 90th percentile of their |slope| over 1.645 (the half-normal's).
    """
    if not sc.hist or sc.hist[0][0] > now - (1 + HIST_MIN_WINDOWS) * sc.window_s:
        return None
    falls = [-v for t, v in sc.hist if t <= now - sc.window_s and v < 0]
    if len(falls) < HIST_MIN_FALLS:
        return 0.0
    return float(np.quantile(falls, HIST_Q)) / HIST_Q_Z


class _Scale:
    """Bin floors of one (window, bin width) pair, bounded to two windows and a block."""

    __slots__ = ("window_s", "bin_s", "eval_s", "bins", "cur_key", "cur_min", "closed_at", "hist")

    def __init__(self, window_s: float, bin_s: float) -> None:
        self.window_s = window_s
        self.bin_s = bin_s
        #: the scale is judged at a closed bin at most this often (a thirtieth of its window)
        self.eval_s = max(bin_s, window_s / 30)
        #: (bin centre, floor) per closed bin: two windows, for the deceleration test, plus a block.
        self.bins: deque[tuple[float, float]] = deque(maxlen=int(round(2.2 * window_s / bin_s)) + 2)
        self.cur_key: int | None = None
        self.cur_min = math.inf
        #: time of the sample at which the scale was last judged
        self.closed_at: float | None = None
        #: (time, de-stepped floor slope) of every judgement over the last HIST_WINDOWS windows
        self.hist: deque[tuple[float, float]] = deque(maxlen=int(HIST_WINDOWS * window_s / self.eval_s) + 2)

    def add(self, t: float, v: float) -> bool:
        """Add a sample; True when it closed a bin."""
        key = int(t // self.bin_s)
        if key == self.cur_key:
            if v < self.cur_min:
                self.cur_min = v
            return False
        closed = self.cur_key is not None
        if closed:
            self.bins.append(((self.cur_key + 0.5) * self.bin_s, self.cur_min))  # type: ignore[operator]
        self.cur_key = key
        self.cur_min = v
        return closed


class _Blocks(NamedTuple):
    """The floor blocks of one scale's two windows (:func:`_floor_blocks`), newest last."""

    #: block centres (s) and floors (bytes)
    ft: np.ndarray
    fy: np.ndarray
    #: which blocks lie in the window being judged
    win: np.ndarray
    #: the block length (s) and the right edge of the newest bin
    block: float
    edge: float
    #: the blocks run from one release to the next (:func:`_release_floors`), not on a fixed grid
    aligned: bool = False


def _floor_blocks(sc: _Scale, release_window: float, min_blocks: int) -> _Blocks | None:
    """Minima of the scale's bins over blocks of at least ``release_window`` s; None: too few to judge."""
    a = np.asarray(sc.bins, dtype=float)
    t, y = a[:, 0], a[:, 1]
    n_w = int(round(sc.window_s / sc.bin_s))
    stride = max(math.ceil(release_window / sc.bin_s - 1e-9), math.ceil(n_w / MAX_BLOCKS), 1)
    block = stride * sc.bin_s
    nb = int(sc.window_s // block)
    if nb < min_blocks:
        return None  # the sawtooth is too slow for this window: longer windows judge it
    edge = t[-1] + sc.bin_s / 2
    j = ((edge - t) // block).astype(np.int64)
    keep = j < 2 * nb
    t, y, j = t[keep], y[keep], j[keep]
    starts = np.flatnonzero(np.r_[True, j[1:] != j[:-1]])
    counts = np.diff(np.r_[starts, len(y)])
    fy = np.minimum.reduceat(y, starts)
    fj = j[starts]
    full = counts * 2 >= stride  # a block with too many missing bins may miss its release
    fy, fj = fy[full], fj[full]
    ft = edge - (fj + 0.5) * block
    win = fj < nb
    if int(win.sum()) < min_blocks or len(fy) < 3:
        return None
    return _Blocks(ft, fy, win, block, edge)


def _release_floors(sc: _Scale, releases: np.ndarray, min_blocks: int, since: float,
                    noise: float = 0.0) -> _Blocks | None:
    """Floor samples from one release to the next: each segment's minimum, at its time; None: too few.

    A fixed block must span the longest usual gap between releases (1.25 x the 90th percentile) to hold
    one, so under random releases (exponential gaps) it spans about three mean periods; a segment that
    starts at a release holds that release's trough whatever the gaps, so the floor is seen once per
    release. Segments are merged in runs when two windows hold more than 2 x MAX_BLOCKS of them.
    ``since``: the log holds every release from then on; None (fixed blocks instead) when the scale's
    bins reach further back (a fast sawtooth's log covers less than the longest windows). ``noise``: the
    per-sample noise SD; above 0, a long open segment adds its lower bounds (:func:`_ceiling_floors`).
    """
    a = np.asarray(sc.bins, dtype=float)
    t, y = a[:, 0], a[:, 1]
    if since > t[0] - sc.bin_s / 2:
        return None
    edge = t[-1] + sc.bin_s / 2
    # (A release on the newest bin's right edge belongs to the bin still open.)
    r = releases[(releases >= edge - 2 * sc.window_s) & (releases < edge)]
    if len(r) < min_blocks:
        return None
    # A bin belongs to the segment of the latest release before its end (the bin holding a release's
    # trough starts that segment); bins before the first release are left out.
    seg = np.searchsorted(r, t + sc.bin_s / 2, side="left") - 1  # the releases strictly before the bin's end
    keep = seg >= 0
    t, y, seg = t[keep], y[keep], seg[keep]
    if not len(seg):
        return None
    merge = max(1, math.ceil((int(seg[-1]) + 1) / (2 * MAX_BLOCKS)))
    group = seg // merge
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    if len(starts) > 1 and len(y) - starts[-1] < 2:
        # The newest segment holds only the bin of its release: the trough after a free that takes a few
        # seconds may still lie in the bin that is open, and that bin's minimum is then part of the free.
        t, y, seg, group, starts = t[: starts[-1]], y[: starts[-1]], seg[: starts[-1]], group[: starts[-1]], starts[:-1]
    fy = np.minimum.reduceat(y, starts)
    # Each floor sample is dated by the release whose trough it is (the lowest bin's segment): a bin's
    # centre would misplace it by up to half a bin, which on a steep warm-up is a misfit of many SDs.
    ends = np.r_[starts[1:], len(y)]
    ft = np.array([r[seg[s0 + int(np.argmin(y[s0:e0]))]] for s0, e0 in zip(starts, ends, strict=True)])
    win = ft >= edge - sc.window_s
    if int(win.sum()) < min_blocks or len(fy) < 3:
        return None
    if noise > 0 and merge == 1:
        # (After the count: too few troughs leave the window to fixed blocks, which see a floor gone idle.)
        bt, by = _ceiling_floors(t, y, seg, r, float(fy[-1]), noise)
        ft, fy, win = np.r_[ft, bt], np.r_[fy, by], np.r_[win, np.ones(len(bt), dtype=bool)]
    block = float(np.median(np.diff(r))) * merge if len(r) > 1 else sc.window_s
    return _Blocks(ft, fy, win, block, edge, True)


#: A sawtooth's cache may be taller now than any tooth closed in the scale's two windows (traffic rising over
#: the day scales it): a bound on the floor counts where it clears the trough by this share of the tallest tooth
CEILING_GROWTH = 0.25
#: ... and this many per-sample noise SDs (the bins are minima of noisy samples, the tooth's top one of them).
CEILING_K = 4.0
#: Fewest closed teeth in the scale's bins for the tallest to stand for the cache's height.
CEILING_TEETH = 3
#: The open segment's parts are this share of the median gap long.
CEILING_PART = 0.5


def _ceiling_floors(t: np.ndarray, y: np.ndarray, seg: np.ndarray, r: np.ndarray, trough: float,
                    noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on the floor inside the open segment (no release since ``r[-1]``) once it outlasts two
    median gaps: (times, floors), empty where none clears the segment's ``trough`` by the margin below.

    Between releases a sawtooth's memory is the floor plus its cache, and the cache is never taller than the
    teeth it has shown: so each half median gap of a long open segment, after its first gap, bounds the floor
    from below by its lowest bin less the tallest closed tooth, and a bound is a floor sample where it clears
    the trough by CEILING_GROWTH of that tooth and CEILING_K noise SDs. A cache that stalls at its top leaves
    every bound near the trough, and none is added; a leak lifts the stalled top with the floor, and once it
    has climbed past the tooth's height and the margin the bounds rise with it. Without them
    the floor was seen only at the next release: a 4 GiB/h leak whose random sawtooth (580 s mean gap) did not
    release for 32 minutes went unseen for the hour its trace lasted.
    """
    empty = (np.zeros(0), np.zeros(0))
    if len(r) < CEILING_TEETH + 2:
        return empty
    gap = float(np.median(np.diff(r)))
    last = len(r) - 1
    opened = seg == last
    if gap <= 0 or t[-1] - r[-1] < 2 * gap or not opened.any():
        return empty
    closed = seg < last
    counts = np.bincount(seg[closed], minlength=last)
    if int((counts > 0).sum()) < CEILING_TEETH:
        return empty
    top = np.full(last, -np.inf)
    low = np.full(last, np.inf)
    np.maximum.at(top, seg[closed], y[closed])
    np.minimum.at(low, seg[closed], y[closed])
    tooth = float(np.max(np.where(counts > 0, top - low, 0.0)))
    margin = CEILING_GROWTH * tooth + CEILING_K * noise
    to, yo = t[opened], y[opened]
    part = np.floor((to - r[-1]) / (CEILING_PART * gap)).astype(np.int64)
    later = part >= 1 / CEILING_PART
    to, yo, part = to[later], yo[later], part[later]
    if not len(part):
        return empty
    starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
    ends = np.r_[starts[1:], len(part)]
    lows = np.array([s0 + int(np.argmin(yo[s0:e0])) for s0, e0 in zip(starts, ends, strict=True)])
    bound = yo[lows] - tooth
    keep = bound > trough + margin
    return to[lows][keep], bound[keep]


#: SD of the minimum of m independent standard normal samples, (m, SD): order statistics (numerical
#: integration of m phi(x) (1 - Phi(x))^(m - 1); tests/components/gpu/test_glr.py checks them with scipy).
MIN_SD = ((1, 1.0), (2, 0.826), (3, 0.748), (5, 0.669), (10, 0.587), (20, 0.525), (50, 0.464), (100, 0.429),
          (200, 0.401), (500, 0.370), (1000, 0.351))


def min_sd(m: float) -> float:
    """The SD of the minimum of ``m`` standard normal samples (MIN_SD, interpolated in log m; flat past the ends)."""
    return float(np.interp(math.log(max(1.0, m)), [math.log(a) for a, _ in MIN_SD], [b for _, b in MIN_SD]))


def floor_share(fb: _Blocks, dts: Iterable[float]) -> float:
    """The least block noise, as a share of the per-sample noise, for the floor samples of ``fb``.

    A release-aligned floor sample is the sawtooth's trough, the minimum of the segment's samples (``fb.block``
    over the median sampling interval of ``dts``): its noise is at least that of such a minimum (a sawtooth's
    ramp leaves fewer samples near the trough: more, never less), while the MAD of a window's few changes, or
    of long idle segments among busy ones, can say far less. Fixed blocks keep 0.3: an allocator's floor is
    the minimum under one-sided spikes (activations), far less noisy than its samples.
    """
    d = sorted(dts)
    if not fb.aligned or not d or d[0] <= 0:
        return 0.3
    return max(0.3, min_sd(fb.block / d[len(d) // 2]))


def _net_of_climb(d: np.ndarray, gaps: np.ndarray, jump: np.ndarray) -> np.ndarray:
    """The floor changes ``d`` over ``gaps`` that are not shifts (``jump``), each less the floor's own climb over
    its gap: the rate of the three changes on each side (their rise over their time, shifts left out), where it is
    beyond twice its noise (on a flat floor, subtracting a climb that is noise added a sixth to its variance; a
    median of the changes' rates per second, each a noise over a gap, 2.4 times the noise)."""
    ok = ~jump & (gaps > 0)
    rest = d[~jump]
    if not ok.any():
        return rest
    n, side = len(d), np.r_[np.ones(3), 0.0, np.ones(3)]
    rise = np.convolve(np.where(ok, d, 0.0), side)[3: 3 + n]
    span = np.convolve(np.where(ok, gaps, 0.0), side)[3: 3 + n]
    count = np.convolve(ok.astype(float), side)[3: 3 + n]
    rate = np.divide(rise, span, out=np.zeros(n), where=span > 0)
    spread = robust_sd(rest)
    noise = np.divide(spread * np.sqrt(count), span, out=np.full(n, np.inf), where=span > 0)
    out: np.ndarray = (d - np.where(np.abs(rate) > 2 * noise, rate, 0.0) * gaps)[~jump]
    return out


def _destep(fy: np.ndarray, glr_method: bool, step_k: float, sample_sigma: float, floor_share: float = 0.3,
            ft: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """The level shifts among the floor blocks, the de-stepped floor, and the block noise.

    ``ft``: the blocks' times (GLR only): a rise the next change carries on at its own rate is a creep,
    not a shift (:func:`_creeps_on`).

    Returns (``jump[i]``: a shift between blocks i and i+1, the floor with the shifts removed, sigma).
    """
    # De-step: a rise far above the typical block-to-block change is a level shift (a load, traffic
    # filling the cache) and is removed. A shift that straddles a block boundary shows in two
    # changes: a neighbour beyond 2.5 SDs belongs to it. The trend test keeps falls (removing only
    # rises can bias the floor down, never up, so a busy/idle swing cannot add up to a false leak);
    # the GLR removes those that give back a rise it removed, by that rise's size.
    d = np.diff(fy)
    med = float(np.median(d))
    if glr_method and len(d) >= 3:
        jump, fall, dev, local, sd = _glr_changes(d, step_k)
    else:
        sd = robust_sd(d)
        dev = d - med
        jump = dev > max(STEP_UP_MIN, step_k * sd)
        fall = np.zeros_like(jump)
    if jump.any():
        jump = _with_neighbours(jump, dev > 2.5 * sd)
        if glr_method and ft is not None:
            # (The bar: the smaller of the deviations' spread and the changes' spread net of their climb. A
            # creep's own changes, counted as noise, held a 4 GiB/h leak's next change under it, and its
            # first one stayed a load.)
            net = _net_of_climb(d, np.diff(ft), jump)
            spread = robust_sd(net) if len(net) else sd
            jump &= ~_creeps_on(d, np.diff(ft), jump, max(STEP_UP_MIN, 2.5 * min(sd, spread)))
    if fall.any():
        jump |= _with_neighbours(fall, dev < -2.5 * sd)
    if glr_method:
        # A shift is what the change adds to the floor's own climb around it: on a flat floor the whole
        # difference of levels, on a climbing one less the climb between them; the difference of levels
        # alone would take the climb of the blocks around it too, and flatten a fast leak into a sawtooth.
        # (A climb within the noise of its median of six changes is not trusted: on a flat floor, a correction
        # over four blocks would add four times that noise. The median of the sixteen around, shifts left out,
        # is taken where beyond its own noise: none left a creep of 1-4 GiB/h in every shift, and an unload no
        # longer matched its load; the window's median change took a warm-up's early climb for its late one.)
        wide = _neighbour_median(d, jump, 8)
        climb = np.where(np.abs(local) > 2 * sd, local, np.where(np.abs(wide) > 0.75 * sd, wide, 0.0))
        sizes = _transients_out(d, jump, _shift_sizes(fy, jump, climb=climb), 3 * sd)
        jump, sizes = _falls_that_give_back(jump, sizes, 4 * sd)
        g = fy - np.r_[0.0, np.cumsum(sizes)]
    else:
        g = fy - np.r_[0.0, np.cumsum(_shift_sizes(fy, jump))]
    # Block noise from the changes that are not shifts (a difference of two blocks: / sqrt 2). (Each net of the
    # floor's climb, as the creep check's bar above, it raised three alarms on warm-ups whose shape the null
    # misfits by less than their climb's spread: docs/benchmarks.md, "Fourteenth pass".)
    rest = d[~jump]
    # Quantised floors (2 MiB granules) often repeat exactly: the MAD can be 0. A block minimum of
    # Gaussian samples has an SD of at least 0.3 of theirs, and never less than one granule.
    mad = robust_sd(rest) / math.sqrt(2) if len(rest) else 0.0
    sigma = max(2 * MiB, floor_share * sample_sigma, mad)
    return jump, g, sigma


def _quarter_share(tw: np.ndarray, gw: np.ndarray, edge: float, window_s: float, max_share: float,
                   sigma: float) -> tuple[float, bool]:
    """The largest share of the window's rise one quarter carries, and whether it is within ``max_share``."""
    # Rise per quarter of the window (medians of the blocks in each quarter).
    qi = np.minimum(3, ((tw - (edge - window_s)) * 4 // window_s).astype(np.int64))
    levels = [float(np.median(gw[qi == k])) for k in range(4) if (qi == k).any()]
    rises = np.diff(levels)
    total = levels[-1] - levels[0] if len(levels) > 1 else 0.0
    share = float(rises.max()) / total if total > 0 and len(rises) else 1.0
    quarter_ok = total > 0 and len(rises) > 0 and float(rises.max()) <= max_share * total + sigma
    return share, quarter_ok


def agreed_rate(fired: list[TrendResult]) -> TrendResult:
    """The passing scale (``fired``, shortest window first, one with a rate at least) whose rate an episode
    reports: the narrowest interval among the scales up to the first whose interval misses a shorter one's.

    A longer window's interval is narrower, but its window may hold a fill or a warm-up's rise that its fit does
    not model; where it disagrees with a shorter window's, the shorter one stands (a busy start two windows back
    doubled a 2 GiB/h leak's rate fifteen minutes after its detection, with an interval of +-1%).
    """
    pick, lo_max, hi_min = None, -math.inf, math.inf
    for r in fired:
        if r.rate is None:
            continue
        lo, hi = r.rate_lower or 0.0, r.rate_upper or 0.0
        if lo > hi_min or hi < lo_max:
            break
        lo_max, hi_min = max(lo_max, lo), min(hi_min, hi)
        if pick is None or hi - lo < (pick.rate_upper or 0.0) - (pick.rate_lower or 0.0):
            pick = r
    if pick is None:
        raise ValueError("agreed_rate needs a passing scale with a rate")
    return pick
