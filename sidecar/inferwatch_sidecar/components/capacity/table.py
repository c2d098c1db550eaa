"""The live capacity table: per model version, throughput and latency by the number of requests in flight.

Time is cut into windows of ``window_s`` seconds (by each request's end time). In each window the sidecar
knows the requests that completed and their durations, so Little's law gives the window's mean number in
flight ``N = sum(durations) / window_s`` next to its throughput ``X = completions / window_s`` (and the mean
latency ``L = N / X``). Each closed window adds one observation to the level of its ``N``: levels are
geometric buckets (2^(1/8) apart, about 9%), so the table is bounded (at most :data:`MAX_LEVELS` levels per
model version) however the traffic moves. Observations decay with a half-life, so the table follows a
server that changed. The knee is :func:`~inferwatch_sidecar.components.capacity.knee.fit` over the levels
seen in at least ``min_windows`` windows whose decayed weight is still at least half of that (evidence at most
one half-life old at the minimum): traffic that stayed at one level says nothing, and none is given. (The
count of windows is kept apart from their decayed weight: compared with the weight alone, a level seen in
exactly ``min_windows`` windows fell out at the first decay, a moment after it was seen.)

One ``observe`` per request is a dictionary lookup and three additions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferwatch_sidecar.components.capacity.knee import Knee, Level, fit

#: Buckets per doubling of the in-flight level.
PER_DOUBLING = 8
#: Lowest and highest bucket (in-flight 1/16 to 65536).
LOW, HIGH = -4 * PER_DOUBLING, 16 * PER_DOUBLING
MAX_LEVELS = HIGH - LOW + 1


def bucket(n: float) -> int:
    if n <= 0:
        return LOW
    return max(LOW, min(HIGH, round(PER_DOUBLING * math.log2(n))))


class _Cell:
    __slots__ = ("k", "w", "n", "x", "x2")

    def __init__(self) -> None:
        self.k = 0  # windows seen (not decayed)
        self.w = 0.0
        self.n = 0.0
        self.x = 0.0
        self.x2 = 0.0


class Series:
    """One model version's open window and its levels."""

    __slots__ = ("win", "next_ns", "dur", "count", "cells", "last_n", "last_win", "windows")

    def __init__(self) -> None:
        self.win = -1
        self.next_ns = -(1 << 62)
        self.dur = 0.0
        self.count = 0
        self.cells: dict[int, _Cell] = {}
        self.last_n = 0.0
        self.last_win = -1
        self.windows = 0


@dataclass(frozen=True)
class Capacity:
    """What the table says of one model version."""

    knee: Knee | None
    in_flight: float
    levels: int
    windows: int

    @property
    def headroom(self) -> float | None:
        """1 - in-flight / knee (0 at the knee, negative beyond); None without a reached knee."""
        if self.knee is None or not self.knee.reached or self.knee.concurrency <= 0:
            return None
        return 1.0 - self.in_flight / self.knee.concurrency


class LiveTable:
    """Per key (service, model, version): windows of completions folded into levels by in-flight count."""

    def __init__(self, window_s: float = 2.0, half_life_s: float = 3600.0, min_windows: int = 3,
                 max_keys: int = 64) -> None:
        self.window_ns = int(window_s * 1e9)
        self.window_s = window_s
        self.half_life_s = half_life_s
        self.min_windows = min_windows
        self.max_keys = max_keys
        self.series: dict[Any, Series] = {}
        self._decayed_at: float | None = None

    def observe(self, key: Any, end_ns: int, duration_ns: int) -> bool:
        """One completed request; False when it was refused (too many keys)."""
        s = self.series.get(key)
        if s is None:
            if len(self.series) >= self.max_keys:
                return False
            s = self.series[key] = Series()
        if end_ns >= s.next_ns:
            if s.count:
                self._close(s)
            s.win = end_ns // self.window_ns
            s.next_ns = (s.win + 1) * self.window_ns
        s.dur += duration_ns
        s.count += 1
        return True

    def _close(self, s: Series) -> None:
        n = s.dur / self.window_ns  # (ns of requests) / (ns of window)
        x = s.count / self.window_s
        c = s.cells.get(bucket(n))
        if c is None:
            c = s.cells[bucket(n)] = _Cell()
        c.k += 1
        c.w += 1.0
        c.n += n
        c.x += x
        c.x2 += x * x
        s.last_n = n
        s.last_win = s.win
        s.windows += 1
        s.dur = 0.0
        s.count = 0

    def close_idle(self, now_ns: int) -> None:
        """Close windows that ended before ``now_ns`` (an evaluation with no newer traffic)."""
        w = now_ns // self.window_ns
        for s in self.series.values():
            if s.count and w > s.win:
                self._close(s)

    def decay(self, now_s: float) -> None:
        if self._decayed_at is None:
            self._decayed_at = now_s
            return
        dt = now_s - self._decayed_at
        if dt <= 0:
            return
        self._decayed_at = now_s
        f = 0.5 ** (dt / self.half_life_s)
        for s in self.series.values():
            for k in list(s.cells):
                c = s.cells[k]
                c.w *= f
                c.n *= f
                c.x *= f
                c.x2 *= f
                if c.w < 0.05:
                    del s.cells[k]

    def levels(self, key: Any) -> list[Level]:
        s = self.series.get(key)
        if s is None:
            return []
        out = []
        for c in s.cells.values():
            if c.k < self.min_windows or c.w < 0.5 * self.min_windows:
                continue
            n, x = c.n / c.w, c.x / c.w
            if x <= 0:
                continue
            var = max(c.x2 / c.w - x * x, 0.0)
            out.append(Level(n, x, math.sqrt(var / c.w), n / x))
        return out

    def capacity(self, key: Any, now_ns: int | None = None) -> Capacity:
        s = self.series[key]
        lv = self.levels(key)
        recent = now_ns is None or (now_ns // self.window_ns) - s.last_win <= 2
        return Capacity(fit(lv, resamples=100), s.last_n if recent else 0.0, len(lv), s.windows)
