"""The HTTP JSON form of events (``POST /v1/events`` and ``POST /v1/labels``).

For servers that cannot import the SDK (other languages, Triton, vLLM).
Each JSON event becomes the same tuple the wire decoder returns
(``inferwatch._wire`` EV_* layouts), so aggregation and the components see
one format. Features are turned into the decoded form ``(Schema, numeric
values, categorical values)`` with :class:`inferwatch._wire.Schema` objects
cached by feature-name tuple.

A bad event is rejected alone and counted by reason; the rest of the body
is accepted. :class:`JsonIngest` is what the HTTP routes call: body bytes in,
events into the pipeline, an answer out.
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
from typing import Any

from inferwatch._wire import (
    EV_BATCH,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    KIND_NUMERIC,
    MAX_FEATURES,
    MAX_REQUEST_ID,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    Schema,
    classify,
)
from inferwatch_sidecar.ingest.pipeline import Pipeline

_OUTCOMES = {"ok": OUTCOME_OK, "error": OUTCOME_ERROR, "cancelled": OUTCOME_CANCELLED}
_TRACE = re.compile(r"^[0-9a-f]{32}$")
_MAX_STR = 255
_MAX_GAPS = 1024


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


def _str(ev: dict[str, Any], key: str, default: str | None = None, limit: int = _MAX_STR) -> str | None:
    v = ev.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise BadEvent("bad_value", f"{key} must be a string")
    if len(v) > limit:
        raise BadEvent("bad_value", f"{key} is longer than {limit} characters")
    return v


def _seconds(ev: dict[str, Any], key: str, required: bool) -> float | None:
    v = ev.get(key)
    if v is None:
        if required:
            raise BadEvent("missing_field", f"{key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise BadEvent("bad_value", f"{key} must be a finite number of seconds >= 0")
    return float(v)


def _count(ev: dict[str, Any], key: str, required: bool = True) -> int | None:
    v = ev.get(key)
    if v is None:
        if required:
            raise BadEvent("missing_field", f"{key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFFFFFFFF:
        raise BadEvent("bad_value", f"{key} must be an integer from 0 to 2^32-1")
    return v


def _ns(s: float) -> int:
    return min(int(s * 1e9), 0xFFFFFFFFFFFFFFFF)


def _stage(name: Any, spec: Any) -> tuple[Any, ...]:
    if not isinstance(name, str) or not name or len(name) > _MAX_STR:
        raise BadEvent("bad_value", "stage name must be a non-empty string")
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return (name, _ns(_seconds({"duration_s": spec}, "duration_s", True) or 0.0), None)
    if not isinstance(spec, dict):
        raise BadEvent("bad_value", f"stage {name!r} must be a number of seconds or an object")
    dur = _seconds(spec, "duration_s", True) or 0.0
    ttft = _seconds(spec, "ttft_s", False)
    stream = None
    if ttft is not None or "items" in spec or "gaps_s" in spec:
        items = _count(spec, "items", required=False) or 0
        gaps_in = spec.get("gaps_s") or []
        if not isinstance(gaps_in, list):
            raise BadEvent("bad_value", "gaps_s must be a list of seconds")
        gaps = []
        for g in gaps_in[:_MAX_GAPS]:
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
                raise BadEvent("bad_value", "gaps_s must hold finite numbers >= 0")
            gaps.append(min(int(g * 1e6), 0xFFFFFFFF))
        stream = (_ns(ttft or 0.0), items, tuple(gaps))
    return (name, _ns(dur), stream)


def _value(ev: dict[str, Any], key: str) -> Any:
    v = ev.get(key)
    if v is None or isinstance(v, str):
        return v[:_MAX_STR] if isinstance(v, str) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadEvent("bad_value", f"{key} must be a string, a finite number or null")
    return float(v)


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
        end = ev.get("time_unix_s")
        if end is None:
            end_ns = now
        else:
            if isinstance(end, bool) or not isinstance(end, (int, float)) or not math.isfinite(end) or end < 0:
                raise BadEvent("bad_value", "time_unix_s must be a Unix time in seconds")
            end_ns = int(end * 1e9)
        if t == "request":
            dur = _seconds(ev, "duration_s", True) or 0.0
            outcome = _OUTCOMES.get(ev.get("outcome", "ok"))  # type: ignore[arg-type]
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
            if conf is not None and (isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf)):
                raise BadEvent("bad_value", "confidence must be a finite number or null")
            feats = self._features(ev.get("features"))
            return (EV_RECORD, ctx, end_ns, rid, _value(ev, "prediction"),
                    None if conf is None else float(conf), _value(ev, "label"), feats)
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
            c = classify(value)
            if c is None:
                raise BadEvent("bad_value", f"feature {name!r} must be a finite number, a string or null")
            kind, v = c
            key.append((name, kind))
            if kind == KIND_NUMERIC:
                nums.append(v)
            else:
                cats.append(v[:_MAX_STR])
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
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            pipeline.count_error("json", "bad_json")
            return 400, {"error": f"body is not JSON: {e}"}
        try:
            records, errors, extra = self.decoder.labels(doc) if kind == "labels" else self.decoder.events(doc)
        except BadEvent as e:
            pipeline.count_error("json", e.reason)
            return 400, {"error": e.detail}
        for reason, n in errors.items():
            pipeline.count_error("json", reason, n)
        if extra:
            pipeline.count_drop("too_many_events", extra)
            errors["too_many_events"] = extra
        pipeline.events(records, "http")
        return 200, {"accepted": len(records), "rejected": sum(errors.values()), "errors": errors}
