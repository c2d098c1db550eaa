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
  span takes it). The join is incremental: each trace keeps a child index
  (parent span ID -> child span IDs), a request span walks down its own
  subtree (at most 64 levels, stopping at other request spans), and a new
  stage span walks up at most 64 parents; no batch re-walks the spans that
  were already waiting;
- a stage span with no request span above it yet waits in a buffer keyed by
  trace ID, at most ``join_timeout_s`` from the trace's first span. A waiting
  span keeps only what the join needs (name, IDs, times, the GenAI operation
  name and Triton's four compute events), and the buffer is bounded three
  ways: ``max_pending_spans`` stage spans and ``max_pending_bytes`` estimated
  bytes in all (the oldest traces are evicted), and ``max_spans_per_trace``
  spans remembered per trace (further stage spans of that trace are counted
  ``trace_full``, further links are not remembered);
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
from inferwatch_sidecar.ingest.otlp_traces.decode import MAX_STRING, Resource, Span
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
    (DROPPED, "trace_full"),
)
#: Deepest parent chain walked from a stage span to its request span.
_MAX_DEPTH = 64
#: Distinct (service, model, version) tuples interned; past it the cache starts over.
_CTX_LIMIT = 4096
#: Estimated bytes of one span remembered as a link (two 8-byte IDs as bytes objects, a dict slot, a list slot).
LINK_BYTES = 200
#: Estimated bytes of one waiting stage span besides its strings (the slim Span, its attrs dict and event list).
PENDING_BYTES = 500
#: Estimated bytes of one (name, time, attrs) event kept on a waiting span.
EVENT_BYTES = 150
#: The span events a waiting stage span keeps: those Triton's preset turns into stages.
_JOIN_EVENTS = frozenset(("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"))
#: The attribute a waiting stage span keeps: the generic preset's stage name.
_JOIN_ATTR = "gen_ai.operation.name"
_NO_RES = Resource({}, "")


def slim(span: Span) -> tuple[Span, int]:
    """What the join keeps of a waiting stage span, and its estimated bytes.

    A stage span gives its request a name, a duration and (Triton's compute span)
    four event times; its other attributes and events are never read again, so a
    span with a megabyte of attributes waits as a few hundred bytes.
    """
    op = span.attrs.get(_JOIN_ATTR)
    attrs = {_JOIN_ATTR: op} if isinstance(op, str) else {}
    events: list[tuple[str, int, dict[str, Any]]] = []
    seen = set()
    for n, t, _ in span.events:
        if n in _JOIN_EVENTS and n not in seen:
            seen.add(n)
            events.append((n, t, {}))
            if len(seen) == len(_JOIN_EVENTS):
                break
    nbytes = PENDING_BYTES + len(span.name) + (len(op) if isinstance(op, str) else 0) + EVENT_BYTES * len(events)
    return Span(span.trace, span.sid, span.parent, span.name, span.kind, span.start, span.end, attrs, events,
                span.status, _NO_RES), nbytes


class TraceEntry:
    """What the join remembers about one trace while it may still get spans."""

    __slots__ = ("deadline", "parents", "kids", "pending", "done", "nbytes")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        #: span ID -> parent span ID, for the spans of the trace seen so far (at most max_spans_per_trace).
        self.parents: dict[bytes, bytes] = {}
        #: parent span ID -> IDs of its children seen so far: the index a request span walks down.
        self.kids: dict[bytes, list[bytes]] = {}
        #: span ID -> (arrival number, slim span, bytes) of the stage spans still waiting for a request span.
        self.pending: dict[bytes, tuple[int, Span, int]] = {}
        #: IDs of the request spans already mapped.
        self.done: set[bytes] = set()
        #: estimated bytes this entry holds (links, waiting spans, mapped IDs).
        self.nbytes = 0


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
        max_pending_bytes: most estimated bytes the join buffer holds, over all traces.
        max_spans_per_trace: spans remembered per trace (links and waiting stage spans).
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
        max_pending_bytes: int = 32 << 20,
        max_spans_per_trace: int = 2048,
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
        self.max_pending_bytes = max_pending_bytes
        self.max_spans_per_trace = max_spans_per_trace
        #: estimated bytes held by every trace entry together.
        self.nbytes = 0
        self._seq = 0
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
        roles: list[tuple[Span, Preset, int]] = []
        batch: dict[bytes, set[bytes]] = {}  # trace -> IDs of this batch's request spans
        for span in spans:
            preset = self._preset(span)
            role = preset.role(span)
            if role != REQUEST and span.name in self.user_stages:
                role = STAGE
            roles.append((span, preset, role))
            if role == REQUEST:
                batch.setdefault(span.trace, set()).add(span.sid)
        touched: dict[bytes, list[tuple[Span, Preset]]] = {}
        cap = self.max_spans_per_trace
        for span, preset, role in roles:
            entry = self.traces.get(span.trace)
            if entry is None:
                entry = self.traces[span.trace] = TraceEntry(now + self.join_timeout_s)
            if role == REQUEST and span.sid in entry.done:
                self.count(DROPPED, "duplicate")
                continue
            linked = self._link(entry, span, cap)
            if role == REQUEST:
                touched.setdefault(span.trace, []).append((span, preset))
            elif role == STAGE:
                if not linked or len(entry.pending) >= cap:
                    self.count(DROPPED, "trace_full")
                elif span.sid in entry.pending:
                    self.count(DROPPED, "duplicate")
                elif self._above_is_done(entry, span.parent, batch.get(span.trace, ())):
                    self.count(DROPPED, "late")
                else:
                    kept, nbytes = slim(span)
                    self._seq += 1
                    entry.pending[span.sid] = (self._seq, kept, nbytes)
                    entry.nbytes += nbytes
                    self.nbytes += nbytes
                    self.pending += 1
            else:
                self.count(ACCEPTED, "unused")
        out: list[tuple[Any, ...]] = []
        for trace, requests in touched.items():
            entry = self.traces[trace]
            self._join(entry, requests, out)
        self._bound()
        return out

    def _link(self, entry: TraceEntry, span: Span, cap: int) -> bool:
        """Remember ``span`` in its trace's parent and child indexes; False when the trace is full."""
        sid = span.sid
        if sid in entry.parents:
            old = entry.parents[sid]
            if old == span.parent:
                return True
            sibs = entry.kids.get(old)
            if sibs is not None and sid in sibs:
                sibs.remove(sid)
        elif len(entry.parents) >= cap:
            return False
        else:
            entry.nbytes += LINK_BYTES
            self.nbytes += LINK_BYTES
        entry.parents[sid] = span.parent
        if span.parent:
            entry.kids.setdefault(span.parent, []).append(sid)
        return True

    def _preset(self, span: Span) -> Preset:
        for p in self.presets:
            if p.claims(span):
                return p
        return self.presets[-1]

    @staticmethod
    def _above_is_done(entry: TraceEntry, p: bytes, batch: Any) -> bool:
        """True when the nearest request span above parent ``p`` was mapped in an earlier batch."""
        parents = entry.parents
        done = entry.done
        for _ in range(_MAX_DEPTH):
            if not p or p in batch:
                return False
            if p in done:
                return True
            nxt = parents.get(p)
            if nxt is None:
                return False
            p = nxt
        return False

    def _collect(self, entry: TraceEntry, root: bytes, batch: set[bytes]) -> list[Span]:
        """The waiting stage spans whose nearest request span above is ``root``, in arrival order.

        Walks down the child index from ``root``, at most ``_MAX_DEPTH`` levels and
        each span once, not into other request spans (mapped or in this batch).
        """
        kids = entry.kids
        pending = entry.pending
        done = entry.done
        found: list[tuple[int, Span, int]] = []
        seen = {root}
        level = [root]
        for _ in range(_MAX_DEPTH):
            nxt: list[bytes] = []
            for p in level:
                for c in kids.get(p, ()):
                    if c in seen or c in done or c in batch:
                        continue
                    seen.add(c)
                    w = pending.pop(c, None)
                    if w is not None:
                        found.append(w)
                    nxt.append(c)
            if not nxt:
                break
            level = nxt
        if found:
            freed = sum(w[2] for w in found)
            entry.nbytes -= freed
            self.nbytes -= freed
            self.pending -= len(found)
            found.sort(key=lambda w: w[0])
        return [w[1] for w in found]

    def _join(self, entry: TraceEntry, requests: list[tuple[Span, Preset]], out: list[tuple[Any, ...]]) -> None:
        batch = {s.sid for s, _ in requests}
        for span, preset in requests:
            kids = self._collect(entry, span.sid, batch)
            self.count(ACCEPTED, "stage", len(kids))
            self._emit(span, preset, kids, out)
            if span.sid not in entry.done:
                entry.done.add(span.sid)
                entry.nbytes += LINK_BYTES
                self.nbytes += LINK_BYTES
            self.count(ACCEPTED, "request")

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
            self.nbytes -= entry.nbytes

    def _bound(self) -> None:
        traces = self.traces
        while traces and (self.pending > self.max_pending_spans or len(traces) > 4 * self.max_pending_spans
                          or self.nbytes > self.max_pending_bytes):
            _, entry = traces.popitem(last=False)
            self._drop(entry, "evicted")
            self.nbytes -= entry.nbytes

    def _drop(self, entry: TraceEntry, reason: str) -> None:
        if entry.pending:
            self.count(DROPPED, reason, len(entry.pending))
            self.pending -= len(entry.pending)
            entry.pending = {}

    def flush(self) -> None:
        """Give up on every waiting stage span (shutdown): each is counted ``orphan``."""
        while self.traces:
            _, entry = self.traces.popitem(last=False)
            self._drop(entry, "orphan")
            self.nbytes -= entry.nbytes
