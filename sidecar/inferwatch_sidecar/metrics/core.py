"""Catalog entries for the daemon's own metrics (ingest, requests, stages).

Bucket boundaries are shared by every latency histogram so that a 2 ms
classifier and a 10-minute LLM generation both land in useful buckets:
sub-millisecond steps at the low end (as in OpenTelemetry's GenAI
``time_to_first_token`` buckets, which start at 1 ms) and vLLM-style long
tails (its end-to-end latency buckets reach 7680 s). Token histograms use
powers of four, like OpenTelemetry's ``gen_ai.client.token.usage``.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

#: End-to-end, stage and queue-wait latency buckets, in seconds (24 bounds).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0,
)
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

METRICS: tuple[Metric, ...] = (
    # -- requests ------------------------------------------------------------
    Metric("inferwatch_requests_total", "counter", "", "Requests finished, by outcome (ok, error, cancelled).",
           (*_CTX, "outcome")),
    Metric("inferwatch_request_errors_total", "counter", "", "Requests that ended in an error, by bounded error type.",
           (*_CTX, "error_type")),
    Metric("inferwatch_request_duration_seconds", "histogram", "seconds",
           "End-to-end request latency; exemplars carry the request or trace ID.", _CTX, buckets=LATENCY_BUCKETS),
    Metric("inferwatch_stage_duration_seconds", "histogram", "seconds",
           "Latency of one stage (access, queue, preprocess, inference, postprocess, ...); exemplars carry the request or trace ID.",
           (*_CTX, "stage"), buckets=LATENCY_BUCKETS),
    Metric("inferwatch_queue_wait_seconds", "histogram", "seconds",
           "Time requests waited in a queue (stages named in ingest.queue_stages).", _CTX, buckets=LATENCY_BUCKETS),
    Metric("inferwatch_queue_depth", "gauge", "", "Latest reported queue depth.", _CTX),
    Metric("inferwatch_batch_size", "histogram", "", "Size of each dynamic batch.", _CTX, buckets=BATCH_BUCKETS),
    # -- streaming / LLM -----------------------------------------------------
    Metric("inferwatch_time_to_first_token_seconds", "histogram", "seconds",
           "Time from the start of a streaming stage to its first item (token).", (*_CTX, "stage"), buckets=TTFT_BUCKETS),
    Metric("inferwatch_inter_token_latency_seconds", "histogram", "seconds",
           "Gaps between consecutive items (tokens) of a streaming stage.", (*_CTX, "stage"), buckets=ITL_BUCKETS),
    Metric("inferwatch_generated_tokens_total", "counter", "", "Items (tokens) yielded by streaming stages.",
           (*_CTX, "stage")),
    Metric("inferwatch_generation_length_tokens", "histogram", "tokens", "Items (tokens) per streaming stage call.",
           (*_CTX, "stage"), buckets=TOKEN_BUCKETS),
    # -- recorded predictions ------------------------------------------------
    Metric("inferwatch_records_total", "counter", "", "Prediction records received (record() calls and labels).", _CTX),
    # -- producers (SDK side) ------------------------------------------------
    Metric("inferwatch_sdk_dropped_events_total", "counter", "",
           "Events the SDK dropped before sending, as reported by the SDK, by reason.", ("reason",)),
    Metric("inferwatch_producers", "gauge", "", "Producers (SDK processes) seen within ingest.producer_timeout_s."),
    # -- the sidecar's own ingest --------------------------------------------
    Metric("inferwatch_ingest_frames_total", "counter", "", "Frames (datagrams or HTTP batches) received, by transport.",
           ("transport",)),
    Metric("inferwatch_ingest_events_total", "counter", "", "Events decoded and aggregated, by transport and event type.",
           ("transport", "type")),
    Metric("inferwatch_ingest_bytes_total", "counter", "bytes", "Bytes received, by transport.", ("transport",)),
    Metric("inferwatch_ingest_decode_errors_total", "counter", "",
           "Frames (scope=frame, dropped whole), records (scope=record) and JSON events (scope=json) that did not decode, by reason.",
           ("scope", "reason")),
    Metric("inferwatch_ingest_dropped_total", "counter", "",
           "Data the sidecar dropped, by reason (body_too_large, too_many_events, internal_error, ...).", ("reason",)),
    Metric("inferwatch_ingest_lost_frames_total", "counter", "",
           "Frames missing from producers' sequence numbers (lost between SDK and sidecar)."),
    Metric("inferwatch_ingest_lag_seconds", "histogram", "seconds", "Delay from the producer sending a frame to its decoding.",
           buckets=LAG_BUCKETS),
    Metric("inferwatch_ingest_socket_queue_dropped_total", "counter", "",
           "Datagrams the kernel dropped because the UDP receive buffer was full."),
    Metric("inferwatch_label_overflow_total", "counter", "",
           "Label values mapped to __overflow__ because the label's cardinality budget was spent.", ("label",)),
    Metric("inferwatch_component_errors_total", "counter", "",
           "Exceptions raised by a component's handle, collect or status (the daemon keeps running).",
           ("component", "method")),
    Metric("inferwatch_component_up", "gauge", "", "1 when the component is running, 0 when unavailable or failed.",
           ("component",)),
    Metric("inferwatch_sidecar", "info", "", "Sidecar build information.", ("version", "python")),
    # -- the sidecar's process (prometheus_client ProcessCollector, namespace inferwatch_sidecar) --
    Metric("inferwatch_sidecar_process_cpu_seconds_total", "counter", "seconds", "Sidecar user and system CPU time."),
    Metric("inferwatch_sidecar_process_virtual_memory_bytes", "gauge", "bytes", "Sidecar virtual memory size."),
    Metric("inferwatch_sidecar_process_resident_memory_bytes", "gauge", "bytes", "Sidecar resident memory size."),
    Metric("inferwatch_sidecar_process_start_time_seconds", "gauge", "seconds",
           "Sidecar start time since the Unix epoch."),
    Metric("inferwatch_sidecar_process_open_fds", "gauge", "", "Sidecar open file descriptors."),
    Metric("inferwatch_sidecar_process_max_fds", "gauge", "", "Sidecar file descriptor limit."),
)
