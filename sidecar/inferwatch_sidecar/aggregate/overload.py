"""HTTP truth and overload: routes, status outcomes, retries, load amplification and client give-ups.

Fed by HTTP events (``EV_HTTP``: the SDK's ASGI middleware, and the OTLP trace receiver's server
spans), under the aggregator's lock. docs/overload.md explains the signals.

The retry window (:class:`SeenIds`) keeps the 64-bit hashes of client request IDs in two generations of
sets: the current one and the one before. A generation starts every ``window_s / 2`` seconds (of the events'
own clock), or when the current one holds ``capacity`` IDs, so an ID is remembered for at least half a
window (at least ``capacity`` IDs back) and forgotten after at most a window. Memory: at most ``2 *
capacity`` entries, 8.5 MiB for the default 65536 (measured by bench/retry_window.py), whatever the
traffic. A unique ID is taken for a retry only when another ID in the window has the same 64-bit hash:
about ``2 * capacity / 2**64`` (7e-15) per request. A retry is missed only when its first attempt was
forgotten: sent more than half a window earlier, or more than ``capacity`` IDs earlier at a rate above
``capacity / (window_s / 2)`` (1092 requests/s by default). So the retry count errs low, never high.
The check is a hash and two set lookups in C, no big-integer arithmetic (bench/retry_window.py counts
its instructions under callgrind).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch.wire import OUTCOME_CANCELLED, OUTCOMES
from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import (
    CLIENT_GIVEUP_WAIT_SECONDS,
    CLIENT_GIVEUPS_TOTAL,
    HTTP_REQUESTS_TOTAL,
    LOAD_AMPLIFICATION_RATIO,
    REQUEST_ATTEMPTS_TOTAL,
    REQUEST_RETRIES_TOTAL,
)

#: The catalog entries :meth:`Overload.collect` exports, in order.
OVERLOAD_METRICS = (
    HTTP_REQUESTS_TOTAL, REQUEST_ATTEMPTS_TOTAL, REQUEST_RETRIES_TOTAL, LOAD_AMPLIFICATION_RATIO,
    CLIENT_GIVEUPS_TOTAL, CLIENT_GIVEUP_WAIT_SECONDS,
)

#: Default IDs per generation of the retry window (two generations are kept).
DEFAULT_CAPACITY = 1 << 16
#: Default seconds within which a repeated request ID counts as a retry.
DEFAULT_WINDOW_S = 120
#: The route label of a request no route matched (a 404).
UNMATCHED = "_unmatched"
#: Nanoseconds per bucket of the load-amplification window, and buckets in it (60 s).
AMP_BUCKET_NS = 10 * 10**9
AMP_BUCKETS = 6


class SeenIds:
    """A bounded set of the client request IDs seen within a sliding window (see the module docstring).

    Args:
        capacity: IDs per generation; memory holds at most twice as many.
        window_s: an ID seen again within this many seconds (at least half of it) is a repeat.
    """

    __slots__ = ("cur", "prev", "capacity", "half_ns", "rotate_at")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, window_s: float = DEFAULT_WINDOW_S) -> None:
        if capacity < 1:
            raise ValueError(f"retry window capacity must be >= 1, not {capacity}")
        if not window_s >= 2:
            raise ValueError(f"retry window must be 2 s or more, not {window_s}")
        self.cur: set[int] = set()
        self.prev: set[int] = set()
        self.capacity = int(capacity)
        self.half_ns = int(window_s * 1e9) // 2
        #: When (event ns) the current generation ends.
        self.rotate_at = 0

    @property
    def nbytes(self) -> int:
        """Memory held now: the two sets and their int objects."""
        n = len(self.cur) + len(self.prev)
        return sys.getsizeof(self.cur) + sys.getsizeof(self.prev) + n * sys.getsizeof(1 << 62)

    def rotate(self, end_ns: int) -> None:
        """Start a generation at ``end_ns`` (the current one full, or half a window old)."""
        # After an idle gap longer than the window, the previous generation is out of it too.
        self.prev = self.cur if end_ns < self.rotate_at + self.half_ns else set()
        self.cur = set()
        self.rotate_at = end_ns + self.half_ns

    def seen(self, rid: str, end_ns: int) -> bool:
        """Record ``rid`` at ``end_ns`` (event ns) and say whether it was seen within the window."""
        if end_ns >= self.rotate_at or len(self.cur) >= self.capacity:
            self.rotate(end_ns)
        h = hash(rid)
        if h in self.cur or h in self.prev:
            return True
        self.cur.add(h)
        return False


class HttpSeries:
    """The HTTP counters of one capped (service, model, model_version) label set."""

    __slots__ = ("lab", "routes", "attempts", "retries", "giveups", "wait", "wait_sum", "amp", "amp_cur", "amp_lo",
                 "amp_hi")

    def __init__(self, lab: tuple[str, str, str], n_bounds: int) -> None:
        self.lab = lab
        #: (capped route, outcome code) -> requests
        self.routes: dict[tuple[str, int], int] = {}
        self.attempts = 0
        self.retries = 0
        self.giveups = 0
        self.wait = [0] * (n_bounds + 1)
        self.wait_sum = 0.0
        #: bucket start (event ns) -> [attempts, retries], for the last AMP_BUCKETS buckets; the bucket being
        #: filled and its bounds (an event outside them finds its bucket through the dict).
        self.amp: dict[int, list[int]] = {}
        self.amp_cur = [0, 0]
        self.amp_lo = self.amp_hi = 0


class Overload:
    """Counts HTTP events; :meth:`process` runs under the aggregator's lock.

    Args:
        bundle_label: raw ctx -> its capped (service, model, model_version) label set (the aggregator's).
        route_limiter: caps the route label.
        capacity, window_s: the retry window's size (see :class:`SeenIds`).
        bounds: bucket bounds of the give-up wait histogram.
    """

    def __init__(
        self, bundle_label: Callable[[Any], tuple[str, str, str]], route_limiter: LabelLimiter,
        capacity: int = DEFAULT_CAPACITY, window_s: float = DEFAULT_WINDOW_S,
        bounds: tuple[float, ...] = CLIENT_GIVEUP_WAIT_SECONDS.buckets or (),
    ) -> None:
        self.label = bundle_label
        self.routes = route_limiter
        self.seen = SeenIds(capacity, window_s)
        self.bounds = bounds
        #: The latest HTTP event's end (ns): the amplification window ends there, so it follows the
        #: events' own clock (a replay, a late OTLP batch) rather than the scrape's.
        self.latest_ns = 0
        self.series: dict[tuple[str, str, str], HttpSeries] = {}
        self._cache: dict[Any, HttpSeries] = {}

    def _series(self, ctx: Any) -> HttpSeries:
        lab = self.label(ctx)
        s = self.series.get(lab)
        if s is None:
            s = self.series[lab] = HttpSeries(lab, len(self.bounds))
        if len(self._cache) >= 20000:
            self._cache.clear()
        self._cache[ctx] = s
        return s

    def process(self, ev: tuple[Any, ...]) -> None:
        """Count one HTTP event ``(EV_HTTP, ctx, end_unix_ns, route, status, outcome, resend_count,
        client_wait_ns, excluded, request_id)``."""
        _, ctx, end_ns, route, _status, outcome, resend, wait_ns, excluded, rid = ev
        s = self._cache.get(ctx) or self._series(ctx)
        key = (UNMATCHED if route is None else self.routes.get(route), outcome)
        s.routes[key] = s.routes.get(key, 0) + 1
        if excluded:
            return
        s.attempts += 1
        # Measured (bench/retry_window.py, callgrind): only comparisons on the ns times, no division.
        if end_ns > self.latest_ns:
            self.latest_ns = end_ns
        retry = resend > 0
        if rid is not None:
            # SeenIds.seen, inlined (the call is a large share of its cost).
            seen = self.seen
            if end_ns >= seen.rotate_at or len(seen.cur) >= seen.capacity:
                seen.rotate(end_ns)
            h = hash(rid)
            if h in seen.cur or h in seen.prev:
                retry = True
            else:
                seen.cur.add(h)
        amp = s.amp_cur if s.amp_lo <= end_ns < s.amp_hi else self._amp_bucket(s, end_ns)
        amp[0] += 1
        if retry:
            s.retries += 1
            amp[1] += 1
        if outcome == OUTCOME_CANCELLED and wait_ns > 0:
            s.giveups += 1
            v = wait_ns * 1e-9
            s.wait[bisect_left(self.bounds, v)] += 1
            s.wait_sum += v

    @staticmethod
    def _amp_bucket(s: HttpSeries, end_ns: int) -> list[int]:
        """The amplification bucket of ``end_ns``, made current (the oldest dropped past AMP_BUCKETS)."""
        lo = end_ns - end_ns % AMP_BUCKET_NS
        amp = s.amp.get(lo)
        if amp is None:
            amp = s.amp[lo] = [0, 0]
            while len(s.amp) > AMP_BUCKETS:
                del s.amp[min(s.amp)]
        s.amp_cur, s.amp_lo, s.amp_hi = amp, lo, lo + AMP_BUCKET_NS
        return amp

    def amplification(self, s: HttpSeries, now_ns: int) -> float:
        """Attempts per unique request in the buckets of the 60 s up to ``now_ns`` (1.0 with none)."""
        lo = now_ns - AMP_BUCKET_NS * AMP_BUCKETS
        att = ret = 0
        for start, (a, r) in s.amp.items():
            if start + AMP_BUCKET_NS > lo:
                att += a
                ret += r
        return att / (att - ret) if att > ret else (1.0 if att == 0 else float(att))

    def collect(self) -> Iterator[PromMetric]:
        """Metric families (call with the aggregator's lock held: it copies nothing large)."""
        now = self.latest_ns
        http = families.counter(HTTP_REQUESTS_TOTAL)
        attempts = families.counter(REQUEST_ATTEMPTS_TOTAL)
        retries = families.counter(REQUEST_RETRIES_TOTAL)
        amp = families.gauge(LOAD_AMPLIFICATION_RATIO)
        giveups = families.counter(CLIENT_GIVEUPS_TOTAL)
        wait = families.histogram(CLIENT_GIVEUP_WAIT_SECONDS)
        les = families.bucket_les(CLIENT_GIVEUP_WAIT_SECONDS, self.bounds)
        for lab, s in self.series.items():
            labels = list(lab)
            for (route, code), n in sorted(s.routes.items()):
                http.add_metric([*labels, route, OUTCOMES[code]], n)
            if not s.attempts:
                continue
            attempts.add_metric(labels, s.attempts)
            retries.add_metric(labels, s.retries)
            amp.add_metric(labels, self.amplification(s, now))
            giveups.add_metric(labels, s.giveups)
            acc = 0
            buckets = []
            for le, c in zip(les, s.wait, strict=True):
                acc += c
                buckets.append((le, acc))
            wait.add_metric(labels, buckets, s.wait_sum)
        yield from (http, attempts, retries, amp, giveups, wait)
