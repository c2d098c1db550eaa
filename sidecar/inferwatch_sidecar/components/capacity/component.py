"""The capacity component: the live knee per model version, on the shared staged-component base.

Each tick folds the staged REQUEST events that succeeded into :class:`~.table.LiveTable`; each evaluation
fits the knee per model version and publishes the knee, its interval, the plateau throughput, the current
in-flight level and the headroom, for model versions whose traffic showed the knee.
"""

from __future__ import annotations

from typing import Any

from inferwatch.wire import EV_HELLO, EV_REQUEST, OUTCOME_OK
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.capacity.coldstart import ColdStarts
from inferwatch_sidecar.components.capacity.config import CapacityConfig
from inferwatch_sidecar.components.capacity.goodput import Goodput, objective_for
from inferwatch_sidecar.components.capacity.table import Capacity, LiveTable, Series
from inferwatch_sidecar.components.identity import VersionKeys
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.metrics import capacity as cm
from inferwatch_sidecar.metrics.samples import Samples

#: A context no event has (the inline path's run starts empty).
_NONE = object()


class _Fast:
    """What the inline path needs of one context tuple: its key, its model version's series, the goodput
    totals of its key (None without an objective), the end-to-end threshold at or under which a successful
    request is good without more checks (an int, so the comparison stays in integers) and whether that is the
    objective's only threshold (then an int duration above it is bad without more checks)."""

    __slots__ = ("key", "series", "totals", "thr", "e2e_only")

    def __init__(self, key: Any, series: Series, totals: list[int] | None, thr: Any) -> None:
        self.key = key
        self.series = series
        self.totals = totals
        self.thr = thr
        self.e2e_only = totals is not None and thr != float("-inf")

    def flush(self, n: int, dsum: Any, bad: int, judged: int) -> None:
        """A run of ``n`` successful requests of summed duration ``dsum``: ``bad`` of them over the end-to-end
        objective, ``judged`` of them counted by :meth:`Goodput.observe`, the others good."""
        s = self.series
        s.dur += dsum
        s.count += n
        if self.totals is not None:
            self.totals[0] += n - bad - judged
            self.totals[1] += bad


class CapacityComponent(StagedComponent):
    name = "capacity"
    record_types = frozenset({EV_REQUEST, EV_HELLO})
    metrics = cm.METRICS
    dropped_metric = cm.CAPACITY_DROPPED_EVENTS_TOTAL
    drop_reasons = ("staging_full", "too_many_models", "error")

    def __init__(self, cfg: CapacityConfig, ctx: ComponentContext) -> None:
        super().__init__(ctx, interval_s=1.0, max_staged=cfg.max_staged, evaluate_interval_s=cfg.evaluate_interval_s)
        self.cfg = cfg
        self._keys = VersionKeys(ctx)
        self.table = LiveTable(cfg.window_seconds, cfg.half_life_seconds, cfg.min_windows, cfg.max_models)
        self._last_end = 0
        #: context tuple -> its capped key (the limiters answer the same for the same context)
        self._key_cache: dict[Any, Any] = {}
        #: context tuple -> its key, series and goodput threshold: one lookup a run of the inline path
        #: (a series is never removed from the table, so an entry never goes stale)
        self._series_by_ctx: dict[Any, _Fast] = {}
        self.goodput = Goodput(cfg.slo, cfg.goodput_window_seconds)
        self._report: dict[str, Any] = {}
        self.cold = ColdStarts(self._keys.of)

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]], nbytes: int | None = None) -> None:
        """Stage the records; a producer still warming up also feeds the cold-start tracker (ingest thread)."""
        super().handle(pid, producer_id, records, nbytes)
        try:
            self.cold.frame(pid, producer_id, records)
        except Exception:  # pragma: no cover - defensive: the ingest thread must survive
            self.count_drop("error")

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Fold the staged events into the windows (the state lock held).

        The common case is a run of successful requests of one context tuple (the decoder shares one tuple
        among a frame's events) ending inside their model version's open window: each costs a tuple
        unpacking, four comparisons and two additions to locals, and the run's sums go to its window and
        goodput counts once, when the run ends (the live knee's bar is 0.3 us an event,
        bench/capacity_callgrind.py). Under an objective on end-to-end time alone, a request within it is
        good and one over it bad by that comparison; an objective on TTFT or inter-token latency has
        :meth:`Goodput.observe` judge each request. A new window, a new model version, another outcome or an
        event that is not a 9-tuple takes :meth:`_general`.
        """
        by_ctx = self._series_by_ctx
        slo = self.goodput.observe if self.goodput.objectives else None
        refused = 0
        last = self._last_end
        ok, req = OUTCOME_OK, EV_REQUEST
        cur: _Fast | None = None
        cur_c: Any = _NONE  # the run's context tuple (compared by identity)
        nxt = thr = 0
        e2e_only = False
        n = dsum = nb = nj = 0  # the run's requests, their summed durations, those bad and those judged apart
        for ev in batch:
            try:
                typ, c, end, d, outcome, _, _, _, stages = ev
            except (TypeError, ValueError):  # not a 9-tuple: the general path judges it
                if n:
                    cur.flush(n, dsum, nb, nj)  # type: ignore[union-attr]
                    n = dsum = nb = nj = 0
                cur_c = _NONE
                r, last = self._general(ev, slo, last)
                refused += r
                continue
            if typ != req:
                continue
            try:  # free unless raised (Python 3.11's zero-cost exceptions)
                if c is not cur_c:
                    if n:
                        cur.flush(n, dsum, nb, nj)  # type: ignore[union-attr]
                        n = dsum = nb = nj = 0
                    cur = by_ctx.get(c)
                    if cur is None:
                        cur_c = _NONE
                        r, last = self._general(ev, slo, last)
                        refused += r
                        continue
                    cur_c, nxt, thr, e2e_only = c, cur.series.next_ns, cur.thr, cur.e2e_only
                if outcome != ok or end >= nxt:
                    if n:
                        cur.flush(n, dsum, nb, nj)  # type: ignore[union-attr]
                        n = dsum = nb = nj = 0
                    cur_c = _NONE  # the general path may open a new window
                    r, last = self._general(ev, slo, last)
                    refused += r
                    continue
                if d <= thr:
                    n += 1
                    dsum += d
                else:  # over the end-to-end threshold, or an objective that needs the stages
                    n += 1
                    dsum += d
                    if e2e_only and type(d) is int:  # an int over the rounded-down threshold is over it
                        nb += 1
                    else:
                        nj += 1
                        if slo is not None:
                            slo(cur.key, cur.key[1], ok, d, stages)  # type: ignore[union-attr]
                if end > last:
                    last = end
            except (TypeError, ValueError, IndexError, KeyError):
                self.count_drop("error")  # a malformed request costs itself, never the batch
        if n:
            cur.flush(n, dsum, nb, nj)  # type: ignore[union-attr]
        self._last_end = last
        if refused:
            self.count_drop("too_many_models", refused)

    def _general(self, ev: Any, slo: Any, last: int) -> tuple[int, int]:
        """One event by the general path: (1 when its model version was refused else 0, the latest end)."""
        try:
            if ev[0] != EV_REQUEST or len(ev) < 9:
                return 0, last
            r = self._absorb_slow(ev, slo)
            if r < 0:
                return 0, last
            if ev[4] == OUTCOME_OK and ev[2] > last:
                last = ev[2]
            return r, last
        except (TypeError, ValueError, IndexError, KeyError):
            self.count_drop("error")  # a malformed request costs itself, never the batch
            return 0, last

    def _absorb_slow(self, ev: tuple[Any, ...], slo: Any) -> int:
        """One event off the inline path: 1 when its model version was refused, -1 when it was malformed."""
        try:
            r = self._absorb_request(ev, self._key_cache, self._keys.of, slo, self.table.observe)
            ctx = ev[1]
            if ctx not in self._series_by_ctx and len(self._series_by_ctx) < 4096:
                key = self._key_cache.get(ctx)
                s = self.table.series.get(key)
                if s is not None and key is not None:
                    totals, thr = self.goodput.inline(key, str(key[1]))
                    self._series_by_ctx[ctx] = _Fast(key, s, totals, thr)
            return r
        except (TypeError, ValueError, IndexError, KeyError):
            self.count_drop("error")  # a malformed request costs itself, never the batch
            return -1

    @staticmethod
    def _absorb_request(ev: tuple[Any, ...], cache: dict[Any, Any], keys: Any, slo: Any, observe: Any) -> int:
        """One finished request into the windows (and the SLO counts); 1 when its model version was refused."""
        ctx = ev[1]
        key = cache.get(ctx)
        if key is None:
            key = keys(ctx)
            if len(cache) < 4096:
                cache[ctx] = key
        # the window first, so that an event whose times are not numbers counts nowhere (on any path)
        r = 0 if ev[4] != OUTCOME_OK or observe(key, ev[2], ev[3]) else 1
        if slo is not None:
            slo(key, key[1], ev[4], ev[3], ev[8])
        return r

    def evaluate(self, now: float | None = None) -> dict[Any, Capacity]:
        now = self.ctx.clock() if now is None else now
        with self._state_lock:
            now_ns = max(int(now * 1e9), self._last_end)
            self.table.close_idle(now_ns - self.table.window_ns)
            self.table.decay(now)
            caps = {k: self.table.capacity(k, now_ns) for k in list(self.table.series)}
            good = self.goodput.ratios(now)
            totals = {k: tuple(v) for k, v in self.goodput.totals.items()}
        out = Samples()
        for key, (ttf, ratio) in self.cold.snapshot().items():
            labels = tuple(str(x) for x in key)
            out.put(cm.COLD_START_SECONDS, labels, ttf)
            out.put(cm.COLD_LATENCY_RATIO, labels, ratio)
        for key, (g, b) in totals.items():
            labels = tuple(str(x) for x in key)
            out.put(cm.SLO_REQUESTS_TOTAL, (*labels, "good"), g)
            out.put(cm.SLO_REQUESTS_TOTAL, (*labels, "bad"), b)
            o = objective_for(self.goodput.objectives, str(key[1]))
            out.put(cm.SLO_OBJECTIVE_RATIO, labels, o.objective if o else None)
            out.put(cm.SLO_GOODPUT_RATIO, labels, good.get(key))
        report: dict[str, Any] = {}
        for key, cap in caps.items():
            labels = tuple(str(x) for x in key)
            out.put(cm.CAPACITY_IN_FLIGHT, labels, cap.in_flight)
            k = cap.knee
            entry: dict[str, Any] = {"levels": cap.levels, "windows": cap.windows, "in_flight": cap.in_flight,
                                     "knee": None}
            if k is not None and k.reached:
                out.put(cm.CAPACITY_KNEE_CONCURRENCY, labels, k.concurrency)
                out.put(cm.CAPACITY_KNEE_LOW, labels, k.low)
                out.put(cm.CAPACITY_KNEE_HIGH, labels, k.high)
                out.put(cm.CAPACITY_MAX_THROUGHPUT_RPS, labels, k.throughput_rps)
                out.put(cm.CAPACITY_HEADROOM_RATIO, labels, cap.headroom)
                entry.update(knee=k.concurrency, knee_low=k.low, knee_high=k.high,
                             max_throughput_rps=k.throughput_rps, headroom=cap.headroom)
            report["/".join(labels)] = entry
        self.publish(out)
        with self._lock:
            self._report = report
        return caps

    def status(self) -> dict[str, Any]:
        with self._lock:
            report = dict(self._report)
        return {"staged": self.staged(), "dropped": dict(self.dropped), "models": report,
                "verdicts": headroom_verdicts(report)}


#: Headroom under which a model version runs at its knee: InferwatchCapacityHeadroomLow's ``headroom``
#: threshold (tests/components/capacity checks that the two agree).
HEADROOM_LOW = 0.1


def headroom_verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The status page's bad-now rows (export/summary.py): the model versions running at their knee."""
    rows = []
    for subject, e in sorted(report.items()):
        h = e.get("headroom")
        if h is not None and h < HEADROOM_LOW:
            rows.append({"subject": subject, "verdict": "at its knee", "severity": "warn",
                         "alert": "InferwatchCapacityHeadroomLow",
                         "detail": f"{e['in_flight']:.1f} in flight against a live knee of {e['knee']:.1f} "
                                   f"(headroom {h:.0%}, under {HEADROOM_LOW:.0%}): more load only adds queueing"})
    return rows


def build(config: CapacityConfig, ctx: ComponentContext) -> CapacityComponent:
    return CapacityComponent(config, ctx)
