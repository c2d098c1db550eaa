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
from inferwatch_sidecar.components.capacity.table import Capacity, LiveTable
from inferwatch_sidecar.components.identity import VersionKeys
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.metrics import capacity as cm
from inferwatch_sidecar.metrics.samples import Samples


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
        #: context tuple -> (its capped key, its model version's table series): one lookup on the inline path
        #: (a series is never removed from the table, so an entry never goes stale)
        self._series_by_ctx: dict[Any, Any] = {}
        self.goodput = Goodput(cfg.slo, cfg.goodput_window_seconds)
        self._report: dict[str, Any] = {}
        self.cold = ColdStarts(self._keys.of)

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        """Stage the records; a producer still warming up also feeds the cold-start tracker (ingest thread)."""
        super().handle(pid, producer_id, records)
        try:
            self.cold.frame(pid, producer_id, records)
        except Exception:  # pragma: no cover - defensive: the ingest thread must survive
            self.count_drop("error")

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Fold the staged events into the windows (the state lock held).

        The common case, a successful request ending inside its model version's open window, is two additions
        inline here (no call per event: the live knee's bar is 0.3 us an event, bench/capacity_callgrind.py);
        a new window, a new model version or a malformed event takes :meth:`_absorb_slow`.
        """
        by_ctx = self._series_by_ctx
        slo = self.goodput.observe if self.goodput.objectives else None
        refused = 0
        last = self._last_end
        ok = OUTCOME_OK
        for ev in batch:
            try:  # free unless raised (Python 3.11's zero-cost exceptions)
                if ev[0] != EV_REQUEST or len(ev) < 9:
                    continue
                ks = by_ctx.get(ev[1])
                if ks is None or ev[4] != ok or ev[2] >= ks[1].next_ns:
                    r = self._absorb_slow(ev, slo)
                    if r < 0:
                        continue
                    refused += r
                else:
                    if slo is not None:
                        slo(ks[0], ks[0][1], ok, ev[3], ev[8])
                    s = ks[1]
                    s.dur += ev[3]
                    s.count += 1
                if ev[4] == ok and ev[2] > last:
                    last = ev[2]
            except (TypeError, ValueError, IndexError, KeyError):
                self.count_drop("error")  # a malformed request costs itself, never the batch
        self._last_end = last
        if refused:
            self.count_drop("too_many_models", refused)

    def _absorb_slow(self, ev: tuple[Any, ...], slo: Any) -> int:
        """One event off the inline path: 1 when its model version was refused, -1 when it was malformed."""
        try:
            r = self._absorb_request(ev, self._key_cache, self._keys.of, slo, self.table.observe)
            ctx = ev[1]
            if ctx not in self._series_by_ctx and len(self._series_by_ctx) < 4096:
                key = self._key_cache.get(ctx)
                s = self.table.series.get(key)
                if s is not None:
                    self._series_by_ctx[ctx] = (key, s)
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
        if slo is not None:
            slo(key, key[1], ev[4], ev[3], ev[8])
        if ev[4] != OUTCOME_OK:
            return 0
        return 0 if observe(key, ev[2], ev[3]) else 1

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
