"""HTTP truth and overload: routes, status outcomes, retries, load amplification and client give-ups.

Fed by HTTP events (``EV_HTTP``: the SDK's ASGI middleware, and the OTLP trace receiver's server
spans), under the aggregator's lock. docs/overload.md explains the signals.

The retry window (:class:`SeenIds`) is a direct-mapped table of ``slots`` 64-bit words: one word per
slot holds a 32-bit fingerprint of a client request ID and the second it was last seen. Its memory is
``8 * slots`` bytes whatever the traffic (2 MiB for the default 2**18 slots). A request whose ID finds
its own fingerprint in its slot, seen at most ``window_s`` earlier, is a retry. A unique ID is taken
for a retry only when its slot holds another in-window ID with the same 32-bit fingerprint: at most
2**-32 per request (bench/retry_window.py measures it). A retry is missed when other IDs overwrote its
slot since the first attempt: about ``rate * delay / slots`` (1000 requests/s retried after 5 s:
1.9 %), so the retry count errs low, never high.
"""

from __future__ import annotations

from array import array
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

#: Default slots of the retry window (a power of two): 2 MiB.
DEFAULT_SLOTS = 1 << 18
#: Default seconds within which a repeated request ID counts as a retry.
DEFAULT_WINDOW_S = 120
#: The route label of a request no route matched (a 404).
UNMATCHED = "_unmatched"
#: Seconds per bucket of the load-amplification window, and buckets in it (60 s).
AMP_BUCKET_S = 10
AMP_BUCKETS = 6
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class SeenIds:
    """A bounded, constant-memory set of the request IDs seen within a sliding window.

    Args:
        slots: table size, a power of two (memory is ``8 * slots`` bytes).
        window_s: an ID seen again at most this many seconds later is a repeat.
    """

    __slots__ = ("table", "mask", "window")

    def __init__(self, slots: int = DEFAULT_SLOTS, window_s: int = DEFAULT_WINDOW_S) -> None:
        if slots < 2 or slots & (slots - 1):
            raise ValueError(f"retry window slots must be a power of two >= 2, not {slots}")
        if not 0 < window_s < 1 << 31:
            raise ValueError(f"retry window must be 1 s or more, not {window_s}")
        self.table = array("Q", bytes(8 * slots))
        self.mask = slots - 1
        self.window = int(window_s)

    @property
    def nbytes(self) -> int:
        """Memory the table holds, in bytes (constant)."""
        return self.table.itemsize * len(self.table)

    def seen(self, rid: str, now_s: int) -> bool:
        """Record ``rid`` at ``now_s`` (whole seconds) and say whether it was seen within the window."""
        h = hash(rid) & _U64
        i = h & self.mask
        fp = (h >> 32) | 1  # never 0: an empty slot matches nothing
        t = self.table
        e = t[i]
        t[i] = (fp << 32) | (now_s & _U32)
        return (e >> 32) == fp and ((now_s - e) & _U32) <= self.window


class HttpSeries:
    """The HTTP counters of one capped (service, model, model_version) label set."""

    __slots__ = ("lab", "routes", "attempts", "retries", "giveups", "wait", "wait_sum", "amp")

    def __init__(self, lab: tuple[str, str, str], n_bounds: int) -> None:
        self.lab = lab
        #: (capped route, outcome code) -> requests
        self.routes: dict[tuple[str, int], int] = {}
        self.attempts = 0
        self.retries = 0
        self.giveups = 0
        self.wait = [0] * (n_bounds + 1)
        self.wait_sum = 0.0
        #: bucket start (s) -> [attempts, retries], for the last AMP_BUCKETS buckets
        self.amp: dict[int, list[int]] = {}


class Overload:
    """Counts HTTP events; :meth:`process` runs under the aggregator's lock.

    Args:
        bundle_label: raw ctx -> its capped (service, model, model_version) label set (the aggregator's).
        route_limiter: caps the route label.
        slots, window_s: the retry window's size (see :class:`SeenIds`).
        bounds: bucket bounds of the give-up wait histogram.
    """

    def __init__(
        self, bundle_label: Callable[[Any], tuple[str, str, str]], route_limiter: LabelLimiter,
        slots: int = DEFAULT_SLOTS, window_s: int = DEFAULT_WINDOW_S,
        bounds: tuple[float, ...] = CLIENT_GIVEUP_WAIT_SECONDS.buckets or (),
    ) -> None:
        self.label = bundle_label
        self.routes = route_limiter
        self.seen = SeenIds(slots, window_s)
        self.bounds = bounds
        #: The latest HTTP event's end (whole seconds): the amplification window ends there, so it
        #: follows the events' own clock (a replay, a late OTLP batch) rather than the scrape's.
        self.latest_s = 0
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
        sec = end_ns // 1_000_000_000
        if sec > self.latest_s:
            self.latest_s = sec
        retry = resend > 0
        if rid is not None:
            # SeenIds.seen, inlined (a method call is a third of its cost; bench/retry_window.py).
            seen = self.seen
            h = hash(rid) & _U64
            i = h & seen.mask
            fp = (h >> 32) | 1
            t = seen.table
            e = t[i]
            t[i] = (fp << 32) | (sec & _U32)
            if (e >> 32) == fp and ((sec - e) & _U32) <= seen.window:
                retry = True
        b = sec - sec % AMP_BUCKET_S
        amp = s.amp.get(b)
        if amp is None:
            amp = s.amp[b] = [0, 0]
            if len(s.amp) > AMP_BUCKETS:
                del s.amp[min(s.amp)]
        amp[0] += 1
        if retry:
            s.retries += 1
            amp[1] += 1
        if outcome == OUTCOME_CANCELLED and wait_ns > 0:
            s.giveups += 1
            v = wait_ns * 1e-9
            s.wait[bisect_left(self.bounds, v)] += 1
            s.wait_sum += v

    def amplification(self, s: HttpSeries, now_s: float) -> float:
        """Attempts per unique request in the buckets of the 60 s up to ``now_s`` (1.0 with none)."""
        lo = now_s - AMP_BUCKET_S * AMP_BUCKETS
        att = ret = 0
        for start, (a, r) in s.amp.items():
            if start + AMP_BUCKET_S > lo:
                att += a
                ret += r
        return att / (att - ret) if att > ret else (1.0 if att == 0 else float(att))

    def collect(self) -> Iterator[PromMetric]:
        """Metric families (call with the aggregator's lock held: it copies nothing large)."""
        now = self.latest_s
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
