"""JSON ingest under hostile input: every body answered, every event accepted or rejected by reason, /metrics intact.

Unit-level tests drive the sidecar's own ingest chain (``JsonIngest`` -> pipeline
-> aggregator, as the daemon wires it) in-process; the HTTP tests run a real
sidecar on loopback. The fuzz tests are bounded versions of ``scripts/fuzz_json.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from inferwatch.wire import EV_BATCH, Decoder, Encoder, WireError
from inferwatch_sidecar.export.otlp.convert import families_to_request
from tests.helpers.imports import load_file
from tests.helpers.paths import REPO
from tests.helpers.sidecar import parse_metrics, sample

fuzz = load_file(REPO / "scripts" / "fuzz_json.py")
VALID = '{"type": "batch", "size": 4}'


class Chain:
    """The in-process ingest chain, with the counters the tests read."""

    def __init__(self) -> None:
        self.ingest, self.registry, self.collect = fuzz.ingest_chain()

    def post(self, raw: bytes | str, kind: str = "events") -> tuple[int, dict[str, Any]]:
        status, answer = self.ingest.post(kind, raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
        return status, answer

    def json_errors(self) -> dict[str, int]:
        return {r: n for (s, r), n in self.ingest.pipeline.decode_errors.items() if s == "json"}

    def accepted(self) -> int:
        return sum(self.ingest.pipeline.counts["http"])

    def exports(self) -> tuple[str, str, Any]:
        """Text and OpenMetrics expositions and the serialized OTLP request; raises if any of them fails."""
        text = generate_latest(self.registry).decode()
        om = generate_openmetrics(self.registry).decode()
        req, stats = families_to_request(self.collect(), {"service.name": "t"}, now_s=time.time(), start_time_s=0.0)
        assert "family_error" not in stats.dropped, stats.dropped
        req.SerializeToString()
        return text, om, req


# -- item 1: label values must be exportable text --------------------------------------------------------------

SURROGATE_EVENTS = {
    "model": '{"type": "batch", "size": 1, "model": "\\ud800"}',
    "service": '{"type": "queue", "depth": 1, "service": "a\\udfffb"}',
    "model_version": '{"type": "batch", "size": 1, "model_version": "\\udbff"}',
    "error_type": '{"type": "request", "duration_s": 0.1, "outcome": "error", "error_type": "\\ud800"}',
    "request_id": '{"type": "request", "duration_s": 0.1, "request_id": "\\ud800"}',
    "stage_key": '{"type": "request", "duration_s": 0.1, "stages": {"\\ud800": 0.01}}',
    "stage_event": '{"type": "stage", "stage": "\\udc00", "duration_s": 0.01}',
    "feature_name": '{"type": "record", "prediction": 1, "features": {"\\ud800": 1.0}}',
    "feature_value": '{"type": "record", "prediction": 1, "features": {"city": "\\ud800"}}',
    "prediction": '{"type": "record", "prediction": "\\ud800"}',
    "label": '{"type": "record", "prediction": "a", "label": "\\ud800"}',
    "raw_bytes": '{"type": "batch", "size": 1, "model": "\ud800"}',  # the bytes ED A0 80, no escape
}


@pytest.mark.parametrize("event", SURROGATE_EVENTS.values(), ids=SURROGATE_EVENTS.keys())
def test_a_lone_surrogate_in_any_exported_string_rejects_the_event_as_bad_string(event: str) -> None:
    chain = Chain()
    status, answer = chain.post(f'{{"events": [{VALID}, {event}, {VALID}]}}')
    assert (status, answer) == (200, {"accepted": 2, "rejected": 1, "errors": {"bad_string": 1}})
    assert chain.json_errors() == {"bad_string": 1}
    text, om, _ = chain.exports()
    assert 'inferwatch_ingest_decode_errors_total{reason="bad_string",scope="json"} 1.0' in text


def test_a_lone_surrogate_in_a_body_default_rejects_the_body_once() -> None:
    chain = Chain()
    status, answer = chain.post(f'{{"model": "\\ud800", "events": [{VALID}]}}')
    assert status == 400 and answer["reason"] == "bad_body" and "surrogate" in answer["error"]
    assert chain.json_errors() == {"bad_body": 1} and chain.accepted() == 0
    chain.exports()


def test_a_lone_surrogate_label_from_the_issue_leaves_every_export_working() -> None:
    chain = Chain()
    chain.post('{"events":[{"type":"batch","size":1,"model":"\\ud800"}]}')
    chain.post('{"events":[{"type":"batch","size":1,"model":"ok"}]}')
    text, om, req = chain.exports()
    assert 'model="ok"' in text and 'model="ok"' in om
    names = {m.name for m in req.resource_metrics[0].scope_metrics[0].metrics}
    assert "inferwatch_batch_size" in names


TEXT_THE_EXPORTERS_ACCEPT = {
    "nul": "a\\u0000b",
    "newline": "a\\nb",
    "quote_backslash": 'a\\"b\\\\c',
    "c1_control": "a\\u0085b",
    "paired_surrogates": "\\ud83d\\ude00",
    "astral": "\U0001f600",
}


@pytest.mark.parametrize("value", TEXT_THE_EXPORTERS_ACCEPT.values(), ids=TEXT_THE_EXPORTERS_ACCEPT.keys())
def test_control_characters_and_astral_text_are_accepted_and_round_trip_through_openmetrics(value: str) -> None:
    chain = Chain()
    status, answer = chain.post(f'{{"events": [{{"type": "batch", "size": 1, "model": "{value}"}}]}}')
    assert (status, answer["accepted"]) == (200, 1)
    want = json.loads(f'"{value}"')
    _, om, req = chain.exports()
    models = {s.labels["model"] for f in parse_openmetrics(om) if f.name == "inferwatch_batch_size" for s in f.samples}
    assert models == {want}


def test_the_wire_decoder_rejects_strings_that_are_not_utf8_as_bad_string() -> None:
    frame = Encoder(1, 2).encode([(EV_BATCH, ("svc", "AAA", "v"), 3)])[0]
    assert Decoder().decode(frame).records[0][1] == ("svc", "AAA", "v")
    for bad in (b"\xed\xa0\x80", b"a\xffb"):  # an encoded surrogate; a surrogateescape'd byte
        with pytest.raises(WireError) as e:
            Decoder().decode(frame.replace(b"AAA", bad))
        assert e.value.reason == "bad_string"


# -- item 3: numbers and nesting that raised outside the handler's accounting ----------------------------------

OVERFLOWING_EVENTS = {
    "duration_1e300": '{"type": "request", "duration_s": 1e300}',
    "duration_negative": '{"type": "request", "duration_s": -1}',
    "duration_infinity": '{"type": "request", "duration_s": Infinity}',
    "duration_nan": '{"type": "request", "duration_s": NaN}',
    "duration_1e99999": '{"type": "request", "duration_s": 1e99999}',
    "duration_310_digits": '{"type": "request", "duration_s": 1' + "0" * 310 + "}",
    "duration_5000_digits": '{"type": "request", "duration_s": ' + "9" * 5000 + "}",
    "time_unix_1e300": '{"type": "batch", "size": 1, "time_unix_s": 1e300}',
    "time_unix_400_digits": '{"type": "batch", "size": 1, "time_unix_s": ' + "9" * 400 + "}",
    "stage_1e300": '{"type": "request", "duration_s": 0.1, "stages": {"s": 1e300}}',
    "stage_event_400_digits": '{"type": "stage", "stage": "s", "duration_s": ' + "9" * 400 + "}",
    "ttft_1e300": '{"type": "stage", "stage": "s", "duration_s": 1, "ttft_s": 1e300}',
    "gap_400_digits": '{"type": "stage", "stage": "s", "duration_s": 1, "gaps_s": [' + "9" * 400 + "]}",
    "confidence_400_digits": '{"type": "record", "prediction": 1, "confidence": ' + "9" * 400 + "}",
    "prediction_400_digits": '{"type": "record", "prediction": ' + "9" * 400 + "}",
    "label_5000_digits": '{"type": "record", "prediction": 1, "label": -' + "9" * 5000 + "}",
    "feature_5000_digits": '{"type": "record", "prediction": 1, "features": {"x": ' + "9" * 5000 + "}}",
    "size_5000_digits": '{"type": "batch", "size": ' + "9" * 5000 + "}",
    "unhashable_outcome": '{"type": "request", "duration_s": 0.1, "outcome": ["ok"]}',
}


@pytest.mark.parametrize("event", OVERFLOWING_EVENTS.values(), ids=OVERFLOWING_EVENTS.keys())
def test_an_overflowing_number_rejects_its_event_as_bad_value_and_keeps_the_others(event: str) -> None:
    chain = Chain()
    status, answer = chain.post(f"[{VALID}, {event}, {VALID}]")
    assert (status, answer) == (200, {"accepted": 2, "rejected": 1, "errors": {"bad_value": 1}})
    assert chain.json_errors() == {"bad_value": 1} and chain.accepted() == 2
    chain.exports()


def test_gaps_longer_than_the_wire_holds_are_clamped_not_raised() -> None:
    chain = Chain()
    status, answer = chain.post('[{"type": "stage", "stage": "s", "duration_s": 1, "gaps_s": [1e303, 5000]}]')
    assert (status, answer["accepted"]) == (200, 1)


def test_a_body_nested_past_the_parsers_limit_is_answered_400_too_deep_and_counted_once() -> None:
    chain = Chain()
    status, answer = chain.post("[" * 5000 + VALID + "]" * 5000)
    assert (status, answer["reason"]) == (400, "too_deep")
    assert chain.json_errors() == {"too_deep": 1}
    status, answer = chain.post('{"events": [' + VALID + ', {"type": "batch", "size": 1, "x": ' + "[" * 5000
                                + "]" * 5000 + "}]}")
    assert (status, answer["reason"]) == (400, "too_deep")
    assert chain.json_errors() == {"too_deep": 2} and chain.accepted() == 0


def test_a_decoder_bug_costs_one_event_counted_as_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = Chain()
    decoder = chain.ingest.decoder
    real = decoder._event

    def buggy(ev: Any, defaults: Any, now: int) -> Any:
        if ev.get("size") == 13:
            raise ZeroDivisionError("a bug")
        return real(ev, defaults, now)

    monkeypatch.setattr(decoder, "_event", buggy)
    status, answer = chain.post(f'[{VALID}, {{"type": "batch", "size": 13}}, {VALID}]')
    assert (status, answer) == (200, {"accepted": 2, "rejected": 1, "errors": {"internal_error": 1}})
    assert chain.json_errors() == {"internal_error": 1}


def test_accepted_plus_rejected_by_reason_equals_sent_for_a_mixed_body() -> None:
    chain = Chain()
    events = [VALID] * 7 + list(OVERFLOWING_EVENTS.values()) + list(SURROGATE_EVENTS.values()) + ["3", '{"type": 1}']
    status, answer = chain.post("[" + ", ".join(events) + "]")
    assert status == 200
    assert answer["accepted"] == 7 and answer["accepted"] + answer["rejected"] == len(events)
    assert answer["errors"] == {"bad_value": len(OVERFLOWING_EVENTS), "bad_string": len(SURROGATE_EVENTS),
                                "not_an_object": 1, "unknown_type": 1}
    assert chain.json_errors() == answer["errors"] and chain.accepted() == 7


# -- the same through a real sidecar over HTTP ----------------------------------------------------------------

def test_over_http_a_surrogate_label_never_breaks_metrics_and_overflows_are_answered(sidecar_factory: Any) -> None:
    sc = sidecar_factory()
    assert sc.post("/v1/events", b'{"events":[{"type":"batch","size":1,"model":"\\ud800"}]}') == (
        200, {"accepted": 0, "rejected": 1, "errors": {"bad_string": 1}})
    overflow = "[" + ", ".join([VALID, *OVERFLOWING_EVENTS.values(), VALID]) + "]"
    assert sc.post("/v1/events", overflow.encode()) == (
        200, {"accepted": 2, "rejected": len(OVERFLOWING_EVENTS), "errors": {"bad_value": len(OVERFLOWING_EVENTS)}})
    code, answer = sc.post("/v1/events", b"[" * 5000 + b"]" * 5000)
    assert (code, answer["reason"]) == (400, "too_deep")
    for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
        code, _, body = sc.get("/metrics", {"Accept": accept})
        assert code == 200, body[:300]
    s = parse_metrics(sc.metrics())
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="bad_string") == 1
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="bad_value") == len(OVERFLOWING_EVENTS)
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="too_deep") == 1
    assert sample(s, "inferwatch_ingest_events_total", transport="http", type="batch") == 2


# -- fuzz ------------------------------------------------------------------------------------------------------

def test_fuzzed_json_bodies_in_process_are_all_answered_and_accounted_for() -> None:
    tally = fuzz.in_process(2000, seed=12)
    assert tally.crashes == [] and tally.unaccounted == []
    assert tally.inputs == 2000
    # The generator reaches every outcome, so the invariant is not checked on easy bodies only.
    assert {"bad_string", "bad_value"} <= set(tally.rejected) and tally.accepted > 0
    assert set(tally.bodies_rejected) == {"bad_json", "too_deep", "bad_body"}


def test_fuzzed_json_bodies_over_http_are_all_answered_and_counted_and_metrics_stays_up(sidecar_factory: Any) -> None:
    sc = sidecar_factory("--set", "ingest.max_json_events=50")
    tally = fuzz.over_http(sc.url, 100, seed=34)
    assert tally.crashes == [] and tally.unaccounted == []
    assert tally.inputs == 100 and tally.accepted > 0 and tally.rejected
    for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
        code, _, body = sc.get("/metrics", {"Accept": accept})
        assert code == 200, body[:300]
    assert fuzz.counter_mismatches(tally, sc.metrics()) == []


# -- labels (issue 12, found as a new user) ---------------------------------------------------------------------

def test_labels_posted_without_a_model_create_no_empty_series_and_are_counted_as_labels_received() -> None:
    chain = Chain()
    status, answer = chain.post('{"labels": [{"request_id": "a", "label": "dog"}, {"request_id": "b", "label": 1}]}',
                                kind="labels")
    assert (status, answer["accepted"]) == (200, 2)
    s = parse_metrics(chain.exports()[0])
    assert not [k for k in s if k[0] == "inferwatch_records_total"], "a label alone is not a prediction record"
    assert sample(s, "inferwatch_labels_received_total") == 2
    # A prediction is still a record of its model, and a prediction sent with its label is one record.
    chain.post('[{"type": "record", "model": "m", "prediction": "cat", "label": "dog"}]')
    s = parse_metrics(chain.exports()[0])
    assert sample(s, "inferwatch_records_total", service="", model="m", model_version="") == 1
    assert sample(s, "inferwatch_labels_received_total") == 2


def test_a_label_joins_by_request_id_without_a_model_and_one_with_no_model_to_count_under_is_dropped_unmatched() -> None:
    from inferwatch_sidecar.components.drift.component import build
    from inferwatch_sidecar.components.drift.config import DriftConfig
    from inferwatch_sidecar.ingest.http_json import JsonDecoder
    from tests.components.drift.helpers import context, rec, samples

    comp = build(DriftConfig(warmup_events=100), context())
    comp.handle(1, 1, [rec("m", "v1", None, pred="cat", conf=0.9, rid=f"q{i}") for i in range(3)])
    comp.drain()
    labels, errors, _ = JsonDecoder().labels({"labels": [
        {"request_id": "q0", "label": "cat"},  # no model: joins its prediction by request ID
        {"request_id": "nope", "label": "dog", "model": "m", "model_version": "v1"},  # a tracked model: unmatched
        {"request_id": "nope", "label": "dog"},  # no prediction and no model: nothing to count it under
        {"request_id": "nope", "label": "dog", "model": "other"},  # a model the engine does not track
    ]})
    assert errors == {}
    comp.handle(1, 1, labels)
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    mv = (("model", "m"), ("model_version", "v1"))
    assert s[("inferwatch_drift_labels_total", (*mv, ("result", "joined")))] == 1
    assert s[("inferwatch_drift_labels_total", (*mv, ("result", "unmatched")))] == 1
    assert s[("inferwatch_drift_dropped_records_total", (("reason", "unmatched_label"),))] == 2
    assert not [k for k in s if k[0] == "inferwatch_drift_labels_total" and ("model", "") in k[1]]
