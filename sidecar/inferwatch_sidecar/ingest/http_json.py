"""The HTTP JSON form of events (``POST /v1/events`` and ``POST /v1/labels``).

For servers that cannot import the SDK (other languages, Triton, vLLM).
Each JSON event becomes the same tuple the wire decoder returns
(``inferwatch.wire`` EV_* layouts), so aggregation and the components see
one format. Features are turned into the decoded form ``(Schema, numeric
values, categorical values)`` with :class:`inferwatch.wire.Schema` objects
cached by feature-name tuple.

A bad event is rejected alone and counted by reason; the rest of the body
is accepted. :class:`JsonIngest` is what the HTTP routes call: body bytes in,
events into the pipeline, an answer out.

Every string taken from a body must be exportable text. JSON can carry a lone
UTF-16 surrogate (``"\\ud800"``, or the raw bytes ``ED A0 80``, which
``json.loads`` decodes with ``surrogatepass``); no UTF-8 encoder accepts one, so
as a label value it would break every later scrape (prometheus_client's text
and OpenMetrics exposition) and the OTLP push (protobuf). Those three accept
every other code point, control characters and NUL included, and so do
Prometheus's own parsers, so a lone surrogate is the one thing rejected
(``bad_string``, the wire decoder's reason for text that is not UTF-8).
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
import time
from typing import Any

from inferwatch.wire import (
    EV_BATCH,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    KIND_NUMERIC,
    MAX_FEATURES,
    MAX_REQUEST_ID,
    OUTCOME_CANCELLED,
    OUTCOME_CLIENT_ERROR,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_SHED,
    Schema,
    classify,
)
from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.ingest.pipeline import Pipeline

log = logging.getLogger("inferwatch.sidecar.ingest")

_OUTCOMES = {"ok": OUTCOME_OK, "error": OUTCOME_ERROR, "cancelled": OUTCOME_CANCELLED,
             "client_error": OUTCOME_CLIENT_ERROR, "shed": OUTCOME_SHED}
_TRACE = re.compile(r"^[0-9a-f]{32}$")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_STR = 255
_MAX_GAPS = 1024
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
#: The largest number of seconds the wire's u64 nanoseconds hold (about 584 years).
_MAX_SECONDS = _U64 / 1e9
#: Body-level reasons (the whole body is unusable and is counted once), as opposed to per-event ones.
BODY_REASONS = ("bad_json", "too_deep", "bad_body")


def _parse_int(digits: str) -> int | float:
    """``json.loads``'s ``parse_int``: integers past 19 digits become floats.

    Python refuses to convert more than 4300 digits to an int (ValueError for
    the whole body) and a float cannot hold an int past about 1.8e308
    (OverflowError where it is converted). Every field that takes a number is
    either a count below 2^32 or a float, so nothing that fits loses meaning,
    and a longer run of digits becomes a large float or inf, which the field's
    own check rejects alone.
    """
    return int(digits) if len(digits) < 20 else float(digits)


class BadEvent(Exception):
    """One JSON event that cannot be used; ``reason`` is a bounded label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SchemaCache:
    """Schemas for JSON feature sets, keyed by ((name, kind), ...). Bounded."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._cache: dict[tuple[tuple[str, int], ...], Schema] = {}

    def get(self, key: tuple[tuple[str, int], ...]) -> Schema:
        s = self._cache.get(key)
        if s is None:
            if len(self._cache) >= self.limit:
                self._cache.clear()
            nums = tuple(n for n, k in key if k == KIND_NUMERIC)
            cats = tuple(n for n, k in key if k != KIND_NUMERIC)
            s = Schema(0, nums, cats, struct.Struct(f"<{len(nums)}d"), struct.Struct(f"<{len(cats)}H"))
            self._cache[key] = s
        return s


def _text(v: str, what: str) -> str:
    """``v`` if it is exportable text; see the module docstring."""
    if not v.isascii() and _SURROGATE.search(v):
        raise BadEvent("bad_string", f"{what} holds a lone UTF-16 surrogate, which is not valid UTF-8 text")
    return v


def _real(v: Any) -> float | None:
    """``v`` as a finite float, or None for anything else (bool, inf, nan, an int past float range)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _str(ev: dict[str, Any], key: str, default: str | None = None, limit: int = _MAX_STR) -> str | None:
    v = ev.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise BadEvent("bad_value", f"{key} must be a string")
    if len(v) > limit:
        raise BadEvent("bad_value", f"{key} is longer than {limit} characters")
    return _text(v, key)


def _seconds(ev: dict[str, Any], key: str, required: bool) -> float | None:
    v = ev.get(key)
    if v is None:
        if required:
            raise BadEvent("missing_field", f"{key} is required")
        return None
    f = _real(v)
    if f is None or not 0 <= f <= _MAX_SECONDS:
        raise BadEvent("bad_value", f"{key} must be a number of seconds from 0 to {_MAX_SECONDS:.3g}")
    return f


def _count(ev: dict[str, Any], key: str, required: bool = True) -> int | None:
    v = ev.get(key)
    if v is None:
        if required:
            raise BadEvent("missing_field", f"{key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32:
        raise BadEvent("bad_value", f"{key} must be an integer from 0 to 2^32-1")
    return v


def _ns(s: float) -> int:
    """Seconds (at most ``_MAX_SECONDS``, checked by :func:`_seconds`) as u64 nanoseconds."""
    return min(int(s * 1e9), _U64)


def _stage(name: Any, spec: Any) -> tuple[Any, ...]:
    if not isinstance(name, str) or not name or len(name) > _MAX_STR:
        raise BadEvent("bad_value", "stage name must be a non-empty string")
    _text(name, "stage name")
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return (name, _ns(_seconds({"duration_s": spec}, "duration_s", True) or 0.0), None)
    if not isinstance(spec, dict):
        raise BadEvent("bad_value", f"stage {name!r} must be a number of seconds or an object")
    dur = _seconds(spec, "duration_s", True) or 0.0
    ttft = _seconds(spec, "ttft_s", False)
    stream: tuple[Any, ...] | None = None
    cancelled = spec.get("cancelled", False)
    if not isinstance(cancelled, bool):
        raise BadEvent("bad_value", "cancelled must be true or false")
    if "undelivered" in spec and not cancelled:
        raise BadEvent("bad_value", "undelivered needs cancelled: true")
    if ttft is not None or "items" in spec or "gaps_s" in spec or cancelled:
        items = _count(spec, "items", required=False) or 0
        gaps_in = spec.get("gaps_s") or []
        if not isinstance(gaps_in, list):
            raise BadEvent("bad_value", "gaps_s must be a list of seconds")
        gaps = []
        for g in gaps_in[:_MAX_GAPS]:
            f = _real(g)
            if f is None or f < 0:
                raise BadEvent("bad_value", "gaps_s must hold finite numbers >= 0")
            # The wire holds a gap as u32 microseconds: longer gaps are clamped (min before int: no overflow).
            gaps.append(int(min(f * 1e6, _U32)))
        stream = (_ns(ttft or 0.0), items, tuple(gaps))
        if cancelled:
            # A cancelled stream (the SDK's form): the items produced after the client had gone.
            undelivered = _count(spec, "undelivered", required=False) or 0
            if undelivered > items:
                raise BadEvent("bad_value", "undelivered cannot exceed items")
            stream = (*stream, undelivered)
    return (name, _ns(dur), stream)


def _value(ev: dict[str, Any], key: str) -> Any:
    v = ev.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        return _text(v[:_MAX_STR], key)
    f = _real(v)
    if f is None:
        raise BadEvent("bad_value", f"{key} must be a string, a finite number or null")
    return f


class JsonDecoder:
    """Turns JSON bodies into event tuples.

    Args:
        max_events: most events accepted from one body.
        clock_ns: wall-clock nanoseconds (injectable for tests).
    """

    def __init__(self, max_events: int = 10000, clock_ns: Any = time.time_ns) -> None:
        self.max_events = max_events
        self.clock_ns = clock_ns
        self.schemas = SchemaCache()
        #: Events that raised something other than BadEvent (a decoder bug), for the log's rate limit.
        self.internal_errors = 0

    def events(self, body: Any) -> tuple[list[tuple[Any, ...]], dict[str, int], int]:
        """Decode a ``/v1/events`` body.

        Returns:
            ``(records, errors by reason, too_many)``: the accepted event
            tuples, rejected events counted by reason, and how many events
            past ``max_events`` were ignored.

        Raises:
            BadEvent: the body itself is unusable (not an object with an ``events`` list).
        """
        if isinstance(body, list):
            body = {"events": body}
        if not isinstance(body, dict) or not isinstance(body.get("events"), list):
            raise BadEvent("bad_body", 'expected {"events": [...]} (see docs/wire-format.md)')
        events = body["events"]
        extra = max(0, len(events) - self.max_events)
        defaults = {}
        for k in ("service", "model", "model_version"):
            try:
                defaults[k] = _str(body, k)
            except BadEvent as e:
                raise BadEvent("bad_body", e.detail) from None
        now = self.clock_ns()
        out: list[tuple[Any, ...]] = []
        errors: dict[str, int] = {}
        for ev in events[: self.max_events]:
            try:
                out.append(self._event(ev, defaults, now))
            except BadEvent as e:
                errors[e.reason] = errors.get(e.reason, 0) + 1
            except Exception:  # a decoder bug costs one event, never the body
                errors["internal_error"] = errors.get("internal_error", 0) + 1
                self.internal_errors += 1
                if self.internal_errors in (1, 10, 100, 1000) or self.internal_errors % 10000 == 0:
                    log.exception("JSON decoder failed on an event (%d times so far)", self.internal_errors)
        return out, errors, extra

    def labels(self, body: Any) -> tuple[list[tuple[Any, ...]], dict[str, int], int]:
        """Decode a ``/v1/labels`` body: ``{"labels": [{"request_id", "label"}, ...]}``."""
        if isinstance(body, list):
            body = {"labels": body}
        if not isinstance(body, dict) or not isinstance(body.get("labels"), list):
            raise BadEvent("bad_body", 'expected {"labels": [{"request_id": ..., "label": ...}, ...]}')
        items = [dict(x, type="label") if isinstance(x, dict) else x for x in body["labels"]]
        return self.events({k: v for k, v in body.items() if k != "labels"} | {"events": items})

    def _ctx(self, ev: dict[str, Any], defaults: dict[str, str | None]) -> tuple[str | None, ...]:
        return (
            _str(ev, "service", defaults["service"]),
            _str(ev, "model", defaults["model"]),
            _str(ev, "model_version", defaults["model_version"]),
        )

    def _event(self, ev: Any, defaults: dict[str, str | None], now: int) -> tuple[Any, ...]:
        if not isinstance(ev, dict):
            raise BadEvent("not_an_object", "each event must be a JSON object")
        t = ev.get("type")
        ctx = self._ctx(ev, defaults)
        rid = _str(ev, "request_id", limit=MAX_REQUEST_ID)
        end = _seconds(ev, "time_unix_s", False)
        end_ns = now if end is None else _ns(end)
        if t == "request":
            dur = _seconds(ev, "duration_s", True) or 0.0
            o = ev.get("outcome", "ok")
            outcome = _OUTCOMES.get(o) if isinstance(o, str) else None
            if outcome is None:
                raise BadEvent("bad_value", "outcome must be ok, error or cancelled")
            err = _str(ev, "error_type")
            if outcome == OUTCOME_ERROR and err is None:
                err = "error"
            trace = None
            tid = ev.get("trace_id")
            if tid is not None:
                if not isinstance(tid, str) or not _TRACE.match(tid):
                    raise BadEvent("bad_value", "trace_id must be 32 lowercase hex digits")
                trace = bytes.fromhex(tid)
            stages_in = ev.get("stages") or {}
            if isinstance(stages_in, dict):
                stages = [_stage(k, v) for k, v in stages_in.items()]
            elif isinstance(stages_in, list):
                stages = []
                for s in stages_in:
                    if not isinstance(s, dict):
                        raise BadEvent("bad_value", "each stage must be an object")
                    stages.append(_stage(s.get("stage", s.get("name")), s))
            else:
                raise BadEvent("bad_value", "stages must be an object or a list")
            return (EV_REQUEST, ctx, end_ns, _ns(dur), outcome, err, rid, trace, stages[:255])
        if t == "stage":
            return (EV_STAGE, ctx, end_ns, rid, _stage(ev.get("stage"), ev))
        if t == "record":
            conf = ev.get("confidence")
            conf_f = None if conf is None else _real(conf)
            if conf is not None and conf_f is None:
                raise BadEvent("bad_value", "confidence must be a finite number or null")
            feats = self._features(ev.get("features"))
            return (EV_RECORD, ctx, end_ns, rid, _value(ev, "prediction"), conf_f, _value(ev, "label"), feats)
        if t == "label":
            if rid is None:
                raise BadEvent("missing_field", "a label needs the request_id of the prediction it labels")
            label = _value(ev, "label")
            if label is None:
                raise BadEvent("missing_field", "label is required")
            return (EV_RECORD, ctx, end_ns, rid, None, None, label, None)
        if t == "batch":
            return (EV_BATCH, ctx, _count(ev, "size"))
        if t == "queue":
            return (EV_QUEUE, ctx, _count(ev, "depth"))
        raise BadEvent("unknown_type", "type must be request, stage, record, label, batch or queue")

    def _features(self, feats: Any) -> tuple[Schema, tuple[float, ...], tuple[str | None, ...]] | None:
        if feats is None or feats == {}:
            return None
        if not isinstance(feats, dict):
            raise BadEvent("bad_value", "features must be an object of name -> number or string")
        if len(feats) > MAX_FEATURES:
            raise BadEvent("bad_value", f"at most {MAX_FEATURES} features per event")
        key: list[tuple[str, int]] = []
        nums: list[float] = []
        cats: list[str | None] = []
        for name, value in feats.items():
            if not name or len(name) > 64:
                raise BadEvent("bad_value", "feature names are 1 to 64 characters")
            _text(name, "a feature name")
            c = classify(value)
            if c is None:
                raise BadEvent("bad_value", f"feature {name!r} must be a finite number, a string or null")
            kind, v = c
            key.append((name, kind))
            if kind == KIND_NUMERIC:
                nums.append(v)
            else:
                cats.append(_text(v[:_MAX_STR], f"feature {name!r}"))
        schema = self.schemas.get(tuple(key))
        # Keep the wire's order: numeric values in schema.numeric order, categorical likewise.
        return (schema, tuple(nums), tuple(cats))


class JsonIngest:
    """JSON bodies into the pipeline, every outcome counted.

    Args:
        pipeline: where accepted events go, and where errors and drops are counted.
        decoder: turns a parsed body into event tuples.
    """

    def __init__(self, pipeline: Pipeline, decoder: JsonDecoder) -> None:
        self.pipeline = pipeline
        self.decoder = decoder

    def reject_body(self) -> None:
        """Count a body the HTTP layer refused for its length."""
        self.pipeline.count_drop("body_too_large")

    def post(self, kind: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """Decode and ingest one ``/v1/events`` (``kind="events"``) or ``/v1/labels`` (``"labels"``) body.

        Returns:
            The HTTP status and the JSON answer: 200 with accepted and
            rejected counts, or 400 with the reason the whole body is unusable.
        """
        pipeline = self.pipeline
        pipeline.add_bytes("http", len(body))
        PRIORITY.pause(ingest=True)
        try:
            doc = json.loads(body, parse_int=_parse_int)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            pipeline.count_error("json", "bad_json")
            return 400, {"error": f"body is not JSON: {e}", "reason": "bad_json"}
        except RecursionError:
            pipeline.count_error("json", "too_deep")
            return 400, {"error": "body is nested too deeply to parse", "reason": "too_deep"}
        try:
            records, errors, extra = self.decoder.labels(doc) if kind == "labels" else self.decoder.events(doc)
        except BadEvent as e:
            pipeline.count_error("json", e.reason)
            return 400, {"error": e.detail, "reason": e.reason}
        for reason, n in errors.items():
            pipeline.count_error("json", reason, n)
        if extra:
            pipeline.count_drop("too_many_events", extra)
            errors["too_many_events"] = extra
        pipeline.events(records, "http")
        return 200, {"accepted": len(records), "rejected": sum(errors.values()), "errors": errors}
