"""Queue and batching: queue wait, queue depth, the dynamic batch-size distribution, and capacity."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    CORE,
    Row,
    core_vars,
    dashboard,
    heatmap,
    hist_buckets,
    hist_rate,
    quantiles,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-queue"


def build() -> Dashboard:
    depth = threshold("InferwatchQueueBacklog", "depth")
    headroom = threshold("InferwatchCapacityHeadroomLow", "headroom")
    return dashboard(
        uid=UID, title="inferwatch / Queue and batching",
        description="Queue wait, queue depth and the dynamic batch-size distribution.",
        variables=core_vars(),
        items=[
            Row("Queue"),
            timeseries(title="Queue wait P50 / P99 / P999", unit="s",
                       description="Time requests waited in the queue stages (ingest.queue_stages).",
                       targets=quantiles("inferwatch_queue_wait_seconds", CORE, "model, model_version",
                                         exemplar=True)),
            timeseries(title="Queue depth", minimum=0, thresholds=[(depth / 2, "yellow"), (depth, "red")],
                       description="Latest reported queue depth; red at InferwatchQueueBacklog's threshold.",
                       targets=[target(f"max by (model, model_version) (inferwatch_queue_depth{{{CORE}}})",
                                       "{{model}} {{model_version}}")]),
            Row("Dynamic batching"),
            heatmap(title="Batch size distribution", description="Batches per second by batch size bucket.",
                    targets=[target(hist_buckets("inferwatch_batch_size", CORE), "{{le}}",
                                    heatmap=True)]),
            timeseries(title="Mean batch size and batches per second", minimum=0,
                       description="Average items per batch, and batches formed per second.",
                       targets=[
                           target(f"{hist_rate('inferwatch_batch_size', 'sum', CORE)}\n/\n"
                                  f"{hist_rate('inferwatch_batch_size', 'count', CORE)}", "mean batch size"),
                           target(hist_rate("inferwatch_batch_size", "count", CORE), "batches/s"),
                       ]),
            timeseries(title="Batch size P50 / P99", w=24, minimum=0, description="Batch size quantiles.",
                       targets=quantiles("inferwatch_batch_size", CORE, "", qs=((0.5, "P50"), (0.99, "P99")))),
            Row("Capacity (docs/capacity.md)"),
            timeseries(title="In flight against the live knee", minimum=0,
                       description="Requests in flight (Little's law over the capacity window) and the knee the "
                                   "sidecar fitted from live traffic, with its 90% interval.",
                       targets=[
                           target(f"max by (model, model_version) (inferwatch_capacity_in_flight{{{CORE}}})",
                                  "in flight {{model}} {{model_version}}"),
                           target(f"max by (model, model_version) (inferwatch_capacity_knee_concurrency{{{CORE}}})",
                                  "knee {{model}} {{model_version}}"),
                           target(f"max by (model, model_version) "
                                  f"(inferwatch_capacity_knee_low_concurrency{{{CORE}}})", "knee low {{model_version}}"),
                           target(f"max by (model, model_version) "
                                  f"(inferwatch_capacity_knee_high_concurrency{{{CORE}}})",
                                  "knee high {{model_version}}"),
                       ]),
            timeseries(title="Capacity headroom", unit="percentunit",
                       thresholds=[(headroom, "red"), (2 * headroom, "yellow")],
                       description="1 - in flight / knee; red below InferwatchCapacityHeadroomLow's threshold.",
                       targets=[target(f"min by (model, model_version) (inferwatch_capacity_headroom_ratio{{{CORE}}})",
                                       "{{model}} {{model_version}}")]),
            timeseries(title="Goodput against the objectives", unit="percentunit", w=24, maximum=1,
                       description="Share of requests meeting every capacity.slo objective (TTFT, ITL, "
                                   "end-to-end), and the objective.",
                       targets=[
                           target(f"min by (model, model_version) (inferwatch_slo_goodput_ratio{{{CORE}}})",
                                  "goodput {{model}} {{model_version}}"),
                           target(f"max by (model, model_version) (inferwatch_slo_objective_ratio{{{CORE}}})",
                                  "objective {{model}} {{model_version}}"),
                       ]),
        ],
    )
