"""The bodies of ``scripts/fuzz_otlp.py``: random and mutated OTLP exports, and an independent count of
their spans and of the answers, to check the receiver against.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
PB = "application/x-protobuf"
JSON = "application/json"
#: Span ID fields: hex in OTLP/JSON, base64 in protobuf's canonical JSON (which builds the protobuf bodies).
ID_KEYS = ("traceId", "spanId", "parentSpanId")
#: Content types and encodings a client may send wrongly.
BAD_TYPES = ["text/plain", "", "application/grpc", "application/x-protobuf-ish", "application/json+x"]
BAD_ENCODINGS = ["br", "deflate", "zstd", "gzip, gzip", "x"]
#: Strings that broke, or could break, text handling; the surrogates only survive in JSON.
NASTY_TEXT = ["", "x" * 300, "\x00", "a\nb", '"', "\\", "\U0001f600", "é" * 200, "{{model}}", "\u202e"]
SURROGATES = ["\ud800", "a\udcffb", "\udfff\ud800"]
NASTY_JSON: list[Any] = [None, 0, -1, 10**400, -(10**30), 1e308, "NaN", "Infinity", "", "zz", [], {}, [1], {"a": 1},
              True, "1" * 5000, 2**64, 2**63, "-5", 1.5]


def _rand_text(rng: random.Random, json_mode: bool) -> str:
    r = rng.random()
    if r < 0.5:
        return rng.choice(["resnet", "llama", "svc", "compute", "llm_request", "InferRequest", "1", "triton-server"])
    if r < 0.75:
        return rng.choice(NASTY_TEXT + (SURROGATES if json_mode else []))
    if r < 0.8:
        return "h" * rng.choice([256, 4096, 50_000])
    return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 20)))


def _any_value(rng: random.Random, json_mode: bool, depth: int) -> dict[str, Any]:
    kind = rng.randrange(8 if depth > 0 else 5)
    if kind == 0:
        return {"stringValue": _rand_text(rng, json_mode)}
    if kind == 1:
        v = rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randrange(-1000, 1000)])
        if json_mode and rng.random() < 0.3:
            return {"intValue": rng.choice(NASTY_JSON)}
        return {"intValue": str(v) if rng.random() < 0.5 else v}
    if kind == 2:
        if json_mode and rng.random() < 0.3:
            return {"doubleValue": rng.choice(NASTY_JSON)}
        return {"doubleValue": rng.choice([0.5, -0.0, 1e308, 5e-324, "NaN", "Infinity", "-Infinity", 3])}
    if kind == 3:
        return {"boolValue": rng.random() < 0.5}
    if kind == 4:
        return {"bytesValue": base64.b64encode(rng.randbytes(rng.randrange(0, 40))).decode()}
    if kind == 5:
        return {"arrayValue": {"values": [_any_value(rng, json_mode, depth - 1) for _ in range(rng.choice([0, 1, 2, 3, 17]))]}}
    if kind == 6:
        return {"kvlistValue": {"values": [{"key": _rand_text(rng, json_mode), "value": _any_value(rng, json_mode, depth - 1)}
                                           for _ in range(rng.randrange(0, 4))]}}
    return {}  # an AnyValue with no value set


def _nested(rng: random.Random, depth: int) -> dict[str, Any]:
    """A kvlist or array nested ``depth`` deep (past protobuf's recursion limit at the deep end)."""
    v: dict[str, Any] = {"intValue": "1"}
    for _ in range(depth):
        v = {"arrayValue": {"values": [v]}} if rng.random() < 0.5 else {"kvlistValue": {"values": [{"key": "k", "value": v}]}}
    return v


def _attrs(rng: random.Random, json_mode: bool, keys: list[str]) -> list[dict[str, Any]]:
    out = []
    for _ in range(rng.randrange(0, 8)):
        key = rng.choice(keys) if rng.random() < 0.7 else _rand_text(rng, json_mode)
        value = _nested(rng, rng.choice([10, 30, 60])) if rng.random() < 0.03 else _any_value(rng, json_mode, 3)
        out.append({"key": key, "value": value})
    return out


SPAN_KEYS = ["triton.model_name", "triton.model_version", "gen_ai.response.model", "gen_ai.request.model",
             "gen_ai.latency.e2e", "gen_ai.latency.time_to_first_token", "gen_ai.operation.name",
             "http.response.status_code", "error.type", "gen_ai.usage.prompt_tokens"]
RES_KEYS = ["service.name", "gen_ai.request.model", "service.version"]


def _id(rng: random.Random, n: int) -> bytes:
    r = rng.random()
    if r < 0.85:
        return rng.randbytes(n)
    if r < 0.9:
        return bytes(n)
    return rng.randbytes(rng.choice([0, 1, n - 1, n + 1, 32]))


def _time(rng: random.Random, json_mode: bool) -> Any:
    r = rng.random()
    if r < 0.8:
        return 1_700_000_000_000_000_000 + rng.randrange(10**10)
    if json_mode and r < 0.9:
        return rng.choice(NASTY_JSON)
    return rng.choice([0, 1, 2**64 - 1, 2**63])


def random_export(rng: random.Random, json_mode: bool) -> dict[str, Any]:
    """A structurally valid export (IDs as bytes, rendered by :func:`render`)."""
    traces = [_id(rng, 16) for _ in range(rng.randrange(1, 4))]
    groups = []
    for _ in range(rng.randrange(0, 3)):
        scopes = []
        for _ in range(rng.randrange(0, 3)):
            spans = []
            sids: list[bytes] = []
            for _ in range(rng.randrange(0, 12)):
                sid = _id(rng, 8)
                span: dict[str, Any] = {
                    "traceId": rng.choice(traces), "spanId": sid,
                    "name": rng.choice(["compute", "llm_request", "resnet", "InferRequest", "x"]),
                    "kind": rng.choice([0, 1, 2, 3, "SPAN_KIND_SERVER", 99] if json_mode else [0, 1, 2, 3, 99]),
                    "startTimeUnixNano": _time(rng, json_mode), "endTimeUnixNano": _time(rng, json_mode),
                    "attributes": _attrs(rng, json_mode, SPAN_KEYS),
                    "events": [{"name": rng.choice(["COMPUTE_START", "COMPUTE_END", "QUEUE_START", "x"]),
                                "timeUnixNano": _time(rng, json_mode), "attributes": _attrs(rng, json_mode, SPAN_KEYS)}
                               for _ in range(rng.randrange(0, 4))],
                    "status": {"code": rng.choice([0, 1, 2])},
                }
                if sids and rng.random() < 0.7:
                    span["parentSpanId"] = rng.choice(sids)
                sids.append(sid)
                spans.append(span)
            scopes.append({"scope": {"name": rng.choice(["triton-server", "vllm", "x", ""])}, "spans": spans})
        groups.append({"resource": {"attributes": _attrs(rng, json_mode, RES_KEYS)}, "scopeSpans": scopes})
    return {"resourceSpans": groups}


def _fixture_docs() -> list[dict[str, Any]]:
    out = []
    for name in ("triton_spans.json", "vllm_spans.json"):
        doc = json.loads((FIXTURES / name).read_text())
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    for k in ID_KEYS:
                        if s.get(k):
                            s[k] = bytes.fromhex(s[k])
        out.append(doc)
    return out


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_doc(rng: random.Random, doc: Any, json_mode: bool) -> Any:
    """Field swaps and (in JSON) wrong-typed values, over the tree; protobuf bodies keep valid types."""
    for _ in range(rng.randrange(1, 4)):
        paths = [p for p in _leaves(doc) if p]
        if not paths:
            break
        a, b = rng.choice(paths), rng.choice(paths)
        op = rng.randrange(4)
        if op == 0 and json_mode:
            _at(doc, a[:-1])[a[-1]] = rng.choice(NASTY_JSON + SURROGATES)
        elif op == 1 and a[:len(b)] != b and b[:len(a)] != a:  # swap two fields, neither holding the other
            va, vb = _at(doc, a), _at(doc, b)
            if json_mode or (_fields(a) == _fields(b) and type(a[-1]) is type(b[-1])):  # protobuf: same field, same type
                _at(doc, a[:-1])[a[-1]], _at(doc, b[:-1])[b[-1]] = vb, va
        elif op == 2:
            parent = _at(doc, a[:-1])
            if isinstance(parent, list) and parent:
                parent.extend(json.loads(json.dumps(parent[0], default=_hex)) if json_mode else parent[0]
                              for _ in range(rng.randrange(1, 30)))
        elif isinstance(_at(doc, a[:-1]), dict) and len(a) > 1:
            del _at(doc, a[:-1])[a[-1]]
    return doc


def _fields(path: tuple[Any, ...]) -> tuple[str, ...]:
    """The field names along ``path``, list indexes left out: equal for values of one message type."""
    return tuple(k for k in path if isinstance(k, str))


def _hex(b: bytes) -> str:
    return b.hex()


def render(doc: dict[str, Any], encoding: str) -> bytes:
    """The export as OTLP/JSON (hex IDs) or protobuf (via the canonical JSON mapping, base64 IDs)."""
    if encoding == JSON:
        return json.dumps(doc, default=_hex).encode()
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def b64(o: Any) -> Any:
        if isinstance(o, bytes):
            return base64.b64encode(o).decode()
        if isinstance(o, dict):
            return {k: b64(v) for k, v in o.items()}
        if isinstance(o, list):
            return [b64(v) for v in o]
        return o

    req = json_format.ParseDict(b64(doc), ExportTraceServiceRequest(), max_recursion_depth=1000)
    return bytes(req.SerializeToString())


def flip(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(4)
        if op == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            del out[rng.randrange(len(out)):]
        elif op == 2:
            out[rng.randrange(len(out) + 1):0] = rng.choice([b"\xed\xa0\x80", b"\xff", b"\x00", b"\\u", b'"', b"["])
        else:
            out.insert(rng.randrange(len(out) + 1), rng.randrange(256))
    return bytes(out)


_BOMB: list[bytes] = []
_RENDERED: dict[tuple[int, str], bytes] = {}


def fixture_body(rng: random.Random, fixtures: list[dict[str, Any]], encoding: str) -> bytes:
    """A recorded export, unchanged, in ``encoding`` (rendered once)."""
    i = rng.randrange(len(fixtures))
    key = (i, encoding)
    if key not in _RENDERED:
        _RENDERED[key] = render(fixtures[i], encoding)
    return _RENDERED[key]


def bomb() -> bytes:
    """64 MiB of zeros, gzipped (about 64 KiB)."""
    if not _BOMB:
        _BOMB.append(gzip.compress(bytes(64 << 20), 9))
    return _BOMB[0]


@dataclass
class Body:
    raw: bytes
    content_type: str
    content_encoding: str | None
    #: the uncompressed payload, when the encoding is one the receiver accepts and gzip is intact
    plain: bytes | None


def body(rng: random.Random, fixtures: list[dict[str, Any]]) -> Body:
    """One fuzz body."""
    encoding = PB if rng.random() < 0.5 else JSON
    json_mode = encoding == JSON
    r = rng.random()
    if r < 0.45:
        raw = render(random_export(rng, json_mode), encoding)
    elif r < 0.75:
        doc = mutate_doc(rng, json.loads(json.dumps(rng.choice(fixtures), default=_hex)) if json_mode
                         else _deep_copy(rng.choice(fixtures)), json_mode)
        raw = render(doc, encoding)
    elif r < 0.9:
        raw = flip(rng, fixture_body(rng, fixtures, encoding) if rng.random() < 0.5 else render(random_export(rng, json_mode), encoding))
    elif r < 0.93:
        raw = b"[" * 5000 + b"]" * 5000 if json_mode else rng.randbytes(rng.randrange(0, 500))
    elif r < 0.95:
        return Body(fixture_body(rng, fixtures, encoding), rng.choice(BAD_TYPES), None, None)
    elif r < 0.97:
        return Body(fixture_body(rng, fixtures, encoding), encoding, rng.choice(BAD_ENCODINGS), None)
    elif r < 0.98:
        return Body(bomb(), encoding, "gzip", None)
    else:  # broken gzip: truncated or flipped
        z = gzip.compress(fixture_body(rng, fixtures, encoding))
        return Body(z[: rng.randrange(len(z))] if rng.random() < 0.5 else flip(rng, z), encoding, "gzip", None)
    ctype = encoding + rng.choice(["", "; charset=utf-8"]) if encoding == JSON else rng.choice([PB, "application/protobuf"])
    if rng.random() < 0.3:
        return Body(gzip.compress(raw, 1), ctype, rng.choice(["gzip", "GZIP", " gzip "]), raw)
    return Body(raw, ctype, rng.choice([None, "identity"]), raw)


def _deep_copy(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _deep_copy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_deep_copy(v) for v in doc]
    return doc


def spans_in(plain: bytes | None, encoding: str | None) -> int | None:
    """Spans an uncompressed body holds if it is a readable export, else None (parsed independently)."""
    if plain is None or encoding is None:
        return None
    if encoding == PB:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(plain)
        except (DecodeError, RuntimeError):
            return None
        return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    try:
        doc = json.loads(plain)
    except (ValueError, RecursionError):
        return None

    def lst(o: Any, camel: str, snake: str) -> list[Any] | None:
        v = o.get(camel)
        v = o.get(snake) if v is None else v
        v = v or []
        return v if isinstance(v, list) else None

    if not isinstance(doc, dict) or (groups := lst(doc, "resourceSpans", "resource_spans")) is None:
        return None
    n = 0
    for rs in groups:
        if not isinstance(rs, dict):
            return None
        res = rs.get("resource") or {}
        attrs = res.get("attributes") if isinstance(res, dict) else None
        if attrs is not None and (not isinstance(attrs, list)
                                  or not all(isinstance(kv, dict) and isinstance(kv.get("key"), str) for kv in attrs)):
            return None
        if (scopes := lst(rs, "scopeSpans", "scope_spans")) is None:
            return None
        for ss in scopes:
            if not isinstance(ss, dict) or (spans := lst(ss, "spans", "spans")) is None:
                return None
            n += len(spans)
    return n


def parse_answer(status: int, ctype: str, data: bytes) -> int | str:
    """``rejected_spans`` of a 200 answer, or the google.rpc.Status message of an error; raises if unparseable."""
    from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    is_json = ctype.split(";")[0].strip() == JSON
    if status == 200:
        if is_json:
            doc = json.loads(data)
            return int(doc.get("partialSuccess", {}).get("rejectedSpans", 0))
        resp = ExportTraceServiceResponse()
        resp.ParseFromString(data)
        return resp.partial_success.rejected_spans
    if is_json:
        doc = json.loads(data)
        if not isinstance(doc.get("code"), int) or not isinstance(doc.get("message"), str):
            raise ValueError(f"not a Status: {doc}")
        return str(doc["message"])
    st = Status()
    st.ParseFromString(data)
    if not st.code:
        raise ValueError("Status without a code")
    return str(st.message)
