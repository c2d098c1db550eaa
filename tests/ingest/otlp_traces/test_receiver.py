"""The OTLP trace receiver in process: decode, presets, join by trace ID, accounting, answers."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from inferwatch_sidecar.config import TRACE_PRESETS, ConfigError, load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.ingest.otlp_traces.mapping import OUTCOMES
from inferwatch_sidecar.ingest.otlp_traces.presets import PRESETS
from tests.helpers.paths import FIXTURES
from tests.helpers.sidecar import parse_metrics, sample, total
from tests.ingest.otlp_traces.spans import MS, T0, export, span, to_json, triton_trace

PB = "application/x-protobuf"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(overrides: dict[str, Any] | None = None, clock: Clock | None = None) -> Sidecar:
    s = Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False},
                                                  **(overrides or {})}))
    if clock is not None:
        s.traces.mapper.clock = clock
    return s


def metrics(s: Sidecar) -> dict[Any, float]:
    return parse_metrics(generate_latest(s.registry).decode())


def spans_total(m: dict[Any, float], result: str, reason: str) -> float:
    return sample(m, "inferwatch_otlp_spans_total", result=result, reason=reason)


def test_presets_in_config_match_the_preset_table() -> None:
    assert tuple(PRESETS) == TRACE_PRESETS


def test_triton_fixture_recorded_from_a_real_server_maps_to_its_own_counters() -> None:
    # Spans and /metrics recorded from one tritonserver 2.51 run (3 requests, PyTriton).
    s = make()
    code, ctype, body = s.traces.handle((FIXTURES / "triton_spans.json").read_bytes(), "application/json", None)
    assert (code, ctype, body) == (200, "application/json", b"{}")
    m = metrics(s)
    lab = {"service": "tritontest", "model": "double", "model_version": "1"}
    assert sample(m, "inferwatch_requests_total", **lab, outcome="ok") == 3
    triton = parse_metrics((FIXTURES / "triton_metrics.txt").read_text())
    tl = {"model": "double", "version": "1"}
    for stage, counter in (("queue", "nv_inference_queue_duration_us"),
                           ("preprocess", "nv_inference_compute_input_duration_us"),
                           ("inference", "nv_inference_compute_infer_duration_us"),
                           ("postprocess", "nv_inference_compute_output_duration_us")):
        ours_us = sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage=stage) * 1e6
        # Triton rounds each request's duration to whole microseconds before summing.
        # (prometheus_client's parser names counter samples with _total.)
        assert abs(ours_us - sample(triton, counter + "_total", **tl)) <= 3 * 1.0, stage
        assert sample(m, "inferwatch_stage_duration_seconds_count", **lab, stage=stage) == 3
    assert spans_total(m, "accepted", "request") == 3
    assert spans_total(m, "accepted", "stage") == 3
    assert spans_total(m, "accepted", "unused") == 3  # the InferRequest roots


@pytest.mark.parametrize("encoding", ["protobuf", "json", "protobuf+gzip", "json+gzip"])
def test_every_encoding_gives_the_same_numbers(encoding: str) -> None:
    s = make()
    body = export([sp for i in range(5) for sp in triton_trace(100 + i, 10 * i + 1, queue_ms=1.0 + i)],
                  resource={"service.name": "edge"}, scope="triton-server")
    ctype = PB
    if encoding.startswith("json"):
        body, ctype = to_json(body), "application/json"
    enc = None
    if encoding.endswith("gzip"):
        body, enc = gzip.compress(body), "gzip"
    code, rtype, _ = s.traces.handle(body, ctype, enc)
    assert (code, rtype) == (200, ctype)
    m = metrics(s)
    lab = {"service": "edge", "model": "resnet", "model_version": "1"}
    assert sample(m, "inferwatch_requests_total", **lab, outcome="ok") == 5
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="queue") == pytest.approx(
        sum(1.0 + i for i in range(5)) * 1e-3, abs=1e-9)
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="inference") == pytest.approx(0.05)
    # The queue stage also feeds the queue-wait histogram (ingest.queue_stages).
    assert sample(m, "inferwatch_queue_wait_seconds_count", **lab) == 5


def test_trace_id_becomes_request_id_and_exemplar() -> None:
    s = make()
    s.traces.handle(export(triton_trace(0xABC, 1), scope="triton-server"), PB, None)
    om_text = openmetrics_latest(s.registry).decode()
    assert om_text.count(f'# {{trace_id="{0xABC:032x}"}}') == 5  # e2e and the four stages


def test_stage_spans_join_their_request_across_exports() -> None:
    s = make()
    compute, model, root = triton_trace(7, 1, queue_ms=3.0)
    assert s.traces.handle(export([compute], scope="triton-server"), PB, None)[0] == 200
    assert s.traces.mapper.pending == 1
    assert sample(metrics(s), "inferwatch_otlp_pending_spans") == 1
    s.traces.handle(export([model, root], scope="triton-server"), PB, None)
    m = metrics(s)
    assert sample(m, "inferwatch_stage_duration_seconds_sum", service="svc", model="resnet", model_version="1",
                  stage="queue") == pytest.approx(3e-3)
    assert sample(m, "inferwatch_otlp_pending_spans") == 0
    assert spans_total(m, "accepted", "stage") == 1


def test_late_orphan_duplicate_and_evicted_spans_are_counted() -> None:
    clock = Clock()
    s = make({"traces": {"join_timeout_s": 2.0, "max_pending_spans": 3}}, clock=clock)
    compute, model, root = triton_trace(1, 1)
    s.traces.handle(export([model, root], scope="triton-server"), PB, None)
    s.traces.handle(export([compute], scope="triton-server"), PB, None)  # after its request: late
    s.traces.handle(export([model], scope="triton-server"), PB, None)  # an exporter's retry
    # Two compute spans whose model spans never come: orphaned at the timeout.
    s.traces.handle(export([triton_trace(2, 10)[0], triton_trace(3, 20)[0]], scope="triton-server"), PB, None)
    clock.t += 2.5
    s.traces.expire()
    m = metrics(s)
    assert spans_total(m, "dropped", "late") == 1
    assert spans_total(m, "dropped", "duplicate") == 1
    assert spans_total(m, "dropped", "orphan") == 2
    # Five waiting spans against a bound of three: the two oldest traces go.
    s.traces.handle(export([triton_trace(10 + i, 100 + 10 * i)[0] for i in range(5)], scope="triton-server"),
                    PB, None)
    m = metrics(s)
    assert spans_total(m, "dropped", "evicted") == 2
    assert s.traces.mapper.pending == 3
    assert sample(m, "inferwatch_requests_total", service="svc", model="resnet", model_version="1",
                  outcome="ok") == 1


def test_every_span_is_accounted_for() -> None:
    clock = Clock()
    s = make({"traces": {"max_spans_per_export": 8}}, clock=clock)
    bad_time = span(50, 1, "x", 5.0, 1.0)  # ends before it starts
    spans = [*triton_trace(40, 1), bad_time, *triton_trace(41, 10), triton_trace(42, 20)[0],
             *triton_trace(43, 30)]  # 11 spans, 8 taken
    code, _, body = s.traces.handle(export(spans, scope="triton-server"), PB, None)
    resp = ExportTraceServiceResponse()
    resp.ParseFromString(body)
    assert code == 200
    assert resp.partial_success.rejected_spans == 4
    assert resp.partial_success.error_message == "rejected spans: bad_time=1, too_many_spans=3"
    clock.t += 10
    s.traces.expire()
    m = metrics(s)
    assert total(m, "inferwatch_otlp_spans_total") == 11
    assert spans_total(m, "dropped", "orphan") == 1
    assert total(m, "inferwatch_otlp_spans_total", result="rejected") == 4
    assert {(r, why) for (n, labs), _ in m.items() if n == "inferwatch_otlp_spans_total"
            for r, why in [(dict(labs)["result"], dict(labs)["reason"])]} == set(OUTCOMES)


def test_json_reasons_and_spec_forms() -> None:
    s = make()
    ok = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "GET /x",
          "kind": "SPAN_KIND_SERVER", "startTimeUnixNano": str(T0), "endTimeUnixNano": T0 + 5 * MS,
          "attributes": [{"key": "http.response.status_code", "value": {"intValue": "500"}}],
          "status": {"code": "STATUS_CODE_ERROR"}}
    snake = {"trace_id": "1af7651916cd43dd8448eb211c80319c", "span_id": "c7ad6b7169203331", "name": "GET /y",
             "kind": 2, "start_time_unix_nano": T0, "end_time_unix_nano": T0 + 7 * MS}
    bad = [
        dict(ok, traceId="00000000000000000000000000000000"),
        dict(ok, traceId="0AF7651916CD43DD8448EB211C80319"),
        dict(ok, spanId="zzad6b7169203331"),
        dict(ok, endTimeUnixNano="soon"),
        dict(ok, kind="SPAN_KIND_SIDEWAYS"),
        dict(ok, attributes={"not": "a list"}),
        "not a span",
    ]
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
                              "scopeSpans": [{"scope": {"name": "fastapi"}, "spans": [ok, snake, *bad]}]}]}
    code, ctype, body = s.traces.handle(json.dumps(doc).encode(), "application/json; charset=utf-8", None)
    assert (code, ctype) == (200, "application/json")
    assert json.loads(body) == {"partialSuccess": {
        "rejectedSpans": "7",
        "errorMessage": "rejected spans: bad_attribute=1, bad_span=2, bad_span_id=1, bad_time=1, bad_trace_id=2"}}
    m = metrics(s)
    assert sample(m, "inferwatch_requests_total", service="api", model="", model_version="", outcome="error") == 1
    assert sample(m, "inferwatch_request_errors_total", service="api", model="", model_version="",
                  error_type="http_500") == 1  # a 503 would be shed (tests/ingest/otlp_traces/test_http_spans.py)
    assert sample(m, "inferwatch_requests_total", service="api", model="", model_version="", outcome="ok") == 1
    assert sample(m, "inferwatch_request_duration_seconds_sum", service="api", model="",
                  model_version="") == pytest.approx(0.012)


@pytest.mark.parametrize(("body", "ctype", "enc", "status", "reason"), [
    (b"\xff\xff\xff", PB, None, 400, "bad_protobuf"),
    (b"{", "application/json", None, 400, "bad_json"),
    (b"[]", "application/json", None, 400, "bad_json"),
    (b"x", "text/plain", None, 415, "unsupported_content_type"),
    (b"x", PB, "br", 415, "unsupported_encoding"),
    (b"not gzip", PB, "gzip", 400, "bad_gzip"),
    (gzip.compress(b"\0" * 4096)[:-8], PB, "gzip", 400, "bad_gzip"),
    (gzip.compress(b"\0" * (2 << 20)), PB, "gzip", 413, "decompressed_too_large"),
])
def test_unusable_bodies_get_a_status_in_their_encoding(body: bytes, ctype: str, enc: str | None, status: int,
                                                        reason: str) -> None:
    s = make({"traces": {"max_decompressed_bytes": 1 << 20}})
    code, rtype, out = s.traces.handle(body, ctype, enc)
    assert code == status
    if rtype == PB:
        st = RpcStatus()
        st.ParseFromString(out)
    else:
        st = RpcStatus(**json.loads(out))
    assert st.code in (3, 8, 12) and st.message
    assert sample(metrics(s), "inferwatch_ingest_decode_errors_total", scope="otlp", reason=reason) == 1


def test_gzip_bomb_is_refused_without_inflating_it() -> None:
    # 64 MiB of zeros compresses to about 64 KB; only limit+1 bytes are ever inflated.
    s = make({"traces": {"max_decompressed_bytes": 1 << 20}})
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
    assert len(bomb) < 100_000
    assert s.traces.handle(bomb, PB, "gzip")[0] == 413


def test_vllm_span_gives_ttft_stages_tokens_and_features() -> None:
    s = make()
    attrs = {
        "gen_ai.response.model": "tiny-llama", "gen_ai.request.id": "cmpl-1", "gen_ai.latency.e2e": 0.5,
        "gen_ai.latency.time_to_first_token": 0.08, "gen_ai.latency.time_in_queue": 0.01,
        "gen_ai.latency.time_in_model_prefill": 0.05, "gen_ai.latency.time_in_model_decode": 0.4,
        "gen_ai.latency.time_in_model_inference": 0.45, "gen_ai.usage.prompt_tokens": 12,
        "gen_ai.usage.completion_tokens": 32, "gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 0.7,
    }
    body = export([span(9, 1, "llm_request", 0, 510, kind=2, attrs=attrs)], resource={"service.name": "vllm"},
                  scope="vllm.llm_engine")
    assert s.traces.handle(body, PB, None)[0] == 200
    m = metrics(s)
    lab = {"service": "vllm", "model": "tiny-llama", "model_version": ""}
    assert sample(m, "inferwatch_request_duration_seconds_sum", **lab) == pytest.approx(0.5)
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="prefill") == pytest.approx(0.05)
    assert sample(m, "inferwatch_time_to_first_token_seconds_sum", **lab, stage="decode") == pytest.approx(0.08)
    assert sample(m, "inferwatch_generated_tokens_total", **lab, stage="decode") == 32
    assert sample(m, "inferwatch_generation_length_tokens_sum", **lab, stage="decode") == 32
    assert sample(m, "inferwatch_records_total", **lab) == 1


def test_feature_records_carry_the_trace_id_and_configured_attributes() -> None:
    s = make({"traces": {"features": ["tenant", "gen_ai.response.finish_reasons", "prompt_len"]}})
    got: list[Any] = []
    s.pipeline.dispatch.append(("probe", frozenset({5}), lambda pid, pid64, recs: got.extend(recs)))
    attrs = {"tenant": "acme", "gen_ai.response.finish_reasons": ["stop", "length"], "prompt_len": 17}
    s.traces.handle(export([span(0xFEED, 1, "POST /predict", 0, 3, kind=2, attrs=attrs)]), PB, None)
    (rec,) = got
    schema, nums, cats = rec[7]
    assert rec[3] == f"{0xFEED:032x}"
    assert schema.numeric == ("prompt_len",) and nums == (17.0,)
    assert schema.categorical == ("tenant", "gen_ai.response.finish_reasons") and cats == ("acme", "stop,length")


def test_user_stage_mapping_and_nested_spans() -> None:
    s = make({"traces": {"stages": {"tokenize": "preprocess", "forward": "inference"}}})
    spans = [
        span(5, 3, "tokenize", 1, 2, parent=2),
        span(5, 4, "forward", 2, 9, parent=2),
        span(5, 2, "handler", 0.5, 9.5, parent=1),  # unmapped, between the stages and the server span
        span(5, 1, "POST /predict", 0, 10, kind=2),
    ]
    s.traces.handle(export(spans[:2]), PB, None)
    s.traces.handle(export(spans[2:]), PB, None)
    m = metrics(s)
    lab = {"service": "svc", "model": "", "model_version": ""}
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="preprocess") == pytest.approx(1e-3)
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="inference") == pytest.approx(7e-3)
    assert spans_total(m, "accepted", "stage") == 2
    assert spans_total(m, "accepted", "unused") == 1


def test_model_attribute_override_and_label_caps() -> None:
    s = make({"traces": {"model_attribute": "app.model"}, "labels": {"max_values": {"model": 2}}})
    spans = [span(60 + i, 1, "POST /p", 0, 1, kind=2, attrs={"app.model": f"m{i}"}) for i in range(5)]
    s.traces.handle(export(spans), PB, None)
    m = metrics(s)
    assert sample(m, "inferwatch_requests_total", service="svc", model="m0", model_version="", outcome="ok") == 1
    assert sample(m, "inferwatch_requests_total", service="svc", model="__overflow__", model_version="",
                  outcome="ok") == 3
    assert sample(m, "inferwatch_label_overflow_total", label="model") == 3


def test_a_plain_otel_apps_model_is_empty_until_the_documented_resource_attributes_name_it() -> None:
    # docs/otlp-traces.md, "Where model and model_version come from".
    res = {"service.name": "svc", "app.model": "ranker", "service.version": "v3"}
    plain = make()
    plain.traces.handle(export([span(80, 1, "GET /predict", 0, 1, kind=2)], resource=res), PB, None)
    assert sample(metrics(plain), "inferwatch_requests_total", service="svc", model="", model_version="",
                  outcome="ok") == 1
    named = make({"traces": {"model_attribute": "app.model", "version_attribute": "service.version"}})
    named.traces.handle(export([span(81, 1, "GET /predict", 0, 1, kind=2),
                                span(82, 1, "GET /predict", 0, 1, kind=2, attrs={"app.model": "reranker"})],
                               resource=res), PB, None)
    m = metrics(named)
    assert sample(m, "inferwatch_requests_total", service="svc", model="ranker", model_version="v3", outcome="ok") == 1
    # The span's own attribute wins over its resource's.
    assert sample(m, "inferwatch_requests_total", service="svc", model="reranker", model_version="v3",
                  outcome="ok") == 1


def test_presets_can_be_turned_off() -> None:
    s = make({"traces": {"presets": ["vllm", "generic"]}})
    s.traces.handle(export(triton_trace(70, 1), scope="triton-server"), PB, None)
    m = metrics(s)
    # Without the Triton preset every Triton span is a plain SERVER span: three requests, no model label.
    assert sample(m, "inferwatch_requests_total", service="svc", model="", model_version="", outcome="ok") == 3


@pytest.mark.parametrize(("section", "message"), [
    ({"presets": ["triton", "jaeger"]}, "unknown preset 'jaeger'"),
    ({"presets": ["vllm", "vllm"]}, "listed twice"),
    ({"stages": {"tokenize": ""}}, "both must be non-empty"),
    ({"features": ["x" * 65]}, "1 to 64 characters"),
])
def test_bad_traces_config_is_refused(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ={}, overrides={"traces": section})


def test_disabled_traces_have_no_route() -> None:
    s = make({"traces": {"enabled": False}})
    assert "/v1/traces" not in s._routes()
    assert "/v1/traces" in make()._routes()
