"""The sidecar's canary component: every version of a model judged against its stable version, off the ingest path.

Data flow:

1. ``handle`` (ingest thread) appends the decoded REQUEST and RECORD tuples to
   a bounded staging list under a lock held for one ``list.extend``.
2. The component's thread drains the list every second into the
   per-version windows (:mod:`.window`): a ring of ``subwindows`` histograms
   over ``window_seconds``, so both versions are compared over the same
   stretch of time.
3. Every ``evaluate_interval_s`` it picks each model's stable version (the
   configured ``baselines`` entry, else the busiest version in the window),
   judges every other version with at least ``min_requests`` requests against
   it (:mod:`.judge`) and publishes the metric samples; ``collect`` only copies
   them. The stable version is :func:`~inferwatch_sidecar.components.identity.baseline`'s,
   the same the drift engine compares canaries with. The estimated accuracy comes
   from the drift component, when it runs, through its declared
   :class:`~inferwatch_sidecar.components.base.EstimatesAccuracy` hook.

State per version is a few histograms of 162 latency bins per sub-window:
about 13 KB per series with the defaults, whatever the traffic.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from inferwatch.wire import EV_RECORD, EV_REQUEST, OUTCOME_OK
from inferwatch_sidecar.aggregate.labels import OVERFLOW
from inferwatch_sidecar.components.base import ComponentContext, EstimatesAccuracy, Peers
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.judge import VERDICTS, Judgement, VerdictHold, judge
from inferwatch_sidecar.components.canary.window import N_OUTCOMES, VersionWindow
from inferwatch_sidecar.components.identity import Key, VersionKeys, baseline, bounded_entry
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.metrics.canary import (
    CANARY_DROPPED_EVENTS_TOTAL,
    CANARY_LAST_EVALUATION_TIMESTAMP_SECONDS,
    CANARY_METRIC_EFFECT,
    CANARY_METRIC_FAILED,
    CANARY_SCORE,
    CANARY_TRAFFIC_RATIO,
    CANARY_VERDICT,
    CANARY_WINDOW_REQUESTS,
    METRICS,
)
from inferwatch_sidecar.metrics.samples import Samples
from inferwatch_sidecar.stats.columns import canon

try:  # the compiled pass over a batch (setup.py); the Python loop where it was not built
    from inferwatch_sidecar.components.canary._gatherc import gather as _compiled_gather  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - CI requires it (tests/components/canary/test_gatherc.py)
    _compiled_gather = None

log = logging.getLogger("inferwatch.sidecar.canary")
#: Modules this component imports only where it first computes (scipy: 26-72 MiB that an idle sidecar need not
#: hold); start-up checks that they are installed (daemon/wiring.py), so a missing one is named at start.
LAZY_IMPORTS = ("scipy",)

#: No event's ctx (the identity checks' start value in :meth:`CanaryComponent._gather`).
_NO_CTX = object()
#: (ctx, pid, producer ID) entries remembered for the per-replica load; past it the table starts over.
_MAX_REPLICA_KEYS = 4096


class CanaryComponent(StagedComponent):
    """The ``canary`` sidecar component (see the module docstring)."""

    name = "canary"
    record_types = frozenset({EV_REQUEST, EV_RECORD})
    metrics = METRICS
    drop_reasons = ("staging_full", "too_many_versions", "too_many_stages", "error")

    def __init__(self, config: CanaryConfig, ctx: ComponentContext) -> None:
        super().__init__(ctx, interval_s=min(1.0, config.evaluate_interval_s / 5), max_staged=config.max_staged,
                         evaluate_interval_s=config.evaluate_interval_s, log=log)
        self.cfg = config
        self.sub_s = config.window_seconds / config.subwindows
        self.windows: dict[Key, VersionWindow] = {}
        self._slot: int | None = None  # absolute sub-window number (time // sub_s) of the ring's current slot
        self.judgements: list[Judgement] = []
        self.last_eval_unix: float | None = None
        self._accuracy_source: EstimatesAccuracy | None = None
        self._keys = VersionKeys(ctx)
        self._lim_stage = ctx.limiter("stage")
        #: The compiled pass over a batch (None: the Python loop, where it was not built or is switched off).
        self.compiled_gather = _compiled_gather
        #: (raw ctx, pid, producer ID) -> when its last frame came (monotonic s): the replicas of each version.
        self._replicas: dict[tuple[Any, int, int], float] = {}
        #: Holds a new fail back for canary.fail_after_s of re-judgements (judge thread only).
        self._hold = VerdictHold(config.fail_hold_s)

    def connect(self, peers: Peers) -> None:
        """Find the component that estimates accuracy (the drift component), if one runs."""
        self._accuracy_source = peers.accuracy()

    # -- ingest thread --------------------------------------------------------------------------------------------

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]], nbytes: int | None = None) -> None:
        """Stage events for the judge's thread. Cheap, bounded, never raises."""
        super().handle(pid, producer_id, records, nbytes)
        # Replicas per version, for the load-imbalance warning: one dict store per frame (its first event's
        # context; a frame's events nearly always share one), bounded.
        try:
            if records:
                rep = self._replicas
                k = (records[0][1], pid, producer_id)
                if k not in rep and len(rep) >= _MAX_REPLICA_KEYS:
                    rep.clear()
                rep[k] = self.ctx.monotonic()
        except Exception:
            self.dropped["error"] += 1

    # -- judge thread ---------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> int:
        """Move the ring to the sub-window of ``now``, emptying the slots it passes; return the ring index."""
        cur = int(now // self.sub_s)
        S = self.cfg.subwindows
        if self._slot is None:
            self._slot = cur
        elif cur > self._slot:
            for k in range(self._slot + 1, self._slot + 1 + min(cur - self._slot, S)):
                for w in self.windows.values():
                    w.clear(k % S)
            self._slot = cur
            for key in [k for k, w in self.windows.items() if w.requests == 0 and not any(
                    c.any() for c in w.classes.values())]:
                del self.windows[key]
        return self._slot % S

    def _window(self, ctx: Any) -> VersionWindow | None:
        cfg = self.cfg
        return bounded_entry(self.windows, self._keys.of(ctx), cfg.max_versions,
                             lambda k: VersionWindow(k, cfg.subwindows, cfg.max_stages, cfg.max_classes))

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Move staged events into the windows (the state lock held)."""
        slot = self._advance(now)
        if not batch:
            return
        slo = self.cfg.slo if self.cfg.slo.enabled else None
        reqs, streams, recs = self._gather(batch, slo)
        for ctx, (outcomes, e2e, stages) in reqs.items():
            w = self._window(ctx)
            if w is None:
                self.dropped["too_many_versions"] += len(outcomes)
                continue
            before = w.dropped_stages
            w.add_requests(slot, outcomes, e2e, stages)
            self.dropped["too_many_stages"] += w.dropped_stages - before
            if slo is not None:
                w.add_good(slot, streams[ctx][2][0] if ctx in streams else 0)
            sv = streams.get(ctx)
            if sv is not None and (sv[0] or sv[1]):
                w.add_streams(slot, sv[0], sv[1])
        for ctx, (confs, preds) in recs.items():
            w = self._window(ctx)
            if w is None:
                self.dropped["too_many_versions"] += len(preds)
                continue
            w.add_records(slot, confs, preds)

    def _gather(self, batch: list[tuple[Any, ...]], slo: Any) -> tuple[
            dict[Any, tuple[list[int], list[float], dict[str, list[float]]]],
            dict[Any, tuple[list[float], list[float], list[int]]], dict[Any, tuple[list[float], list[str]]]]:
        """Per raw ctx: outcomes, e2e seconds, stage seconds by name; streamed stages' TTFTs and gaps (seconds)
        and the requests that met every SLO; confidences and predictions. In C where it was built and no SLO is
        set (the SLO's per-request checks are the Python loop's); the results are the same either way."""
        if slo is None and self.compiled_gather is not None:
            return self._gather_compiled(batch)
        return self._gather_python(batch, slo)

    def _gather_compiled(self, batch: list[tuple[Any, ...]]) -> tuple[
            dict[Any, tuple[list[int], list[float], dict[str, list[float]]]],
            dict[Any, tuple[list[float], list[float], list[int]]], dict[Any, tuple[list[float], list[str]]]]:
        """:meth:`_gather_python` with no SLO, in C (_gatherc.c): each event it does not read goes to the Python
        loop alone, in its turn, so the lists and the limiter's calls come in the same order."""
        reqs: dict[Any, tuple[list[int], list[float], dict[str, list[float]], dict[Any, list[float]]]] = {}
        streams: dict[Any, tuple[list[float], list[float], list[int]]] = {}
        recs: dict[Any, tuple[list[float], list[str]]] = {}
        assert self.compiled_gather is not None
        errors = self.compiled_gather(batch, reqs, streams, recs, self._lim_stage.get, OVERFLOW,
                                      lambda ev: self._gather_into([ev], None, reqs, streams, recs),
                                      EV_REQUEST, N_OUTCOMES)
        if errors:
            self.dropped["error"] += errors
        return {k: v[:3] for k, v in reqs.items()}, streams, recs

    def _gather_python(self, batch: list[tuple[Any, ...]], slo: Any) -> tuple[
            dict[Any, tuple[list[int], list[float], dict[str, list[float]]]],
            dict[Any, tuple[list[float], list[float], list[int]]], dict[Any, tuple[list[float], list[str]]]]:
        """Per raw ctx: outcomes, e2e seconds, stage seconds by name; streamed stages' TTFTs and gaps (seconds)
        and the requests that met every SLO; confidences and predictions."""
        # The fourth member of a ctx's entry is its stage lists by raw name (see below), dropped on return.
        reqs: dict[Any, tuple[list[int], list[float], dict[str, list[float]], dict[Any, list[float]]]] = {}
        streams: dict[Any, tuple[list[float], list[float], list[int]]] = {}
        recs: dict[Any, tuple[list[float], list[str]]] = {}
        self._gather_into(batch, slo, reqs, streams, recs)
        return {k: v[:3] for k, v in reqs.items()}, streams, recs

    def _gather_into(self, batch: list[tuple[Any, ...]], slo: Any, reqs: dict[Any, Any], streams: dict[Any, Any],
                     recs: dict[Any, Any]) -> None:
        """The Python loop of :meth:`_gather_python`, into the caller's dicts (also the compiled pass's fallback)."""
        # The events of a frame share one ctx tuple object, so its lists are looked up again only when the
        # object changes; a stage's list is found by its raw name (``by_name``, per ctx), the label limiter
        # asked once per name, except a name it refuses (each refusal is counted, as before).
        lim = self._lim_stage
        last_req: Any = _NO_CTX
        last_rec: Any = _NO_CTX
        r: Any = None
        c: Any = None
        by_name: dict[Any, list[float]] = {}
        for ev in batch:
            try:
                if ev[0] == EV_REQUEST:
                    # Outcome and latency are checked before either is added: their lists must stay paired.
                    outcome, e2e = ev[4], ev[3] * 1e-9
                    if outcome.__class__ is not int or not 0 <= outcome < N_OUTCOMES or e2e != e2e:
                        raise ValueError("bad request event")
                    ctx = ev[1]
                    if ctx is not last_req:
                        r = reqs.get(ctx)
                        if r is None:
                            r = reqs[ctx] = ([], [], {}, {})
                        last_req, by_name = ctx, r[3]
                    r[0].append(outcome)
                    r[1].append(e2e)
                    good = outcome == OUTCOME_OK
                    for name, dur, stream in ev[8]:
                        vals = by_name.get(name)
                        if vals is None:
                            label = lim.get(name)
                            vals = r[2].setdefault(label, [])
                            if label != OVERFLOW:
                                by_name[name] = vals
                        vals.append(dur * 1e-9)
                        if stream is not None:
                            good = self._stream(streams, ctx, stream, slo, good)
                    if slo is not None:
                        good = good and (slo.latency_s is None or ev[3] * 1e-9 <= slo.latency_s)
                        if good:
                            g = streams.get(ctx)
                            if g is None:
                                g = streams[ctx] = ([], [], [0])
                            g[2][0] += 1
                elif ev[4] is not None or ev[5] is not None:  # a record with a prediction or confidence
                    ctx = ev[1]
                    if ctx is not last_rec:
                        c = recs.get(ctx)
                        if c is None:
                            c = recs[ctx] = ([], [])
                        last_rec = ctx
                    conf = ev[5]
                    if conf is not None and math.isfinite(conf):
                        c[0].append(conf)
                    pred = ev[4]
                    pred = pred if pred.__class__ is str else canon(pred)
                    if pred is not None:
                        c[1].append(pred)
            except Exception:
                self.dropped["error"] += 1

    @staticmethod
    def _stream(streams: dict[Any, tuple[list[float], list[float], list[int]]], ctx: Any, stream: Any, slo: Any,
                good: bool) -> bool:
        """Add a streamed stage's TTFT and gaps to ``streams[ctx]``; whether the request still meets the SLOs."""
        st = streams.get(ctx)
        if st is None:
            st = streams[ctx] = ([], [], [0])
        ttft = stream[0] * 1e-9
        if stream[1]:
            st[0].append(ttft)
        gaps = [g * 1e-6 for g in stream[2]]
        st[1].extend(gaps)
        if slo is not None and good:
            good = ((slo.ttft_s is None or (stream[1] > 0 and ttft <= slo.ttft_s))
                    and (slo.itl_s is None or not gaps or max(gaps) <= slo.itl_s))
        return good

    def _accuracy(self) -> dict[tuple[str, str], float]:
        """The estimated accuracy by (model, version), from the component that estimates it (drift)."""
        src = self._accuracy_source
        if src is None:
            return {}
        try:
            return dict(src.estimated_accuracy())
        except Exception:
            log.exception("canary: cannot read the drift component's accuracy estimates")
            return {}

    def evaluate(self, now: float | None = None) -> list[Judgement]:
        """Judge every canary against its model's stable version and publish the samples."""
        now = self.ctx.clock() if now is None else now
        accuracy = self._accuracy()
        with self._state_lock:
            self._advance(now)
            summaries = {k: w.summary() for k, w in self.windows.items()}
        replicas = self._replica_counts()
        by_model: dict[tuple[str, str], list[Key]] = {}
        for key in sorted(summaries):
            by_model.setdefault(key[:2], []).append(key)
        out = Samples()
        put = out.put
        judgements: list[Judgement] = []
        for (svc, model), keys in by_model.items():
            total = sum(summaries[k].requests for k in keys)
            for k in keys:
                put(CANARY_WINDOW_REQUESTS, k, summaries[k].requests)
                put(CANARY_TRAFFIC_RATIO, k, summaries[k].requests / total if total else None)
            base = self._baseline(model, keys, summaries)
            if base is None:
                continue
            for k in keys:
                if k == base or summaries[k].requests < self.cfg.min_requests:
                    continue
                judgements.append(judge(svc, model, base[2], k[2], summaries[base], summaries[k], self.cfg,
                                        (accuracy.get((model, base[2])), accuracy.get((model, k[2]))),
                                        (replicas.get(base, 0), replicas.get(k, 0))))
        self._hold.apply(judgements, now)
        for j in judgements:
            pair = (j.service, j.model, j.canary_version, j.baseline_version)
            put(CANARY_SCORE, pair, j.score)
            for v in VERDICTS:
                put(CANARY_VERDICT, (*pair, v), float(j.verdict == v))
            for m in j.metrics:
                if m.result == "nodata":
                    continue
                ml = (*pair, m.name, m.stage or "")
                put(CANARY_METRIC_FAILED, ml, float(m.result == "fail"))
                put(CANARY_METRIC_EFFECT, ml, m.effect)
        for reason, n in self.dropped.items():
            put(CANARY_DROPPED_EVENTS_TOTAL, (reason,), n)
        self.last_eval_unix = self.ctx.clock()
        put(CANARY_LAST_EVALUATION_TIMESTAMP_SECONDS, (), self.last_eval_unix)
        with self._lock:
            self._snapshot = out
            self.judgements = judgements
        return judgements

    def _replica_counts(self) -> dict[Key, int]:
        """Producers (SDK processes: replicas) that sent each version's events within the window."""
        lo = self.ctx.monotonic() - self.cfg.window_seconds
        out: dict[Key, int] = {}
        for (ctx, _pid, _prod), t in list(self._replicas.items()):
            if t < lo:
                continue
            try:
                svc, model, ver = ctx
            except (TypeError, ValueError):
                continue
            key = self._keys.of((svc, model, ver))
            out[key] = out.get(key, 0) + 1
        return out

    def _baseline(self, model: str, keys: list[Key], summaries: dict[Key, Any]) -> Key | None:
        """The stable version of a model: the configured one, else the busiest; None without enough requests."""
        ver = baseline(model, {k[2]: summaries[k].requests for k in keys}, self._baselines())
        base = next((k for k in keys if k[2] == ver), None)
        if base is None or summaries[base].requests < self.cfg.min_requests:
            return None
        return base

    def _baselines(self) -> dict[str, str]:
        """``canary.baselines``: the context's (the daemon's config), with this section's own entries over it."""
        return {**self.ctx.baselines, **self.cfg.baselines}

    # -- export -----------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            judgements = list(self.judgements)
            staged = len(self._staging)
        with self._state_lock:
            versions = [{"service": k[0], "model": k[1], "version": k[2], "requests": w.requests,
                         "state_bytes": w.nbytes} for k, w in sorted(self.windows.items())]
        cfg = self.cfg
        return {
            "window_seconds": cfg.window_seconds,
            "evaluate_interval_s": cfg.evaluate_interval_s,
            "min_requests": cfg.min_requests,
            "baselines": dict(cfg.baselines),
            "last_evaluation_unix": self.last_eval_unix,
            "staged": staged,
            "dropped": dict(self.dropped),
            "versions": versions,
            "judgements": [j.to_json() for j in judgements],
        }


def build(config: CanaryConfig, ctx: ComponentContext) -> CanaryComponent:
    """Build the canary component."""
    return CanaryComponent(config, ctx)
