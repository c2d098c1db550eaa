"""``POST /v1/traces``: one OTLP/HTTP export in, events into the pipeline, the spec's answer out.

Accounting:

- a body that cannot be read (wrong content type or encoding, corrupt,
  too large once decompressed) is answered 4xx with a ``google.rpc.Status``
  and counted in ``inferwatch_ingest_decode_errors_total{scope="otlp"}``;
- otherwise every span in it is counted in ``inferwatch_otlp_spans_total``:
  rejected ones by reason (and reported in the answer's ``partial_success``),
  accepted ones by role, and those the join later gives up on as dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.ingest.otlp_traces.decode import (
    JSON,
    PROTOBUF,
    RPC_INVALID_ARGUMENT,
    RPC_RESOURCE_EXHAUSTED,
    BodyError,
    Limits,
    decode,
    inflate,
    media_type,
    status_body,
    success_body,
)
from inferwatch_sidecar.ingest.otlp_traces.mapping import REJECTED, Mapper
from inferwatch_sidecar.ingest.pipeline import Pipeline
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import OTLP_CUT_TOTAL, OTLP_PENDING_BYTES, OTLP_PENDING_SPANS, OTLP_SPANS_TOTAL
from inferwatch_sidecar.metrics.entry import Metric

#: The catalog entries :meth:`TraceReceiver.collect` exports.
METRICS: tuple[Metric, ...] = (OTLP_SPANS_TOTAL, OTLP_PENDING_SPANS, OTLP_CUT_TOTAL, OTLP_PENDING_BYTES)
#: Bodies larger than this once inflated are decoded one at a time: parsing costs up to ~28 bytes of
#: memory per byte of body (a JSON array of empty objects, a protobuf array of empty values), so
#: four handler threads parsing 4 MiB bodies at once would need ~450 MiB.
LARGE_BODY = 256 << 10
#: How long a large body waits for the one decode slot before the export is answered 503 (retryable).
LARGE_BODY_WAIT_S = 10.0


class TraceReceiver:
    """Decodes exports, maps spans, feeds the pipeline; safe to call from many HTTP threads.

    Args:
        pipeline: where the events go (transport ``http``), and where body errors are counted.
        mapper: the span mapper and its join buffer.
        max_spans: spans taken from one export; the rest are rejected.
        max_decompressed_bytes: largest body once gzip is undone.
        limits: attributes and events kept per span at decode.
        max_json_containers: most JSON objects and arrays in one OTLP/JSON body, counted before it is parsed.
    """

    def __init__(self, pipeline: Pipeline, mapper: Mapper, max_spans: int = 10000,
                 max_decompressed_bytes: int = 4 << 20, limits: Limits | None = None,
                 max_json_containers: int = 1 << 19) -> None:
        self.pipeline = pipeline
        self.mapper = mapper
        self.max_spans = max_spans
        self.max_decompressed_bytes = max_decompressed_bytes
        self.limits = limits or Limits()
        self.max_json_containers = max_json_containers
        self.lock = threading.Lock()
        #: The one slot for decoding a large body (see :data:`LARGE_BODY`).
        self.large = threading.BoundedSemaphore(1)
        self.cut: dict[str, int] = {"attribute": 0, "event": 0, "key": 0}

    def handle(self, body: bytes, content_type: str, content_encoding: str | None) -> tuple[int, str, bytes]:
        """Ingest one export.

        Returns:
            ``(HTTP status, content type, body)``: 200 with an
            ``ExportTraceServiceResponse`` (``partial_success`` when spans were
            rejected), or 400/413/415 with a ``google.rpc.Status``, in the
            request's encoding (JSON when the content type is unknown).
        """
        self.pipeline.add_bytes("http", len(body))
        PRIORITY.pause(ingest=True)
        encoding = media_type(content_type)
        if encoding is None:
            self.pipeline.count_error("otlp", "unsupported_content_type")
            msg = f"Content-Type {content_type!r} is not supported; send {PROTOBUF} or {JSON}"
            return 415, JSON, status_body(JSON, RPC_INVALID_ARGUMENT, msg)
        try:
            decoded = self._decode(body, encoding, content_encoding)
        except BodyError as e:
            self.pipeline.count_error("otlp", e.reason)
            return e.status, encoding, status_body(encoding, e.code, str(e))
        with self.lock:
            for what, n in decoded.cut.items():
                self.cut[what] += n
            m = self.mapper
            for reason, n in decoded.rejected.items():
                m.count(REJECTED, reason, n)
            records = m.map(decoded.spans)
        self.pipeline.events(records, "http")
        rejected = sum(decoded.rejected.values())
        message = ""
        if rejected:
            message = "rejected spans: " + ", ".join(f"{r}={n}" for r, n in sorted(decoded.rejected.items()))
        return 200, encoding, success_body(encoding, rejected, message)

    def _decode(self, body: bytes, encoding: str, content_encoding: str | None) -> Any:
        raw = inflate(body, content_encoding, self.max_decompressed_bytes)
        if encoding == JSON and raw.count(b"{") + raw.count(b"[") > self.max_json_containers:
            # Counted before parsing: json.loads of 4 MiB of "{}," would build 1.4 million dicts.
            raise BodyError(413, "too_many_values", f"body has more than {self.max_json_containers} JSON objects "
                            "and arrays (traces.max_json_containers)", RPC_RESOURCE_EXHAUSTED)
        if len(raw) <= LARGE_BODY:
            return decode(raw, encoding, self.max_spans, self.limits)
        if not self.large.acquire(timeout=LARGE_BODY_WAIT_S):
            raise BodyError(503, "busy", "another large export is being decoded; retry later", 14)
        try:
            return decode(raw, encoding, self.max_spans, self.limits)
        finally:
            self.large.release()

    def reject_body(self) -> None:
        """Count a body the HTTP layer refused for its length."""
        self.pipeline.count_drop("body_too_large")

    def expire(self) -> None:
        """Give up on traces past ``join_timeout_s`` (called from the daemon's tick)."""
        with self.lock:
            self.mapper.expire()

    def flush(self) -> None:
        """At shutdown: count every stage span still waiting as orphaned."""
        with self.lock:
            self.mapper.flush()

    def collect(self) -> Iterator[PromMetric]:
        with self.lock:
            counts = dict(self.mapper.counts)
            pending = self.mapper.pending
            nbytes = self.mapper.nbytes
            cut = dict(self.cut)
        fam = families.counter(OTLP_SPANS_TOTAL)
        for (result, reason), n in counts.items():
            fam.add_metric([result, reason], n)
        yield fam
        g = families.gauge(OTLP_PENDING_SPANS)
        g.add_metric([], pending)
        yield g
        c = families.counter(OTLP_CUT_TOTAL)
        for what, n in cut.items():
            c.add_metric([what], n)
        yield c
        g = families.gauge(OTLP_PENDING_BYTES)
        g.add_metric([], nbytes)
        yield g

    def status(self) -> dict[str, Any]:
        with self.lock:
            counts = {f"{r}/{why}": n for (r, why), n in self.mapper.counts.items() if n}
            return {"spans": counts, "pending_spans": self.mapper.pending, "pending_traces": len(self.mapper.traces),
                    "pending_bytes": self.mapper.nbytes, "cut": dict(self.cut)}
