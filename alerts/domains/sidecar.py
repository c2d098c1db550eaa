"""The sidecar's own health: scrape, SDK and ingest drops, decode errors, label overflow, checkpoints.
promtool: tests/alerts/sidecar.test.yml (the checkpoint alert in drift.test.yml).
"""

from __future__ import annotations

from alerts.model import Alert, Threshold


def _sidecar_alerts() -> list[Alert]:
    return [
        Alert(
            name="InferwatchSidecarDown", group="inferwatch-sidecar", severity="critical", for_s=300,
            expr="up{{{sidecar_job}}} == 0",
            summary="The inferwatch sidecar {labels.instance} cannot be scraped.",
            description="Prometheus has failed to scrape {labels.instance} (job {labels.job}) for {window:5m}: "
                        "no latency, GPU or drift data arrives from that replica.",
        ),
        Alert(
            name="InferwatchSidecarAbsent", group="inferwatch-sidecar", severity="critical", for_s=900,
            expr="absent(up{{{sidecar_job}}})",
            summary="No inferwatch sidecar is being scraped.",
            description="Prometheus has had no scrape target of job {labels.job} ({{{sidecar_job}}}) for "
                        "{window:15m}: the sidecar, its Service or its ServiceMonitor is missing.",
        ),
        Alert(
            name="InferwatchSDKDroppingEvents", group="inferwatch-sidecar", severity="warning", for_s=600,
            expr="sum by (job, instance, reason) (rate(inferwatch_sdk_dropped_events_total[{window:5m}])) > {rate}",
            summary="The SDK in the model server drops events ({labels.reason}).",
            description='Producers reporting to {labels.instance} drop {value:printf "%.3g"} events/s before '
                        "sending (reason {labels.reason}); latency and drift data are incomplete.",
            thresholds=(Threshold(name="rate", value=0, doc="dropped events per second"),),
        ),
        Alert(
            name="InferwatchIngestDropping", group="inferwatch-sidecar", severity="warning", for_s=600,
            expr="(\n  sum by (job, instance, reason) (rate(inferwatch_ingest_dropped_total[{window:5m}]))\nor\n  "
                 "label_replace(sum by (job, instance) (rate(inferwatch_ingest_socket_queue_dropped_total"
                 '[{window:5m}])), "reason", "socket_queue", "", "")\nor\n  '
                 "label_replace(sum by (job, instance) (rate(inferwatch_ingest_lost_frames_total[{window:5m}])), "
                 '"reason", "lost_frames", "", "")\n) > {rate}',
            summary="The sidecar {labels.instance} loses events ({labels.reason}).",
            description='The sidecar {labels.instance} lost {value:printf "%.3g"} items/s over the last '
                        "{window:5m} (reason {labels.reason}).",
            thresholds=(Threshold(name="rate", value=0, doc="dropped items per second"),),
        ),
        Alert(
            name="InferwatchIngestDecodeErrors", group="inferwatch-sidecar", severity="warning", for_s=600,
            expr="sum by (job, instance, scope, reason) (rate(inferwatch_ingest_decode_errors_total[{window:5m}])) "
                 "> {rate}",
            summary="The sidecar {labels.instance} receives malformed events ({labels.reason}).",
            description='{value:printf "%.3g"} {labels.scope}s/s sent to {labels.instance} do not decode '
                        "(reason {labels.reason}); they are counted and dropped.",
            thresholds=(Threshold(name="rate", value=0, doc="undecodable frames, records or JSON events per second"),),
        ),
        Alert(
            name="InferwatchLabelCardinalityOverflow", group="inferwatch-sidecar", severity="warning", for_s=0,
            expr="increase(inferwatch_label_overflow_total[{window:15m}]) > {values}",
            summary="Values of label {labels.label} overflow their cardinality budget.",
            description="{value:humanize} values of label {labels.label} were mapped to __overflow__ by "
                        "{labels.instance} in the last {window:15m}: the label's budget is spent and new values are "
                        "merged.",
            thresholds=(Threshold(name="values", value=0, doc="values mapped to __overflow__ within 15 minutes"),),
        ),
        Alert(
            # A read fails at start-up, before the first scrape, so its series can be born above 0, which
            # increase() does not see: the second branch fires on it for a while after the start.
            name="InferwatchDriftCheckpointFailing", group="inferwatch-sidecar", severity="warning", for_s=0,
            expr="sum by (job, instance, op, reason) "
                 "(increase(inferwatch_drift_checkpoint_failures_total[{window:15m}])) > {failures}\nor\n"
                 'sum by (job, instance, op, reason) (inferwatch_drift_checkpoint_failures_total{{op="read"}}) '
                 "> {failures}\n  and on (job, instance)\n"
                 "  (time() - inferwatch_sidecar_process_start_time_seconds < {since_start_seconds})",
            summary="The drift checkpoint of {labels.instance} fails ({labels.op}: {labels.reason}).",
            description="The drift component of {labels.instance} failed a checkpoint {labels.op} (reason "
                        "{labels.reason}) in the last {window:15m}. After a write failure the windows do not "
                        "survive a restart; after a read failure the sidecar started with empty windows, and a "
                        "corrupt or incompatible checkpoint was moved aside next to it for inspection.",
            thresholds=(Threshold(name="failures", value=0, doc="failed checkpoint operations within 15 minutes"),
                        Threshold(name="since_start_seconds", value=900, duration=True,
                                  doc="how long after the sidecar's start a failed read (at start-up) alerts")),
        ),
    ]
