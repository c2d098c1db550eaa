"""Serving rules: the request and stage recordings, the latency SLO burn rates and the serving
alerts (error rate, canary verdict, queue backlog). promtool: tests/alerts/serving.test.yml, canary.test.yml.
"""

from __future__ import annotations

from alerts.domains.common import _VERSION_ARGS, _VERSION_MATCH, _WHERE
from alerts.model import Alert, LatencyObjective, Recording, Threshold

#: The latency objectives. The burn rate counts the calls slower than the target straight from the
#: histogram buckets, so each target is a bucket bound of inferwatch_stage_duration_seconds.
LATENCY_OBJECTIVES: tuple[LatencyObjective, ...] = (
    LatencyObjective(name="p99", objective=0.99, target_seconds=1.0, burn_rate=14.4, severity="critical"),
    LatencyObjective(name="p999", objective=0.999, target_seconds=2.5, burn_rate=14.4, severity="warning"),
)


def _slo_alert_name(o: LatencyObjective) -> str:
    return f"InferwatchStageLatency{o.name.upper()}BudgetBurn"


def _recordings() -> list[Recording]:
    out: list[Recording] = [
        Recording(record="service_model_version:inferwatch_requests:rate5m", group="inferwatch-recording",
                  expr="sum by ({by_version}) (rate(inferwatch_requests_total[{window:5m}]))"),
        Recording(record="service_model_version:inferwatch_request_errors:ratio_rate5m",
                  group="inferwatch-recording",
                  expr='sum by ({by_version}) (rate(inferwatch_requests_total{{outcome="error"}}[{window:5m}]))\n'
                       "/\nsum by ({by_version}) (rate(inferwatch_requests_total[{window:5m}]))"),
    ]
    # Each quantile from the classic buckets where a replica exports them, else from the native histogram
    # (a sidecar scraped in protobuf by Prometheus with native histograms on; docs/scale.md).
    for q, name in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
        out.append(Recording(
            record=f"service_model_version:inferwatch_request_duration_seconds:{name}_5m",
            group="inferwatch-recording",
            expr=f"histogram_quantile({q}, "
                 "sum by ({by_version}, le) (rate(inferwatch_request_duration_seconds_bucket[{window:5m}])))\nor\n"
                 f"histogram_quantile({q}, "
                 "sum by ({by_version}) (rate(inferwatch_request_duration_seconds[{window:5m}])))"))
        out.append(Recording(
            record=f"service_model_version_stage:inferwatch_stage_duration_seconds:{name}_5m",
            group="inferwatch-recording",
            expr=f"histogram_quantile({q}, "
                 "sum by ({by_stage}, le) (rate(inferwatch_stage_duration_seconds_bucket[{window:5m}])))\nor\n"
                 f"histogram_quantile({q}, "
                 "sum by ({by_stage}) (rate(inferwatch_stage_duration_seconds[{window:5m}])))"))
    # Share of stage calls slower than each latency target, over the two windows of the burn-rate alerts.
    for o in LATENCY_OBJECTIVES:
        for window in ("5m", "1h"):
            out.append(Recording(
                record=f"service_model_version_stage:inferwatch_stage_slow_{o.name}:ratio_rate{window}",
                group="inferwatch-slo", alert=_slo_alert_name(o),
                expr="1 - (\n"
                     "  sum by ({by_stage}) (rate(inferwatch_stage_duration_seconds_bucket{{{target_seconds:le}}}"
                     f"[{{window:{window}}}]))\n  /\n"
                     f"  sum by ({{by_stage}}) (rate(inferwatch_stage_duration_seconds_count[{{window:{window}}}]))\n)\n"
                     "or\n"
                     "1 - histogram_fraction(0, {target_seconds}, "
                     f"sum by ({{by_stage}}) (rate(inferwatch_stage_duration_seconds[{{window:{window}}}])))"))
    return out


def _tail_note(tail: str) -> str:
    """The tail attribution of the alert's model version, when the tail component has one (docs/tail.md).

    It names the stage that explains most of the tail's extra latency with its share of the tail, and the
    feature that most sets slow requests apart, e.g. "Slowest 0.1%: queue is 83% of their latency; slow
    requests have input_tokens 4.1x the median."
    """
    pct = {"p99": "1%", "p999": "0.1%"}[tail]
    sel = f"{_VERSION_MATCH},tail='{tail}'"
    stage = (f"inferwatch_tail_stage_share_ratio{{{{{sel}}}}} and on (service, model, model_version, stage, tail) "
             f"topk(1, inferwatch_tail_stage_excess_ratio{{{{{sel}}}}})")
    feature = (f"topk(1, inferwatch_tail_feature_ratio{{{{{sel}}}}} and on (service, model, model_version, feature, "
               f"tail) inferwatch_tail_feature_distinguishes{{{{{sel}}}}} == 1)")
    args = " ".join([_VERSION_ARGS] * 2)
    return (f'{{{{{{{{ with printf "{stage}" {args} | query }}}}}}}} Slowest {pct}: {{{{{{{{ . | first | label '
            f'"stage" }}}}}}}} is {{{{{{{{ . | first | value | humanizePercentage }}}}}}}} of their latency'
            f'{{{{{{{{ with printf "{feature}" {args} | query }}}}}}}}; slow requests have {{{{{{{{ . | first | '
            f'label "feature" }}}}}}}} {{{{{{{{ . | first | value | printf "%.1f" }}}}}}}}x the median'
            "{{{{ end }}}}.{{{{ end }}}}")


def _slo_alerts() -> list[Alert]:
    out: list[Alert] = []
    for o in LATENCY_OBJECTIVES:
        pct = f"{o.objective * 100:g}"
        rec = f"service_model_version_stage:inferwatch_stage_slow_{o.name}"
        q = o.name.upper()
        out.append(Alert(
            name=_slo_alert_name(o), group="inferwatch-slo", severity=o.severity, for_s=120,
            expr=f"{rec}:ratio_rate5m > ({{burn_rate}} * (1 - {{objective}}))\n"
                 f"and\n{rec}:ratio_rate1h > ({{burn_rate}} * (1 - {{objective}}))",
            summary=f"Stage {{labels.stage}} of {{labels.model}} is burning its {q} latency budget.",
            description="{value:humanizePercentage} of the calls of stage {labels.stage} of " + _WHERE +
                        f" over the last {{window:5m}} took longer than the {q} target of {{target_seconds}}s; "
                        f"the objective allows {100 - float(pct):.3g}%, so the error budget burns more than "
                        "{burn_rate}x too fast (also true over the last {window:1h})." + _tail_note(o.name),
            thresholds=(
                Threshold(name="objective", value=o.objective,
                          doc=f"share of calls that must finish within target_seconds ({pct}%)"),
                Threshold(name="target_seconds", value=o.target_seconds, bucket_of="inferwatch_stage_duration_seconds",
                          doc="latency target in seconds; must be a bucket bound of inferwatch_stage_duration_seconds"),
                Threshold(name="burn_rate", value=o.burn_rate,
                          doc="how many times faster than sustainable the budget burns (14.4 = a 30-day budget in "
                              "2 days), required over both 5m and 1h"),
            ),
        ))
    return out


def _serving_alerts() -> list[Alert]:
    return [
        Alert(
            name="InferwatchHighErrorRate", group="inferwatch-serving", severity="critical", for_s=300,
            expr="service_model_version:inferwatch_request_errors:ratio_rate5m > {error_ratio}",
            summary="{labels.model} {labels.model_version} fails too many requests.",
            description="{value:humanizePercentage} of the requests to " + _WHERE +
                        " failed over the last {window:5m} (threshold {error_ratio}).",
            thresholds=(Threshold(name="error_ratio", value=0.05, doc="share of requests ending in outcome=\"error\""),),
        ),
        Alert(
            name="InferwatchCanaryFailing", group="inferwatch-serving", severity="critical", for_s=300,
            expr="inferwatch_canary_score\nand on (service, model, model_version, baseline_version)\n"
                 '(inferwatch_canary_verdict{{verdict="fail"}} == 1)',
            summary="Canary {labels.model_version} of {labels.model} fails against {labels.baseline_version}.",
            description="The canary judge scores version {labels.model_version} of {labels.model} ({labels.service}) "
                        '{value:printf "%.0f"}/100 against the stable version {labels.baseline_version} over the '
                        "same window and has judged it fail for {window:5m}. Failing:"
                        '{{{{ range printf "inferwatch_canary_metric_failed{{'
                        + _VERSION_MATCH + ",baseline_version='%s'}} == 1\" " + _VERSION_ARGS
                        + ' $labels.baseline_version | query | sortByLabel "metric" }}}} {{{{ .Labels.metric }}}}'
                        "{{{{ if .Labels.stage }}}}[{{{{ .Labels.stage }}}}]{{{{ end }}}}{{{{ end }}}}. Roll it back "
                        "(gateway weight 0) and see `inferwatch canary --sidecar URL`.",
        ),
        Alert(
            name="InferwatchQueueBacklog", group="inferwatch-serving", severity="warning", for_s=600,
            expr="min_over_time(inferwatch_queue_depth[{window:5m}]) > {depth}",
            summary="The request queue of {labels.model} {labels.model_version} is not draining.",
            description="The queue of " + _WHERE + " has held more than {depth} requests for at least {window:15m} "
                        "(lowest depth over the last {window:5m}: {value:humanize}).",
            thresholds=(Threshold(name="depth", value=100,
                                  doc="queue depth that must be exceeded for the whole 5-minute window"),),
        ),
    ]
