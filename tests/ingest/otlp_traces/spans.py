"""Builders for OTLP trace exports, with the real opentelemetry-proto messages."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def any_value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        out = AnyValue()
        out.array_value.values.extend(any_value(x) for x in v)
        return out
    return AnyValue(string_value=str(v))


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def span(trace: int, sid: int, name: str, start_ms: float, end_ms: float, parent: int = 0, kind: int = 1,
         attrs: dict[str, Any] | None = None, events: list[tuple[str, float]] | None = None, status: int = 0) -> Span:
    s = Span(
        trace_id=trace.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"", name=name, kind=kind,  # type: ignore[arg-type]
        start_time_unix_nano=T0 + int(start_ms * MS), end_time_unix_nano=T0 + int(end_ms * MS),
        attributes=kvs(attrs or {}), status=Status(code=status),  # type: ignore[arg-type]
    )
    for ev_name, t_ms in events or []:
        e = s.events.add()
        e.name = ev_name
        e.time_unix_nano = T0 + int(t_ms * MS)
    return s


def export(spans: list[Span], resource: dict[str, Any] | None = None, scope: str = "test") -> bytes:
    req = ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource={"attributes": kvs(resource or {"service.name": "svc"})},  # type: ignore[arg-type]
                      scope_spans=[ScopeSpans(scope={"name": scope}, spans=spans)])  # type: ignore[arg-type]
    ])
    return req.SerializeToString()


def triton_trace(trace: int, base: int, model: str = "resnet", version: int = 1, t: float = 0.0,
                 queue_ms: float = 2.0, pre_ms: float = 0.5, infer_ms: float = 10.0, post_ms: float = 1.0) -> list[Span]:
    """The three spans Triton sends per request (as recorded from tritonserver 2.51), end order."""
    cs = t + 0.1 + queue_ms
    end = cs + pre_ms + infer_ms + post_ms
    compute = span(trace, base + 2, "compute", cs, end, parent=base + 1, kind=2, events=[
        ("COMPUTE_START", cs), ("COMPUTE_INPUT_END", cs + pre_ms), ("COMPUTE_OUTPUT_START", cs + pre_ms + infer_ms),
        ("COMPUTE_END", end)])
    model_span = span(trace, base + 1, model, t + 0.05, end + 0.01, parent=base, kind=2,
                      attrs={"triton.model_name": model, "triton.model_version": version, "triton.trace_id": 1},
                      events=[("REQUEST_START", t + 0.05), ("QUEUE_START", t + 0.1), ("REQUEST_END", end + 0.01)])
    root = span(trace, base, "InferRequest", t, end + 0.02, kind=2,
                events=[("HTTP_RECV_START", t), ("HTTP_SEND_END", end + 0.02)])
    return [compute, model_span, root]


def to_json(body: bytes) -> bytes:
    """An export as OTLP/JSON: hex IDs, enums as names, 64-bit integers as strings (what Triton sends)."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)

    def val(v: AnyValue) -> dict[str, Any]:
        w = v.WhichOneof("value")
        if w == "int_value":
            return {"intValue": str(v.int_value)}
        if w == "array_value":
            return {"arrayValue": {"values": [val(x) for x in v.array_value.values]}}
        key = {"string_value": "stringValue", "double_value": "doubleValue", "bool_value": "boolValue"}[w]
        return {key: getattr(v, w)}

    def attrs(a: Any) -> list[dict[str, Any]]:
        return [{"key": kv.key, "value": val(kv.value)} for kv in a]

    kinds = {0: "SPAN_KIND_UNSPECIFIED", 1: "SPAN_KIND_INTERNAL", 2: "SPAN_KIND_SERVER", 3: "SPAN_KIND_CLIENT"}
    doc = {"resourceSpans": [{
        "resource": {"attributes": attrs(rs.resource.attributes)},
        "scopeSpans": [{"scope": {"name": ss.scope.name}, "spans": [{
            "traceId": s.trace_id.hex(), "spanId": s.span_id.hex(), "parentSpanId": s.parent_span_id.hex(),
            "name": s.name, "kind": kinds[s.kind], "startTimeUnixNano": str(s.start_time_unix_nano),
            "endTimeUnixNano": str(s.end_time_unix_nano), "attributes": attrs(s.attributes),
            "events": [{"name": e.name, "timeUnixNano": str(e.time_unix_nano)} for e in s.events],
            "status": {"code": s.status.code},
        } for s in ss.spans]} for ss in rs.scope_spans],
    } for rs in req.resource_spans]}
    return json.dumps(doc).encode()
