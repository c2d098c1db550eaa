"""Spans into the event tuples the SDK sends, joined across export batches by trace ID.

Every decoded span gets a role from the preset that claims it (see
:mod:`.presets`). A request span becomes one ``EV_REQUEST`` (end time,
duration, outcome, the trace ID as request ID and exemplar, the stages) and,
when configured attributes are present, one ``EV_RECORD`` with them as
features, both under ``(service, model, model_version)``: the same tuples
``POST /v1/events`` produces, so aggregation, exemplars, drift and every
dashboard work unchanged. Label values are capped later by the aggregator's
limiters, like every other source.

Joining. The stages of a request come from spans below it in its trace
(Triton's ``compute`` span, user-mapped spans). SDKs export a span when it
ends, and a child ends before its parent, so stage spans arrive before or
with their request span, possibly in an earlier export batch. So:

- a request span is mapped at the end of the batch that brings it, with the
  stage spans already seen below it (the nearest request span above a stage
  span takes it; the walk goes through every span of the trace seen so far);
- a stage span with no request span above it yet waits in a buffer keyed by
  trace ID, at most ``join_timeout_s`` from the trace's first span and at
  most ``max_pending_spans`` spans in all;
- a stage span that arrives after its request was mapped is counted
  ``late``; one whose request never comes is counted ``orphan`` when its
  trace times out, or ``evicted`` when the buffer is full; a request span
  seen again (an exporter's retry) is counted ``duplicate``.

Every span ends in exactly one ``(result, reason)`` count of
``inferwatch_otlp_spans_total``, or is still pending.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from inferwatch._asgi import DEFAULT_EXCLUDED_PATHS, MAX_RESEND
from inferwatch.wire import EV_HTTP, EV_RECORD, EV_REQUEST, KIND_NUMERIC, MAX_FEATURES, classify
from inferwatch_sidecar.ingest.http_json import SchemaCache
from inferwatch_sidecar.ingest.otlp_traces.decode import MAX_STRING, Span
from inferwatch_sidecar.ingest.otlp_traces.presets import PRESETS, REQUEST, STAGE, Preset

ACCEPTED = "accepted"
REJECTED = "rejected"
DROPPED = "dropped"
#: Every (result, reason) a span can end in; all are exported from the start.
OUTCOMES: tuple[tuple[str, str], ...] = (
    (ACCEPTED, "request"), (ACCEPTED, "stage"), (ACCEPTED, "unused"),
    (REJECTED, "bad_trace_id"), (REJECTED, "bad_span_id"), (REJECTED, "bad_time"), (REJECTED, "bad_span"),
    (REJECTED, "bad_attribute"), (REJECTED, "too_many_spans"),
    (DROPPED, "late"), (DROPPED, "orphan"), (DROPPED, "evicted"), (DROPPED, "duplicate"),
)
#: Deepest parent chain walked from a stage span to its request span.
_MAX_DEPTH = 64
#: Span IDs remembered per trace for the parent walk; a trace with more still maps, its extra spans unlinked.
_MAX_TRACE_SPANS = 10000
#: Distinct (service, model, version) tuples interned; past it the cache starts over.
_CTX_LIMIT = 4096


class TraceEntry:
    """What the join remembers about one trace while it may still get spans."""

    __slots__ = ("deadline", "parents", "pending", "done")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        #: span ID -> parent span ID, for every span of the trace seen so far.
        self.parents: dict[bytes, bytes] = {}
        #: stage spans still waiting for a request span above them.
        self.pending: list[Span] = []
        #: IDs of the request spans already mapped.
        self.done: set[bytes] = set()


class Mapper:
    """Turns decoded spans into event tuples. Not thread-safe: the receiver holds a lock around it.

    Args:
        presets: preset names in the order spans are offered to them.
        stages: user span name -> stage name, for spans under any request span.
        features: span attributes recorded as drift features; None for each preset's defaults.
        model_attribute: span or resource attribute that names the model, over the preset's choice.
        version_attribute: likewise for the model version.
        service_attribute: span or resource attribute for the service label.
        join_timeout_s: how long a trace's stage spans wait for their request span.
        max_pending_spans: most stage spans waiting at once, over all traces.
        clock: monotonic seconds.
        exclude_routes: ``http.route`` (or ``url.path``) values of request spans left out of the request
            metrics (probes, docs): they give only an HTTP event, like the SDK's middleware.
    """

    def __init__(
        self,
        presets: Iterable[str] = ("triton", "vllm", "generic"),
        stages: dict[str, str] | None = None,
        features: list[str] | None = None,
        model_attribute: str | None = None,
        version_attribute: str | None = None,
        service_attribute: str = "service.name",
        join_timeout_s: float = 5.0,
        max_pending_spans: int = 20000,
        clock: Callable[[], float] = time.monotonic,
        exclude_routes: Iterable[str] = DEFAULT_EXCLUDED_PATHS,
    ) -> None:
        self.exclude_routes = frozenset(exclude_routes)
        self.presets: list[Preset] = [PRESETS[p] for p in presets]
        self.user_stages = dict(stages or {})
        self.features = None if features is None else tuple(features)
        self.model_attribute = model_attribute
        self.version_attribute = version_attribute
        self.service_attribute = service_attribute
        self.join_timeout_s = join_timeout_s
        self.max_pending_spans = max_pending_spans
        self.clock = clock
        self.traces: OrderedDict[bytes, TraceEntry] = OrderedDict()
        self.pending = 0
        self.counts: dict[tuple[str, str], int] = dict.fromkeys(OUTCOMES, 0)
        self.schemas = SchemaCache()
        self._ctx: dict[tuple[str | None, str | None, str | None], tuple[str | None, str | None, str | None]] = {}

    def count(self, result: str, reason: str, n: int = 1) -> None:
        k = (result, reason)
        self.counts[k] = self.counts.get(k, 0) + n

    # -- per batch -------------------------------------------------------------

    def map(self, spans: list[Span]) -> list[tuple[Any, ...]]:
        """Map one export batch; returns the event tuples for the pipeline."""
        now = self.clock()
        self.expire(now)
        touched: dict[bytes, list[tuple[Span, Preset]]] = {}
        for span in spans:
            preset = self._preset(span)
            role = preset.role(span)
            if role != REQUEST and span.name in self.user_stages:
                role = STAGE
            entry = self.traces.get(span.trace)
            if entry is None:
                entry = self.traces[span.trace] = TraceEntry(now + self.join_timeout_s)
            if len(entry.parents) < _MAX_TRACE_SPANS:
                entry.parents[span.sid] = span.parent
            if role == REQUEST:
                if span.sid in entry.done:
                    self.count(DROPPED, "duplicate")
                    continue
                touched.setdefault(span.trace, []).append((span, preset))
            elif role == STAGE:
                entry.pending.append(span)
                self.pending += 1
                touched.setdefault(span.trace, [])
            else:
                self.count(ACCEPTED, "unused")
        out: list[tuple[Any, ...]] = []
        for trace, requests in touched.items():
            entry = self.traces[trace]
            self._join(entry, requests, out)
        self._bound()
        return out

    def _preset(self, span: Span) -> Preset:
        for p in self.presets:
            if p.claims(span):
                return p
        return self.presets[-1]

    def _join(self, entry: TraceEntry, requests: list[tuple[Span, Preset]], out: list[tuple[Any, ...]]) -> None:
        ids = {s.sid: i for i, (s, _) in enumerate(requests)}
        children: list[list[Span]] = [[] for _ in requests]
        keep = []
        for st in entry.pending:
            where = self._owner(entry, st, ids)
            if where is None:
                keep.append(st)
            elif where < 0:
                self.count(DROPPED, "late")
            else:
                children[where].append(st)
                self.count(ACCEPTED, "stage")
        self.pending -= len(entry.pending) - len(keep)
        entry.pending = keep
        for (span, preset), kids in zip(requests, children, strict=True):
            self._emit(span, preset, kids, out)
            entry.done.add(span.sid)
            self.count(ACCEPTED, "request")

    def _owner(self, entry: TraceEntry, st: Span, ids: dict[bytes, int]) -> int | None:
        """Index of the nearest request span above ``st`` in this batch, -1 if it was mapped earlier, else None."""
        p = st.parent
        parents = entry.parents
        for _ in range(_MAX_DEPTH):
            if not p:
                return None
            i = ids.get(p)
            if i is not None:
                return i
            if p in entry.done:
                return -1
            nxt = parents.get(p)
            if nxt is None:
                return None
            p = nxt
        return None

    # -- events ----------------------------------------------------------------

    def _ctx_of(self, span: Span, preset: Preset) -> tuple[str | None, str | None, str | None]:
        model, version = preset.model(span)
        if self.model_attribute is not None:
            v = span.attr(self.model_attribute)
            if v is not None and not isinstance(v, tuple):
                model = str(v)
        if self.version_attribute is not None:
            v = span.attr(self.version_attribute)
            if v is not None and not isinstance(v, tuple):
                version = str(v)
        svc = span.attr(self.service_attribute)
        key = (None if svc is None or isinstance(svc, tuple) else str(svc)[:MAX_STRING],
               None if model is None else model[:MAX_STRING], None if version is None else version[:MAX_STRING])
        # One tuple object per label set: the aggregator skips its lookup while the ctx object repeats.
        ctx = self._ctx.get(key)
        if ctx is None:
            if len(self._ctx) >= _CTX_LIMIT:
                self._ctx.clear()
            ctx = self._ctx[key] = key
        return ctx

    def _emit(self, span: Span, preset: Preset, kids: list[Span], out: list[tuple[Any, ...]]) -> None:
        ctx = self._ctx_of(span, preset)
        outcome, err = preset.outcome(span)
        stages = preset.stages(span, [k for k in kids if k.name not in self.user_stages])
        user = self.user_stages
        stages += [(user[k.name], k.end - k.start, None) for k in kids if k.name in user]
        rid = span.trace.hex()
        excluded = self._http(span, ctx, outcome, out)
        if excluded:
            return
        out.append((EV_REQUEST, ctx, span.end, max(0, preset.duration(span)), outcome, err, rid, span.trace,
                    stages[:255]))
        feats = self._features(span, preset)
        if feats is not None:
            out.append((EV_RECORD, ctx, span.end, rid, None, None, None, feats))

    def _http(self, span: Span, ctx: Any, outcome: int, out: list[tuple[Any, ...]]) -> bool:
        """The HTTP event of a request span with an HTTP status code; True when its route is excluded.

        The route is ``http.route`` (a template by the semantic conventions; ``url.path`` only decides
        exclusion), the resend count ``http.request.resend_count``, the client's request ID a captured
        ``http.request.header.x-request-id``. A span cannot tell how long a client waited: 0.
        """
        a = span.attrs
        code = a.get("http.response.status_code", a.get("http.status_code"))
        if not isinstance(code, int) or isinstance(code, bool) or not 0 < code < 1000:
            return False
        route = a.get("http.route")
        route = route[:MAX_STRING] if isinstance(route, str) and route else None
        path = a.get("url.path", a.get("http.target"))
        excluded = (route or (path if isinstance(path, str) else None)) in self.exclude_routes
        if excluded and route is None:
            route = path
        resend = a.get("http.request.resend_count")
        resend = resend if isinstance(resend, int) and not isinstance(resend, bool) and 0 < resend <= MAX_RESEND else 0
        xrid = a.get("http.request.header.x-request-id")
        if isinstance(xrid, tuple):
            xrid = xrid[0] if xrid else None
        xrid = xrid[:128] if isinstance(xrid, str) and xrid else None
        out.append((EV_HTTP, ctx, span.end, route, code, outcome, resend, 0, excluded, xrid))
        return excluded

    def _features(self, span: Span, preset: Preset) -> Any:
        names = preset.default_features if self.features is None else self.features
        if not names:
            return None
        key: list[tuple[str, int]] = []
        nums: list[float] = []
        cats: list[str | None] = []
        for name in names[:MAX_FEATURES]:
            v = span.attr(name)
            if v is None:
                continue
            if isinstance(v, tuple):
                v = ",".join(str(x) for x in v)[:MAX_STRING]
            c = classify(v)
            if c is None:
                continue
            kind, val = c
            key.append((name, kind))
            if kind == KIND_NUMERIC:
                nums.append(val)
            else:
                cats.append(val[:MAX_STRING])
        if not key:
            return None
        return (self.schemas.get(tuple(key)), tuple(nums), tuple(cats))

    # -- bounds ----------------------------------------------------------------

    def expire(self, now: float | None = None) -> None:
        """Forget traces past their deadline; their waiting stage spans are counted ``orphan``."""
        now = self.clock() if now is None else now
        traces = self.traces
        while traces:
            trace, entry = next(iter(traces.items()))
            if entry.deadline > now:
                break
            del traces[trace]
            self._drop(entry, "orphan")

    def _bound(self) -> None:
        traces = self.traces
        while traces and (self.pending > self.max_pending_spans or len(traces) > 4 * self.max_pending_spans):
            _, entry = traces.popitem(last=False)
            self._drop(entry, "evicted")

    def _drop(self, entry: TraceEntry, reason: str) -> None:
        if entry.pending:
            self.count(DROPPED, reason, len(entry.pending))
            self.pending -= len(entry.pending)
            entry.pending = []

    def flush(self) -> None:
        """Give up on every waiting stage span (shutdown): each is counted ``orphan``."""
        while self.traces:
            _, entry = self.traces.popitem(last=False)
            self._drop(entry, "orphan")
