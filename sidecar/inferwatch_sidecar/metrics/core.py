"""Catalog entries for the daemon's own metrics (ingest, requests, stages).

Bucket boundaries are shared by every latency histogram so that a 5 us
stage, a 2 ms classifier and a 10-minute LLM generation all land in useful
buckets: microsecond steps at the low end (as in OpenTelemetry's GenAI
``time_to_first_token`` buckets, which start at 1 ms) and vLLM-style long
tails (its end-to-end latency buckets reach 7680 s). Token histograms use
powers of four, like OpenTelemetry's ``gen_ai.client.token.usage``.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

#: End-to-end, stage and queue-wait latency buckets, in seconds (30 bounds): from 5 us, so a
#: microsecond-scale stage (a tokenizer lookup, a feature fetch from memory) is resolved, to 21 minutes.
#: ``aggregate.buckets`` in the config replaces them per family and per stage.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0,
)
#: Bucket bounds that the generated alert rules count (``{target_seconds:le}`` matchers in
#: alerts/source.py), per histogram family, with the alert that needs each. Configured buckets
#: that leave one out make that alert count nothing; the sidecar says so at start-up.
ALERT_BUCKET_BOUNDS: dict[str, dict[float, str]] = {
    "inferwatch_stage_duration_seconds": {
        1.0: "InferwatchStageLatencyP99BudgetBurn",
        2.5: "InferwatchStageLatencyP999BudgetBurn",
    },
}
#: Time to first token / first item (OTel GenAI TTFT buckets plus vLLM's tail).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
)
#: Gaps between consecutive tokens (OTel GenAI time_per_output_token + vLLM ITL).
ITL_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
#: Items (tokens) per stream.
TOKEN_BUCKETS: tuple[float, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
#: Dynamic batch sizes.
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Ingest lag: producer send time to sidecar receive time.
LAG_BUCKETS: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)

_CTX = ("service", "model", "model_version")

# -- requests ------------------------------------------------------------
REQUESTS_TOTAL = Metric(
    name="inferwatch_requests_total", type="counter", labels=(*_CTX, "outcome"), component="core",
    help="Requests finished, by outcome (ok, error, cancelled, client_error for a 4xx, shed for a 429 or 503).",
)
REQUEST_ERRORS_TOTAL = Metric(
    name="inferwatch_request_errors_total", type="counter", labels=(*_CTX, "error_type"), component="core",
    help="Requests that ended in an error, by bounded error type.",
)
REQUEST_DURATION_SECONDS = Metric(
    name="inferwatch_request_duration_seconds", type="histogram", unit="seconds", labels=_CTX, buckets=LATENCY_BUCKETS,
    component="core",
    help="End-to-end request latency; exemplars carry the request or trace ID.",
)
STAGE_DURATION_SECONDS = Metric(
    name="inferwatch_stage_duration_seconds", type="histogram", unit="seconds", labels=(*_CTX, "stage"),
    buckets=LATENCY_BUCKETS, component="core",
    help=(
        "Latency of one stage (ingress, queue, preprocess, inference, postprocess, ...); exemplars carry the "
        "request or trace ID."
    ),
)
QUEUE_WAIT_SECONDS = Metric(
    name="inferwatch_queue_wait_seconds", type="histogram", unit="seconds", labels=_CTX, buckets=LATENCY_BUCKETS,
    component="core",
    help="Time requests waited in a queue (stages named in ingest.queue_stages).",
)
QUEUE_DEPTH = Metric(
    name="inferwatch_queue_depth", type="gauge", labels=_CTX, component="core",
    help="Latest reported queue depth.",
)
BATCH_SIZE = Metric(
    name="inferwatch_batch_size", type="histogram", labels=_CTX, buckets=BATCH_BUCKETS, component="core",
    help="Size of each dynamic batch.",
)

# -- streaming / LLM -----------------------------------------------------
TIME_TO_FIRST_TOKEN_SECONDS = Metric(
    name="inferwatch_time_to_first_token_seconds", type="histogram", unit="seconds", labels=(*_CTX, "stage"),
    buckets=TTFT_BUCKETS, component="core",
    help="Time from the start of a streaming stage to its first item (token).",
)
INTER_TOKEN_LATENCY_SECONDS = Metric(
    name="inferwatch_inter_token_latency_seconds", type="histogram", unit="seconds", labels=(*_CTX, "stage"),
    buckets=ITL_BUCKETS, component="core",
    help="Gaps between consecutive items (tokens) of a streaming stage.",
)
GENERATED_TOKENS_TOTAL = Metric(
    name="inferwatch_generated_tokens_total", type="counter", labels=(*_CTX, "stage"), component="core",
    help="Items (tokens) yielded by streaming stages.",
)
GENERATION_LENGTH_TOKENS = Metric(
    name="inferwatch_generation_length_tokens", type="histogram", unit="tokens", labels=(*_CTX, "stage"),
    buckets=TOKEN_BUCKETS, component="core",
    help="Items (tokens) per completed streaming stage call; cancelled ones are counted in "
    "inferwatch_cancelled_streams_total instead.",
)
CANCELLED_STREAMS_TOTAL = Metric(
    name="inferwatch_cancelled_streams_total", type="counter", labels=(*_CTX, "stage"), component="core",
    help="Streaming stage calls that were cancelled: closed before they finished (a client disconnect, "
    "GeneratorExit, CancelledError) or still running when their client disconnected.",
)
UNDELIVERED_TOKENS_TOTAL = Metric(
    name="inferwatch_undelivered_tokens_total", type="counter", labels=(*_CTX, "stage"), component="core",
    help="Items (tokens) streaming stages produced after their client had disconnected: generated and never "
    "delivered, so wasted work (delivered = inferwatch_generated_tokens_total minus this).",
)

# -- recorded predictions ------------------------------------------------
RECORDS_TOTAL = Metric(
    name="inferwatch_records_total", type="counter", labels=_CTX, component="core",
    help="Prediction records received (record() calls with a prediction or features).",
)
LABELS_RECEIVED_TOTAL = Metric(
    name="inferwatch_labels_received_total", type="counter", component="core",
    help="Ground-truth labels received alone (POST /v1/labels, record(label=...) without a prediction); "
    "the drift engine joins them to their predictions (inferwatch_drift_labels_total).",
)

# -- producers (SDK side) ------------------------------------------------
SDK_DROPPED_EVENTS_TOTAL = Metric(
    name="inferwatch_sdk_dropped_events_total", type="counter", labels=("reason",), component="core",
    help="Events the SDK dropped before sending, as reported by the SDK, by reason.",
)
PRODUCERS = Metric(
    name="inferwatch_producers", type="gauge", component="core",
    help="Producers (SDK processes) seen within ingest.producer_timeout_s.",
)

# -- the sidecar's own ingest --------------------------------------------
INGEST_FRAMES_TOTAL = Metric(
    name="inferwatch_ingest_frames_total", type="counter", labels=("transport",), component="core",
    help="Frames (datagrams or HTTP batches) received, by transport.",
)
INGEST_EVENTS_TOTAL = Metric(
    name="inferwatch_ingest_events_total", type="counter", labels=("transport", "type"), component="core",
    help="Events decoded and aggregated, by transport and event type.",
)
INGEST_BYTES_TOTAL = Metric(
    name="inferwatch_ingest_bytes_total", type="counter", unit="bytes", labels=("transport",), component="core",
    help="Bytes received, by transport.",
)
INGEST_DECODE_ERRORS_TOTAL = Metric(
    name="inferwatch_ingest_decode_errors_total", type="counter", labels=("scope", "reason"), component="core",
    help=(
        "Frames (scope=frame, dropped whole), records (scope=record) and JSON events (scope=json) that did "
        "not decode, by reason."
    ),
)
INGEST_DROPPED_TOTAL = Metric(
    name="inferwatch_ingest_dropped_total", type="counter", labels=("reason",), component="core",
    help="Data the sidecar dropped, by reason (body_too_large, too_many_events, internal_error, ...).",
)
INGEST_LOST_FRAMES_TOTAL = Metric(
    name="inferwatch_ingest_lost_frames_total", type="counter", component="core",
    help="Frames missing from producers' sequence numbers (lost between SDK and sidecar).",
)
INGEST_IMPLAUSIBLE_TOTAL = Metric(
    name="inferwatch_ingest_implausible_total", type="counter", labels=("field",), component="core",
    help=(
        "Producer-reported counts rejected as more than one producer can reach between two frames "
        "(field=sdk_drops: a DROPS record not added; field=lost_frames: a sequence gap not counted as lost)."
    ),
)
INGEST_SCHEMA_CACHE_BYTES = Metric(
    name="inferwatch_ingest_schema_cache_bytes", type="gauge", unit="bytes", labels=("kind",), component="core",
    help="Estimated memory of the remembered feature schemas (kind=used) and its bound ingest.max_schema_bytes (kind=limit).",
)
INGEST_SCHEMAS_EVICTED_TOTAL = Metric(
    name="inferwatch_ingest_schemas_evicted_total", type="counter", labels=("reason",), component="core",
    help=(
        "Feature schemas forgotten to keep the cache within ingest.max_schemas (reason=count) or "
        "ingest.max_schema_bytes (reason=bytes), or refused as larger than the byte bound alone (reason=too_large)."
    ),
)
INGEST_TRUNCATED_STRINGS_TOTAL = Metric(
    name="inferwatch_ingest_truncated_strings_total", type="counter", component="core",
    help=(
        "Strings of SDK frames (categorical values, names) cut to ingest.max_string_chars as they were decoded, "
        "so long values never wait in the sidecar's buffers at full length."
    ),
)
INGEST_LAG_SECONDS = Metric(
    name="inferwatch_ingest_lag_seconds", type="histogram", unit="seconds", buckets=LAG_BUCKETS, component="core",
    help="Delay from the producer sending a frame to its decoding.",
)
INGEST_SOCKET_QUEUE_DROPPED_TOTAL = Metric(
    name="inferwatch_ingest_socket_queue_dropped_total", type="counter", component="core",
    help="Datagrams the kernel dropped because the UDP receive buffer was full.",
)
HTTP_REFUSED_TOTAL = Metric(
    name="inferwatch_http_refused_total", type="counter", labels=("reason",), component="core",
    help=(
        "HTTP connections and requests the sidecar refused, by reason (too_many_connections, header_timeout, "
        "body_timeout, body_too_large, invalid_request, write_timeout, foreign_host, foreign_origin)."
    ),
)
LABEL_OVERFLOW_TOTAL = Metric(
    name="inferwatch_label_overflow_total", type="counter", labels=("label",), component="core",
    help="Label values mapped to __overflow__ because the label's cardinality budget was spent.",
)
OTLP_SPANS_TOTAL = Metric(
    name="inferwatch_otlp_spans_total", type="counter", labels=("result", "reason"), component="core",
    help=(
        "Spans received on POST /v1/traces, by fate: accepted (request, stage, unused), rejected in the "
        "export's partial success (bad_trace_id, too_many_spans, ...) or dropped later (late, orphan, evicted, "
        "duplicate)."
    ),
)
OTLP_PENDING_SPANS = Metric(
    name="inferwatch_otlp_pending_spans", type="gauge", component="core",
    help="Stage spans waiting for their request span to arrive (bounded by traces.max_pending_spans).",
)
OTLP_CUT_TOTAL = Metric(
    name="inferwatch_otlp_cut_total", type="counter", labels=("what",), component="core",
    help=(
        "Span parts dropped at decode by the per-span caps: attribute (traces.max_attributes_per_span), event "
        "(traces.max_events_per_span, traces.max_attributes_per_event), key (an attribute key over 255 characters)."
    ),
)
OTLP_PENDING_BYTES = Metric(
    name="inferwatch_otlp_pending_bytes", type="gauge", component="core",
    help="Estimated bytes the trace join buffer holds (bounded by traces.max_pending_bytes).",
)
COMPONENT_ERRORS_TOTAL = Metric(
    name="inferwatch_component_errors_total", type="counter", labels=("component", "method"), component="core",
    help="Exceptions raised by a component's handle, collect or status (the daemon keeps running).",
)
COMPONENT_UP = Metric(
    name="inferwatch_component_up", type="gauge", labels=("component",), component="core",
    help="1 when the component is running, 0 when unavailable or failed.",
)
SIDECAR = Metric(
    name="inferwatch_sidecar", type="info", labels=("version", "python"), component="core",
    help="Sidecar build information.",
)

# -- the sidecar's process (prometheus_client ProcessCollector, namespace inferwatch_sidecar) --
SIDECAR_PROCESS_CPU_SECONDS_TOTAL = Metric(
    name="inferwatch_sidecar_process_cpu_seconds_total", type="counter", unit="seconds", component="core",
    help="Sidecar user and system CPU time.",
)
SIDECAR_PROCESS_VIRTUAL_MEMORY_BYTES = Metric(
    name="inferwatch_sidecar_process_virtual_memory_bytes", type="gauge", unit="bytes", component="core",
    help="Sidecar virtual memory size.",
)
SIDECAR_PROCESS_RESIDENT_MEMORY_BYTES = Metric(
    name="inferwatch_sidecar_process_resident_memory_bytes", type="gauge", unit="bytes", component="core",
    help="Sidecar resident memory size.",
)
SIDECAR_PROCESS_START_TIME_SECONDS = Metric(
    name="inferwatch_sidecar_process_start_time_seconds", type="gauge", unit="seconds", component="core",
    help="Sidecar start time since the Unix epoch.",
)
SIDECAR_PROCESS_OPEN_FDS = Metric(
    name="inferwatch_sidecar_process_open_fds", type="gauge", component="core",
    help="Sidecar open file descriptors.",
)
SIDECAR_PROCESS_MAX_FDS = Metric(
    name="inferwatch_sidecar_process_max_fds", type="gauge", component="core",
    help="Sidecar file descriptor limit.",
)

#: What prometheus_client's ``ProcessCollector(namespace="inferwatch_sidecar")`` exports.
PROCESS_METRICS: tuple[Metric, ...] = (
    SIDECAR_PROCESS_CPU_SECONDS_TOTAL, SIDECAR_PROCESS_VIRTUAL_MEMORY_BYTES, SIDECAR_PROCESS_RESIDENT_MEMORY_BYTES,
    SIDECAR_PROCESS_START_TIME_SECONDS, SIDECAR_PROCESS_OPEN_FDS, SIDECAR_PROCESS_MAX_FDS,
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    REQUESTS_TOTAL, REQUEST_ERRORS_TOTAL, REQUEST_DURATION_SECONDS, STAGE_DURATION_SECONDS, QUEUE_WAIT_SECONDS,
    QUEUE_DEPTH, BATCH_SIZE, TIME_TO_FIRST_TOKEN_SECONDS, INTER_TOKEN_LATENCY_SECONDS, GENERATED_TOKENS_TOTAL,
    GENERATION_LENGTH_TOKENS, CANCELLED_STREAMS_TOTAL, UNDELIVERED_TOKENS_TOTAL, RECORDS_TOTAL, LABELS_RECEIVED_TOTAL, SDK_DROPPED_EVENTS_TOTAL, PRODUCERS, INGEST_FRAMES_TOTAL,
    INGEST_EVENTS_TOTAL, INGEST_BYTES_TOTAL, INGEST_DECODE_ERRORS_TOTAL, INGEST_DROPPED_TOTAL, INGEST_LOST_FRAMES_TOTAL,
    INGEST_IMPLAUSIBLE_TOTAL, INGEST_SCHEMA_CACHE_BYTES, INGEST_SCHEMAS_EVICTED_TOTAL, INGEST_TRUNCATED_STRINGS_TOTAL,
    INGEST_LAG_SECONDS, INGEST_SOCKET_QUEUE_DROPPED_TOTAL, HTTP_REFUSED_TOTAL, LABEL_OVERFLOW_TOTAL,
    OTLP_SPANS_TOTAL, OTLP_PENDING_SPANS, OTLP_CUT_TOTAL, OTLP_PENDING_BYTES, COMPONENT_ERRORS_TOTAL, COMPONENT_UP, SIDECAR, SIDECAR_PROCESS_CPU_SECONDS_TOTAL, SIDECAR_PROCESS_VIRTUAL_MEMORY_BYTES,
    SIDECAR_PROCESS_RESIDENT_MEMORY_BYTES, SIDECAR_PROCESS_START_TIME_SECONDS, SIDECAR_PROCESS_OPEN_FDS,
    SIDECAR_PROCESS_MAX_FDS,
)

# -- HTTP truth and overload (issue 27; aggregate/overload.py, docs/overload.md) ---------------
HTTP_REQUESTS_TOTAL = Metric(
    name="inferwatch_http_requests_total", type="counter", labels=(*_CTX, "route", "outcome"), component="core",
    help="HTTP requests by route template (capped; __overflow__ past the cap, _unmatched for no route, the path "
    "for probes and docs) and outcome (ok, client_error, error, cancelled, shed); probes included.",
)
REQUEST_ATTEMPTS_TOTAL = Metric(
    name="inferwatch_request_attempts_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests to the model's routes (probes and docs left out), first attempts and retries alike.",
)
REQUEST_RETRIES_TOTAL = Metric(
    name="inferwatch_request_retries_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests that were retries: a resend count in their headers or span "
    "(http.request.resend_count), or a client request ID already seen within the retry window.",
)
LOAD_AMPLIFICATION_RATIO = Metric(
    name="inferwatch_load_amplification_ratio", type="gauge", unit="ratio", labels=_CTX, component="core",
    help="Attempts per unique request over the 60 s up to the latest HTTP request (1 = no retries; 2 = every "
    "request sent twice); alerts use the counters' rates instead.",
)
CLIENT_GIVEUPS_TOTAL = Metric(
    name="inferwatch_client_giveups_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests whose client disconnected before the response was complete.",
)
CLIENT_GIVEUP_WAIT_SECONDS = Metric(
    name="inferwatch_client_giveup_wait_seconds", type="histogram", unit="seconds", labels=_CTX,
    buckets=LATENCY_BUCKETS, component="core",
    help="How long clients that gave up had waited: compare with inferwatch_request_duration_seconds.",
)

METRICS = (
    *METRICS, HTTP_REQUESTS_TOTAL, REQUEST_ATTEMPTS_TOTAL, REQUEST_RETRIES_TOTAL, LOAD_AMPLIFICATION_RATIO,
    CLIENT_GIVEUPS_TOTAL, CLIENT_GIVEUP_WAIT_SECONDS,
)
