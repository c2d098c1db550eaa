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
   history (while no spread is known, the independent-block error is widened by the
   lag-1 autocorrelation of the blocks around their best hinge); no quarter of the window
   carries more than ``max_quarter_share`` of the rise (not concentrated in time: a fill
   or a step below the step threshold); the slope at the end of a quadratic fit over the window and half
   a window before is at least ``decel`` x the slope at its start (a warm-up
   decelerates towards its plateau, a leak does not). A window is judged once
   the series is 1.5 windows old: nothing is judged in a new series' first 22.5
   minutes (1.5 shortest windows), in effect a blind period of that length.
4. **Verdict.** Leak once some window passed for ``confirm_s``; cleared when the
   floor falls back towards where the episode started (a restart or a fix), or
   after every window failed for ``clear_s``. Every episode is kept (bounded):
   onset estimate (hinge fit), detection, clearing, rate with its interval (the
   narrowest among the passing windows that agree: ``trend.agreed_rate``).

Cost: O(scales) Python per sample; per closed bin one O(n^2) numpy pass over at most
120 floor blocks of that scale and one pass over its slope history (at most 362 values).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.gpu import glr, loadlog
from inferwatch_sidecar.components.gpu.config import DetectorConfig

# The floor's statistics live in trend.py (issue 23); every name stays importable from here.
from inferwatch_sidecar.components.gpu.shifts import STEP_UP_MIN
from inferwatch_sidecar.components.gpu.trend import (
    HIST_MIN_FALLS,
    HIST_MIN_WINDOWS,
    HIST_Q,
    HIST_Q_Z,
    HIST_WINDOWS,
    MAX_BLOCKS,
    PRE_WINDOW,
    RELEASE_K,
    RELEASE_MIN,
    MiB,
    TrendResult,
    _ar1_inflation,
    _Blocks,
    _decel,
    _destep,
    _floor_blocks,
    _hinge,
    _hist_spread,
    _norm_ppf,
    _quarter_share,
    _release_floors,
    _Scale,
    _slope,
    agreed_rate,
    floor_share,
    sen_mann_kendall,
)

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only

__all__ = [
    "HIST_MIN_FALLS", "HIST_MIN_WINDOWS", "HIST_Q", "HIST_Q_Z", "HIST_WINDOWS", "MAX_BLOCKS", "PRE_WINDOW",
    "RELEASE_K", "RELEASE_MIN", "STEP_UP_MIN", "VERDICTS", "Episode", "LeakDetector", "MiB", "TrendResult",
    "sen_mann_kendall",
]

VERDICTS = ("leak", "no_leak", "insufficient_data")
#: Releases kept for release-aligned floor samples (two 4-hour windows of a 20 s sawtooth).
RELEASE_LOG = 1500


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


class LeakDetector:
    """Leak detector for one memory series (a device or a process).

    A :class:`~inferwatch_sidecar.components.detector.Detector`: call ``update(t, value)`` for each sample,
    then read the results (``verdict``, ``rate``, ``ci``, ``detected_at``, ``last``, ``results``, ``samples``,
    ``episodes``); ``to_state()`` / ``from_state()`` round-trip the state, config included, as plain JSON.

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
        self._unsized = False  # judging waits for a sawtooth to be sized (the verdict stands meanwhile)
        # Noise and releases.
        self._diffs: deque[float] = deque(maxlen=64)
        self._dts: deque[float] = deque(maxlen=15)
        self._sigma = 0.0
        self._peak: float | None = None
        self._releases: deque[float] = deque(maxlen=13)
        #: every release over the longest two windows (at most RELEASE_LOG), for release-aligned floors
        self._release_log: deque[float] = deque(maxlen=RELEASE_LOG)
        #: the log holds every release since this time (the series' start, or a restore from an older state)
        self._log_since = -math.inf
        #: the highest floor level of the last episode that ended (a floor that climbs past it again is a
        #: leak again, whatever its fitted onset: an end that was noise must not hide the leak for good)
        self._released_top: float | None = None
        self._loads: deque[float] = deque(maxlen=8)  # level shifts de-stepping found (loadlog.remember)
        self._glr = glr.Recent()  # the statistic of a window judged again on the same blocks
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
            self._release_log.append(t)
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
        # The GLR judges a young series as soon as the shortest window holds its blocks (its null holds
        # warm-ups); a longer window waits until the series is half its length, since its coarser bins
        # see a steep warm-up's start as a few level shifts, and de-stepping them bends what is left.
        if cfg.method == "glr":
            young = cfg.warmup_s if sc is self._scales[0] else max(sc.window_s / 2, cfg.warmup_s)
        else:
            young = max((1 + PRE_WINDOW) * sc.window_s, cfg.warmup_s)
        if age < young or not sc.bins or now - sc.bins[-1][0] > sc.window_s / 4:
            return None
        fb, rw = None, self.release_window()
        if cfg.method == "glr" and rw > 0:
            since = self._log_since if len(self._release_log) < RELEASE_LOG else self._release_log[0]
            fb = _release_floors(sc, np.fromiter(self._release_log, float), cfg.min_blocks, since, self._sigma)
        self._unsized = fb is None and cfg.method == "glr" and rw == 0 and bool(self._release_log) and (
            now - self._release_log[-1] < cfg.release_max_s)
        if self._unsized:
            return None  # a sawtooth shown, not sized: until a gap rules it out, bins hold its filling
        if fb is None:
            fb = _floor_blocks(sc, rw, cfg.min_blocks)
        if fb is None:
            return None
        jump, g, sigma = _destep(fb.fy, cfg.method == "glr", cfg.step_k, self._sigma, floor_share(fb, self._dts),
                                 fb.ft)
        ft, fy, win = fb.ft, fb.fy, fb.win
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
            return self._glr_result(sc, now, ft[sel], g[sel], sigma, fb.block, jump, slope, se,
                                    float(fy[-1]), ft, fy, g, fb.edge, fb.aligned)
        return self._trend_result(sc, now, fb, jump, g, sigma, slope, se)

    def _trend_result(self, sc: _Scale, now: float, fb: _Blocks, jump: np.ndarray, g: np.ndarray, sigma: float,
                      slope: float, se: float) -> TrendResult:
        """The slope test with its shape conditions (method ``trend``) on the window's de-stepped floor blocks."""
        cfg = self.cfg
        ft, fy, edge = fb.ft, fb.fy, fb.edge
        tw, gw = ft[fb.win], g[fb.win]
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
        share, quarter_ok = _quarter_share(tw, gw, edge, sc.window_s, cfg.max_quarter_share, sigma)
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
        return TrendResult(sc.window_s, fb.block, len(tw), slope, lower, upper, z, int(jump.sum()), share, ratio,
                           bool(passed), onset, rate, r_lo, r_hi, float(fy[-1]), base,
                           level=float(np.median(fy[-3:])), sigma=sigma)

    def _glr_result(self, sc: _Scale, now: float, tw: np.ndarray, gw: np.ndarray, sigma: float, block: float,
                    jump: np.ndarray, slope: float, se: float, floor: float, ft: np.ndarray, fy: np.ndarray,
                    g: np.ndarray, edge: float, aligned: bool = False) -> TrendResult:
        """The one GLR test (``glr.statistic``) on the window's de-stepped floor blocks."""
        cfg = self.cfg
        t0 = self._first_t if self._first_t is not None else float(tw[0])
        # Only blocks that lie wholly after the series' first sample: a block cut short by the start
        # holds the floor at another phase than the others (on a steep warm-up, a misfit of many SDs).
        # Release-aligned segments start at a release, after the first sample by construction.
        whole = tw - (0.0 if aligned else block / 2) >= t0 - sc.bin_s / 2
        # The loads de-stepping found here join the series' log: a warm-up of their own is in the null.
        loads: tuple[float, ...] = ()
        if cfg.load_warmups:
            found, undone = loadlog.origins(ft, jump, fy - g, fy, loadlog.undo_window(self.release_window()))
            loads = loadlog.remember(self._loads, found, now, cfg.tau_max_s, undone)
        thr = glr.threshold(int(whole.sum()))  # over it, the null's shift is refitted exactly until an episode opens
        stat, knot = self._glr.statistic(tw[whole], gw[whole], t0, cfg.tau_max_s, sigma, not aligned, loads,
                                   thr if self._verdict != "leak" else math.inf)
        q = _norm_ppf(0.5 + cfg.confidence / 2)
        passed = stat > thr
        onset = rate = r_lo = r_hi = base = None
        if passed:
            # The change point: the hinge's knot fitted together with the warm-up over both windows; the
            # rate: the floor's least-squares slope after it (a hinge refitted here, its knot held to the
            # window's first three quarters, took a creep in the last quarter for a slower, older one).
            tk, gk = tw[whole], gw[whole]
            onset = self._change_point(ft, g, sigma, knot)
            after = tk >= onset
            if int(after.sum()) >= 3:
                rate, se_r = glr.creep_rate(tk, gk, t0, cfg.tau_max_s, sigma, onset)
                r_lo, r_hi = rate - q * se_r, rate + q * se_r
            else:
                _, rate, r_lo, r_hi = _hinge(tk, gk, sigma, q, edge - (edge - float(tk[0])) / 4)
            base = float(fy[ft >= onset].min())
            passed = rate > 0 and r_lo > cfg.min_rate_bytes_per_s
        z = slope / se if se > 0 else 0.0
        return TrendResult(sc.window_s, block, len(tw), slope, slope - q * se, slope + q * se, z, int(jump.sum()),
                           0.0, None, bool(passed), onset, rate, r_lo, r_hi, floor, base, stat, thr,
                           level=float(np.median(fy[-3:])), sigma=sigma)

    def _change_point(self, t: np.ndarray, g: np.ndarray, sigma: float, fallback: float) -> float:
        """The onset: the knot of the GLR's hinge, fitted together with a warm-up from the series' start.

        A hinge alone, fitted over a floor that was still warming up, puts its knot inside the warm-up (20-40
        minutes early); with the warm-up in the fit the knot is where the creep departs from it.
        """
        t0 = self._first_t if self._first_t is not None else float(t[0])
        whole = t >= t0
        if int(whole.sum()) < 5:
            return fallback
        stat, knot = self._glr.statistic(t[whole], g[whole], t0, self.cfg.tau_max_s, sigma, cache=False)
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
            if self._verdict != "leak" and not (self._unsized and self._verdict == "no_leak"):
                self._verdict = "insufficient_data"
            return
        fired = [r for r in res if r.passed]
        best = min(fired, key=lambda r: (r.rate_upper or 0.0) - (r.rate_lower or 0.0)) if fired else None
        # The newest floor level: the shortest judged scale's (a longer scale's latest block reaches further
        # back, and just after a quick detection may still hold the floor from before the onset), as the
        # median of its last three floor samples (one sample carries the sawtooth's sampling phase).
        floor = res[0].level if res[0].level is not None else res[0].floor
        noise = res[0].sigma or 0.0
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
            # (Or a climb past the last episode's highest level: an end that was noise, a release that was no
            # restart or a slow leak's slope lost in the shortest window, must not hide the leak for good.)
            after = not self._episodes or best is None or best.onset is None or (
                best.onset >= (self._episodes[-1]["cleared_at"] or now)) or (
                self._released_top is not None and floor > self._released_top + 4 * noise)
            if (best is not None and after and self._pass_since is not None
                    and now - self._pass_since >= self.cfg.confirm_s):
                self._open(now, best, fired)
            else:
                self._verdict = "no_leak"
                self._rate, self._ci = res[0].slope, (res[0].lower, res[0].upper)
            return
        ep = self._episodes[-1]
        self._top = max(self._top or floor, floor)
        base = self._base if self._base is not None else floor
        # Released: the floor fell back below halfway to where the episode started, by more than the floor's
        # noise (just after a detection the climb is only a few noise SDs high).
        if floor < base + 0.5 * (self._top - base) and self._top - floor > 4 * noise:
            self._close(now, "released")
        elif not self._still_rising(fired, res, now):
            self._close(now, "stopped")
        elif best is not None and best.rate is not None:
            pick = agreed_rate(fired)
            self._rate, self._ci = pick.rate, (pick.rate_lower or 0.0, pick.rate_upper or 0.0)
            ep["rate"], ep["rate_ci"] = self._rate, list(self._ci)

    def _still_rising(self, fired: list[TrendResult], res: list[TrendResult], now: float) -> bool:
        """Whether an open episode holds: its test passed within the last ``clear_s``.

        With the GLR, once a leak is found the question becomes whether the floor still climbs, not
        whether the climb still departs from a warm-up: a creep that fills a window is as straight as
        the middle of an S-shaped warm-up, and the GLR's statistic falls while the leak goes on. So the
        shortest judged scale's floor slope, with its lower bound above ``min_rate_bytes_per_s``, also
        holds it (a longer window keeps the stopped climb in view for hours).
        """
        if not fired and self.cfg.method == "glr" and res[0].lower > self.cfg.min_rate_bytes_per_s:
            self._fail_since = None
            return True
        return fired != [] or self._fail_since is None or now - self._fail_since < self.cfg.clear_s

    def _open(self, now: float, best: TrendResult, fired: list[TrendResult]) -> None:
        assert best.rate is not None and best.onset is not None
        self._verdict = "leak"
        self._detected_at = now
        pick = agreed_rate(fired)
        self._rate, self._ci = pick.rate, (pick.rate_lower or 0.0, pick.rate_upper or 0.0)
        self._base = best.base
        self._top = best.level if best.level is not None else best.floor
        self._released_top = None
        onset = max(best.onset, self._first_t if self._first_t is not None else best.onset)
        self._episodes.append({"onset_estimate": onset, "detected_at": now, "cleared_at": None,
                               "rate": self._rate, "rate_ci": list(self._ci), "end": None})

    def _close(self, now: float, why: str) -> None:
        self._released_top = self._top
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
            "releases": list(self._releases), "release_log": list(self._release_log),
            "log_since": None if self._log_since == -math.inf else self._log_since,
            "released_top": self._released_top, "loads": list(self._loads),
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
        if "release_log" in state:
            self._release_log.extend(float(x) for x in state["release_log"])
            since = state.get("log_since")
            self._log_since = -math.inf if since is None else float(since)
        else:  # a state from before the log: complete from the restore on
            self._log_since = float(state["last_t"]) if state["last_t"] is not None else -math.inf
        self._released_top = state.get("released_top")
        self._loads.extend(float(x) for x in state.get("loads", []))
        for e in state["episodes"]:
            self._episodes.append({k: e[k] for k in ("onset_estimate", "detected_at", "cleared_at", "rate",
                                                     "rate_ci", "end")})
        self._base, self._top = state["base"], state["top"]
