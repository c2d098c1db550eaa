"""The ingest pipeline: frames in, accounted for, aggregated, dispatched.

Every datagram is accounted for exactly once:

    frames received = frames decoded + frame decode errors (by reason)

and within a decoded frame every record is either aggregated (counted in
``events``) or counted as a record decode error by reason. Producers are
tracked by producer ID in a bounded table; gaps in a producer's frame
sequence numbers are counted as lost frames.

Counts a producer reports (DROPS records, sequence gaps) come from any local
writer, so they are bounded by what one producer can do between two of its
frames: ``max_event_rate`` events (``max_frame_rate`` frames) per second times
the seconds since its previous frame (at least 1 s; ``MAX_INTERVAL_S`` for a
producer's first frame). A count past that is not added and is counted in
``inferwatch_ingest_implausible_total{field}``. A producer's sequence gaps count as lost
only once it has said HELLO (the SDK does in its first frame): a producer ID that a mutated
datagram made up never says it, so any number of forged IDs adds no lost frames.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch.wire import (
    EV_ALLOC,
    EV_ALLOC_SITE,
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_HTTP,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    Decoder,
    WireError,
)
from inferwatch_sidecar.aggregate.aggregator import Aggregator, HistogramSet, histogram_family
from inferwatch_sidecar.components.staging import EVENT_BYTES, feature_bytes
from inferwatch_sidecar.ingest import fastwire
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import (
    COMPONENT_ERRORS_TOTAL,
    INGEST_BYTES_TOTAL,
    INGEST_DECODE_ERRORS_TOTAL,
    INGEST_DROPPED_TOTAL,
    INGEST_EVENTS_TOTAL,
    INGEST_FRAMES_TOTAL,
    INGEST_IMPLAUSIBLE_TOTAL,
    INGEST_LAG_SECONDS,
    INGEST_LOST_FRAMES_TOTAL,
    INGEST_SCHEMA_CACHE_BYTES,
    INGEST_SCHEMAS_EVICTED_TOTAL,
    INGEST_SOCKET_QUEUE_DROPPED_TOTAL,
    INGEST_TRUNCATED_STRINGS_TOTAL,
    LABEL_OVERFLOW_TOTAL,
    PRODUCERS,
)
from inferwatch_sidecar.metrics.entry import Metric

log = logging.getLogger("inferwatch.sidecar.ingest")

#: Event type names by wire code, for ``inferwatch_ingest_events_total{type}``.
EVENT_TYPES = {
    EV_HELLO: "hello",
    EV_REQUEST: "request",
    EV_STAGE: "stage",
    EV_RECORD: "record",
    EV_BATCH: "batch",
    EV_QUEUE: "queue",
    EV_DROPS: "drops",
    EV_ALLOC: "alloc",
    EV_HTTP: "http",
    EV_ALLOC_SITE: "alloc_site",
}
TRANSPORTS = ("unix", "udp", "http")
#: Every catalog entry :meth:`Pipeline.collect` exports, in the order it yields them.
METRICS: tuple[Metric, ...] = (
    INGEST_FRAMES_TOTAL, INGEST_BYTES_TOTAL, INGEST_EVENTS_TOTAL, INGEST_DECODE_ERRORS_TOTAL, INGEST_DROPPED_TOTAL,
    INGEST_LOST_FRAMES_TOTAL, INGEST_SOCKET_QUEUE_DROPPED_TOTAL, PRODUCERS, INGEST_LAG_SECONDS, LABEL_OVERFLOW_TOTAL,
    COMPONENT_ERRORS_TOTAL, INGEST_IMPLAUSIBLE_TOTAL, INGEST_SCHEMA_CACHE_BYTES, INGEST_SCHEMAS_EVICTED_TOTAL,
    INGEST_TRUNCATED_STRINGS_TOTAL,
)
#: Fields of ``inferwatch_ingest_implausible_total``.
IMPLAUSIBLE_FIELDS = ("sdk_drops", "lost_frames")
#: The longest interval a producer's counts are bounded by: the SDK's longest hello interval
#: (``INFERWATCH_HELLO_INTERVAL_S`` is at most 3600), used for its first frame.
MAX_INTERVAL_S = 3600.0
_RECORD_ONLY = frozenset({EV_RECORD})
_SEQ_MOD = 1 << 32


class Producer:
    """One SDK process (one producer ID), as seen by the sidecar."""

    __slots__ = (
        "pid", "producer_id", "transport", "first_seen", "last_seen", "last_seq",
        "frames", "lost_frames", "pending_lost", "lost_budget", "hello", "drops", "interval", "max_events",
        "implausible",
    )

    def __init__(
        self, pid: int, producer_id: int, transport: str, now: float, seq: int,
        max_events: float = 1e7, implausible: dict[str, int] | None = None,
    ) -> None:
        self.pid = pid
        self.producer_id = producer_id
        self.transport = transport
        self.first_seen = now
        self.last_seen = now
        self.last_seq = seq
        self.frames = 0
        self.lost_frames = 0
        #: Sequence gaps seen before the producer's first HELLO: counted as lost once it says HELLO (the SDK
        #: sends one in its first frame, after a failed send and every hello interval). A producer ID that a
        #: mutated datagram made up never does, so forged IDs cannot add up lost frames.
        self.pending_lost = 0
        #: Frames this producer may still be counted as having lost: a token bucket filled at
        #: ``max_frame_rate`` per second of real time (a gap beyond it is a forged sequence number).
        self.lost_budget = 0.0
        self.hello: dict[str, Any] | None = None
        #: Drops reported so far, by reason (the sum of its DROPS records' counts).
        self.drops: dict[str, int] = {}
        #: Seconds since the producer's previous frame (bounded), set per frame.
        self.interval = MAX_INTERVAL_S
        #: Most events one producer can drop per second (see the module docstring).
        self.max_events = max_events
        #: The pipeline's implausible-count counters, by field (shared by all producers).
        self.implausible = implausible if implausible is not None else dict.fromkeys(IMPLAUSIBLE_FIELDS, 0)

    def plausible_drops(self, counts: dict[str, int]) -> dict[str, int]:
        """A DROPS record's counts, or none when they exceed what the producer could drop since its last frame."""
        if sum(counts.values()) > self.max_events * self.interval:
            self.implausible["sdk_drops"] += 1
            return {}
        for reason, n in counts.items():
            self.drops[reason] = self.drops.get(reason, 0) + n
        return counts

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "producer_id": f"{self.producer_id:016x}",
            "transport": self.transport,
            "first_seen_unix": round(self.first_seen, 3),
            "last_seen_age_s": round(now - self.last_seen, 3),
            "frames": self.frames,
            "lost_frames": self.lost_frames,
            "hello": self.hello,
            "sdk_drops": dict(self.drops),
        }


class Pipeline:
    """Decodes and accounts frames, feeds the aggregator and the components.

    Args:
        aggregator: where events go; its lock guards this object's state too.
        dispatch: ``(name, record_types, handle)`` per component that wants records.
        max_producers: bound of the producers table (least recently seen evicted).
        max_schemas: bound of the decoder's schema cache, by count.
        max_schema_bytes: bound of the decoder's schema cache, by estimated bytes.
        max_string_chars: longest string kept from a frame's string table (None: whole, up to 255 bytes).
        max_event_rate: most events per second one producer can report as dropped.
        max_frame_rate: most frames per second one producer can send (bounds its sequence gaps).
        clock: wall-clock seconds.
    """

    def __init__(
        self,
        aggregator: Aggregator,
        dispatch: list[tuple[str, frozenset[int], Callable[..., None]]] | None = None,
        max_producers: int = 1024,
        max_schemas: int = 4096,
        max_schema_bytes: int = 64 << 20,
        max_event_rate: float = 1e7,
        max_frame_rate: float = 1e5,
        clock: Callable[[], float] = time.time,
        max_string_chars: int | None = None,
    ) -> None:
        self.agg = aggregator
        self.lock = aggregator.lock
        self.dispatch = dispatch or []
        #: The names in ``dispatch`` whose handle takes the records' byte estimate (see :meth:`subscribe`).
        self.sized: frozenset[str] = frozenset()
        loop, self.wire_decoder = fastwire.choose()
        self.decoder = Decoder(max_schemas=max_schemas, max_schema_bytes=max_schema_bytes,
                               max_string_chars=max_string_chars, loop=loop)
        self.max_schema_bytes = max_schema_bytes
        self.max_event_rate = max_event_rate
        self.max_frame_rate = max_frame_rate
        self.implausible = dict.fromkeys(IMPLAUSIBLE_FIELDS, 0)
        self.max_producers = max_producers
        self.clock = clock
        self.producers: OrderedDict[int, Producer] = OrderedDict()
        self.frames = dict.fromkeys(TRANSPORTS, 0)
        self.bytes = dict.fromkeys(TRANSPORTS, 0)
        self.frames_decoded = 0
        self.counts = {t: [0] * 16 for t in TRANSPORTS}
        self.decode_errors: dict[tuple[str, str], int] = {}
        self.dropped: dict[str, int] = {}
        self.lost_frames = 0
        self.component_errors: dict[tuple[str, str], int] = {}
        self._err_lock = threading.Lock()
        self.lag = HistogramSet(INGEST_LAG_SECONDS)
        self._lag_h = self.lag.get(())
        #: Extra zero-arg callables returning {reason: count} merged into dropped (e.g. kernel UDP drops).
        self.socket_drop_sources: list[Callable[[], int]] = []

    # -- ingest ----------------------------------------------------------------

    def datagram(self, buf: bytes, transport: str) -> None:
        """Account, decode and aggregate one frame. Never raises."""
        now = self.clock()
        with self.lock:
            self.frames[transport] += 1
            self.bytes[transport] += len(buf)
            try:
                frame = self.decoder.decode(buf)
            except WireError as e:
                self._count_error("frame", e.reason)
                return
            except Exception:  # a decoder bug must never take ingest down
                self._count_error("frame", "internal_error")
                log.exception("decoder failed on a %d-byte frame", len(buf))
                return
            self.frames_decoded += 1
            for r in frame.errors:
                self._count_error("record", r)
            p = self._producer(frame.pid, frame.producer_id, frame.seq, transport, now)
            lag = now - frame.sent_unix_ns * 1e-9
            h = self._lag_h
            h.counts[self._lag_index(lag if lag > 0 else 0.0)] += 1
            h.sum += lag if lag > 0 else 0.0
            records = frame.records
            if not records:
                return
            self._process(records, transport, p, frame.pid, frame.producer_id)
            if p.pending_lost and p.hello is not None:  # the HELLO came in this frame
                self._commit_lost(p)

    def _commit_lost(self, p: Producer) -> None:
        p.lost_frames += p.pending_lost
        self.lost_frames += p.pending_lost
        p.pending_lost = 0

    def _lag_index(self, v: float) -> int:
        return bisect_left(self.lag.bounds, v)

    def events(self, records: list[tuple[Any, ...]], transport: str = "http") -> None:
        """Aggregate already-decoded event tuples (the JSON endpoints). Never raises."""
        with self.lock:
            self.frames[transport] += 1
            self.frames_decoded += 1
            if records:
                self._process(records, transport, None, 0, 0)

    def add_bytes(self, transport: str, n: int) -> None:
        with self.lock:
            self.bytes[transport] += n

    def _process(self, records: list[tuple[Any, ...]], transport: str, p: Producer | None, pid: int, pid64: int) -> None:
        counts = self.counts[transport]
        dispatch = self.dispatch
        if not dispatch:
            try:
                self.agg.process(records, counts, p)
            except Exception:  # a record the decoder let through but the aggregator cannot use
                self._count_error("record", "internal_error")
                log.exception("aggregation failed")
            return
        # Component handoff without a filtering pass per component where we can help it:
        # the aggregator collects RECORD events as it goes (the drift engine's diet), and
        # its per-type counters say which other types this frame held at all (an ALLOC
        # for the GPU monitor is rare, so most frames skip that component's pass).
        before = counts[:]
        sink: list[tuple[Any, ...]] | None = [] if any(t == _RECORD_ONLY for _, t, _ in dispatch) else None
        ok = True
        try:
            self.agg.process(records, counts, p, sink)
        except Exception:  # a record the decoder let through but the aggregator cannot use
            ok = False
            self._count_error("record", "internal_error")
            log.exception("aggregation failed")
        n_rec, n_types = len(records), len(counts)
        sized = self.sized
        # The features' bytes of the frame's RECORD events, summed once (None: not yet) for every component
        # that stages all of them; a component that takes no RECORD stages EVENT_BYTES an event.
        fbytes: int | None = None
        for name, types, handle in dispatch:
            nb: int | None = None
            if not ok:
                sub = [r for r in records if r[0] in types]
            elif sink is not None and types == _RECORD_ONLY:
                if name in sized:
                    if fbytes is None:
                        fbytes = feature_bytes(sink)
                    nb = EVENT_BYTES * len(sink) + fbytes
                sub, sink = sink, list(sink)  # each component gets its own list
            else:
                # How many of this frame's events the component takes, from the per-type counters:
                # none (skip it), all of them (a copy of the list, made in C: tail and canary take
                # REQUEST and RECORD, which is what a frame nearly always holds), or some (filter).
                wanted = 0
                for t in types:
                    if 0 <= t < n_types:
                        wanted += counts[t] - before[t]
                if not wanted:
                    continue
                if wanted == n_rec:
                    sub = records[:]
                    if name in sized:
                        if fbytes is None:
                            fbytes = feature_bytes(sink if sink is not None else records)
                        nb = EVENT_BYTES * n_rec + fbytes
                else:
                    sub = [r for r in records if r[0] in types]
                    if EV_RECORD not in types and name in sized:
                        nb = EVENT_BYTES * len(sub)
            if sub:
                try:
                    if nb is None:
                        handle(pid, pid64, sub)
                    else:
                        handle(pid, pid64, sub, nb)
                except Exception:
                    self.count_component_error(name, "handle")

    def _count_error(self, scope: str, reason: str) -> None:
        k = (scope, reason)
        self.decode_errors[k] = self.decode_errors.get(k, 0) + 1

    def count_error(self, scope: str, reason: str, n: int = 1) -> None:
        with self.lock:
            k = (scope, reason)
            self.decode_errors[k] = self.decode_errors.get(k, 0) + n

    def count_drop(self, reason: str, n: int = 1) -> None:
        with self.lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    #: Component methods whose exceptions are counted, one series each from the start.
    COMPONENT_METHODS = ("handle", "collect", "status", "admin", "admin_routes")

    def register_component(self, name: str) -> None:
        """Create the component's error series at zero, so rates and panels work before the first error."""
        with self._err_lock:
            for method in self.COMPONENT_METHODS:
                self.component_errors.setdefault((name, method), 0)

    def subscribe(self, name: str, record_types: frozenset[int], handle: Callable[..., None], *,
                  sized: bool = False) -> None:
        """Send component ``name`` the decoded records of ``record_types`` (``handle`` runs on the ingest thread:
        it must not block; what it raises is counted). Registers its error series at zero too.

        ``sized``: ``handle`` takes a fourth argument, the records' byte estimate
        (:func:`~inferwatch_sidecar.components.staging.record_bytes` summed, or None), which the pipeline
        sums once per frame for every component instead of each stage summing it again.

        The list is replaced, not changed in place, so a frame being dispatched keeps the list it started with.
        """
        self.register_component(name)
        if record_types:
            self.dispatch = [*self.dispatch, (name, frozenset(record_types), handle)]
            if sized:
                self.sized = self.sized | {name}

    def count_component_error(self, name: str, method: str) -> None:
        """Count an exception from a component; log it with its traceback now and then (call from an except block)."""
        # Called from the ingest thread (holding self.lock) and from HTTP threads, so it has its own lock.
        with self._err_lock:
            k = (name, method)
            n = self.component_errors[k] = self.component_errors.get(k, 0) + 1
        if n in (1, 10, 100, 1000) or n % 10000 == 0:
            log.exception("component %s raised in %s (%d times so far)", name, method, n)

    def _producer(self, pid: int, producer_id: int, seq: int, transport: str, now: float) -> Producer:
        producers = self.producers
        p = producers.get(producer_id)
        if p is None:
            p = producers[producer_id] = Producer(
                pid, producer_id, transport, now, seq, self.max_event_rate, self.implausible
            )
            p.lost_budget = self.max_frame_rate  # one second's worth
            if len(producers) > self.max_producers:
                producers.popitem(last=False)
        else:
            elapsed = now - p.last_seen
            p.interval = min(max(elapsed, 1.0), MAX_INTERVAL_S)
            # Over any stretch of time a producer loses at most the frames it can send in it: each
            # frame's gap is checked against what the elapsed time allows, not a 1 s floor per frame
            # (which let a stream of mutated datagrams claim 100k lost frames each).
            cap = self.max_frame_rate * MAX_INTERVAL_S
            p.lost_budget = min(p.lost_budget + self.max_frame_rate * max(elapsed, 0.0), cap)
            gap = (seq - p.last_seq - 1) % _SEQ_MOD
            if gap < _SEQ_MOD // 2:
                if gap > p.lost_budget:
                    self.implausible["lost_frames"] += 1  # a forged sequence number: resynchronise
                elif gap:
                    p.lost_budget -= gap
                    p.pending_lost += gap
                p.last_seq = seq
            if p.pending_lost and p.hello is not None:
                self._commit_lost(p)
            # else: a late or duplicated frame; keep the newer sequence number.
            p.last_seen = now
            producers.move_to_end(producer_id)
        p.frames += 1
        return p

    # -- read side -------------------------------------------------------------

    def totals(self) -> dict[str, Any]:
        """Counters for /v1/status and the rate sampler."""
        with self.lock:
            events = sum(sum(c) for c in self.counts.values())
            return {
                "frames": sum(self.frames.values()),
                "frames_decoded": self.frames_decoded,
                "events": events,
                "bytes": sum(self.bytes.values()),
                "frames_by_transport": dict(self.frames),
                "decode_errors": {f"{s}/{r}": n for (s, r), n in sorted(self.decode_errors.items())},
                "dropped": dict(self.dropped),
                "lost_frames": self.lost_frames,
                "implausible": dict(self.implausible),
                "schema_cache_bytes": self.decoder.schema_bytes,
                "sdk_dropped": dict(self.agg.sdk_drops),
                "wire_decoder": self.wire_decoder,
            }

    def producers_status(self, now: float, timeout_s: float, limit: int = 100) -> dict[str, Any]:
        with self.lock:
            ps = list(self.producers.values())
        connected = [p for p in ps if now - p.last_seen <= timeout_s]
        return {
            "connected": len(connected),
            "known": len(ps),
            "table": [p.as_dict(now) for p in reversed(ps[-limit:])],
        }

    def collect(self, now: float, producer_timeout_s: float, limiters: dict[str, Any]) -> Iterator[PromMetric]:
        """Families for the sidecar's own ingest metrics."""
        with self.lock:
            frames = dict(self.frames)
            nbytes = dict(self.bytes)
            counts = {t: list(c) for t, c in self.counts.items()}
            errors = dict(self.decode_errors)
            dropped = dict(self.dropped)
            lost = self.lost_frames
            implausible = dict(self.implausible)
            schema_bytes = self.decoder.schema_bytes
            evicted = dict(self.decoder.evicted)
            truncated = self.decoder.truncated_strings
        with self._err_lock:
            comp_errors = dict(self.component_errors)
        with self.lock:
            lag = self.lag.snapshot()
            connected = sum(1 for p in self.producers.values() if now - p.last_seen <= producer_timeout_s)

        fam = families.counter(INGEST_FRAMES_TOTAL)
        for t, n in frames.items():
            fam.add_metric([t], n)
        yield fam
        fam = families.counter(INGEST_BYTES_TOTAL)
        for t, n in nbytes.items():
            fam.add_metric([t], n)
        yield fam
        fam = families.counter(INGEST_EVENTS_TOTAL)
        for t, c in counts.items():
            for code, name in EVENT_TYPES.items():
                if c[code]:
                    fam.add_metric([t, name], c[code])
        yield fam
        fam = families.counter(INGEST_DECODE_ERRORS_TOTAL)
        for (scope, reason), n in sorted(errors.items()):
            fam.add_metric([scope, reason], n)
        yield fam
        fam = families.counter(INGEST_DROPPED_TOTAL)
        for reason, n in sorted(dropped.items()):
            fam.add_metric([reason], n)
        yield fam
        fam = families.counter(INGEST_LOST_FRAMES_TOTAL)
        fam.add_metric([], lost)
        yield fam
        fam = families.counter(INGEST_SOCKET_QUEUE_DROPPED_TOTAL)
        kernel = 0
        for src in self.socket_drop_sources:
            try:
                kernel += int(src())
            except Exception:  # /proc unreadable: report what we have
                pass
        fam.add_metric([], kernel)
        yield fam
        g = families.gauge(PRODUCERS)
        g.add_metric([], connected)
        yield g
        yield histogram_family(self.lag.metric, lag)
        fam = families.counter(LABEL_OVERFLOW_TOTAL)
        for name, lim in sorted(limiters.items()):
            fam.add_metric([name], lim.overflowed)
        yield fam
        fam = families.counter(COMPONENT_ERRORS_TOTAL)
        for (comp, method), n in sorted(comp_errors.items()):
            fam.add_metric([comp, method], n)
        yield fam
        fam = families.counter(INGEST_IMPLAUSIBLE_TOTAL)
        for field, n in implausible.items():
            fam.add_metric([field], n)
        yield fam
        g = families.gauge(INGEST_SCHEMA_CACHE_BYTES)
        g.add_metric(["used"], schema_bytes)
        g.add_metric(["limit"], self.max_schema_bytes)
        yield g
        fam = families.counter(INGEST_SCHEMAS_EVICTED_TOTAL)
        for reason, n in evicted.items():
            fam.add_metric([reason], n)
        yield fam
        fam = families.counter(INGEST_TRUNCATED_STRINGS_TOTAL)
        fam.add_metric([], truncated)
        yield fam
