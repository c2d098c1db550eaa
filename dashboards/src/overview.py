"""Service overview and SLO: QPS, errors, latency and its budget, why P99.9 is slow, and the canary verdict."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as d
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    CORE,
    RATE,
    Row,
    bargauge,
    core_vars,
    dashboard,
    quantiles,
    stat,
    state_timeline,
    target,
    threshold,
    timeseries,
)
from inferwatch_sidecar.components.canary.config import CanaryConfig

UID = "inferwatch-overview"
#: The canary verdict panel's values: 1 pass, 2 marginal, 3 fail.
VERDICT_MAP = [d.ValueMap(options={
    "1": d.ValueMappingResult(text="pass", color="green", index=0),
    "2": d.ValueMappingResult(text="marginal", color="yellow", index=1),
    "3": d.ValueMappingResult(text="fail", color="red", index=2),
})]


def build() -> Dashboard:
    return dashboard(
        uid=UID, title="inferwatch / Service overview and SLO",
        description="QPS, errors by type, end-to-end latency and the latency SLO of an inference service.",
        variables=core_vars(),
        items=[*_traffic_panels(), *_latency_panels(), *_tail_panels(), *_canary_panels(), *_overload_panels()],
    )


def _traffic_panels() -> list[object]:
    """Traffic and errors: QPS, error ratio, end-to-end P99, firing alerts, outcomes and error types."""
    err = threshold("InferwatchHighErrorRate", "error_ratio")
    p99_target = threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    return [
        Row("Traffic and errors"),
        stat(title="Requests per second", unit="reqps", w=6, h=4,
             description="Finished requests per second, all outcomes.",
             targets=[target(f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "QPS")]),
        stat(title="Error ratio", unit="percentunit", w=6, h=4, thresholds=[(err / 5, "yellow"), (err, "red")],
             description="Share of requests ending in an error; red at InferwatchHighErrorRate's threshold.",
             targets=[target(
                 f'(sum(rate(inferwatch_requests_total{{{CORE}, outcome="error"}}[{RATE}])) or vector(0))\n/\n'
                 f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "errors")]),
        # Classic buckets where the sidecars export them, else their native histograms (docs/scale.md).
        stat(title="End-to-end P99", unit="s", w=6, h=4,
             thresholds=[(p99_target / 2, "yellow"), (p99_target, "red")],
             description="99th percentile of end-to-end latency.",
             targets=quantiles("inferwatch_request_duration_seconds", CORE, "", qs=((0.99, "P99"),))),
        stat(title="Firing inferwatch alerts", w=6, h=4, thresholds=[(1, "red")],
             description="Alerts of the inferwatch rules that are firing now.",
             targets=[target('count(ALERTS{alertname=~"Inferwatch.*", alertstate="firing"}) or vector(0)',
                             "alerts")]),
        timeseries(title="Requests by outcome", unit="reqps", stack=True, minimum=0,
                   description="Finished requests per second by model version and outcome (ok, error, "
                               "cancelled, client_error, shed).",
                   targets=[target("sum by (model, model_version, outcome) "
                                   f"(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))",
                                   "{{model}} {{model_version}} {{outcome}}")]),
        timeseries(title="Errors by type", unit="reqps", stack=True, minimum=0,
                   description="Failed requests per second by bounded error type.",
                   targets=[target("sum by (model, model_version, error_type) "
                                   f"(rate(inferwatch_request_errors_total{{{CORE}}}[{RATE}]))",
                                   "{{model}} {{model_version}} {{error_type}}")]),
    ]


def _latency_panels() -> list[object]:
    """Latency and SLO: end-to-end quantiles, the P99 budget's burn rate and the recorded stage P99."""
    p99_target = threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    burn = threshold("InferwatchStageLatencyP99BudgetBurn", "burn_rate")
    objective = threshold("InferwatchStageLatencyP99BudgetBurn", "objective")
    return [
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
    ]


def _tail_panels() -> list[object]:
    """Why is P99.9 slow: the tail attribution's stage shares, stage times and distinguishing features."""
    return [
        Row("Why is P99.9 slow"),
        bargauge(title="Why is P99.9 slow: time of the slowest 0.1% by stage", unit="percentunit", w=8,
                 minimum=0, maximum=1,
                 description="Share of the slowest 0.1% requests' latency spent in each stage, over the last "
                             "tail-attribution window (tail.window_seconds); /v1/status has the whole report.",
                 targets=[target("max by (model_version, stage) "
                                 f'(inferwatch_tail_stage_share_ratio{{{CORE}, tail="p999"}})',
                                 "{{model_version}} {{stage}}")]),
        bargauge(title="Stage time: slowest 0.1% vs median requests", unit="s", w=8, minimum=0,
                 description="Mean time per stage of the slowest 0.1% and of the median requests (40th to "
                             "60th percentile): the stage whose bar grows most is where the tail comes from.",
                 targets=[target("max by (model_version, stage, group) "
                                 f'(inferwatch_tail_stage_seconds{{{CORE}, group=~"median|p999"}})',
                                 "{{model_version}} {{stage}} {{group}}")]),
        bargauge(title="What slow requests have: feature vs the rest (x median)", w=8, minimum=0,
                 description="For features the drift engine's tests single out (slowest 0.1% against the rest, "
                             "Benjamini-Hochberg across features), the tail's median over the rest's.",
                 targets=[target(f'max by (model_version, feature) (inferwatch_tail_feature_ratio{{{CORE}, '
                                 'tail="p999"}\n  and on (service, model, model_version, feature, tail)\n  '
                                 f'inferwatch_tail_feature_distinguishes{{{CORE}, tail="p999"}} == 1)',
                                 "{{model_version}} {{feature}}")]),
    ]


def _canary_panels() -> list[object]:
    """Canary judgement: score, verdict, traffic split and the failing metrics."""
    passing, marginal = CanaryConfig().pass_score, CanaryConfig().marginal_score
    return [
        Row("Canary judgement"),
        timeseries(title="Canary score", minimum=0, maximum=100, w=8,
                   thresholds=[(marginal, "yellow"), (passing, "green")],
                   description="The canary judge's score of each version against the stable one over the same "
                               f"window (0-100); pass from {passing:g}, marginal from {marginal:g}, and a failed "
                               "critical metric fails it whatever the score.",
                   targets=[target(f"max by (model, model_version, baseline_version) (inferwatch_canary_score{{{CORE}}})",
                                   "{{model}} {{model_version}} vs {{baseline_version}}")]),
        state_timeline(title="Canary verdict", w=8, mappings=VERDICT_MAP,
                       description="The judge's verdict per canary version: pass, marginal or fail "
                                   "(InferwatchCanaryFailing pages on fail).",
                       targets=[target(" + ".join(
                           f'{k} * max by (model, model_version) (inferwatch_canary_verdict{{{CORE}, verdict="{v}"}})'
                           for k, v in ((1, "pass"), (2, "marginal"), (3, "fail"))),
                           "{{model}} {{model_version}}")]),
        timeseries(title="Traffic share by version", unit="percentunit", minimum=0, maximum=1, w=8, stack=True,
                   description="Each version's share of its model's requests in the judge's window: the "
                               "gateway's split as served (95/5 during a canary, 100/0 after a rollback).",
                   targets=[target(f"max by (model, model_version) (inferwatch_canary_traffic_ratio{{{CORE}}})",
                                   "{{model}} {{model_version}}")]),
        bargauge(title="Canary metrics failing", w=24, h=6, minimum=0, maximum=1,
                 description="Metrics of the judgement that are significantly worse than the stable version's "
                             "beyond their tolerance (1 = failing); `inferwatch canary --sidecar URL` prints why.",
                 targets=[target("max by (model_version, metric, stage) "
                                 f"(inferwatch_canary_metric_failed{{{CORE}}})",
                                 "{{model_version}} {{metric}} {{stage}}")]),
    ]


def _overload_panels() -> list[object]:
    """HTTP truth and overload (issue 27, docs/overload.md): 4xx and shed rates, retries, give-ups."""
    amp = threshold("InferwatchRetryStorm", "amplification")
    att = f"sum by (model, model_version) (rate(inferwatch_request_attempts_total{{{CORE}}}[{RATE}]))"
    ret = f"sum by (model, model_version) (rate(inferwatch_request_retries_total{{{CORE}}}[{RATE}]))"
    return [
        Row("Overload: status codes, retries and give-ups"),
        timeseries(title="4xx and shed by route", unit="reqps", stack=True, minimum=0, w=8,
                   description="Requests per second answered with a 4xx (client_error: validation, 404) or shed "
                               "(429/503 the server returned), by route template; probes and docs included.",
                   targets=[target("sum by (route, outcome) (rate(inferwatch_http_requests_total"
                                   f'{{{CORE}, outcome=~"client_error|shed"}}[{RATE}]))',
                                   "{{route}} {{outcome}}")]),
        timeseries(title="4xx and shed ratio", unit="percentunit", minimum=0, w=8,
                   description="Share of model requests answered with a 4xx or shed (probes left out).",
                   targets=[target(f'sum by (outcome) (rate(inferwatch_requests_total{{{CORE}, '
                                   f'outcome=~"client_error|shed"}}[{RATE}]))\n/ ignoring(outcome) group_left\n'
                                   f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "{{outcome}}")]),
        timeseries(title="Load amplification (attempts per unique request)", minimum=1, w=8,
                   thresholds=[(amp, "red")],
                   description="Attempts per unique request: 1 without retries; InferwatchRetryStorm fires "
                               f"above {amp:g} when clients also give up.",
                   targets=[target(f"{att}\n/\n({att} - {ret})", "{{model}} {{model_version}}")]),
        timeseries(title="Client give-ups per second", unit="reqps", minimum=0, w=12,
                   description="Requests whose client disconnected before the response was complete.",
                   targets=[target("sum by (model, model_version) "
                                   f"(rate(inferwatch_client_giveups_total{{{CORE}}}[{RATE}]))",
                                   "{{model}} {{model_version}}")]),
        timeseries(title="Client give-up wait vs server latency (P50)", unit="s", minimum=0, w=12,
                   description="How long clients that gave up had waited, against the server's median: a wait "
                               "below the server's latency is a timeout shorter than the work "
                               "(InferwatchTimeoutMismatch).",
                   # The give-up wait is classic on every exposition; the server's latency may be native.
                   targets=[target("histogram_quantile(0.5, sum by (le) "
                                   f"(rate(inferwatch_client_giveup_wait_seconds_bucket{{{CORE}}}[{RATE}])))",
                                   "client give-up wait P50"),
                            *quantiles("inferwatch_request_duration_seconds", CORE, "",
                                       qs=((0.5, "server latency P50"),))]),
    ]
