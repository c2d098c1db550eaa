"""OTLP/HTTP trace bodies into :class:`Span` objects, and the answers the spec asks for.

Two encodings of ``ExportTraceServiceRequest`` arrive on ``POST /v1/traces``:

- ``application/x-protobuf``: parsed with ``opentelemetry-proto``'s message
  (the upb backend, so parsing is C).
- ``application/json``: OTLP/JSON, which differs from protobuf's canonical
  JSON mapping: trace and span IDs are hex strings (not base64), enums may
  be integers or their names, 64-bit integers may be strings. ``json_format``
  would read the IDs as base64, so the walk below is our own; it accepts the
  lowerCamelCase names the spec requires and the original snake_case names
  the spec allows receivers to accept.

Either may be gzip-compressed (``Content-Encoding: gzip``). The decompressed
size is bounded (a 1 MiB gzip bomb expands a thousandfold), and so is the
number of spans taken from one body: the rest are rejected and reported in
the response's ``partial_success``.

A span that cannot be used (bad IDs, an end before its start) is rejected
alone, by reason; a body that cannot be read at all gets a 4xx answer with a
``google.rpc.Status`` in the request's encoding, as the spec says.
"""

from __future__ import annotations

import json
import re
import sys
import zlib
from typing import Any

from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Content types accepted, without parameters; ``application/protobuf`` is what some clients send.
CONTENT_TYPES = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}

SPAN_KIND_SERVER = 2
STATUS_ERROR = 2
_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5,
}
_STATUS = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
#: google.rpc.Code values used in error answers.
RPC_INVALID_ARGUMENT = 3
RPC_RESOURCE_EXHAUSTED = 8
RPC_UNIMPLEMENTED = 12
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
#: Longest attribute string kept; longer values are cut (the wire format's string limit).
MAX_STRING = 255
#: Elements kept from an array attribute.
MAX_ARRAY = 16
#: Longest attribute key kept; an attribute with a longer key is dropped (no convention has one).
MAX_KEY = 255


class Limits:
    """Per-span caps applied while a body is walked, before anything is stored (``traces.max_*``).

    Attributes:
        attributes: attributes kept per span (and per resource); the rest are dropped.
        events: events kept per span.
        event_attributes: attributes kept per event.
    """

    __slots__ = ("attributes", "events", "event_attributes")

    def __init__(self, attributes: int = 128, events: int = 128, event_attributes: int = 16) -> None:
        self.attributes = attributes
        self.events = events
        self.event_attributes = event_attributes


_DEFAULT_LIMITS = Limits()
#: Largest integer that converts to a finite double.
_MAX_DOUBLE_INT = int(sys.float_info.max)
#: Longest duration taken from an attribute: what fits in the wire format's 64-bit nanoseconds.
_MAX_SECONDS = (2**64 - 1) / 1e9
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyError(Exception):
    """A body that cannot be used at all.

    Attributes:
        status: the HTTP status to answer (400, 413 or 415).
        reason: a bounded label value for the decode-error counter.
        code: the ``google.rpc.Code`` of the answer's Status.
    """

    def __init__(self, status: int, reason: str, message: str, code: int = RPC_INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.code = code


class Resource:
    """The resource and scope a group of spans shares (one object per scope group)."""

    __slots__ = ("attrs", "scope")

    def __init__(self, attrs: dict[str, Any], scope: str) -> None:
        self.attrs = attrs
        self.scope = scope


class Span:
    """One decoded span; times in Unix nanoseconds, IDs as bytes, attributes as plain values.

    ``events`` holds ``(name, time_unix_ns, attributes)`` tuples; ``status`` is
    the OTLP status code (0 unset, 1 ok, 2 error).
    """

    __slots__ = ("trace", "sid", "parent", "name", "kind", "start", "end", "attrs", "events", "status", "res")

    def __init__(
        self, trace: bytes, sid: bytes, parent: bytes, name: str, kind: int, start: int, end: int,
        attrs: dict[str, Any], events: list[tuple[str, int, dict[str, Any]]], status: int, res: Resource,
    ) -> None:
        self.trace = trace
        self.sid = sid
        self.parent = parent
        self.name = name
        self.kind = kind
        self.start = start
        self.end = end
        self.attrs = attrs
        self.events = events
        self.status = status
        self.res = res

    def attr(self, key: str) -> Any:
        """The span's attribute ``key``, else the resource's, else None."""
        v = self.attrs.get(key)
        return self.res.attrs.get(key) if v is None else v

    def event_time(self, name: str) -> int | None:
        for n, t, _ in self.events:
            if n == name:
                return t
        return None


class Decoded:
    """What one body held: usable spans, spans rejected by reason, and the body's encoding."""

    __slots__ = ("spans", "rejected", "encoding", "cut")

    def __init__(self, encoding: str) -> None:
        self.spans: list[Span] = []
        self.rejected: dict[str, int] = {}
        self.encoding = encoding
        #: what the per-span caps dropped: ``attribute``, ``event``, ``key`` -> count.
        self.cut: dict[str, int] = {"attribute": 0, "event": 0, "key": 0}

    def reject(self, reason: str, n: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + n


class SpanError(Exception):
    """One span that cannot be used; ``args[0]`` is the bounded reason."""


class BadText(SpanError):
    """A string that is not exportable text; in resource attributes it rejects the resource's spans."""


def media_type(content_type: str) -> str | None:
    """The encoding a Content-Type names (:data:`PROTOBUF` or :data:`JSON`), or None."""
    return CONTENT_TYPES.get(content_type.split(";", 1)[0].strip().lower())


def inflate(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body without its Content-Encoding, at most ``limit`` bytes.

    Raises:
        BodyError: an encoding other than gzip or identity (415), a corrupt
            stream (400), or more than ``limit`` bytes once decompressed (413).
    """
    enc = (content_encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc != "gzip":
        raise BodyError(415, "unsupported_encoding", f"Content-Encoding {enc!r} is not supported; use gzip or none",
                        RPC_UNIMPLEMENTED)
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise BodyError(400, "bad_gzip", f"body is not valid gzip: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BodyError(413, "decompressed_too_large", f"body is larger than {limit} bytes once decompressed",
                        RPC_RESOURCE_EXHAUSTED)
    if not d.eof:
        raise BodyError(400, "bad_gzip", "gzip stream is truncated")
    return out


def decode(body: bytes, encoding: str, max_spans: int, limits: Limits = _DEFAULT_LIMITS) -> Decoded:
    """Decode an uncompressed ``ExportTraceServiceRequest``.

    Args:
        body: the request body, already inflated.
        encoding: :data:`PROTOBUF` or :data:`JSON`.
        max_spans: spans taken from the body; the rest are rejected as ``too_many_spans``.
        limits: attributes and events kept per span; what they cut is counted in ``Decoded.cut``.

    Raises:
        BodyError: the body does not parse as the message (400).
    """
    out = Decoded(encoding)
    if encoding == PROTOBUF:
        _decode_protobuf(body, max_spans, out, limits)
    else:
        _decode_json(body, max_spans, out, limits)
    return out


# -- protobuf ------------------------------------------------------------------


def _pb_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value[:MAX_STRING]
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "array_value":
        vals = [_pb_value(x) for x in v.array_value.values[:MAX_ARRAY]]
        return tuple(x for x in vals if x is not None and not isinstance(x, tuple))
    return None  # kvlist and bytes values are not used for metrics


def _pb_attrs(kvs: Any, limit: int, cut: dict[str, int]) -> dict[str, Any]:
    n = len(kvs)
    if n > limit:
        cut["attribute"] += n - limit
        kvs = kvs[:limit]
    out = {}
    for kv in kvs:
        k = kv.key
        if len(k) > MAX_KEY:
            cut["key"] += 1
            continue
        v = _pb_value(kv.value)
        if v is not None:
            out[k] = v
    return out


def _pb_events(evs: Any, lim: Limits, cut: dict[str, int]) -> list[tuple[str, int, dict[str, Any]]]:
    n = len(evs)
    if n > lim.events:
        cut["event"] += n - lim.events
        evs = evs[:lim.events]
    ea = lim.event_attributes
    return [(e.name[:MAX_STRING], e.time_unix_nano, _pb_attrs(e.attributes, ea, cut)) for e in evs]


def _decode_protobuf(body: bytes, max_spans: int, out: Decoded, lim: Limits) -> None:
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except (ProtoDecodeError, RuntimeError) as e:
        raise BodyError(400, "bad_protobuf", f"body is not an ExportTraceServiceRequest: {e}") from None
    left = max_spans
    spans = out.spans
    for rs in msg.resource_spans:
        cut = out.cut
        rattrs = _pb_attrs(rs.resource.attributes, lim.attributes, cut)
        for ss in rs.scope_spans:
            n = len(ss.spans)
            if left <= 0:
                out.reject("too_many_spans", n)
                continue
            res = Resource(rattrs, ss.scope.name)
            for s in ss.spans[:left]:
                trace = s.trace_id
                sid = s.span_id
                if len(trace) != 16 or trace == _ZERO_TRACE:
                    out.reject("bad_trace_id")
                    continue
                if len(sid) != 8 or sid == _ZERO_SPAN:
                    out.reject("bad_span_id")
                    continue
                parent = s.parent_span_id
                if parent and len(parent) != 8:
                    out.reject("bad_span_id")
                    continue
                start = s.start_time_unix_nano
                end = s.end_time_unix_nano
                if not start or end < start:
                    out.reject("bad_time")
                    continue
                spans.append(Span(trace, sid, parent, s.name[:MAX_STRING], s.kind, start, end,
                                  _pb_attrs(s.attributes, lim.attributes, cut), _pb_events(s.events, lim, cut),
                                  s.status.code, res))
            if n > left:
                out.reject("too_many_spans", n - left)
            left -= n


# -- OTLP/JSON -----------------------------------------------------------------


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    v = obj.get(camel)
    return obj.get(snake) if v is None else v


def _int64(v: Any, what: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    """An OTLP/JSON 64-bit integer from ``lo`` to ``hi``: a JSON number or a decimal string.

    The range is the protobuf field's (int64, or fixed64 for times): JSON has no
    limit, and a time past 2**64 ns would overflow the float conversions downstream.
    """
    if isinstance(v, bool):
        raise SpanError(what)
    if isinstance(v, int):
        n = v
    elif isinstance(v, str):
        try:
            n = int(v, 10)
        except ValueError:
            raise SpanError(what) from None
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    else:
        raise SpanError(what)
    if not lo <= n <= hi:
        raise SpanError(what)
    return n


def _time(v: Any) -> int:
    """A fixed64 Unix-nanosecond time."""
    return _int64(v or 0, "bad_time", 0, 2**64 - 1)


def _hex_id(v: Any, n: int, reason: str, required: bool) -> bytes:
    if v is None or v == "":
        if required:
            raise SpanError(reason)
        return b""
    if not isinstance(v, str) or len(v) != 2 * n:
        raise SpanError(reason)
    try:
        b = bytes.fromhex(v)
    except ValueError:
        raise SpanError(reason) from None
    if b == bytes(n):
        raise SpanError(reason)
    return b


def _enum(v: Any, names: dict[str, int], what: str) -> int:
    if v is None:
        return 0
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v in names:
        return names[v]
    raise SpanError(what)


def _json_value(v: Any) -> Any:
    if not isinstance(v, dict):
        return None
    if "stringValue" in v or "string_value" in v:
        s = _get(v, "stringValue", "string_value")
        if not isinstance(s, str):
            return None
        s = s[:MAX_STRING]
        # JSON can carry a lone UTF-16 surrogate; no UTF-8 encoder takes one, so as a label it would break /metrics.
        if not s.isascii() and _SURROGATE.search(s):
            raise BadText("bad_attribute")
        return s
    if "intValue" in v or "int_value" in v:
        try:
            return _int64(_get(v, "intValue", "int_value"), "bad_attribute")
        except SpanError:
            return None
    if "doubleValue" in v or "double_value" in v:
        d = _get(v, "doubleValue", "double_value")
        if isinstance(d, float):
            return d
        if isinstance(d, int) and not isinstance(d, bool):
            # A JSON integer past the float range (1e309 written out) is not a usable double.
            return float(d) if abs(d) <= _MAX_DOUBLE_INT else None
        # OTLP/JSON writes NaN and the infinities as strings, as protobuf's JSON mapping does.
        if d in ("NaN", "Infinity", "-Infinity"):
            return float(d)
        return None
    if "boolValue" in v or "bool_value" in v:
        b = _get(v, "boolValue", "bool_value")
        return b if isinstance(b, bool) else None
    if "arrayValue" in v or "array_value" in v:
        arr = _get(v, "arrayValue", "array_value")
        vals = arr.get("values") if isinstance(arr, dict) else None
        if not isinstance(vals, list):
            return None
        items = [_json_value(x) for x in vals[:MAX_ARRAY]]
        return tuple(x for x in items if x is not None and not isinstance(x, tuple))
    return None


def _json_attrs(kvs: Any, limit: int, cut: dict[str, int]) -> dict[str, Any]:
    if kvs is None:
        return {}
    if not isinstance(kvs, list):
        raise SpanError("bad_attribute")
    if len(kvs) > limit:
        cut["attribute"] += len(kvs) - limit
        kvs = kvs[:limit]
    out = {}
    for kv in kvs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise SpanError("bad_attribute")
        k = kv["key"]
        if len(k) > MAX_KEY:
            cut["key"] += 1
            continue
        v = _json_value(kv.get("value"))
        if v is not None:
            out[k] = v
    return out


def _json_span(s: Any, res: Resource, lim: Limits, cut: dict[str, int]) -> Span:
    if not isinstance(s, dict):
        raise SpanError("bad_span")
    trace = _hex_id(_get(s, "traceId", "trace_id"), 16, "bad_trace_id", True)
    sid = _hex_id(_get(s, "spanId", "span_id"), 8, "bad_span_id", True)
    parent = _hex_id(_get(s, "parentSpanId", "parent_span_id"), 8, "bad_span_id", False)
    start = _time(_get(s, "startTimeUnixNano", "start_time_unix_nano"))
    end = _time(_get(s, "endTimeUnixNano", "end_time_unix_nano"))
    if start <= 0 or end < start:
        raise SpanError("bad_time")
    name = s.get("name", "")
    if not isinstance(name, str):
        raise SpanError("bad_span")
    kind = _enum(s.get("kind"), _KINDS, "bad_span")
    status = s.get("status")
    code = _enum(status.get("code"), _STATUS, "bad_span") if isinstance(status, dict) else 0
    events = []
    evs = s.get("events") or []
    if not isinstance(evs, list):
        raise SpanError("bad_span")
    if len(evs) > lim.events:
        cut["event"] += len(evs) - lim.events
        evs = evs[:lim.events]
    for e in evs:
        if not isinstance(e, dict):
            raise SpanError("bad_span")
        en = e.get("name", "")
        events.append((en[:MAX_STRING] if isinstance(en, str) else "",
                       _time(_get(e, "timeUnixNano", "time_unix_nano")),
                       _json_attrs(e.get("attributes"), lim.event_attributes, cut)))
    return Span(trace, sid, parent, name[:MAX_STRING], kind, start, end,
                _json_attrs(s.get("attributes"), lim.attributes, cut), events, code, res)


def _decode_json(body: bytes, max_spans: int, out: Decoded, lim: Limits) -> None:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BodyError(400, "bad_json", f"body is not JSON: {e}") from None
    except RecursionError:
        raise BodyError(400, "too_deep", "body is nested too deeply to parse") from None
    if not isinstance(doc, dict):
        raise BodyError(400, "bad_json", "body must be an ExportTraceServiceRequest object")
    groups = _get(doc, "resourceSpans", "resource_spans") or []
    if not isinstance(groups, list):
        raise BodyError(400, "bad_json", "resourceSpans must be a list")
    left = max_spans
    for rs in groups:
        if not isinstance(rs, dict):
            raise BodyError(400, "bad_json", "each resourceSpans entry must be an object")
        resource = rs.get("resource") or {}
        try:
            rattrs: dict[str, Any] | None = _json_attrs(
                resource.get("attributes") if isinstance(resource, dict) else None, lim.attributes, out.cut)
        except BadText:
            rattrs = None
        except SpanError:
            raise BodyError(400, "bad_json", "resource attributes must be a list of {key, value}") from None
        scopes = _get(rs, "scopeSpans", "scope_spans") or []
        if not isinstance(scopes, list):
            raise BodyError(400, "bad_json", "scopeSpans must be a list")
        for ss in scopes:
            if not isinstance(ss, dict):
                raise BodyError(400, "bad_json", "each scopeSpans entry must be an object")
            scope = ss.get("scope")
            sname = scope.get("name", "") if isinstance(scope, dict) else ""
            spans = ss.get("spans") or []
            if not isinstance(spans, list):
                raise BodyError(400, "bad_json", "spans must be a list")
            if left <= 0:
                out.reject("too_many_spans", len(spans))
                continue
            if rattrs is None:
                out.reject("bad_attribute", len(spans))
                left -= len(spans)
                continue
            res = Resource(rattrs, sname if isinstance(sname, str) else "")
            for s in spans[:left]:
                try:
                    out.spans.append(_json_span(s, res, lim, out.cut))
                except SpanError as e:
                    out.reject(e.args[0])
            if len(spans) > left:
                out.reject("too_many_spans", len(spans) - left)
            left -= len(spans)


# -- answers -------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def success_body(encoding: str, rejected: int, message: str) -> bytes:
    """An ``ExportTraceServiceResponse``; ``partial_success`` is set only when spans were rejected."""
    if encoding == JSON:
        if not rejected:
            return b"{}"
        return json.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}).encode()
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return resp.SerializeToString()


def status_body(encoding: str, code: int, message: str) -> bytes:
    """A ``google.rpc.Status`` (fields 1 code, 2 message), the body of a failed OTLP/HTTP export.

    Written by hand because the message is two fields and googleapis-common-protos
    is not a dependency of the sidecar; the tests parse it with the real class.
    """
    if encoding == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    msg = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(msg)) + msg


def finite_seconds(v: Any) -> float | None:
    """An attribute holding seconds, as a float from 0 to 2**64 ns, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if 0 <= f <= _MAX_SECONDS else None
