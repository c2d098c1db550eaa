"""Stage breakdown: per-stage P50/P99/P999 with exemplars, and where each request's time goes."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    CORE,
    RATE,
    Row,
    core_vars,
    dashboard,
    heatmap,
    hist_buckets,
    hist_rate,
    quantiles,
    query_var,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-stages"
STAGE_DURATION = "inferwatch_stage_duration_seconds"


def build() -> Dashboard:
    p99_target = threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    p999_target = threshold("InferwatchStageLatencyP999BudgetBurn", "target_seconds")
    sel = f'{CORE}, stage=~"$stage"'
    # The classic _count or the native histogram, whichever the sidecars export (docs/scale.md).
    stage_var = query_var("stage", "Stage", 'label_values({__name__=~"inferwatch_stage_duration_seconds(_count)?", '
                                            'service=~"$service", model=~"$model"}, stage)')
    return dashboard(
        uid=UID, title="inferwatch / Stage breakdown",
        description="Per-stage P50/P99/P999 with exemplars, and where each request's time goes.",
        variables=[*core_vars(), stage_var],
        items=[
            Row("Per-stage latency (exemplars on: click a dot for the request and trace ID)"),
            timeseries(title="Stage P50", unit="s", w=8, description="Median latency of each stage.",
                       targets=quantiles(STAGE_DURATION, sel, "stage", exemplar=True, qs=((0.5, "P50"),))),
            timeseries(title="Stage P99", unit="s", w=8, thresholds=[(p99_target, "red")],
                       description="99th percentile of each stage; red at the P99 latency target.",
                       targets=quantiles(STAGE_DURATION, sel, "stage", exemplar=True, qs=((0.99, "P99"),))),
            timeseries(title="Stage P999", unit="s", w=8, thresholds=[(p999_target, "red")],
                       description="99.9th percentile of each stage; red at the P999 latency target.",
                       targets=quantiles(STAGE_DURATION, sel, "stage", exemplar=True, qs=((0.999, "P999"),))),
            Row("Where the time goes"),
            timeseries(title="Mean time per request by stage (stacked)", unit="s", stack=True, minimum=0,
                       description="Seconds each stage adds to the average request; the stack is the mean request "
                                   "time.",
                       targets=[target(
                           f"{hist_rate(STAGE_DURATION, 'sum', sel, 'stage')}\n"
                           f"/ ignoring (stage) group_left\nsum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))",
                           "{{stage}}")]),
            timeseries(title="Share of stage time", unit="percentunit", stack=True, minimum=0, maximum=1,
                       description="Fraction of all stage time spent in each stage.",
                       targets=[target(
                           f"{hist_rate(STAGE_DURATION, 'sum', sel, 'stage')}\n"
                           "/ ignoring (stage) group_left()\n"
                           f"{hist_rate(STAGE_DURATION, 'sum', sel)}", "{{stage}}")]),
            heatmap(title="Stage latency distribution", unit="s", w=24,
                    description="Calls per second in each latency bucket of the selected stages, over time.",
                    targets=[target(hist_buckets(STAGE_DURATION, sel),
                                    "{{le}}", exemplar=True, heatmap=True)]),
            timeseries(title="Stage calls per second", unit="ops", w=24, minimum=0,
                       description="Calls per second of each stage.",
                       targets=[target(hist_rate(STAGE_DURATION, "count", sel, "stage"), "{{stage}}")]),
        ],
    )
