"""Fuzz the OTLP trace receiver (``POST /v1/traces``) and check that every span is accounted for.

Seeded bodies: structurally valid random exports (resource, scope and span
attributes of every ``AnyValue`` kind, IDs of wrong lengths, times out of order
or past 64 bits, huge values, deep kvlist/array nesting, lone surrogates in
JSON) and mutations of the recorded Triton and vLLM exports (field swaps, byte
flips, truncation), as protobuf and OTLP/JSON, with and without gzip (gzip
bombs and broken streams included), plus wrong content types and encodings.
They go through the daemon's :class:`TraceReceiver` in-process and, a bounded
number, over HTTP to a real sidecar subprocess on loopback.

For every body the answer must be 200 with a parseable
``ExportTraceServiceResponse`` (its ``rejected_spans`` equal to the spans the
body had rejected), or 400/413/415 with a parseable ``google.rpc.Status``. A body
that decodes must move ``inferwatch_otlp_spans_total`` plus the pending gauge by
exactly the spans it holds (counted here with an independent parse); one that
does not must move ``inferwatch_ingest_decode_errors_total{scope="otlp"}`` by
one and no span count. Afterwards ``/metrics`` must render as Prometheus text
and OpenMetrics and convert to OTLP.

With ``--attacks N`` it also sends the issue-28 attacks (join-buffer bombs, a parent-cycle trace,
new label values in every export, JSON container bombs) and checks the join buffer's byte and
per-trace bounds and the series budget after every export (:func:`attacks`).

Usage:
    .venv/bin/python scripts/fuzz_otlp.py --count 20000 [--seed 1] [--http 500] [--attacks 400]

Prints the inputs tried, crashes, unaccounted items and RSS before/after; exits 1
unless crashes and unaccounted are both 0. The test suite runs the same checks
on a bounded count (``tests/traces/test_fuzz_otlp.py``).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import logging
import os
import random
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch_sidecar.demo.supervise import Process, child_env, wait_ready

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


@dataclass
class Tally:
    """What a fuzz run saw."""

    inputs: int = 0
    spans: int = 0
    answered: dict[int, int] = field(default_factory=dict)
    rejected_spans: int = 0
    crashes: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)

    def check(self, b: Body, status: int, ctype: str, data: bytes) -> tuple[int | None, int]:
        """Check one answer; returns (spans the body holds if it decoded, rejected spans answered)."""
        self.inputs += 1
        self.answered[status] = self.answered.get(status, 0) + 1
        where = f"body #{self.inputs} ({b.content_type!r}, {b.content_encoding!r}, {len(b.raw)} bytes, {b.raw[:60]!r})"
        from inferwatch_sidecar.ingest.otlp_traces.decode import media_type

        n = spans_in(b.plain, media_type(b.content_type))
        if status not in (200, 400, 413, 415):
            self.crashes.append(f"{where}: answered {status} {data[:200]!r}")
            return None, 0
        try:
            answer = parse_answer(status, ctype, data)
        except Exception as e:
            self.crashes.append(f"{where}: answer {status} does not parse ({type(e).__name__}: {e}): {data[:200]!r}")
            return None, 0
        if status == 200:
            if n is None:
                self.unaccounted.append(f"{where}: answered 200 for a body that does not decode")
                return None, 0
            self.spans += n
            self.rejected_spans += int(answer)
            return n, int(answer)
        if n is not None:
            self.unaccounted.append(f"{where}: a readable export of {n} spans answered {status} {answer!r:.200}")
        return None, 0

    def report(self, label: str) -> str:
        return (f"{label}: inputs tried {self.inputs}, answers {dict(sorted(self.answered.items()))}, spans in "
                f"decoded bodies {self.spans} (rejected in answers {self.rejected_spans}), crashes "
                f"{len(self.crashes)}, unaccounted {len(self.unaccounted)}")


def rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def make_sidecar() -> Any:
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.daemon import Sidecar

    return Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False}}))


def _span_total(s: Any) -> int:
    m = s.traces.mapper
    return int(sum(m.counts.values()) + m.pending)


def _otlp_errors(s: Any) -> int:
    return sum(n for (scope, _), n in s.pipeline.decode_errors.items() if scope == "otlp")


def in_process(count: int, seed: int) -> Tally:
    """Fuzz the daemon's :class:`TraceReceiver` in this process, checking its counters after every body."""
    s = make_sidecar()
    rng = random.Random(seed)
    fixtures = _fixture_docs()
    tally = Tally()
    errors = _ErrorLog()
    logging.getLogger().addHandler(errors)
    try:
        _feed(s, rng, fixtures, tally, count)
    finally:
        logging.getLogger().removeHandler(errors)
    s.traces.flush()
    if _span_total(s) != tally.spans or s.traces.mapper.pending:
        tally.unaccounted.append(f"after flush: {_span_total(s)} spans counted, {tally.spans} sent in decoded bodies")
    internal = {k: n for k, n in s.pipeline.decode_errors.items() if k[1] == "internal_error"}
    if internal:
        tally.crashes.append(f"events the aggregator could not use: {internal}")
    tally.crashes.extend(f"logged: {m}" for m in errors.messages[:5])
    tally.crashes.extend(exposition_failures(s))
    return tally


class _ErrorLog(logging.Handler):
    """Collects ERROR records: the pipeline logs (and counts) an event it could not aggregate, then carries on."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.messages.append(f"{record.getMessage()}: {type(exc).__name__}: {exc}" if exc else record.getMessage())


def _feed(s: Any, rng: random.Random, fixtures: list[dict[str, Any]], tally: Tally, count: int) -> None:
    for _ in range(count):
        b = body(rng, fixtures)
        spans0, err0, rej0 = _span_total(s), _otlp_errors(s), s.traces.mapper.counts
        rej0 = sum(v for (r, _), v in rej0.items() if r == "rejected")
        try:
            status, ctype, data = s.traces.handle(b.raw, b.content_type, b.content_encoding)
        except BaseException as e:  # noqa: BLE001 - a crash is what we are looking for
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({b.content_type!r}, {b.raw[:60]!r}): {type(e).__name__}: {e}")
            continue
        before = len(tally.crashes) + len(tally.unaccounted)
        n, rejected = tally.check(b, status, ctype, data)
        if len(tally.crashes) + len(tally.unaccounted) > before:
            continue
        moved_spans, moved_err = _span_total(s) - spans0, _otlp_errors(s) - err0
        moved_rej = sum(v for (r, _), v in s.traces.mapper.counts.items() if r == "rejected") - rej0
        want = (n, 0, rejected) if n is not None else (0, 1, 0)
        if (moved_spans, moved_err, moved_rej) != want:
            tally.unaccounted.append(f"body #{tally.inputs} ({b.raw[:60]!r}): answered {status}, spans counted "
                                     f"+{moved_spans}, decode errors +{moved_err}, rejected +{moved_rej}; want {want}")


def exposition_failures(s: Any) -> list[str]:
    """Render the sidecar's registry as Prometheus text, OpenMetrics and OTLP; one line per failure."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from inferwatch_sidecar.export.otlp.convert import families_to_request

    out = []
    for name, render_ in (("text", generate_latest), ("OpenMetrics", generate_openmetrics)):
        try:
            render_(s.registry)
        except Exception as e:
            out.append(f"{name} exposition failed: {type(e).__name__}: {e}")
    try:
        req, stats = families_to_request(s.collect(), {"service.name": "fuzz"}, now_s=time.time(), start_time_s=0.0)
        req.SerializeToString()
        if stats.dropped.get("family_error"):
            out.append(f"OTLP conversion dropped families: {stats.dropped}")
    except Exception as e:
        out.append(f"OTLP conversion failed: {type(e).__name__}: {e}")
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, b: Body) -> tuple[int, str, bytes]:
    headers = {"Content-Type": b.content_type}
    if b.content_encoding is not None:
        headers["Content-Encoding"] = b.content_encoding
    req = urllib.request.Request(url, data=b.raw, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def over_http(base_url: str, count: int, seed: int) -> tuple[Tally, int]:
    """Fuzz a running sidecar; returns the tally and the bodies answered with an error."""
    rng = random.Random(seed)
    fixtures = _fixture_docs()
    tally = Tally()
    errors = 0
    for _ in range(count):
        b = body(rng, fixtures)
        try:
            status, ctype, data = post(f"{base_url}/v1/traces", b)
        except OSError as e:
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({b.raw[:60]!r}): no answer: {e}")
            continue
        tally.check(b, status, ctype, data)
        errors += status != 200
    return tally, errors


def scrape_mismatches(base_url: str, tally: Tally, errors: int) -> list[str]:
    """Scrape /metrics (text and OpenMetrics) and compare the OTLP counters with the answers."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    text = ""
    for accept in ("text/plain", "application/openmetrics-text"):
        req = urllib.request.Request(base_url + "/metrics", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                if accept == "text/plain":
                    text = r.read().decode()
        except urllib.error.HTTPError as e:
            out.append(f"/metrics ({accept}) answered {e.code}: {e.read()[:200]!r}")
    spans = decode_errors = 0.0
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in ("inferwatch_otlp_spans_total", "inferwatch_otlp_pending_spans"):
                spans += smp.value
            elif smp.name == "inferwatch_ingest_decode_errors_total" and smp.labels["scope"] == "otlp":
                decode_errors += smp.value
    if spans != tally.spans:
        out.append(f"inferwatch_otlp_spans_total + pending = {spans}, spans in decoded bodies {tally.spans}")
    if decode_errors != errors:
        out.append(f"decode errors (scope=otlp) = {decode_errors}, bodies answered with an error {errors}")
    return out


def run_sidecar(tmp: str, port: int) -> Process:
    """Start ``inferwatch sidecar`` on loopback and wait until it is ready."""
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    proc = Process(
        "sidecar",
        [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--socket", os.path.join(tmp, "s.sock"),
         "--http-port", str(port), "--no-gpu", "--no-drift", "--set", "traces.join_timeout_s=600"],
        env, Path(tmp) / "sidecar.log",
    )
    wait_ready(proc, f"http://127.0.0.1:{port}/readyz", time.monotonic() + 20)
    return proc


def run_http(count: int, seed: int) -> tuple[Tally, tuple[int, int]]:
    """Fuzz a fresh sidecar subprocess; returns the tally and its RSS (KiB) before and after."""
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = run_sidecar(tmp, port)
        try:
            base = f"http://127.0.0.1:{port}"
            rss0 = rss_kib(proc.p.pid)
            tally, errors = over_http(base, count, seed)
            tally.unaccounted.extend(scrape_mismatches(base, tally, errors))
            rss1 = rss_kib(proc.p.pid)
        finally:
            proc.stop(15)
    return tally, (rss0, rss1)


def _pb_span(trace: int, sid: int, parent: int, kind: int, name: str, attrs: list[tuple[str, Any]],
             events: int) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    sp = Span(trace_id=trace.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
              parent_span_id=parent.to_bytes(8, "big") if parent else b"", name=name, kind=kind,  # type: ignore[arg-type]
              start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_000_001_000_000)
    for k, v in attrs:
        val = AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=str(v))
        sp.attributes.append(KeyValue(key=k, value=val))
    for _ in range(events):
        e = sp.events.add()
        e.name = "e"
        e.time_unix_nano = 1_700_000_000_000_500_000
    return sp


def _pb_export(spans: list[Any], service: str = "svc") -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def attacks(count: int, seed: int) -> list[str]:
    """The issue-28 attacks, ``count`` exports in all, through one receiver; one line per bound broken.

    Join-buffer bombs (big keys, many attributes and events, requests that never come), stage
    spans in a parent cycle with requests touching their trace, the cardinality attack (new
    models, stages and error types in every export) and JSON container bombs, in seeded random
    order. Checked after every export: the join buffer within ``traces.max_pending_bytes`` and
    ``max_spans_per_trace``, the request/stage series within ``labels.max_series``, every span
    counted once, and afterwards the exposition renders within the whole-exposition budget.
    """
    import gzip

    s = make_sidecar()
    r, agg, cfg = s.traces, s.aggregator, s.cfg
    rng = random.Random(seed)
    broken: list[str] = []
    sent = 0
    cycle_trace = rng.randrange(1, 1 << 100)
    for i in range(count):
        kind = rng.randrange(4)
        spans0 = _span_total(s)
        if kind == 0:
            key = "k" * rng.choice((300, 10_000, 200_000))
            sp = _pb_span(rng.randrange(1, 1 << 120), rng.randrange(1, 1 << 60), 99, 1, "stage",
                          [("gen_ai.operation.name", "chat"), (key, "v")]
                          + [(f"a{j}", "x" * 255) for j in range(rng.randrange(0, 400))], rng.randrange(0, 3000))
            raw, n = gzip.compress(_pb_export([sp])), 1
            status = r.handle(raw, "application/x-protobuf", "gzip")[0]
        elif kind == 1:
            n = rng.randrange(1, 400)
            raw = _pb_export([_pb_span(cycle_trace, rng.randrange(1 << 16, 1 << 60), 1 + rng.randrange(64), 1,
                                       "stage", [("gen_ai.operation.name", "op")], 0) for _ in range(n)])
            raw += _pb_export([_pb_span(cycle_trace, rng.randrange(1 << 16, 1 << 60), rng.randrange(1, 80), 2,
                                        "req", [], 0)])  # two messages concatenated are one message
            n += 1
            status = r.handle(raw, "application/x-protobuf", None)[0]
        elif kind == 2:
            k = rng.randrange(1 << 40)
            spans = [_pb_span(k + 1, 1, 0, 2, "req", [("gen_ai.request.model", f"model{k}"),
                                                       ("http.response.status_code", 500 + k % 99)], 0)]
            spans += [_pb_span(k + 1, 2 + j, 1, 1, "op", [("gen_ai.operation.name", f"stage{k}-{j}")], 0)
                      for j in range(rng.randrange(1, 60))]
            raw, n = _pb_export(spans[1:] + spans[:1], service=f"svc{k % 500}"), len(spans)
            status = r.handle(raw, "application/x-protobuf", None)[0]
        else:
            raw = b'{"resourceSpans":[' + b"{}," * rng.randrange(10_000, 1_500_000) + b"{}]}"
            n = 0
            status = r.handle(raw, "application/json", None)[0]
        sent += n if status == 200 else 0
        m = r.mapper
        if m.nbytes > m.max_pending_bytes:
            broken.append(f"export {i}: join buffer {m.nbytes} B > {m.max_pending_bytes}")
        if any(len(e.parents) > m.max_spans_per_trace for e in m.traces.values()):
            broken.append(f"export {i}: a trace remembers more than {m.max_spans_per_trace} spans")
        if agg.series > cfg.labels.max_series:
            broken.append(f"export {i}: {agg.series} series > labels.max_series {cfg.labels.max_series}")
        if status == 200 and _span_total(s) - spans0 != n:
            broken.append(f"export {i}: {n} spans sent, {_span_total(s) - spans0} counted")
        if status not in (200, 413):
            broken.append(f"export {i}: answered {status}")
    s.traces.flush()
    if _span_total(s) != sent:
        broken.append(f"{_span_total(s)} spans counted, {sent} sent in accepted exports")
    from prometheus_client.exposition import generate_latest

    text = generate_latest(s.exposition).decode()  # type: ignore[arg-type]
    samples = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    if samples > cfg.labels.max_exposition_series + 500:  # the core families outside the budgeted view's cut
        broken.append(f"/metrics has {samples} samples > labels.max_exposition_series")
    broken.extend(exposition_failures(s))
    return broken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", type=int, default=0, metavar="N",
                    help="also send N exports of the issue-28 attacks (join, cardinality, byte-budget) and check "
                    "the bounds after each")
    ap.add_argument("--count", type=int, default=20_000, help="bodies through the receiver in-process")
    ap.add_argument("--http", type=int, default=500, help="bodies over HTTP to a real sidecar (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rss0 = rss_kib()
    tally = in_process(args.count, args.seed)
    print(tally.report("in-process") + f" ({time.monotonic() - t0:.1f} s); RSS {rss0 // 1024} MiB -> "
          f"{rss_kib() // 1024} MiB")
    bad = tally.crashes + tally.unaccounted
    if args.http:
        t0 = time.monotonic()
        h, (r0, r1) = run_http(args.http, args.seed + 1)
        print(h.report("over HTTP") + f" ({time.monotonic() - t0:.1f} s); sidecar RSS {r0 // 1024} MiB -> "
              f"{r1 // 1024} MiB")
        bad += h.crashes + h.unaccounted
    if args.attacks:
        t0 = time.monotonic()
        broken = attacks(args.attacks, args.seed + 2)
        print(f"attacks: {args.attacks} exports, {len(broken)} bounds broken ({time.monotonic() - t0:.1f} s); "
              f"RSS {rss_kib() // 1024} MiB")
        bad += broken
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
