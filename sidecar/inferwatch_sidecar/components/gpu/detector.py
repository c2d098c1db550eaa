"""Leak detection over a memory series: robust trend statistics on bin floors.

The detector answers "is this series creeping up steadily?" and must stay quiet
on everything else memory does: warm-up that plateaus, a step (model load,
larger batch shape), the caching allocator's sawtooth, a static 90%
preallocation and ordinary noise. docs/gpu.md explains the choice; in short:

1. Samples go into fixed-width time bins and each bin keeps its **minimum**
   (the floor); the floors are then eroded by a running minimum over half a
   sub-window. A leak raises the floor; a sawtooth or a busy burst does not.
2. On each closed bin, for every *scale* (window, bin width) whose window is
   full, the bin floors must pass all of:

   - **Mann-Kendall**: the floors trend up (z above ``z``);
   - **Theil-Sen slope** with Sen's distribution-free confidence interval; the
     lower bound must exceed ``min_rate_bytes_per_s``;
   - **sustained rise**: the window is cut into ``sub_windows``; each
     sub-window's floor must exceed the previous one's (one flat pair
     tolerated) and the total rise must exceed ``noise_k`` robust SDs;
   - **above the sampling jitter**: the total rise exceeds ``jitter_k`` x the
     typical upward step between raw samples (a sampled sawtooth aliases);
   - **constant rate**: the Theil-Sen slopes of the two halves agree within
     a factor ``1/balance`` (a warm-up decelerates, a step lands in one half);
   - **no staircase**: the backward running minimum of the floors may not take
     more than ``max_step_share`` of its rise in one bin (a jump within one
     sampling-jitter step is discounted by that step once the series has settled:
     under a fast sawtooth the floor of a creep rises in such aliasing jumps).

3. The verdict flips to leak once the conditions have held for ``confirm_s``
   and back after they have failed for ``clear_s``.

Cost: O(number of scales) Python work per sample; one O(n^2) numpy pass over
n <= 1000 bins per closed bin (about 100 us for n = 72).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from inferwatch_sidecar.components.gpu.config import DetectorConfig

VERDICTS = ("leak", "no_leak", "insufficient_data")

_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    p = _PAIRS.get(n)
    if p is None:
        p = _PAIRS[n] = np.triu_indices(n, k=1)
    return p


def _norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |err| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


@dataclass(frozen=True)
class TrendResult:
    """The statistics of one scale at one evaluation.

    Attributes:
        window_s: the scale's window.
        n: bins used.
        slope: Theil-Sen slope, bytes/s.
        lower: lower bound of Sen's confidence interval, bytes/s.
        upper: upper bound, bytes/s.
        z: Mann-Kendall z statistic.
        rises: floor rise between consecutive sub-windows, bytes.
        step_share: largest share of the backward-minimum rise taken in one bin (after the
            jitter discount, see ``trend``).
        half_ratio: Theil-Sen slope of the second half over that of the first.
        passed: whether every leak condition held.
    """

    window_s: float
    n: int
    slope: float
    lower: float
    upper: float
    z: float
    rises: tuple[float, ...]
    step_share: float
    half_ratio: float
    passed: bool


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


def trend(t: np.ndarray, y: np.ndarray, cfg: DetectorConfig, window_s: float, jitter: float = 0.0,
          settled: bool = False) -> TrendResult:
    """Run every leak test on bin floors ``y`` at times ``t`` (seconds).

    Args:
        t: bin times, seconds.
        y: bin floors, bytes.
        cfg: detector settings.
        window_s: the scale's window (reported back).
        jitter: the typical upward step between consecutive raw samples: a sawtooth sampled
            at 1 s has its sampled trough drift by up to one such step as the sampling phase
            slides (aliasing), which looks like a slow creep of the floor.
        settled: the series is older than twice ``warmup_s``, so a warm-up tail (time constant
            up to ``warmup_s``/6) has faded; only then is a jump of the floor within ``jitter``
            discounted in the staircase test.
    """
    # Erode the floors (running minimum over half a sub-window): a sawtooth slower than
    # one bin still shows in the bin floors; its troughs are what a leak lifts.
    m = max(1, len(y) // (2 * cfg.sub_windows))
    if m > 1:
        y = np.lib.stride_tricks.sliding_window_view(y, m).min(axis=1)
        t = t[m - 1:]
    slope, lower, upper, z = sen_mann_kendall(t, y, cfg.confidence)
    # Sub-window floors.
    k = cfg.sub_windows
    edges = t[0] + (t[-1] - t[0] + 1e-9) * np.arange(1, k) / k
    idx = np.searchsorted(t, edges)
    parts = np.split(y, idx)
    floors = [float(p.min()) if len(p) else math.nan for p in parts]
    rises = tuple(b - a for a, b in zip(floors, floors[1:], strict=False))
    # Backward running minimum: where the floor of everything after bin i sits.
    back = np.minimum.accumulate(y[::-1])[::-1]
    inc = np.diff(back)
    total = float(back[-1] - back[0])
    step = float(inc.max()) if len(inc) else 0.0
    # A jump of up to one sampling-jitter step can be aliasing of a sawtooth's trough rather than
    # a step change: under a 2.5 GiB sawtooth sampled at 1 s (70 MiB per sample) the floor of a
    # 1 GiB/h creep rises in jumps of about 70 MiB, half of its 12-minute rise. The jump is
    # discounted by one jitter only when the rise is at least two jitters (aliasing can account
    # for one), and only once the series has settled: right after warmup_s, a decelerating
    # warm-up tail (time constant ~warmup_s/6) plus aliasing passes every other test and only the
    # strict step test stops it (5 of 120 benchmark warm-ups fired without this condition).
    if settled and total >= 2 * jitter and step > cfg.max_step_share * total:
        step = max(0.0, step - jitter)
    step_share = step / total if total > 0 else 1.0
    # Noise floor: the spread of the eroded floors around the Theil-Sen line. Erosion makes
    # neighbouring floors dependent, so the rank tests alone overstate significance; the
    # floor must also rise clearly above this noise.
    resid = y - slope * (t - t[0])
    mad = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    # Constant rate: the Theil-Sen slopes of the two halves must agree within a factor
    # 1/balance. A warm-up decelerates (second half flatter); a step lands in one half.
    h = len(y) // 2
    s1 = sen_mann_kendall(t[:h], y[:h], cfg.confidence)[0]
    s2 = sen_mann_kendall(t[h:], y[h:], cfg.confidence)[0]
    half_ratio = s2 / s1 if s1 > 0 else (math.inf if s2 > 0 else 0.0)
    passed = (
        z > cfg.z
        and lower > cfg.min_rate_bytes_per_s
        # Every sub-window's floor rises; one flat pair is tolerated because a fast sawtooth
        # sampled at 1 s leaves tens of MiB of jitter in the floors.
        and sum(r <= 0 for r in rises) <= (len(rises) - 1) // 2
        and min(r for r in rises if r > 0) >= cfg.min_rise_ratio * max(rises)
        and floors[-1] - floors[0] > cfg.noise_k * mad
        and floors[-1] - floors[0] > cfg.jitter_k * jitter
        and cfg.balance <= half_ratio <= 1 / cfg.balance
        and step_share <= cfg.max_step_share
    )
    return TrendResult(window_s, len(y), slope, lower, upper, z, rises, step_share, half_ratio, bool(passed))


class _Scale:
    """Bin floors of one (window, bin width) pair, bounded to window/bin + 1 bins."""

    __slots__ = ("window_s", "bin_s", "bins", "cur_key", "cur_min", "prev", "up_sum", "up_n", "closed_at")

    def __init__(self, window_s: float, bin_s: float) -> None:
        self.window_s = window_s
        self.bin_s = bin_s
        #: (bin centre, floor, mean upward step between consecutive samples) per closed bin.
        self.bins: deque[tuple[float, float, float]] = deque(maxlen=int(round(window_s / bin_s)) + 1)
        self.cur_key: int | None = None
        self.cur_min = math.inf
        self.prev: float | None = None
        self.up_sum = 0.0
        self.up_n = 0
        #: time of the sample that last closed a bin (the statistics of the scale were computed then)
        self.closed_at: float | None = None

    def add(self, t: float, v: float) -> bool:
        """Add a sample; True when it closed a bin."""
        key = int(t // self.bin_s)
        if self.prev is not None and v > self.prev:
            self.up_sum += v - self.prev
            self.up_n += 1
        self.prev = v
        if key == self.cur_key:
            if v < self.cur_min:
                self.cur_min = v
            return False
        closed = False
        if self.cur_key is not None:
            up = self.up_sum / self.up_n if self.up_n else 0.0
            self.bins.append(((self.cur_key + 0.5) * self.bin_s, self.cur_min, up))
            closed = True
        self.cur_key = key
        self.cur_min = v
        self.up_sum, self.up_n = 0.0, 0
        return closed

    def arrays(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo = now - self.window_s
        pts = [p for p in self.bins if p[0] >= lo]
        if not pts:
            return np.empty(0), np.empty(0), np.empty(0)
        a = np.asarray(pts, dtype=float)
        return a[:, 0], a[:, 1], a[:, 2]


class LeakDetector:
    """Leak detector for one memory series (a device or a process).

    A :class:`~inferwatch_sidecar.components.detector.Detector`: call
    ``update(t, value)`` for each sample, then read the results (``verdict``,
    ``rate``, ``ci``, ``detected_at``, ``last``, ``results``, ``samples``);
    ``to_state()`` / ``from_state()`` round-trip the state, config included, as
    plain JSON.

    Args:
        cfg: detector settings.
    """

    RESULTS = ("verdict", "rate", "ci", "detected_at", "last", "results", "samples")

    def __init__(self, cfg: DetectorConfig | None = None) -> None:
        self.cfg = cfg or DetectorConfig()
        self._scales = [_Scale(w, b) for w, b in self.cfg.scales]
        self._verdict = "insufficient_data"
        self._rate: float | None = None
        self._ci: tuple[float, float] | None = None
        self._detected_at: float | None = None
        self._last: float | None = None
        self._last_t: float | None = None
        self._results: tuple[TrendResult, ...] = ()
        self._pass_since: float | None = None
        self._fail_since: float | None = None
        self._last_pass: float | None = None
        self._samples = 0
        self._first_t: float | None = None
        self._by_scale: list[TrendResult | None] = [None] * len(self._scales)

    @property
    def verdict(self) -> str:
        """One of ``VERDICTS``."""
        return self._verdict

    @property
    def rate(self) -> float | None:
        """Leak rate in bytes/s (from the scale that fired, or the shortest full scale's estimate while quiet)."""
        return self._rate

    @property
    def ci(self) -> tuple[float, float] | None:
        """Confidence interval of ``rate``, bytes/s."""
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
        """The statistics of every full scale at the last closed bin."""
        return self._results

    @property
    def samples(self) -> int:
        """Samples taken (out-of-order and NaN ones are not)."""
        return self._samples

    def update(self, t: float, value: float) -> None:
        """Feed one sample (seconds, bytes). Out-of-order or NaN samples are ignored."""
        if value != value or (self._last_t is not None and t <= self._last_t):
            return
        self._samples += 1
        if self._first_t is None:
            self._first_t = float(t)
        self._last, self._last_t = float(value), float(t)
        closed = False
        for k, sc in enumerate(self._scales):
            if sc.add(t, value):
                closed = True
                # Only the scale whose bin closed is re-evaluated: the others' bins did not change.
                sc.closed_at = float(t)
                self._by_scale[k] = self._scale_result(sc, t)
        if closed:
            self._evaluate(t)

    def _scale_result(self, sc: _Scale, now: float) -> TrendResult | None:
        age = now - (self._first_t if self._first_t is not None else now)
        if age < max(sc.window_s, self.cfg.warmup_s) or now - sc.bins[-1][0] > sc.window_s / 4:
            return None
        tt, yy, up = sc.arrays(now)
        if len(yy) < max(8, self.cfg.sub_windows * 2) or len(yy) < 0.5 * sc.window_s / sc.bin_s:
            return None  # too many gaps in this window to judge
        return trend(tt, yy, self.cfg, sc.window_s, float(np.median(up)), settled=age >= 2 * self.cfg.warmup_s)

    def _evaluate(self, now: float) -> None:
        res = [r for r in self._by_scale if r is not None]
        self._results = tuple(res)
        if not res:
            if self._verdict != "leak":
                self._verdict = "insufficient_data"
            return
        fired = [r for r in res if r.passed]
        # Rate: the narrowest interval among the scales that fired, else the shortest scale.
        best = min(fired, key=lambda r: r.upper - r.lower) if fired else res[0]
        if fired:
            self._fail_since = None
            if self._pass_since is None:
                self._pass_since = now
            self._last_pass = now
            if self._verdict != "leak" and now - self._pass_since >= self.cfg.confirm_s:
                self._verdict = "leak"
                self._detected_at = now
        else:
            # Near the thresholds the tests flap from one bin to the next; a confirmation
            # survives failures shorter than half of confirm_s.
            if self._last_pass is None or now - self._last_pass > self.cfg.confirm_s / 2:
                self._pass_since = None
            if self._verdict == "leak":
                if self._fail_since is None:
                    self._fail_since = now
                if now - self._fail_since >= self.cfg.clear_s:
                    self._verdict = "no_leak"
                    self._detected_at = None
            else:
                self._verdict = "no_leak"
        if self._verdict == "leak" and not fired:
            return  # keep the rate from when it fired until it clears
        self._rate = best.slope
        self._ci = (best.lower, best.upper)

    def trend_rate(self) -> float | None:
        """The Theil-Sen slope of the shortest full scale (for classification), or None."""
        return self._results[0].slope if self._results else None

    def time_to_oom(self, headroom_bytes: float | None) -> float | None:
        """Seconds until ``headroom_bytes`` more memory is used at the leak rate, or None."""
        if self._verdict != "leak" or headroom_bytes is None or not self._rate or self._rate <= 0:
            return None
        return max(0.0, headroom_bytes) / self._rate

    def memory_bins(self) -> int:
        """Number of stored bins (bounded by the config, whatever the stream length)."""
        return sum(len(sc.bins) for sc in self._scales)

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state, config included; ``from_state`` rebuilds the detector."""
        return {
            "config": self.cfg.model_dump(mode="json"),
            "scales": [
                {"bins": [list(p) for p in sc.bins], "cur_key": sc.cur_key,
                 "cur_min": None if sc.cur_min == math.inf else sc.cur_min, "prev": sc.prev,
                 "up": [sc.up_sum, sc.up_n], "closed_at": sc.closed_at}
                for sc in self._scales
            ],
            "verdict": self._verdict, "rate": self._rate, "ci": list(self._ci) if self._ci else None,
            "detected_at": self._detected_at, "last": self._last, "last_t": self._last_t,
            "pass_since": self._pass_since, "fail_since": self._fail_since, "last_pass": self._last_pass,
            "samples": self._samples,
            "first_t": self._first_t,
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
        if len(state["scales"]) != len(self._scales):
            raise ValueError("the state was taken with different detector scales than its config holds")
        for sc, st in zip(self._scales, state["scales"], strict=True):
            sc.bins.extend((float(a), float(b), float(c)) for a, b, c in st["bins"])
            sc.prev = st["prev"]
            sc.up_sum, sc.up_n = float(st["up"][0]), int(st["up"][1])
            sc.cur_key = st["cur_key"]
            sc.cur_min = math.inf if st["cur_min"] is None else st["cur_min"]
            sc.closed_at = st["closed_at"]
        if state["verdict"] not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {state['verdict']!r}")
        self._verdict = state["verdict"]
        self._rate = state["rate"]
        self._ci = (float(state["ci"][0]), float(state["ci"][1])) if state["ci"] else None
        self._detected_at = state["detected_at"]
        self._last, self._last_t = state["last"], state["last_t"]
        self._pass_since, self._fail_since = state["pass_since"], state["fail_since"]
        self._last_pass = state["last_pass"]
        self._samples = int(state["samples"])
        self._first_t = state["first_t"]
        # The per-scale statistics are not stored: they are recomputed from the bins as they stood when
        # each scale last closed a bin (unchanged since), so they equal the ones the original held.
        self._by_scale = [None if sc.closed_at is None else self._scale_result(sc, sc.closed_at)
                          for sc in self._scales]
        self._results = tuple(r for r in self._by_scale if r is not None)
