"""Service overview and SLO: QPS, errors by type, end-to-end latency and the latency budget."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import CORE, RATE, Row, core_vars, dashboard, quantiles, stat, target, threshold, timeseries

UID = "inferwatch-overview"


def build() -> Dashboard:
    err = threshold("InferwatchHighErrorRate", "error_ratio")
    p99_target = threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    burn = threshold("InferwatchStageLatencyP99BudgetBurn", "burn_rate")
    objective = threshold("InferwatchStageLatencyP99BudgetBurn", "objective")
    return dashboard(
        uid=UID, title="inferwatch / Service overview and SLO",
        description="QPS, errors by type, end-to-end latency and the latency SLO of an inference service.",
        variables=core_vars(),
        items=[
            Row("Traffic and errors"),
            stat(title="Requests per second", unit="reqps", w=6, h=4,
                 description="Finished requests per second, all outcomes.",
                 targets=[target(f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "QPS")]),
            stat(title="Error ratio", unit="percentunit", w=6, h=4, thresholds=[(err / 5, "yellow"), (err, "red")],
                 description="Share of requests ending in an error; red at InferwatchHighErrorRate's threshold.",
                 targets=[target(
                     f'(sum(rate(inferwatch_requests_total{{{CORE}, outcome="error"}}[{RATE}])) or vector(0))\n/\n'
                     f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "errors")]),
            stat(title="End-to-end P99", unit="s", w=6, h=4,
                 thresholds=[(p99_target / 2, "yellow"), (p99_target, "red")],
                 description="99th percentile of end-to-end latency.",
                 targets=[target("histogram_quantile(0.99, sum by (le) "
                                 f"(rate(inferwatch_request_duration_seconds_bucket{{{CORE}}}[{RATE}])))", "P99")]),
            stat(title="Firing inferwatch alerts", w=6, h=4, thresholds=[(1, "red")],
                 description="Alerts of the inferwatch rules that are firing now.",
                 targets=[target('count(ALERTS{alertname=~"Inferwatch.*", alertstate="firing"}) or vector(0)',
                                 "alerts")]),
            timeseries(title="Requests by outcome", unit="reqps", stack=True, minimum=0,
                       description="Finished requests per second by model version and outcome (ok, error, "
                                   "cancelled).",
                       targets=[target("sum by (model, model_version, outcome) "
                                       f"(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))",
                                       "{{model}} {{model_version}} {{outcome}}")]),
            timeseries(title="Errors by type", unit="reqps", stack=True, minimum=0,
                       description="Failed requests per second by bounded error type.",
                       targets=[target("sum by (model, model_version, error_type) "
                                       f"(rate(inferwatch_request_errors_total{{{CORE}}}[{RATE}]))",
                                       "{{model}} {{model_version}} {{error_type}}")]),
            Row("Latency and SLO"),
            timeseries(title="End-to-end latency P50 / P99 / P999", unit="s", thresholds=[(p99_target, "red")],
                       log_scale=True,
                       description="End-to-end latency quantiles; exemplar dots link to the request and trace.",
                       targets=quantiles("inferwatch_request_duration_seconds", CORE, "model, model_version",
                                         exemplar=True)),
            timeseries(title="P99 latency budget burn rate by stage", thresholds=[(1, "yellow"), (burn, "red")],
                       minimum=0,
                       description=f"How fast each stage spends its P99 budget ({objective:.0%} of calls within "
                                   f"{p99_target:g}s) over 1h; 1 is sustainable, the page fires at {burn:g} "
                                   "(InferwatchStageLatencyP99BudgetBurn).",
                       targets=[target("max by (stage) (service_model_version_stage:inferwatch_stage_slow_p99:"
                                       f"ratio_rate1h{{{CORE}}}) / (1 - {objective:g})", "{{stage}}")]),
            timeseries(title="Stage P99 (recorded, 5m)", unit="s", thresholds=[(p99_target, "red")], w=24,
                       description="Per-stage P99 over 5 minutes from the recording rules.",
                       targets=[target("max by (stage) (service_model_version_stage:inferwatch_stage_duration_"
                                       f"seconds:p99_5m{{{CORE}}})", "{{stage}}")]),
        ],
    )
