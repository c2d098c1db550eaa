"""OTLP trace bodies under hostile input: every body answered, every span accounted for, /metrics intact.

The fuzz tests are bounded versions of ``scripts/fuzz_otlp.py``; the others pin
what that fuzzing found, each on the smallest body that showed it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from inferwatch_sidecar.export.otlp.convert import families_to_request
from tests.helpers.imports import load_file
from tests.helpers.paths import REPO
from tests.ingest.otlp_traces.spans import export, span
from tests.ingest.otlp_traces.test_receiver import make

JSON = "application/json"
TRACE = "0123456789abcdef0123456789abcdef"
T0 = 1_700_000_000_000_000_000


fuzz = load_file(REPO / "scripts" / "fuzz_otlp.py")


def json_span(sid: str = "0123456789abcdef", start: Any = T0, end: Any = T0 + 10**6, kind: int = 2,
              attrs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"traceId": TRACE, "spanId": sid, "kind": kind, "name": "x", "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end), "attributes": attrs or []}


def json_export(spans: list[dict[str, Any]], resource: list[dict[str, Any]] | None = None) -> bytes:
    doc = {"resourceSpans": [{"resource": {"attributes": resource or []}, "scopeSpans": [{"spans": spans}]}]}
    return json.dumps(doc).encode()


def spans_counted(s: Any) -> dict[tuple[str, str], int]:
    return {k: n for k, n in s.traces.mapper.counts.items() if n}


def otlp_errors(s: Any) -> dict[str, int]:
    return {r: n for (scope, r), n in s.pipeline.decode_errors.items() if scope == "otlp"}


def exports_ok(s: Any) -> None:
    """Text, OpenMetrics and the OTLP conversion all succeed, every family converted."""
    generate_latest(s.registry)
    generate_openmetrics(s.registry)
    req, stats = families_to_request(s.collect(), {"service.name": "t"}, now_s=time.time(), start_time_s=0.0)
    req.SerializeToString()
    assert not stats.dropped.get("family_error"), stats.dropped


def test_a_double_attribute_past_the_float_range_is_dropped_and_its_span_accepted() -> None:
    s = make()
    raw = json_export([json_span(attrs=[{"key": "a", "value": {"doubleValue": 1}}])]).replace(b'{"doubleValue": 1}',
                                                                                              b'{"doubleValue": 1' + b"0" * 400 + b"}")
    status, _, body = s.traces.handle(raw, JSON, None)
    assert (status, body) == (200, b"{}")
    assert spans_counted(s) == {("accepted", "request"): 1}


def test_a_json_body_nested_past_the_parsers_limit_is_answered_400_too_deep_and_counted_once() -> None:
    s = make()
    status, ctype, body = s.traces.handle(b"[" * 100_000 + b"]" * 100_000, JSON, None)
    assert (status, ctype) == (400, JSON)
    assert json.loads(body)["message"] == "body is nested too deeply to parse"
    assert otlp_errors(s) == {"too_deep": 1}


def test_a_lone_surrogate_in_a_json_span_attribute_rejects_that_span_and_metrics_keep_rendering() -> None:
    s = make()
    bad = json_span(attrs=[{"key": "gen_ai.request.model", "value": {"stringValue": "\ud800"}}])
    status, _, body = s.traces.handle(json_export([bad, json_span(sid="00000000000000ff")]), JSON, None)
    assert status == 200
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
    assert spans_counted(s) == {("rejected", "bad_attribute"): 1, ("accepted", "request"): 1}
    exports_ok(s)


def test_a_lone_surrogate_in_json_resource_attributes_rejects_only_that_resources_spans() -> None:
    s = make()
    doc = {"resourceSpans": [
        {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "a\udcffb"}}]},
         "scopeSpans": [{"spans": [json_span(), json_span(sid="00000000000000ff")]}]},
        {"scopeSpans": [{"spans": [json_span(sid="0000000000000abc")]}]},
    ]}
    status, _, body = s.traces.handle(json.dumps(doc).encode(), JSON, None)
    assert status == 200
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "2"
    assert spans_counted(s) == {("rejected", "bad_attribute"): 2, ("accepted", "request"): 1}
    exports_ok(s)


def test_a_vllm_latency_past_64_bit_nanoseconds_falls_back_to_the_span_duration() -> None:
    s = make()
    attrs = [{"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1e300}},
             {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 1e300}}]
    status, _, _ = s.traces.handle(json_export([json_span(attrs=attrs)]), JSON, None)
    assert status == 200
    assert spans_counted(s) == {("accepted", "request"): 1}
    assert not s.pipeline.decode_errors
    exports_ok(s)


def test_json_span_and_event_times_outside_64_bits_reject_the_span_as_bad_time() -> None:
    s = make()
    late_event = json_span(sid="0000000000000abc")
    late_event["events"] = [{"name": "e", "timeUnixNano": str(2**64)}]
    spans = [json_span(end=10**400), json_span(sid="00000000000000ff", start=2**64, end=2**64 + 1), late_event]
    status, _, body = s.traces.handle(json_export(spans), JSON, None)
    assert status == 200
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "3"
    assert spans_counted(s) == {("rejected", "bad_time"): 3}
    assert not s.pipeline.decode_errors


def test_a_span_ending_at_the_last_64_bit_nanosecond_still_converts_to_otlp_metrics() -> None:
    s = make()
    sp = span(7, 1, "req", 0, 1, kind=2)
    sp.end_time_unix_nano = 2**64 - 1  # its exemplar's timestamp rounds to 2**64 ns when read back from seconds
    status, _, _ = s.traces.handle(export([sp]), "application/x-protobuf", None)
    assert status == 200
    assert spans_counted(s) == {("accepted", "request"): 1}
    exports_ok(s)


# -- fuzz ------------------------------------------------------------------------------------------------------


def test_fuzzed_otlp_bodies_in_process_are_all_answered_and_every_span_accounted_for() -> None:
    tally = fuzz.in_process(1500, seed=12)
    assert tally.crashes == []
    assert tally.unaccounted == []
    assert tally.inputs == 1500
    # The mix reaches every answer and a few thousand spans.
    assert set(tally.answered) == {200, 400, 413, 415}
    assert tally.spans > 3000


def test_fuzzed_otlp_bodies_over_http_are_all_answered_and_counted_and_metrics_stays_up() -> None:
    tally, _ = fuzz.run_http(50, seed=34)
    assert tally.crashes == []
    assert tally.unaccounted == []
    assert tally.inputs == 50


def test_the_issue_28_attacks_stay_within_every_bound() -> None:
    assert fuzz.attacks(120, seed=28) == []
