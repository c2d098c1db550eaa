"""Leak detection over a memory series: robust trend tests on the de-stepped release floor.

A leak is memory that keeps climbing and does not come back down after the
allocator releases its cache; everything else memory does is noise around the
floor it returns to: the caching allocator's sawtooth (any period, amplitude or
shape), busy/idle swings, model loads and unloads, a warm-up that plateaus, a
static preallocation. docs/gpu.md explains the design and derives its settings;
in short, per series:

1. **Release floor.** Samples go into time bins (per-bin minimum). Releases are
   recognised as drops of more than ``max(64 MiB, 12 sigma)`` below the peak since
   the previous release (sigma: the robust per-sample noise). Blocks of bins at
   least 1.25 x the 90th percentile of recent release intervals each hold a
   release, so each block's minimum is a sample of the floor, whatever the
   sawtooth's period. A window is judged only with at least ``min_blocks`` blocks.
2. **De-stepping.** A block-to-block change further than ``step_k`` robust SDs
   from the typical change (and above 32 MiB up / 256 MiB down) is a level shift:
   it is removed, so loads, unloads and busy/idle swings do not tilt the trend.
3. **Three tests per window** (every scale, at each of its closed bins): the
   Theil-Sen slope of the de-stepped floor blocks exceeds ``z`` times its
   spread under the background, and the lower bound of its interval exceeds
   ``min_rate_bytes_per_s`` (the floor rises steadily). The spread is the larger
   of the standard error for independent blocks and the spread of the scale's
   own window slopes over its last 12 windows, read off the falling windows
   (a stationary background falls as often and as fast as it rises; a leak
   only adds rises), borrowed from a shorter scale until the scale has that
   history (while no spread is known, the independent-block error is widened
   by the lag-1 autocorrelation of the blocks around their best hinge); no quarter of the
   window carries more than ``max_quarter_share``
   of the rise (not concentrated in time: a fill or a step below the step
   threshold); the slope at the end of a quadratic fit over the window and half
   a window before is at least ``decel`` x the slope at its start (a warm-up
   decelerates towards its plateau, a leak does not). A window is judged once
   the series is 1.5 windows old: nothing is judged in a new series' first 22.5
   minutes (1.5 shortest windows), in effect a blind period of that length.
4. **Verdict.** Leak once some window passed for ``confirm_s``; cleared when the
   floor falls back towards where the episode started (a restart or a fix), or
   after every window failed for ``clear_s``. Every episode is kept (bounded):
   onset estimate (hinge fit), detection, clearing, rate with its interval.

Cost: O(scales) Python per sample; per closed bin one O(n^2) numpy pass over at
most 120 floor blocks of that scale and one pass over its slope history (at most
362 values).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import ndtri

from inferwatch_sidecar.components.gpu import glr
from inferwatch_sidecar.components.gpu.config import DetectorConfig

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only

VERDICTS = ("leak", "no_leak", "insufficient_data")
MiB = 2**20
#: Releases are drops of at least this much below the peak since the previous release, and of
#: RELEASE_K per-sample SDs (the peak is the highest of many noisy samples, 4-5 SDs up by itself).
RELEASE_MIN = 64 * MiB
RELEASE_K = 12.0
#: Smallest block-to-block rise ever treated as a level shift.
STEP_UP_MIN = 32 * MiB
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


@dataclass(frozen=True)
class Episode:
    """One leak episode of a series.

    Attributes:
        onset_estimate: when the floor started to climb (hinge fit at detection), seconds.
        detected_at: time of the first sample at which the leak verdict held.
        cleared_at: when the verdict cleared; None while still leaking.
        rate: leak rate, bytes/s (the latest estimate while it lasted).
        rate_ci: its interval, bytes/s.
        end: why it cleared: ``released`` (the floor fell back towards its level at onset: a
            restart or a fix), ``stopped`` (the floor stopped climbing), or None.
    """

    onset_estimate: float
    detected_at: float
    cleared_at: float | None
    rate: float
    rate_ci: tuple[float, float]
    end: str | None


def _slope(t: np.ndarray, y: np.ndarray, sigma: float) -> tuple[float, float]:
    """Theil-Sen slope of ``y`` over ``t`` and its standard error for independent noise of SD ``sigma``."""
    n = len(t)
    if n < 2:
        return 0.0, math.inf
    i, j = _pairs(n)
    slope = float(np.median((y[j] - y[i]) / (t[j] - t[i])))
    sxx = float(((t - t.mean()) ** 2).sum())
    return slope, sigma / math.sqrt(sxx)


def _row_nanmedian(m: np.ndarray) -> np.ndarray:
    """``np.nanmedian(m, axis=1)`` for rows with at least one value (a sort, not numpy.ma's slow path)."""
    srt = np.sort(np.where(np.isnan(m), np.inf, m), axis=1)
    cnt = (~np.isnan(m)).sum(axis=1)
    r = np.arange(len(m))
    out: np.ndarray = 0.5 * (srt[r, np.maximum(cnt - 1, 0) // 2] + srt[r, cnt // 2])
    return out


def _shift_sizes(fy: np.ndarray, jump: np.ndarray, m: int = 4) -> np.ndarray:
    """Size of each level shift (``jump[i]``: between blocks i and i+1), else 0.

    The size is the median of up to ``m`` blocks after the shift minus that of up to ``m`` before
    (not crossing another shift): the change between the two adjacent blocks alone would carry
    their noise into the de-stepped level for good.
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
        before = fy[max(left, lo + 1 - m): lo + 1]
        after = fy[hi + 1: min(right + 1, hi + 1 + m)]
        out[lo] = float(np.median(after)) - float(np.median(before))
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


class LeakDetector:
    """Leak detector for one memory series (a device or a process).

    A :class:`~inferwatch_sidecar.components.detector.Detector`: call
    ``update(t, value)`` for each sample, then read the results (``verdict``,
    ``rate``, ``ci``, ``detected_at``, ``last``, ``results``, ``samples``,
    ``episodes``); ``to_state()`` / ``from_state()`` round-trip the state,
    config included, as plain JSON.

    Args:
        cfg: detector settings.
    """

    RESULTS = ("verdict", "rate", "ci", "detected_at", "last", "results", "samples", "episodes")

    def __init__(self, cfg: DetectorConfig | None = None) -> None:
        self.cfg = cfg or DetectorConfig()
        self._scales = [_Scale(w, b) for w, b in self.cfg.scales]
        self._verdict = "insufficient_data"
        self._rate: float | None = None
        self._ci: tuple[float, float] | None = None
        self._detected_at: float | None = None
        self._last: float | None = None
        self._last_t: float | None = None
        self._pass_since: float | None = None
        self._fail_since: float | None = None
        self._last_pass: float | None = None
        self._samples = 0
        self._first_t: float | None = None
        self._by_scale: list[TrendResult | None] = [None] * len(self._scales)
        # Noise and releases.
        self._diffs: deque[float] = deque(maxlen=64)
        self._dts: deque[float] = deque(maxlen=15)
        self._sigma = 0.0
        self._peak: float | None = None
        self._releases: deque[float] = deque(maxlen=13)
        # Episodes: the open one is the last, with its raw floor at onset ("base") and highest since ("top").
        self._episodes: deque[dict[str, Any]] = deque(maxlen=self.cfg.max_episodes)
        self._base: float | None = None
        self._top: float | None = None

    @property
    def verdict(self) -> str:
        """One of ``VERDICTS``."""
        return self._verdict

    @property
    def rate(self) -> float | None:
        """Leak rate in bytes/s while leaking; the shortest judged window's floor slope otherwise."""
        return self._rate

    @property
    def ci(self) -> tuple[float, float] | None:
        """Interval of ``rate``, bytes/s."""
        return self._ci

    @property
    def detected_at(self) -> float | None:
        """Time of the first sample at which the current leak verdict held."""
        return self._detected_at

    @property
    def last(self) -> float | None:
        """The last value seen."""
        return self._last

    @property
    def results(self) -> tuple[TrendResult, ...]:
        """The statistics of every judged scale at its last closed bin."""
        return tuple(r for r in self._by_scale if r is not None)

    @property
    def samples(self) -> int:
        """Samples taken (out-of-order, duplicated and NaN ones are not)."""
        return self._samples

    @property
    def episodes(self) -> tuple[Episode, ...]:
        """Leak episodes, oldest first (at most ``cfg.max_episodes``); the last is open while leaking."""
        return tuple(Episode(e["onset_estimate"], e["detected_at"], e["cleared_at"], e["rate"],
                             (e["rate_ci"][0], e["rate_ci"][1]), e["end"]) for e in self._episodes)

    def update(self, t: float, value: float) -> None:
        """Feed one sample (seconds, bytes). Out-of-order, duplicated or NaN samples are ignored."""
        if value != value or (self._last_t is not None and t <= self._last_t):
            return
        t, value = float(t), float(value)
        self._samples += 1
        if self._first_t is None:
            self._first_t = t
        if self._last is not None and self._last_t is not None:
            self._diffs.append(value - self._last)
            self._dts.append(t - self._last_t)
        self._track_release(t, value)
        self._last, self._last_t = value, t
        closed = False
        for k, sc in enumerate(self._scales):
            if sc.add(t, value) and (sc.closed_at is None or t - sc.closed_at >= sc.eval_s):
                if not closed:
                    self._sigma = self._noise()
                closed = True
                sc.closed_at = t
                self._by_scale[k] = self._scale_result(sc, t)
        if closed:
            self._evaluate(t)

    # -- floor ---------------------------------------------------------------------------------------------------------
    def _noise(self) -> float:
        """Robust per-sample noise: MAD of successive differences (a ramp's constant slope drops out)."""
        if len(self._diffs) < 8:
            return 0.0
        d = sorted(self._diffs)
        med = d[len(d) // 2]
        dev = sorted(abs(x - med) for x in d)
        return 1.4826 * dev[len(dev) // 2] / math.sqrt(2.0)

    def _track_release(self, t: float, v: float) -> None:
        if self._peak is None or v > self._peak:
            self._peak = v
        elif v < self._peak - max(RELEASE_MIN, RELEASE_K * self._sigma):
            self._releases.append(t)
            self._peak = v

    def release_window(self) -> float:
        """Seconds a floor block must span to hold a release: 1.25 x the 90th percentile of recent intervals."""
        r = list(self._releases)
        gaps = sorted(b - a for a, b in zip(r, r[1:], strict=False) if b - a <= self.cfg.release_max_s)
        if len(gaps) < 2:
            return 0.0
        # A sawtooth sampled a few times per period is caught at a random phase: a block also needs
        # 16 samples for its minimum to come close to the trough.
        dts = sorted(self._dts)
        dt = dts[len(dts) // 2] if dts else 0.0
        return max(1.25 * gaps[min(len(gaps) - 1, math.ceil(0.9 * len(gaps)) - 1)], 16 * dt)

    def _scale_result(self, sc: _Scale, now: float) -> TrendResult | None:
        cfg = self.cfg
        age = now - (self._first_t if self._first_t is not None else now)
        # The GLR judges a young series as soon as its window holds the blocks: its null holds warm-ups.
        young = (cfg.warmup_s if cfg.method == "glr" else max((1 + PRE_WINDOW) * sc.window_s, cfg.warmup_s))
        if age < young or not sc.bins or now - sc.bins[-1][0] > sc.window_s / 4:
            return None
        a = np.asarray(sc.bins, dtype=float)
        t, y = a[:, 0], a[:, 1]
        n_w = int(round(sc.window_s / sc.bin_s))
        stride = max(math.ceil(self.release_window() / sc.bin_s - 1e-9), math.ceil(n_w / MAX_BLOCKS), 1)
        block = stride * sc.bin_s
        nb = int(sc.window_s // block)
        if nb < cfg.min_blocks:
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
        if int(win.sum()) < cfg.min_blocks or len(fy) < 3:
            return None
        # De-step: a rise far above the typical block-to-block change is a level shift (a load, traffic
        # filling the cache) and is removed. A shift that straddles a block boundary shows in two
        # changes: a neighbour beyond 2.5 SDs belongs to it. Falls are kept: removing only rises can
        # bias the floor down, never up, so a busy/idle swing cannot add up to a false leak.
        d = np.diff(fy)
        med = float(np.median(d))
        if cfg.method == "glr" and len(d) >= 3:
            # Against the neighbouring changes (three on each side): a warm-up's changes fall smoothly and
            # none stands out from its neighbours, while a shift is one change far above both sides.
            pad = np.r_[np.full(3, np.nan), d, np.full(3, np.nan)]
            nb = np.lib.stride_tricks.sliding_window_view(pad, 7).copy()
            nb[:, 3] = np.nan
            dev = d - _row_nanmedian(nb)
            sd = 1.4826 * float(np.median(np.abs(dev - np.median(dev))))
        else:
            sd = 1.4826 * float(np.median(np.abs(d - med)))
            dev = d - med
        jump = dev > max(STEP_UP_MIN, cfg.step_k * sd)
        if jump.any():
            near = np.zeros_like(jump)
            near[1:] |= jump[:-1]
            near[:-1] |= jump[1:]
            jump |= near & (dev > 2.5 * sd)
        g = fy - np.r_[0.0, np.cumsum(_shift_sizes(fy, jump))]
        # Block noise from the changes that are not shifts (a difference of two blocks: / sqrt 2).
        rest = d[~jump]
        # Quantised floors (2 MiB granules) often repeat exactly: the MAD can be 0. A block minimum of
        # Gaussian samples has an SD of at least 0.3 of theirs, and never less than one granule.
        mad = 1.4826 * float(np.median(np.abs(rest - np.median(rest)))) / math.sqrt(2) if len(rest) else 0.0
        sigma = max(2 * MiB, 0.3 * self._sigma, mad)
        tw, gw = ft[win], g[win]
        slope, se = _slope(tw, gw, sigma)
        if cfg.method == "glr":
            # A shift that spans several block changes (a load straddling blocks) leaves the blocks inside
            # it on its ramp, at no de-stepped level: they are left out.
            ramp = np.zeros(len(fy), dtype=bool)
            idx = np.flatnonzero(jump)
            if len(idx):
                for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
                    ramp[run[0] + 1: run[-1] + 1] = True
            sel = win & ~ramp
            return self._glr_result(sc, now, ft[sel], g[sel], sigma, block, int(jump.sum()), slope, se,
                                    float(fy[-1]), ft, fy, g, edge)
        # The standard error above holds for independent blocks. A floor that wanders slowly (the
        # sawtooths of several processes beating, a daily cycle) has dependent blocks, and its window
        # slopes spread far wider: the series' own history of window slopes measures that spread.
        # While the history gives no spread (a series' first hour or two, or a floor that never fell),
        # the standard error for independent blocks is widened by the serial correlation the blocks
        # show around their best hinge.
        spread = self._null_spread(sc, now)
        if spread == 0.0:
            se *= _ar1_inflation(tw, gw, edge - sc.window_s / 4)
        se = max(se, spread)
        sc.hist.append((now, slope))
        q = _norm_ppf(0.5 + cfg.confidence / 2)
        lower, upper = slope - q * se, slope + q * se
        z = slope / se
        # Rise per quarter of the window (medians of the blocks in each quarter).
        qi = np.minimum(3, ((tw - (edge - sc.window_s)) * 4 // sc.window_s).astype(np.int64))
        levels = [float(np.median(gw[qi == k])) for k in range(4) if (qi == k).any()]
        rises = np.diff(levels)
        total = levels[-1] - levels[0] if len(levels) > 1 else 0.0
        share = float(rises.max()) / total if total > 0 and len(rises) else 1.0
        quarter_ok = total > 0 and len(rises) > 0 and float(rises.max()) <= cfg.max_quarter_share * total + sigma
        # Deceleration over the two windows (as much of them as the series has): a floor whose slope
        # now is below ``decel`` x its slope at the start is a warm-up approaching its plateau. The
        # point estimate decides, not a significance test: the burden of proof is on the leak.
        ratio = _decel(ft, g)
        decel_ok = ratio is None or ratio >= cfg.decel
        passed = z > cfg.z and lower > cfg.min_rate_bytes_per_s and quarter_ok and decel_ok
        onset = rate = r_lo = r_hi = base = None
        if passed:
            # The rise after the knot must span a quarter of the window at least: a steeper rise over
            # less is concentrated in time (the quarter test's reasoning), a step or a fill.
            onset, rate, r_lo, r_hi = _hinge(ft, g, sigma, q, edge - sc.window_s / 4)
            onset = self._change_point(ft, g, sigma, onset)
            base = float(fy[ft >= onset].min())
            passed = rate > cfg.min_rate_bytes_per_s
        return TrendResult(sc.window_s, block, len(tw), slope, lower, upper, z, int(jump.sum()), share, ratio,
                           bool(passed), onset, rate, r_lo, r_hi, float(fy[-1]), base)

    def _glr_result(self, sc: _Scale, now: float, tw: np.ndarray, gw: np.ndarray, sigma: float, block: float,
                    steps: int, slope: float, se: float, floor: float, ft: np.ndarray, fy: np.ndarray,
                    g: np.ndarray, edge: float) -> TrendResult:
        """The one GLR test (``glr.statistic``) on the window's de-stepped floor blocks."""
        cfg = self.cfg
        t0 = self._first_t if self._first_t is not None else float(tw[0])
        # Only blocks that lie wholly after the series' first sample: a block cut short by the start
        # holds the floor at another phase than the others (on a steep warm-up, a misfit of many SDs).
        whole = tw - block / 2 >= t0 - sc.bin_s / 2
        stat, knot = glr.statistic(tw[whole], gw[whole], t0, cfg.tau_max_s, sigma)
        thr = glr.threshold(int(whole.sum()))
        q = _norm_ppf(0.5 + cfg.confidence / 2)
        passed = stat > thr
        onset = rate = r_lo = r_hi = base = None
        if passed:
            # The knot leaves a quarter of the data after it (of a young series' data, not of the window).
            tk, gk = tw[whole], gw[whole]
            onset, rate, r_lo, r_hi = _hinge(tk, gk, sigma, q, edge - (edge - float(tk[0])) / 4)
            onset = knot  # the change point: the hinge's knot fitted together with the warm-up
            base = float(fy[ft >= onset].min())
            passed = rate > 0 and r_lo > cfg.min_rate_bytes_per_s
        z = slope / se if se > 0 else 0.0
        return TrendResult(sc.window_s, block, len(tw), slope, slope - q * se, slope + q * se, z, steps, 0.0, None,
                           bool(passed), onset, rate, r_lo, r_hi, floor, base, stat, thr)

    def _change_point(self, t: np.ndarray, g: np.ndarray, sigma: float, fallback: float) -> float:
        """The onset: the knot of the GLR's hinge, fitted together with a warm-up from the series' start.

        A hinge alone, fitted over a floor that was still warming up, puts its knot inside the warm-up (20-40
        minutes early); with the warm-up in the fit the knot is where the creep departs from it.
        """
        t0 = self._first_t if self._first_t is not None else float(t[0])
        whole = t >= t0
        if int(whole.sum()) < 5:
            return fallback
        stat, knot = glr.statistic(t[whole], g[whole], t0, self.cfg.tau_max_s, sigma)
        return knot if stat > 0 else fallback

    def _null_spread(self, sc: _Scale, now: float) -> float:
        """The spread of the scale's window slope under the series' own background, bytes/s (0: unknown).

        Measured on the scale's history once the judgements that ended at least a window ago (so do
        not overlap the one being judged) span HIST_MIN_WINDOWS windows. Until then it is borrowed from
        the longest shorter scale that has its history, scaled by sqrt(W' / W): the slope spread of a
        random-walk floor, between that of independent noise (W^-1.5) and of a wander slower than
        either window (W^0).
        """
        own = _hist_spread(sc, now)
        if own is not None:
            return own
        for other in reversed(self._scales):
            if other.window_s < sc.window_s:
                sp = _hist_spread(other, now)
                if sp is not None:
                    return sp * math.sqrt(other.window_s / sc.window_s)
        return 0.0

    # -- verdict -------------------------------------------------------------------------------------------------------
    def _evaluate(self, now: float) -> None:
        res = [r for r in self._by_scale if r is not None]
        if not res:
            if self._verdict != "leak":
                self._verdict = "insufficient_data"
            return
        fired = [r for r in res if r.passed]
        best = min(fired, key=lambda r: (r.rate_upper or 0.0) - (r.rate_lower or 0.0)) if fired else None
        floor = min(r.floor for r in res)
        if fired:
            self._fail_since = None
            if self._pass_since is None:
                self._pass_since = now
            self._last_pass = now
        else:
            # Near the thresholds the tests flap from one bin to the next; a confirmation
            # survives failures shorter than half of confirm_s.
            if self._last_pass is None or now - self._last_pass > self.cfg.confirm_s / 2:
                self._pass_since = None
            if self._fail_since is None:
                self._fail_since = now
        if self._verdict != "leak":
            # A new episode needs a rise that began after the previous one cleared.
            after = not self._episodes or best is None or best.onset is None or (
                best.onset >= (self._episodes[-1]["cleared_at"] or now))
            if (best is not None and after and self._pass_since is not None
                    and now - self._pass_since >= self.cfg.confirm_s):
                self._open(now, best)
            else:
                self._verdict = "no_leak"
                self._rate, self._ci = res[0].slope, (res[0].lower, res[0].upper)
            return
        ep = self._episodes[-1]
        self._top = max(self._top or floor, floor)
        base = self._base if self._base is not None else floor
        if floor < base + 0.5 * (self._top - base) and self._top > base:
            self._close(now, "released")
        elif not fired and self._fail_since is not None and now - self._fail_since >= self.cfg.clear_s:
            self._close(now, "stopped")
        elif best is not None and best.rate is not None:
            self._rate, self._ci = best.rate, (best.rate_lower or 0.0, best.rate_upper or 0.0)
            ep["rate"], ep["rate_ci"] = self._rate, list(self._ci)

    def _open(self, now: float, best: TrendResult) -> None:
        assert best.rate is not None and best.onset is not None
        self._verdict = "leak"
        self._detected_at = now
        self._rate, self._ci = best.rate, (best.rate_lower or 0.0, best.rate_upper or 0.0)
        self._base = best.base
        self._top = best.floor
        onset = max(best.onset, self._first_t if self._first_t is not None else best.onset)
        self._episodes.append({"onset_estimate": onset, "detected_at": now, "cleared_at": None,
                               "rate": self._rate, "rate_ci": list(self._ci), "end": None})

    def _close(self, now: float, why: str) -> None:
        self._verdict = "no_leak"
        self._detected_at = None
        self._pass_since = None
        self._base = self._top = None
        ep = self._episodes[-1]
        ep["cleared_at"], ep["end"] = now, why

    def trend_rate(self) -> float | None:
        """The floor slope of the shortest judged scale (for classification), or None."""
        res = self.results
        return res[0].slope if res else None

    def time_to_oom(self, headroom_bytes: float | None) -> float | None:
        """Seconds until ``headroom_bytes`` more memory is used at the leak rate, or None."""
        if self._verdict != "leak" or headroom_bytes is None or not self._rate or self._rate <= 0:
            return None
        return max(0.0, headroom_bytes) / self._rate

    def memory_bins(self) -> int:
        """Number of stored bins (bounded by the config, whatever the stream length)."""
        return sum(len(sc.bins) for sc in self._scales)

    # -- state ---------------------------------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state, config included; ``from_state`` rebuilds the detector."""
        return {
            "config": self.cfg.model_dump(mode="json"),
            "scales": [
                {"bins": [list(p) for p in sc.bins], "cur_key": sc.cur_key,
                 "cur_min": None if sc.cur_min == math.inf else sc.cur_min, "closed_at": sc.closed_at,
                 "hist": [list(p) for p in sc.hist]}
                for sc in self._scales
            ],
            "by_scale": [None if r is None else asdict(r) for r in self._by_scale],
            "verdict": self._verdict, "rate": self._rate, "ci": list(self._ci) if self._ci else None,
            "detected_at": self._detected_at, "last": self._last, "last_t": self._last_t,
            "pass_since": self._pass_since, "fail_since": self._fail_since, "last_pass": self._last_pass,
            "samples": self._samples, "first_t": self._first_t,
            "diffs": list(self._diffs), "dts": list(self._dts), "sigma": self._sigma, "peak": self._peak,
            "releases": list(self._releases),
            "episodes": [dict(e) for e in self._episodes], "base": self._base, "top": self._top,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Self:
        """Rebuild a detector from ``to_state()``.

        Raises:
            ValueError: the state's scales do not match its config, or a field is malformed.
        """
        try:
            det = cls(DetectorConfig.model_validate(state["config"]))
            det._load(state)
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"not a leak detector state ({type(e).__name__}: {e})") from None
        return det

    def _load(self, state: dict[str, Any]) -> None:
        if len(state["scales"]) != len(self._scales) or len(state["by_scale"]) != len(self._scales):
            raise ValueError("the state was taken with different detector scales than its config holds")
        for sc, st in zip(self._scales, state["scales"], strict=True):
            sc.bins.extend((float(a), float(b)) for a, b in st["bins"])
            sc.cur_key = st["cur_key"]
            sc.cur_min = math.inf if st["cur_min"] is None else st["cur_min"]
            sc.closed_at = st["closed_at"]
            sc.hist.extend((float(a), float(b)) for a, b in st["hist"])
        if state["verdict"] not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {state['verdict']!r}")
        self._by_scale = [None if r is None else TrendResult(**r) for r in state["by_scale"]]
        self._verdict = state["verdict"]
        self._rate = state["rate"]
        self._ci = (float(state["ci"][0]), float(state["ci"][1])) if state["ci"] else None
        self._detected_at = state["detected_at"]
        self._last, self._last_t = state["last"], state["last_t"]
        self._pass_since, self._fail_since = state["pass_since"], state["fail_since"]
        self._last_pass = state["last_pass"]
        self._samples = int(state["samples"])
        self._first_t = state["first_t"]
        self._diffs.extend(float(x) for x in state["diffs"])
        self._dts.extend(float(x) for x in state["dts"])
        self._sigma = float(state["sigma"])
        self._peak = state["peak"]
        self._releases.extend(float(x) for x in state["releases"])
        for e in state["episodes"]:
            self._episodes.append({k: e[k] for k in ("onset_estimate", "detected_at", "cleared_at", "rate",
                                                     "rate_ci", "end")})
        self._base, self._top = state["base"], state["top"]
