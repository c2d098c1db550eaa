"""Sidecar health: scrape status, ingest rates, drops by reason, SDK drops and cardinality overflow."""

from __future__ import annotations

from alerts.source import SIDECAR_JOB_SELECTOR
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    INST,
    RATE,
    UP_MAP,
    Row,
    dashboard,
    datasource_var,
    query_var,
    stat,
    state_timeline,
    target,
    timeseries,
)

UID = "inferwatch-sidecar"
#: Any sustained rate of loss is red (the matching alerts fire above 0).
ANY_LOSS = [(0.0001, "red")]


def _rate(metric: str, by: str = "") -> str:
    """The summed rate of a sidecar counter, by ``by`` (comma-separated labels) when given."""
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{{{INST}}}[{RATE}]))"


def build() -> Dashboard:
    return dashboard(
        uid=UID, title="inferwatch / Sidecar health",
        description="Scrape status, ingest rates, drops by reason, SDK drops and cardinality overflow.",
        variables=[datasource_var(),
                   query_var("instance", "Sidecar", "label_values(inferwatch_ingest_frames_total, instance)")],
        items=[
            Row("Health"),
            state_timeline(title="Scrape status", w=12, h=5, mappings=UP_MAP, thresholds=[(1, "green")],
                           description="Whether Prometheus can scrape each sidecar.",
                           targets=[target(f"up{{{SIDECAR_JOB_SELECTOR}, {INST}}}", "{{instance}}")]),
            state_timeline(title="Components", w=12, h=5, mappings=UP_MAP, thresholds=[(1, "green")],
                           description="1 when a component (gpu, drift, ...) is running.",
                           targets=[target(f"inferwatch_component_up{{{INST}}}", "{{instance}} {{component}}")]),
            stat(title="Producers", w=8, h=5, description="SDK processes seen recently.",
                 targets=[target(f"sum by (instance) (inferwatch_producers{{{INST}}})", "{{instance}}")]),
            stat(title="Ingest lag P99", unit="s", w=8, h=5, thresholds=[(0.1, "yellow"), (1, "red")],
                 description="Delay from a producer sending a frame to its decoding.",
                 targets=[target("histogram_quantile(0.99, sum by (instance, le) "
                                 f"(rate(inferwatch_ingest_lag_seconds_bucket{{{INST}}}[{RATE}])))", "{{instance}}")]),
            timeseries(title="Component errors", unit="ops", w=8, h=5, minimum=0,
                       description="Exceptions raised by a component; the daemon keeps running.",
                       targets=[target(_rate("inferwatch_component_errors_total", "component, method"),
                                       "{{component}}.{{method}}")]),
            Row("Ingest"),
            timeseries(title="Events per second", unit="ops", stack=True, minimum=0,
                       description="Events decoded and aggregated, by transport and type.",
                       targets=[target(_rate("inferwatch_ingest_events_total", "transport, type"),
                                       "{{transport}} {{type}}")]),
            timeseries(title="Frames and bytes per second", minimum=0,
                       description="Datagrams or HTTP batches received, and their bytes.",
                       targets=[target(_rate("inferwatch_ingest_frames_total", "transport"), "{{transport}} frames/s"),
                                target(_rate("inferwatch_ingest_bytes_total", "transport"), "{{transport}} bytes/s")]),
            Row("Losses"),
            timeseries(title="Sidecar drops by reason", unit="ops", stack=True, minimum=0, thresholds=ANY_LOSS,
                       description="Everything the sidecar lost, by reason; any sustained rate fires "
                                   "InferwatchIngestDropping.",
                       targets=[
                           target(_rate("inferwatch_ingest_dropped_total", "reason"), "{{reason}}"),
                           target(_rate("inferwatch_ingest_socket_queue_dropped_total"), "kernel socket queue"),
                           target(_rate("inferwatch_ingest_lost_frames_total"), "lost frames (sequence gaps)"),
                           target(_rate("inferwatch_drift_dropped_records_total", "reason"), "drift: {{reason}}"),
                           target(_rate("inferwatch_gpu_allocator_records_dropped_total", "reason"),
                                  "gpu allocator: {{reason}}"),
                       ]),
            timeseries(title="Decode errors by reason", unit="ops", stack=True, minimum=0, thresholds=ANY_LOSS,
                       description="Frames, records and JSON events that did not decode (counted and dropped).",
                       targets=[target(_rate("inferwatch_ingest_decode_errors_total", "scope, reason"),
                                       "{{scope}} {{reason}}")]),
            timeseries(title="SDK drops by reason", unit="ops", stack=True, minimum=0, thresholds=ANY_LOSS,
                       description="Events the SDK dropped before sending, as reported by the SDK.",
                       targets=[target(_rate("inferwatch_sdk_dropped_events_total", "reason"), "{{reason}}")]),
            timeseries(title="Cardinality overflow by label", unit="ops", stack=True, minimum=0, thresholds=ANY_LOSS,
                       description="Label values mapped to __overflow__ because the label's budget is spent.",
                       targets=[target(_rate("inferwatch_label_overflow_total", "label"), "{{label}}")]),
            Row("Process"),
            timeseries(title="CPU", unit="percentunit", w=8, minimum=0,
                       description="Sidecar CPU time per second (1 = one core).",
                       targets=[target(f"rate(inferwatch_sidecar_process_cpu_seconds_total{{{INST}}}[{RATE}])",
                                       "{{instance}}")]),
            timeseries(title="Memory", unit="bytes", w=8, minimum=0, description="Sidecar resident memory.",
                       targets=[target(f"inferwatch_sidecar_process_resident_memory_bytes{{{INST}}}",
                                       "{{instance}} RSS")]),
            timeseries(title="Open file descriptors", w=8, minimum=0, description="Open descriptors and the limit.",
                       targets=[target(f"inferwatch_sidecar_process_open_fds{{{INST}}}", "{{instance}} open"),
                                target(f"inferwatch_sidecar_process_max_fds{{{INST}}}", "{{instance}} limit")]),
        ],
    )
