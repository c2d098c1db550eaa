"""The single source of inferwatch's Prometheus recording and alerting rules.

Everything an operator may want to tune is a named threshold attached to the
alert it feeds (kubernetes-mixin style); ``docs/alerts.md`` is generated from
the same objects, so the documented values cannot drift from the rules. Every
rule file of ``alerts/`` is rendered from here (:data:`RULE_FILES`).

Expressions and annotations are :meth:`str.format_map` templates with these fields:

* ``{NAME}``: the value of the alert's threshold ``NAME`` (a ``duration``
  threshold is scaled by the :class:`Profile`);
* ``{NAME:le}``: a ``le`` matcher for the histogram bucket bounded by threshold ``NAME``;
* ``{window:5m}``: a duration (range window, or a span named in prose), scaled
  by the :class:`Profile` so that an end-to-end test can load the same rules
  with second-long windows;
* ``{labels.NAME}`` and ``{value:FUNCTION}``: the Go template text
  ``{{ $labels.NAME }}`` and ``{{ $value | FUNCTION }}`` of annotations;
* ``{by_version}``, ``{by_stage}``: the labels of one model version (and stage);
  ``{sidecar_job}``: :data:`SIDECAR_JOB_SELECTOR`.

Literal braces (PromQL label matchers, other Go template actions) are doubled,
as in any format string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from inferwatch_sidecar.metrics.catalog import by_name

#: Selects the scrape job(s) of the sidecar, used by the "sidecar down / not scraped" alerts.
#: Change it to match your scrape config (the ServiceMonitor in deploy/k8s names the job "inferwatch").
SIDECAR_JOB_SELECTOR = 'job="inferwatch"'

#: Where runbook_url annotations point. Each alert links to its own anchor (the lower-cased alert name).
RUNBOOK_BASE_URL = "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md"

#: Labels that identify one served model version in the core (request/stage) metrics; the drift metrics
#: use the same model and model_version labels, so drift and latency series join.
SERVING = "service, model, model_version"
#: The same, plus the stage.
STAGE = "service, model, model_version, stage"


@dataclass(frozen=True)
class Profile:
    """How durations are rendered.

    Attributes:
        name: "production" or a test profile's name.
        scale: factor applied to every duration (1/60 turns 5m into 5s).
        min_seconds: lower bound of a scaled duration, so a range window still
            spans several scrapes.
    """

    name: str = "production"
    scale: float = 1.0
    min_seconds: float = 0.0

    def duration(self, seconds: float) -> str:
        """A Prometheus duration string for ``seconds`` scaled by this profile."""
        if seconds == 0:
            return "0s"
        s = max(seconds * self.scale, self.min_seconds)
        ms = int(round(s * 1000))
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"{ms // size}{unit}"
        return f"{ms}ms"

    def seconds(self, seconds: float) -> float:
        """A plain number of seconds (for ``predict_linear`` horizons), scaled."""
        return max(seconds * self.scale, self.min_seconds) if seconds else 0.0


PRODUCTION = Profile()
#: For end-to-end tests scraping every second: 5m becomes 5s, 1h becomes 1m, at least 4s.
FAST = Profile(name="fast", scale=1 / 60, min_seconds=4.0)


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """A tunable value of one alert.

    Attributes:
        name: the threshold's name, unique within its alert; the template field ``{name}``.
        value: the number (or regex) the field renders.
        doc: what it means, for docs/alerts.md.
        duration: the value is seconds of time, scaled by the profile like the windows.
        bucket_of: a histogram whose bucket bounds the value must be one of (the rule counts whole buckets).
    """

    name: str
    value: float | str
    doc: str
    duration: bool = False
    bucket_of: str | None = None


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alerting rule.

    Attributes:
        name: the alertname (CamelCase, prefixed Inferwatch).
        group: the rule group it belongs to.
        severity: critical (pages), warning (ticket) or info.
        expr: the PromQL template.
        for_s: the ``for:`` duration in seconds (0 = fire at once).
        summary: one line, may use ``{labels.NAME}``.
        description: the details, with live values (``{value:humanize}``).
        thresholds: the tunable values the templates use.
    """

    name: str
    group: str
    severity: str
    expr: str
    for_s: float
    summary: str
    description: str
    thresholds: tuple[Threshold, ...] = ()

    @property
    def anchor(self) -> str:
        """The runbook section anchor (GitHub lower-cases heading text)."""
        return self.name.lower()

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE_URL}#{self.anchor}"


@dataclass(frozen=True, kw_only=True)
class Recording:
    """One recording rule (``level:metric:operations`` naming).

    Attributes:
        record: the series it writes.
        group: the rule group it belongs to.
        expr: the PromQL template.
        labels: static labels added to the result.
        alert: the alert whose thresholds ``expr`` reads, so that an override of the alert moves both.
    """

    record: str
    group: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)
    alert: str | None = None


@dataclass(frozen=True, kw_only=True)
class RuleFile:
    """One generated rule file of ``alerts/``: its groups in file order, and the comment at its top."""

    name: str
    groups: tuple[str, ...]
    doc: str = ""


class LatencyObjective(NamedTuple):
    """A latency SLO of every stage; ``target_seconds`` must be a bucket bound of the stage histogram."""

    name: str
    objective: float
    target_seconds: float
    burn_rate: float
    severity: str


#: The latency objectives. The burn rate counts the calls slower than the target straight from the
#: histogram buckets, so each target is a bucket bound of inferwatch_stage_duration_seconds.
LATENCY_OBJECTIVES: tuple[LatencyObjective, ...] = (
    LatencyObjective(name="p99", objective=0.99, target_seconds=1.0, burn_rate=14.4, severity="critical"),
    LatencyObjective(name="p999", objective=0.999, target_seconds=2.5, burn_rate=14.4, severity="warning"),
)


def _slo_alert_name(o: LatencyObjective) -> str:
    return f"InferwatchStageLatency{o.name.upper()}BudgetBurn"


# ---------------------------------------------------------------------------------------------------------------
# recording rules
# ---------------------------------------------------------------------------------------------------------------


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


# Fleet-wide drift computed by Prometheus from every replica's sidecar.
#
# Each sidecar exports, per model version and feature:
#   inferwatch_drift_bin_events_total{model,model_version,feature,bin}   values per reference bin (counter)
#   inferwatch_drift_reference_bin_ratio{model,model_version,feature,bin} the reference proportion of that bin
# (numeric features: the reference's 10 decile bins; categorical: top-K categories, last bin = "other").
# Summing the counters' increases over all replicas gives the fleet's window; these rules turn it into PSI and a
# chi-square statistic, exactly as the sidecar's engine does for one replica
# (inferwatch_sidecar/components/drift/stats.py: psi, chi2_goodness_of_fit), with zero proportions replaced by 1e-4.
# The window is a literal 10 minutes in every profile: the record names say so, and tests/drift/test_rules.py
# checks these rules with promtool against values computed by the engine.
FLEET_DRIFT_DOC = """\
Fleet-wide drift (PSI and chi-square per feature) from the bin counters of every replica, over the last
10 minutes, as the sidecar's engine computes it for one replica. This only makes sense when every replica
uses the same reference profile file (drift.reference): warm-up references differ per replica."""

_FLEET = "inferwatch-drift-fleet"
_BINS = "model_feature_bin:inferwatch_drift_bin_events:increase10m"
_TOTALS = "model_feature:inferwatch_drift_bin_events:increase10m"
_RATIO = "model_feature_bin:inferwatch_drift_bin:ratio10m"
_REF = "model_feature_bin:inferwatch_drift_reference_bin:ratio"


def _fleet_recordings() -> list[Recording]:
    return [
        # Values per bin over the whole fleet in the last 10 minutes.
        Recording(record=_BINS, group=_FLEET,
                  expr="sum by (model, model_version, feature, bin) (increase(inferwatch_drift_bin_events_total[10m]))"),
        # Values per feature over the whole fleet (only features that had traffic).
        Recording(record=_TOTALS, group=_FLEET, expr=f"sum by (model, model_version, feature) ({_BINS}) > 0"),
        # Fleet proportion per bin, zeros replaced by 1e-4 (as in the engine's PSI).
        Recording(record=_RATIO, group=_FLEET, expr=(
            "(\n"
            f"  ({_BINS}\n    / ignoring(bin) group_left {_TOTALS}) > 0\n"
            ")\n"
            "or\n"
            "(\n"
            f"  {_BINS}\n    / ignoring(bin) group_left {_TOTALS}\n"
            ") * 0 + 0.0001\n")),
        # Reference proportion per bin (identical on every replica with the same profile), zeros -> 1e-4.
        Recording(record=_REF, group=_FLEET, expr=(
            "(max by (model, model_version, feature, bin) (inferwatch_drift_reference_bin_ratio) > 0)\n"
            "or\n"
            "(max by (model, model_version, feature, bin) (inferwatch_drift_reference_bin_ratio) * 0 + 0.0001)\n")),
        # Fleet-wide population stability index per feature.
        Recording(record="model_feature:inferwatch_drift_psi:10m", group=_FLEET, expr=(
            "sum by (model, model_version, feature) (\n"
            f"  ({_RATIO} - {_REF})\n"
            f"  * ln({_RATIO} / {_REF})\n"
            ")\n")),
        # Fleet-wide chi-square goodness-of-fit statistic per feature: sum (observed - expected)^2 / expected.
        Recording(record="model_feature:inferwatch_drift_chi2:10m", group=_FLEET, expr=(
            "sum by (model, model_version, feature) (\n"
            "  (\n"
            f"    {_BINS}\n"
            f"    - {_REF}\n"
            f"      * ignoring(bin) group_left {_TOTALS}\n"
            "  ) ^ 2\n"
            "  / (\n"
            f"    {_REF}\n"
            f"      * ignoring(bin) group_left {_TOTALS}\n"
            "  )\n"
            ")\n")),
        # Share of replicas whose own engine flags the feature as drifted right now.
        Recording(record="model_feature:inferwatch_drift_feature_drifted:avg", group=_FLEET,
                  expr="avg by (model, model_version, feature) (inferwatch_drift_feature_drifted)"),
    ]


# ---------------------------------------------------------------------------------------------------------------
# alerts
# ---------------------------------------------------------------------------------------------------------------

#: Regex (RE2, fully anchored) of the profile column names that hold the prediction. The drift
#: metrics carry no role label, so the prediction column is found by name; ``__prediction__`` is
#: the column name of warm-up references; ``.*pred.*`` catches the usual names of a profile's prediction
#: column (prediction, predicted_class, y_pred, label_pred). Narrow it if an input feature matches.
PREDICTION_FEATURES = "__prediction__|.*pred.*"

_WHERE = "{labels.model} {labels.model_version} ({labels.service})"
_MV = "{labels.model} version {labels.model_version}"


def _version_query(metric: str, condition: str = "") -> str:
    """The Go template pipeline that queries ``metric`` of the alert's model version, for ``{{ with ... }}``."""
    return (f'printf "{metric}{{{{model=\'%s\',model_version=\'%s\'}}}}{condition}" $labels.model '
            "$labels.model_version | query")


#: ``{service, model, model_version}`` of the alert's series, as a PromQL matcher built by printf in a Go template.
_VERSION_MATCH = "service='%s',model='%s',model_version='%s'"
_VERSION_ARGS = "$labels.service $labels.model $labels.model_version"


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


def _gpu_alerts() -> list[Alert]:
    return [
        Alert(
            name="InferwatchGPUMemoryFillingUp", group="inferwatch-gpu", severity="warning", for_s=3600,
            expr="(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < {free_ratio}\n"
                 "and\npredict_linear(inferwatch_gpu_memory_free_bytes[{window:6h}], {horizon_seconds}) < 0",
            summary="GPU {labels.gpu} memory is predicted to run out within {window:1d}.",
            description="GPU {labels.gpu} has only {value:humanizePercentage} of its memory free and, at the "
                        "trend of the last {window:6h}, will be full within {window:1d}.",
            thresholds=(
                Threshold(name="free_ratio", value=0.25,
                          doc="level gate: free share of device memory below which the trend counts"),
                Threshold(name="horizon_seconds", value=86400, duration=True,
                          doc="trend gate: predict_linear horizon (24h)"),
            ),
        ),
        Alert(
            name="InferwatchGPUMemoryFillingUpSoon", group="inferwatch-gpu", severity="critical", for_s=1800,
            expr="(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < {free_ratio}\n"
                 "and\npredict_linear(inferwatch_gpu_memory_free_bytes[{window:1h}], {horizon_seconds}) < 0",
            summary="GPU {labels.gpu} memory is predicted to run out within {window:4h}.",
            description="GPU {labels.gpu} has only {value:humanizePercentage} of its memory free and, at the "
                        "trend of the last {window:1h}, will be full within {window:4h}.",
            thresholds=(
                Threshold(name="free_ratio", value=0.10, doc="level gate: free share of device memory"),
                Threshold(name="horizon_seconds", value=14400, duration=True,
                          doc="trend gate: predict_linear horizon (4h)"),
            ),
        ),
        Alert(
            # The description's Go template queries the device's time to OOM (the summed rate of every
            # leaking process and the unattributed memory, not this process's own) and the kind (tensor,
            # cache_fragmentation, native, unknown); the kind picks the runbook's branch.
            name="InferwatchGPUMemoryLeak", group="inferwatch-gpu", severity="warning", for_s=0,
            expr="inferwatch_gpu_leak_rate_bytes_per_second\nand on (job, instance, gpu, pid)\n"
                 "(inferwatch_gpu_leak_detected == 1)",
            summary="GPU memory leak on GPU {labels.gpu}{{{{ if $labels.pid }}}} in process {labels.pid}"
                    "{{{{ end }}}}.",
            description="The memory floor on GPU {labels.gpu}{{{{ if $labels.pid }}}} of process {labels.pid}"
                        "{{{{ end }}}} grows by {value:humanize1024}B/s; "
                        '{{{{ with printf "inferwatch_gpu_device_time_to_oom_seconds{{instance=\'%s\',gpu=\'%s\'}}" '
                        "$labels.instance $labels.gpu | query }}}}at the summed rate of everything leaking on it, the "
                        "device runs out of memory in {{{{ . | first | value | humanizeDuration }}}}{{{{ else }}}}the "
                        "time to OOM is not known yet{{{{ end }}}}."
                        '{{{{ with printf "inferwatch_gpu_leak_kind{{instance=\'%s\',gpu=\'%s\',pid=\'%s\'}} == 1" '
                        '$labels.instance $labels.gpu $labels.pid | query }}}} Kind: {{{{ . | first | label "kind" }}}}.'
                        "{{{{ end }}}}",
        ),
        Alert(
            name="InferwatchGPUAllocatorFragmented", group="inferwatch-gpu", severity="warning", for_s=1800,
            expr="inferwatch_gpu_allocator_fragmentation_ratio > {ratio}",
            summary="The CUDA caching allocator of process {labels.pid} is fragmented.",
            description="{value:humanizePercentage} of the memory reserved by the caching allocator of process "
                        "{labels.pid} on GPU {labels.gpu} sits in inactive split blocks (threshold {ratio}).",
            thresholds=(Threshold(name="ratio", value=0.3, doc="inactive-split bytes / reserved bytes"),),
        ),
        Alert(
            name="InferwatchGPUAllocRetries", group="inferwatch-gpu", severity="warning", for_s=0,
            expr="increase(inferwatch_gpu_allocator_alloc_retries_total[{window:15m}]) > {retries}",
            summary="Process {labels.pid} keeps flushing the CUDA allocator cache to allocate.",
            description="The caching allocator of process {labels.pid} on GPU {labels.gpu} retried "
                        "{value:humanize} cudaMalloc calls after flushing its cache in the last {window:15m} "
                        "(threshold {retries}); every retry stalls the stream.",
            thresholds=(Threshold(name="retries", value=10, doc="allocation retries within 15 minutes"),),
        ),
        Alert(
            name="InferwatchGPUOutOfMemory", group="inferwatch-gpu", severity="critical", for_s=0,
            expr="increase(inferwatch_gpu_allocator_ooms_total[{window:10m}]) > 0",
            summary="Process {labels.pid} ran out of GPU memory.",
            description="The allocator of process {labels.pid} on GPU {labels.gpu} raised "
                        "{value:humanize} out-of-memory errors in the last {window:10m}.",
        ),
        Alert(
            # The sidecar already requires each copy to be flat for gpu.duplicates.flat_s (5 min), so the
            # rule only rides out a worker restart.
            name="InferwatchGPUDuplicateModelCopies", group="inferwatch-gpu", severity="warning", for_s=600,
            expr="inferwatch_gpu_duplicate_model_copies >= {min_copies}",
            summary="GPU {labels.gpu} holds {value} copies of what looks like one model.",
            description="{value} processes on GPU {labels.gpu} each hold a similar, large and flat amount of "
                        "memory: one model loaded once per worker process"
                        '{{{{ with printf "inferwatch_gpu_duplicate_model_extra_bytes{{instance=\'%s\',gpu=\'%s\'}}" '
                        "$labels.instance $labels.gpu | query }}}}, {{{{ . | first | value | humanize1024 }}}}B "
                        "beyond one copy{{{{ end }}}}. "
                        "Serve it from one process per GPU, or from Triton or vLLM.",
            thresholds=(Threshold(name="min_copies", value=2, doc="similar copies on one GPU"),),
        ),
        Alert(
            # last_success_age is -1 until the first good sample: a host without a GPU (backend auto, no
            # NVML) never pages; a collector that worked and stopped does, and so does a failed component.
            name="InferwatchGPUCollectorDown", group="inferwatch-gpu", severity="warning", for_s=300,
            expr="(\n  inferwatch_gpu_collector_up == 0\n  and\n  inferwatch_gpu_collector_last_success_age_seconds >= 0\n)"
                 '\nor\ninferwatch_component_up{{component="gpu"}} == 0',
            summary="The sidecar's GPU collector is not returning data.",
            description="The GPU collector of {labels.instance} has returned no device data for {window:5m}, so GPU "
                        "memory, leak and fragmentation alerts are blind. /v1/status shows the NVML error and its fix.",
        ),
    ]


def _drift_alerts() -> list[Alert]:
    return [
        Alert(
            # The dataset verdict with at least one drifted column; without one, only the joint test can have
            # made the verdict, and InferwatchJointDrift fires instead.
            name="InferwatchFeatureDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_dataset_drifted_ratio > 0\nand on (model, model_version)\n"
                 "(inferwatch_drift_dataset_drifted == 1)",
            summary="The inputs of " + _MV + " drifted from the reference.",
            description="{value:humanizePercentage} of the input features of " + _MV + " differ significantly "
                        "from the reference profile (after multiple-testing correction and effect-size floors) for "
                        "{window:15m}."
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_drifted", " == 1") + " }}}}"
                        " The joint test fired too: the relations between the features changed as well."
                        "{{{{ end }}}}",
        ),
        Alert(
            # Joint-only drift: every column keeps its distribution (a join that attaches values to the wrong rows).
            name="InferwatchJointDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_multivariate_statistic\nand on (model, model_version)\n"
                 "(inferwatch_drift_multivariate_drifted == 1)\nunless on (model, model_version)\n"
                 "(inferwatch_drift_dataset_drifted_ratio > 0)",
            summary="The relations between the inputs of " + _MV + " changed, though no single input drifted.",
            description="No input feature of " + _MV + " drifted on its own, but the joint test did for "
                        "{window:15m}: the window's rows reconstruct worse from the reference's principal components "
                        '(AUC {value:printf "%.3f"}'
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_threshold") + " }}}}"
                        ' against a threshold of {{{{ . | first | value | printf "%.3f" }}}}{{{{ end }}}}'
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_adjusted_p_value") + " }}}}"
                        ', adjusted p {{{{ . | first | value | printf "%.2g" }}}}{{{{ end }}}}). '
                        "Each column keeps its distribution while the relations between columns broke, as when a "
                        "join or a pipeline attaches values to the wrong rows.",
        ),
        Alert(
            name="InferwatchPredictionDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr='inferwatch_drift_feature_drifted{{feature=~"{feature_regex}"}} == 1',
            summary="The predictions of " + _MV + " drifted from the reference.",
            description="The distribution of the predicted classes of " + _MV + " (column {labels.feature}) "
                        "differs significantly from the reference profile for {window:15m}.",
            thresholds=(Threshold(name="feature_regex", value=PREDICTION_FEATURES,
                                  doc="regex of the prediction column names (the drift metrics have no role label)"),),
        ),
        Alert(
            name="InferwatchConfidenceDrop", group="inferwatch-drift", severity="warning", for_s=1800,
            expr='inferwatch_drift_confidence_mean{{window="reference"}}\n- ignoring (window)\n'
                 'inferwatch_drift_confidence_mean{{window="current"}}\n> {drop}',
            summary="The mean confidence of " + _MV + " dropped.",
            description="The mean confidence of " + _MV + ' is {value:printf "%.2f"} below the reference\'s '
                        "(threshold {drop}) for {window:30m}.",
            thresholds=(Threshold(name="drop", value=0.1,
                                  doc="absolute drop of the window's mean confidence below the reference's"),),
        ),
        Alert(
            name="InferwatchCanaryDiverging", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_canary_drifted_ratio > {drifted_ratio}",
            summary="Version {labels.model_version} of {labels.model} behaves differently from "
                    "{labels.baseline_version}.",
            description="{value:humanizePercentage} of the columns (inputs, predictions, confidence) of " + _MV +
                        " differ significantly from the stable version {labels.baseline_version} for {window:15m}.",
            thresholds=(Threshold(name="drifted_ratio", value=0,
                                  doc="share of columns that differ (0: any column; the test already corrects for "
                                      "multiple testing)"),),
        ),
        Alert(
            name="InferwatchEstimatedAccuracyLow", group="inferwatch-drift", severity="warning", for_s=1800,
            expr="inferwatch_drift_estimated_accuracy_ratio < {accuracy}",
            summary="The estimated accuracy of " + _MV + " is low.",
            description="The label-free accuracy estimate (CBPE) of " + _MV + " is {value:humanizePercentage}, "
                        "below {accuracy}, for {window:30m}.",
            thresholds=(Threshold(name="accuracy", value=0.7, doc="floor of the estimated accuracy"),),
        ),
        Alert(
            # Only calibrated estimates have a reference accuracy; the upper bound of the 95% interval must
            # be below the reference too, so a small window's noise does not fire it.
            name="InferwatchEstimatedAccuracyDrop", group="inferwatch-drift", severity="warning", for_s=1800,
            expr="inferwatch_drift_reference_accuracy_ratio - inferwatch_drift_estimated_accuracy_ratio > {drop}\n"
                 "and on (model, model_version)\n"
                 '(inferwatch_drift_estimated_accuracy_bound_ratio{{bound="upper"}} < ignoring (bound)\n'
                 " inferwatch_drift_reference_accuracy_ratio)",
            summary="The calibrated accuracy estimate of " + _MV + " dropped below the reference's.",
            description="The label-free accuracy estimate of " + _MV + ", calibrated on the labelled reference, is "
                        '{value:printf "%.3f"} below the reference accuracy (threshold {drop}, and the whole 95% '
                        "interval is below it) for {window:30m}.",
            thresholds=(Threshold(name="drop", value=0.05,
                                  doc="absolute drop of the calibrated estimate below the reference accuracy"),),
        ),
    ]


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


# Engines' own metrics, under their native names (alerts/catalog_check.py: ENGINE_SERIES, taken from the
# recorded /metrics of a real server in tests/fixtures/). vLLM labels the model `model_name` (its
# --served-model-name, which the vllm trace preset also makes inferwatch's `model`); Triton labels it `model`
# and `version` (inferwatch's `model` and `model_version` from its spans).
_VLLM = "job, instance, model_name"
_TRITON = "job, instance, model, version"


def _engine_slow_share(histogram: str) -> str:
    """Share of a vLLM latency histogram's observations above ``target_seconds``, over 5 minutes."""
    return ("(\n  1 - sum by (" + _VLLM + f") (rate({histogram}_bucket{{{{{{target_seconds:le}}}}}}[{{window:5m}}]))\n"
            "  / sum by (" + _VLLM + f") (rate({histogram}_count[{{window:5m}}]))\n) > {{slow_ratio}}")


def _engine_alerts() -> list[Alert]:
    triton_compute = ("sum by (" + _TRITON + ") (\n  rate(nv_inference_compute_input_duration_us[{window:5m}])\n"
                      "  + rate(nv_inference_compute_infer_duration_us[{window:5m}])\n"
                      "  + rate(nv_inference_compute_output_duration_us[{window:5m}])\n)")
    # Nothing ties Triton's scrape instance to the sidecar's service label: of the services that report
    # this model version, the highest (one value, whichever order the query returns them in).
    inferwatch_queue = ("max(service_model_version_stage:inferwatch_stage_duration_seconds:p99_5m"
                        "{{model='%s',model_version='%s',stage='queue'}})")
    return [
        Alert(
            name="InferwatchVLLMKVCacheFull", group="inferwatch-engines", severity="warning", for_s=300,
            expr="max by (" + _VLLM + ") (vllm:kv_cache_usage_perc) > {usage_ratio}\nand on (" + _VLLM + ")\n"
                 "sum by (" + _VLLM + ") (vllm:num_requests_waiting) > {waiting}",
            summary="vLLM's KV cache for {labels.model_name} is full and requests wait.",
            description="The KV cache of {labels.model_name} on {labels.instance} is {value:humanizePercentage} "
                        "used (threshold {usage_ratio}) while more than {waiting} requests wait, for {window:5m}: "
                        "the scheduler cannot admit new sequences until running ones finish.",
            thresholds=(Threshold(name="usage_ratio", value=0.9, doc="vllm:kv_cache_usage_perc (0 to 1)"),
                        Threshold(name="waiting", value=0, doc="vllm:num_requests_waiting that must be exceeded")),
        ),
        Alert(
            name="InferwatchVLLMPreemptions", group="inferwatch-engines", severity="warning", for_s=0,
            expr="sum by (" + _VLLM + ") (increase(vllm:num_preemptions_total[{window:15m}])) > {preemptions}",
            summary="vLLM preempts running requests of {labels.model_name}.",
            description="vLLM on {labels.instance} preempted {value:humanize} running sequences of "
                        "{labels.model_name} in the last {window:15m} (threshold {preemptions}): their KV blocks "
                        "were freed and they are recomputed, so their latency grows.",
            thresholds=(Threshold(name="preemptions", value=10, doc="preemptions within 15 minutes"),),
        ),
        Alert(
            name="InferwatchVLLMTimeToFirstTokenSlow", group="inferwatch-engines", severity="warning", for_s=600,
            expr=_engine_slow_share("vllm:time_to_first_token_seconds"),
            summary="vLLM's time to first token for {labels.model_name} misses its objective.",
            description="{value:humanizePercentage} of the requests to {labels.model_name} on {labels.instance} "
                        "waited longer than {target_seconds}s for their first token over the last {window:5m} "
                        "(threshold {slow_ratio}), by vllm:time_to_first_token_seconds.",
            thresholds=(Threshold(name="target_seconds", value=1.0,
                                  doc="time-to-first-token target; must be a bucket bound of "
                                      "vllm:time_to_first_token_seconds"),
                        Threshold(name="slow_ratio", value=0.05, doc="share of requests allowed above the target")),
        ),
        Alert(
            name="InferwatchVLLMInterTokenLatencySlow", group="inferwatch-engines", severity="warning", for_s=600,
            expr=_engine_slow_share("vllm:inter_token_latency_seconds"),
            summary="vLLM's inter-token latency for {labels.model_name} misses its objective.",
            description="{value:humanizePercentage} of the token gaps of {labels.model_name} on {labels.instance} "
                        "were longer than {target_seconds}s over the last {window:5m} (threshold {slow_ratio}), by "
                        "vllm:inter_token_latency_seconds: streams stutter.",
            thresholds=(Threshold(name="target_seconds", value=0.1,
                                  doc="inter-token latency target; must be a bucket bound of "
                                      "vllm:inter_token_latency_seconds"),
                        Threshold(name="slow_ratio", value=0.05, doc="share of token gaps allowed above the target")),
        ),
        Alert(
            # The description adds inferwatch's own P99 queue wait of the same model version (from Triton's
            # spans), joined on model and version, the highest over the services that report it.
            name="InferwatchTritonQueueDominatesCompute", group="inferwatch-engines", severity="warning",
            for_s=900,
            expr="sum by (" + _TRITON + ") (rate(nv_inference_queue_duration_us[{window:5m}]))\n/\n"
                 + triton_compute + "\n> {queue_to_compute_ratio}",
            summary="Requests to Triton model {labels.model} {labels.version} queue longer than they compute.",
            description="Requests to {labels.model} version {labels.version} on {labels.instance} spend "
                        '{value:printf "%.2g"}x their compute time waiting in the scheduler queue (threshold '
                        "{queue_to_compute_ratio}) for {window:15m}."
                        f'{{{{{{{{ with printf "{inferwatch_queue}" $labels.model $labels.version | query }}}}}}}}'
                        " Highest P99 queue wait in Triton's spans of that version: {{{{ . | first | value | humanizeDuration }}}}."
                        "{{{{ end }}}}",
            thresholds=(Threshold(name="queue_to_compute_ratio", value=1,
                                  doc="queue time over compute (input + infer + output) time"),),
        ),
        Alert(
            name="InferwatchTritonPendingRequests", group="inferwatch-engines", severity="warning", for_s=600,
            expr="min_over_time(nv_inference_pending_request_count[{window:5m}]) > {pending}",
            summary="Triton model {labels.model} {labels.version} has a standing backlog.",
            description="At least {value:humanize} requests to {labels.model} version {labels.version} on "
                        "{labels.instance} have waited for execution through the last {window:5m} (threshold "
                        "{pending}), for {window:10m}.",
            thresholds=(Threshold(name="pending", value=50,
                                  doc="nv_inference_pending_request_count that must be exceeded for the whole "
                                      "5-minute window"),),
        ),
        Alert(
            name="InferwatchTritonRequestFailures", group="inferwatch-engines", severity="critical", for_s=300,
            expr="sum by (" + _TRITON + ", reason) (rate(nv_inference_request_failure[{window:5m}]))\n"
                 "/ ignoring (reason) group_left ()\n(\n"
                 "  sum by (" + _TRITON + ") (rate(nv_inference_request_success[{window:5m}]))\n"
                 "  + sum by (" + _TRITON + ") (rate(nv_inference_request_failure[{window:5m}]))\n"
                 ") > {failure_ratio}",
            summary="Triton fails requests to {labels.model} {labels.version} ({labels.reason}).",
            description="{value:humanizePercentage} of the requests to {labels.model} version {labels.version} on "
                        "{labels.instance} failed with reason {labels.reason} over the last {window:5m} "
                        "(threshold {failure_ratio}).",
            thresholds=(Threshold(name="failure_ratio", value=0.01,
                                  doc="share of requests failing with one reason"),),
        ),
    ]


def _streaming_alerts() -> list[Alert]:
    return [
        Alert(
            name="InferwatchWastedGeneration", group="inferwatch-serving", severity="warning", for_s=600,
            expr="sum by (" + SERVING + ") (rate(inferwatch_undelivered_tokens_total[{window:10m}]))\n/\n"
                 "sum by (" + SERVING + ") (rate(inferwatch_generated_tokens_total[{window:10m}]))\n"
                 "> {wasted_ratio}",
            summary="{labels.model} {labels.model_version} keeps generating for clients that have left.",
            description="{value:humanizePercentage} of the tokens that " + _WHERE + " generated over the last "
                        "{window:10m} were produced after their client had disconnected (threshold {wasted_ratio}): "
                        "generation is not cancelled on disconnect, so the GPU works for nobody. Cancel it when "
                        "the client leaves (see the runbook).",
            thresholds=(Threshold(name="wasted_ratio", value=0.05,
                                  doc="share of generated tokens produced after the client disconnected"),),
        ),
    ]


def _skew_alerts() -> list[Alert]:
    """Training-serving skew (docs/skew.md): served feature values that differ from the offline pipeline's."""
    kind = ('{{{{ with printf "inferwatch_skew_explained_ratio{{service=\'%s\',model=\'%s\',model_version=\'%s\','
            'feature=\'%s\'}}" $labels.service $labels.model $labels.model_version $labels.feature | query }}}}'
            ' Diagnosis: {{{{ . | first | label "kind" }}}}, explaining {{{{ . | first | value | humanizePercentage }}}}'
            " of the rows.{{{{ end }}}}")
    return [
        Alert(
            name="InferwatchTrainingServingSkew", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_skew_match_ratio < {match_ratio}",
            summary="Feature {labels.feature} of " + _MV + " is served differently from training.",
            description="Only {value:humanizePercentage} of the last joined requests of " + _MV + " (" +
                        "{labels.service}) were served the value of {labels.feature} that the offline pipeline "
                        "computes for them (threshold {match_ratio}) for {window:15m}." + kind +
                        " Run `inferwatch skew` on the served sample for the whole diagnosis.",
            thresholds=(Threshold(name="match_ratio", value=0.99,
                                  doc="share of joined rows whose served value matches the offline value"),),
        ),
    ]


def _rate(metric: str, window: str) -> str:
    return f"sum by ({SERVING}) (rate({metric}[{{window:{window}}}]))"


def _overload_alerts() -> list[Alert]:
    """Issue 27: retries and client give-ups that feed an overload (docs/overload.md)."""
    att5, ret5 = _rate("inferwatch_request_attempts_total", "5m"), _rate("inferwatch_request_retries_total", "5m")
    att15 = _rate("inferwatch_request_attempts_total", "15m")
    return [
        Alert(
            name="InferwatchRetryStorm", group="inferwatch-serving", severity="critical", for_s=300,
            expr=f"(\n  {att5}\n  /\n  ({att5} - {ret5})\n) > {{amplification}}\nand\n"
                 f"(\n  {_rate('inferwatch_client_giveups_total', '5m')}\n  /\n  {att5}\n) > {{giveup_ratio}}",
            summary="{labels.model} {labels.model_version} is in a retry storm: retries and client give-ups "
                    "feed each other.",
            description="Clients of " + _WHERE + " sent {value:humanize} attempts per unique request over the "
                        "last {window:5m} (threshold {amplification}) while more than {giveup_ratio} of the "
                        "requests lost their client before the answer: clients time out, retry at once and add "
                        "load to a service that is already too slow. Budget the retries and shed load (see the "
                        "runbook).",
            thresholds=(
                Threshold(name="amplification", value=1.5, doc="attempts per unique request (retries included)"),
                Threshold(name="giveup_ratio", value=0.05,
                          doc="share of requests whose client disconnected before the response was complete"),
            ),
        ),
        Alert(
            name="InferwatchTimeoutMismatch", group="inferwatch-serving", severity="warning", for_s=600,
            expr="histogram_quantile(0.5, sum by (" + SERVING + ", le) "
                 "(rate(inferwatch_client_giveup_wait_seconds_bucket[{window:15m}])))\n<\n"
                 "{wait_share} * histogram_quantile(0.5, sum by (" + SERVING + ", le) "
                 "(rate(inferwatch_request_duration_seconds_bucket[{window:15m}])))\n"
                 "and\n(\n  " + _rate("inferwatch_client_giveups_total", "15m") + f"\n  /\n  {att15}\n"
                 ") > {giveup_ratio}",
            summary="Clients of {labels.model} {labels.model_version} give up before the server typically "
                    "answers.",
            description="Clients that gave up on " + _WHERE + " over the last {window:15m} had waited "
                        "{value:humanizeDuration} (median), less than {wait_share} of the server's median "
                        "latency, and more than {giveup_ratio} of the requests ended so: the client timeout is "
                        "shorter than the work, so the work is wasted and usually retried. Align the timeouts "
                        "(see the runbook).",
            thresholds=(
                Threshold(name="wait_share", value=1.0,
                          doc="the median give-up wait below this share of the median server latency fires"),
                Threshold(name="giveup_ratio", value=0.01,
                          doc="share of requests whose client disconnected before the response was complete"),
            ),
        ),
    ]


ALERTS: tuple[Alert, ...] = (*_slo_alerts(), *_serving_alerts(), *_streaming_alerts(), *_overload_alerts(),
                             *_gpu_alerts(), *_drift_alerts(), *_skew_alerts(), *_sidecar_alerts(), *_engine_alerts())
RECORDINGS: tuple[Recording, ...] = (*_recordings(), *_fleet_recordings())

#: Group names of alerts/inferwatch.rules.yml, in file order.
GROUPS: tuple[str, ...] = (
    "inferwatch-recording", "inferwatch-slo", "inferwatch-serving", "inferwatch-gpu", "inferwatch-drift",
    "inferwatch-sidecar", "inferwatch-engines",
)
#: Group names of alerts/drift.rules.yml (owned by the drift component).
FLEET_GROUPS: tuple[str, ...] = (_FLEET,)

#: Every rule file of ``alerts/``.
RULE_FILES: tuple[RuleFile, ...] = (
    RuleFile(name="inferwatch.rules.yml", groups=GROUPS),
    RuleFile(name="drift.rules.yml", groups=FLEET_GROUPS, doc=FLEET_DRIFT_DOC),
)

# ---------------------------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _fmt_number(v: float | str) -> str:
    if isinstance(v, str):
        return v
    return f"{v:g}" if not float(v).is_integer() else str(int(v))


def _le(value: float) -> str:
    """A label matcher for the bucket whose upper bound is ``value``.

    prometheus_client writes ``1.0`` while other exporters write ``1``; match both.
    """
    text = repr(float(value))
    if float(value).is_integer():
        return f'le=~"{int(value)}|{text}"'
    return f'le="{text}"'


class _Window:
    """``{window:5m}``: the duration in the format spec, scaled by the profile."""

    def __init__(self, profile: Profile) -> None:
        self._profile = profile

    def __format__(self, spec: str) -> str:
        m = _DURATION.fullmatch(spec)
        if m is None:
            raise ValueError(f"{{window:{spec}}}: not a duration such as 5m, 1h or 1d")
        return self._profile.duration(int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


class _Labels:
    """``{labels.NAME}``: Go template text for the alert's label NAME."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        return f"{{{{ $labels.{name} }}}}"


class _Value:
    """``{value:FUNCTION}``: Go template text for the alert's value piped through FUNCTION."""

    def __format__(self, spec: str) -> str:
        return f"{{{{ $value | {spec} }}}}" if spec else "{{ $value }}"


class _ThresholdField:
    """``{NAME}`` or ``{NAME:le}`` for one threshold."""

    def __init__(self, threshold: Threshold, profile: Profile) -> None:
        self._t = threshold
        self._profile = profile

    def __format__(self, spec: str) -> str:
        v = self._t.value
        if spec == "le":
            return _le(float(v))
        if spec:
            raise ValueError(f"{{{self._t.name}:{spec}}}: the only threshold format is 'le'")
        if self._t.duration:
            return _fmt_number(self._profile.seconds(float(v)))
        return _fmt_number(v)


class _Fields(dict[str, Any]):
    """The fields of one rule's templates; a missing one names the rule."""

    def __init__(self, owner: str, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self._owner = owner

    def __missing__(self, key: str) -> Any:
        raise KeyError(f"{self._owner}: no threshold or field {key!r}")


def render(text: str, profile: Profile, alert: Alert | None = None) -> str:
    """Fill a template's fields (see the module docstring) for ``profile`` and ``alert``'s thresholds."""
    fields: dict[str, Any] = {
        "window": _Window(profile), "labels": _Labels(), "value": _Value(),
        "by_version": SERVING, "by_stage": STAGE, "sidecar_job": SIDECAR_JOB_SELECTOR,
    }
    if alert is not None:
        fields.update((t.name, _ThresholdField(t, profile)) for t in alert.thresholds)
    return text.format_map(_Fields(alert.name if alert else "template", fields))


Overrides = dict[str, dict[str, float | str]]


def effective_alerts(overrides: Overrides | None = None) -> list[Alert]:
    """The alerts with some thresholds replaced (for tests that need, say, a 50 ms latency target).

    Args:
        overrides: ``{alert name: {threshold name: value}}``; ``"for_s"`` replaces the ``for:`` duration.

    Raises:
        ValueError: an unknown alert or threshold, or a threshold that must be a bucket bound and is not.
    """
    overrides = dict(overrides or {})
    out = []
    for a in ALERTS:
        changes = dict(overrides.pop(a.name, {}))
        for_s = float(changes.pop("for_s", a.for_s))
        names = {t.name for t in a.thresholds}
        unknown = set(changes) - names
        if unknown:
            raise ValueError(f"{a.name} has no threshold {sorted(unknown)}; it has {sorted(names) or 'none'}")
        th = tuple(replace(t, value=changes.get(t.name, t.value)) for t in a.thresholds)
        out.append(replace(a, thresholds=th, for_s=for_s))
    if overrides:
        raise ValueError(f"unknown alert(s) {sorted(overrides)}")
    _check_bucket_bounds(out)
    return out


def _check_bucket_bounds(alerts: list[Alert]) -> None:
    catalog = by_name()
    for a in alerts:
        for t in a.thresholds:
            if t.bucket_of is None:
                continue
            buckets = catalog[t.bucket_of].buckets or ()
            if float(t.value) not in buckets:
                raise ValueError(f"{a.name}: {t.name}={t.value} is not a bucket bound of {t.bucket_of} {buckets}; "
                                 "the rule counts whole buckets")


def groups(profile: Profile = PRODUCTION, overrides: Overrides | None = None,
           names: tuple[str, ...] = GROUPS) -> list[dict[str, Any]]:
    """Rule groups in Prometheus's rule-file layout, rendered for ``profile``.

    Args:
        profile: duration scaling (``PRODUCTION`` or ``FAST``).
        overrides: thresholds to replace, see :func:`effective_alerts`.
        names: the groups to render, in order (those of one :class:`RuleFile`).
    """
    alerts = {a.name: a for a in effective_alerts(overrides)}
    out: list[dict[str, Any]] = []
    for g in names:
        rules: list[dict[str, Any]] = []
        for r in RECORDINGS:
            if r.group == g:
                rule: dict[str, Any] = {"record": r.record,
                                        "expr": render(r.expr, profile, alerts[r.alert] if r.alert else None)}
                if r.labels:
                    rule["labels"] = dict(r.labels)
                rules.append(rule)
        for a in alerts.values():
            if a.group == g:
                rule = {"alert": a.name, "expr": render(a.expr, profile, a)}
                if a.for_s:
                    rule["for"] = profile.duration(a.for_s)
                rule["labels"] = {"severity": a.severity}
                rule["annotations"] = {
                    "summary": render(a.summary, profile, a),
                    "description": render(a.description, profile, a),
                    "runbook_url": a.runbook_url,
                }
                rules.append(rule)
        if rules:
            out.append({"name": g, "rules": rules})
    return out


def threshold(alert: str, name: str) -> float:
    """The numeric value of threshold ``name`` of ``alert`` (dashboards draw it on their panels)."""
    a = next(a for a in ALERTS if a.name == alert)
    v = next(t.value for t in a.thresholds if t.name == name)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{alert}.{name} is {v!r}, not a number")
    return float(v)


def alert_names() -> list[str]:
    """Every alert defined here, in file order."""
    return [a.name for a in ALERTS]


def recording_names() -> list[str]:
    """Every recording rule defined here."""
    return [r.record for r in RECORDINGS]
