"""The single source of inferwatch's Prometheus recording and alerting rules.

Everything an operator may want to tune is a named threshold attached to the
alert it feeds (kubernetes-mixin style); ``docs/alerts.md`` is generated from
the same objects, so the documented values cannot drift from the rules.

Expressions and annotations use two placeholders, expanded by :func:`render`:

* ``@w(SECONDS)``: a duration (range-vector window, ``predict_linear`` horizon
  or ``for:``), scaled by the :class:`Profile` so that an end-to-end test can
  load the same rules with second-long windows;
* ``@t(NAME)``: the value of the alert's threshold ``NAME``.

Everything else is literal PromQL / Go template text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

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
FAST = Profile("fast", scale=1 / 60, min_seconds=4.0)


@dataclass(frozen=True)
class Threshold:
    """A tunable value of one alert.

    Attributes:
        name: the threshold's name, unique within its alert.
        value: the number substituted for ``@t(name)``.
        doc: what it means, for docs/alerts.md.
    """

    name: str
    value: float | str
    doc: str


@dataclass(frozen=True)
class Alert:
    """One alerting rule.

    Attributes:
        name: the alertname (CamelCase, prefixed Inferwatch).
        group: the rule group it belongs to.
        severity: critical (pages), warning (ticket) or info.
        expr: PromQL with ``@w``/``@t`` placeholders.
        for_s: the ``for:`` duration in seconds (0 = fire at once).
        summary: one line, may use ``$labels``.
        description: the details, with live values (``$value``, ``humanize``).
        thresholds: the tunable values used by ``expr`` and the annotations.
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


@dataclass(frozen=True)
class Recording:
    """One recording rule (``level:metric:operations`` naming)."""

    record: str
    group: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)


def _le(value: float) -> str:
    """A label matcher for the bucket whose upper bound is ``value``.

    prometheus_client writes ``1.0`` while other exporters write ``1``; match both.
    """
    text = repr(float(value))
    if float(value).is_integer():
        return f'le=~"{int(value)}|{text}"'
    return f'le="{text}"'


#: The latency objectives: (quantile name, objective, target seconds, burn-rate factor, severity).
#: Targets must be bucket bounds of inferwatch_stage_duration_seconds (a test checks it) because the
#: burn rate counts the calls slower than the target straight from the histogram buckets.
LATENCY_OBJECTIVES: tuple[tuple[str, float, float, float, str], ...] = (
    ("p99", 0.99, 1.0, 14.4, "critical"),
    ("p999", 0.999, 2.5, 14.4, "warning"),
)

# ---------------------------------------------------------------------------------------------------------------
# recording rules
# ---------------------------------------------------------------------------------------------------------------


def _recordings() -> list[Recording]:
    out: list[Recording] = [
        Recording("service_model_version:inferwatch_requests:rate5m", "inferwatch-recording",
                  f"sum by ({SERVING}) (rate(inferwatch_requests_total[@w(300)]))"),
        Recording("service_model_version:inferwatch_request_errors:ratio_rate5m", "inferwatch-recording",
                  f'sum by ({SERVING}) (rate(inferwatch_requests_total{{outcome="error"}}[@w(300)]))\n'
                  f"/\nsum by ({SERVING}) (rate(inferwatch_requests_total[@w(300)]))"),
    ]
    for q, name in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
        out.append(Recording(
            f"service_model_version:inferwatch_request_duration_seconds:{name}_5m", "inferwatch-recording",
            f"histogram_quantile({q}, sum by ({SERVING}, le) "
            f"(rate(inferwatch_request_duration_seconds_bucket[@w(300)])))"))
        out.append(Recording(
            f"service_model_version_stage:inferwatch_stage_duration_seconds:{name}_5m", "inferwatch-recording",
            f"histogram_quantile({q}, sum by ({STAGE}, le) "
            f"(rate(inferwatch_stage_duration_seconds_bucket[@w(300)])))"))
    # Share of stage calls slower than each latency target, over the two windows of the burn-rate alerts.
    for name, _obj, _target, _burn, _sev in LATENCY_OBJECTIVES:
        for window, seconds in (("5m", 300), ("1h", 3600)):
            out.append(Recording(
                f"service_model_version_stage:inferwatch_stage_slow_{name}:ratio_rate{window}", "inferwatch-slo",
                f"1 - (\n  sum by ({STAGE}) (rate(inferwatch_stage_duration_seconds_bucket{{@le({name})}}"
                f"[@w({seconds})]))\n  /\n"
                f"  sum by ({STAGE}) (rate(inferwatch_stage_duration_seconds_count[@w({seconds})]))\n)"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# alerts
# ---------------------------------------------------------------------------------------------------------------

#: Regex (RE2, fully anchored) of the profile column names that hold the prediction. The drift
#: metrics carry no role label, so the prediction column is found by name; ``__prediction__`` is
#: the column name of warm-up references; ``.*pred.*`` catches the usual names of a profile's prediction
#: column (prediction, predicted_class, y_pred, label_pred). Narrow it if an input feature matches.
PREDICTION_FEATURES = "__prediction__|.*pred.*"

_WHERE = "{{ $labels.model }} {{ $labels.model_version }} ({{ $labels.service }})"
_MV = "{{ $labels.model }} version {{ $labels.model_version }}"


def _alerts() -> list[Alert]:
    out: list[Alert] = []
    for name, objective, target, burn, severity in LATENCY_OBJECTIVES:
        pct = f"{objective * 100:g}"
        rec = f"service_model_version_stage:inferwatch_stage_slow_{name}"
        out.append(Alert(
            f"InferwatchStageLatency{name.upper()}BudgetBurn", "inferwatch-slo", severity,
            f"{rec}:ratio_rate5m > (@t(burn_rate) * (1 - @t(objective)))\n"
            f"and\n{rec}:ratio_rate1h > (@t(burn_rate) * (1 - @t(objective)))",
            120,
            f"Stage {{{{ $labels.stage }}}} of {{{{ $labels.model }}}} is burning its {name.upper()} latency budget.",
            f"{{{{ $value | humanizePercentage }}}} of the calls of stage {{{{ $labels.stage }}}} of {_WHERE} "
            f"over the last @w(300) took longer than the {name.upper()} target of @t(target_seconds)s; "
            f"the objective allows {100 - float(pct):.3g}%, so the error budget burns more than "
            f"@t(burn_rate)x too fast (also true over the last @w(3600)).",
            (
                Threshold("objective", objective, f"share of calls that must finish within target_seconds ({pct}%)"),
                Threshold("target_seconds", target,
                          "latency target in seconds; must be a bucket bound of inferwatch_stage_duration_seconds"),
                Threshold("burn_rate", burn,
                          "how many times faster than sustainable the budget burns (14.4 = a 30-day budget in "
                          "2 days), required over both 5m and 1h"),
            ),
        ))
    out += [
        Alert(
            "InferwatchHighErrorRate", "inferwatch-serving", "critical",
            "service_model_version:inferwatch_request_errors:ratio_rate5m > @t(error_ratio)",
            300,
            "{{ $labels.model }} {{ $labels.model_version }} fails too many requests.",
            f"{{{{ $value | humanizePercentage }}}} of the requests to {_WHERE} failed over the last @w(300) "
            "(threshold @t(error_ratio))." ,
            (Threshold("error_ratio", 0.05, "share of requests ending in outcome=\"error\""),),
        ),
        Alert(
            "InferwatchQueueBacklog", "inferwatch-serving", "warning",
            "min_over_time(inferwatch_queue_depth[@w(300)]) > @t(depth)",
            600,
            "The request queue of {{ $labels.model }} {{ $labels.model_version }} is not draining.",
            f"The queue of {_WHERE} has held more than @t(depth) requests for at least @w(900) "
            "(lowest depth over the last @w(300): {{ $value | humanize }}).",
            (Threshold("depth", 100, "queue depth that must be exceeded for the whole 5-minute window"),),
        ),
        # -- GPU -----------------------------------------------------------------------------------------------
        Alert(
            "InferwatchGPUMemoryFillingUp", "inferwatch-gpu", "warning",
            "(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < @t(free_ratio)\n"
            "and\npredict_linear(inferwatch_gpu_memory_free_bytes[@w(21600)], @t(horizon_seconds)) < 0",
            3600,
            "GPU {{ $labels.gpu }} memory is predicted to run out within @w(86400).",
            "GPU {{ $labels.gpu }} has only {{ $value | humanizePercentage }} of its memory free and, at the "
            "trend of the last @w(21600), will be full within @w(86400).",
            (
                Threshold("free_ratio", 0.25, "level gate: free share of device memory below which the trend counts"),
                Threshold("horizon_seconds", 86400, "trend gate: predict_linear horizon (24h)"),
            ),
        ),
        Alert(
            "InferwatchGPUMemoryFillingUpSoon", "inferwatch-gpu", "critical",
            "(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < @t(free_ratio)\n"
            "and\npredict_linear(inferwatch_gpu_memory_free_bytes[@w(3600)], @t(horizon_seconds)) < 0",
            1800,
            "GPU {{ $labels.gpu }} memory is predicted to run out within @w(14400).",
            "GPU {{ $labels.gpu }} has only {{ $value | humanizePercentage }} of its memory free and, at the "
            "trend of the last @w(3600), will be full within @w(14400).",
            (
                Threshold("free_ratio", 0.10, "level gate: free share of device memory"),
                Threshold("horizon_seconds", 14400, "trend gate: predict_linear horizon (4h)"),
            ),
        ),
        Alert(
            "InferwatchGPUMemoryLeak", "inferwatch-gpu", "warning",
            "inferwatch_gpu_leak_rate_bytes_per_second\nand on (gpu, pid)\n"
            "(inferwatch_gpu_leak_detected == 1)",
            0,
            "GPU memory leak on GPU {{ $labels.gpu }}{{ if $labels.pid }} in process {{ $labels.pid }}{{ end }}.",
            "The memory floor on GPU {{ $labels.gpu }}{{ if $labels.pid }} of process {{ $labels.pid }}{{ end }} "
            "grows by {{ $value | humanize1024 }}B/s; "
            '{{ with printf "inferwatch_gpu_leak_time_to_oom_seconds{gpu=\'%s\',pid=\'%s\'}" $labels.gpu '
            "$labels.pid | query }}at that rate the device runs out of memory in "
            "{{ . | first | value | humanizeDuration }}{{ else }}the time to OOM is not known yet{{ end }}."
            '{{ with printf "inferwatch_gpu_leak_kind{gpu=\'%s\',pid=\'%s\'} == 1" $labels.gpu $labels.pid '
            '| query }} Kind: {{ . | first | label "kind" }}.{{ end }}',
            # the kind (tensor, cache_fragmentation, native, unknown) picks the runbook's branch
        ),
        Alert(
            "InferwatchGPUAllocatorFragmented", "inferwatch-gpu", "warning",
            "inferwatch_gpu_allocator_fragmentation_ratio > @t(ratio)",
            1800,
            "The CUDA caching allocator of process {{ $labels.pid }} is fragmented.",
            "{{ $value | humanizePercentage }} of the memory reserved by the caching allocator of process "
            "{{ $labels.pid }} on GPU {{ $labels.gpu }} sits in inactive split blocks (threshold @t(ratio)).",
            (Threshold("ratio", 0.3, "inactive-split bytes / reserved bytes"),),
        ),
        Alert(
            "InferwatchGPUAllocRetries", "inferwatch-gpu", "warning",
            "increase(inferwatch_gpu_allocator_alloc_retries_total[@w(900)]) > @t(retries)",
            0,
            "Process {{ $labels.pid }} keeps flushing the CUDA allocator cache to allocate.",
            "The caching allocator of process {{ $labels.pid }} on GPU {{ $labels.gpu }} retried "
            "{{ $value | humanize }} cudaMalloc calls after flushing its cache in the last @w(900) "
            "(threshold @t(retries)); every retry stalls the stream.",
            (Threshold("retries", 10, "allocation retries within 15 minutes"),),
        ),
        Alert(
            "InferwatchGPUOutOfMemory", "inferwatch-gpu", "critical",
            "increase(inferwatch_gpu_allocator_ooms_total[@w(600)]) > 0",
            0,
            "Process {{ $labels.pid }} ran out of GPU memory.",
            "The allocator of process {{ $labels.pid }} on GPU {{ $labels.gpu }} raised "
            "{{ $value | humanize }} out-of-memory errors in the last @w(600).",
        ),
        Alert(
            "InferwatchGPUCollectorDown", "inferwatch-gpu", "warning",
            # last_success_age is -1 until the first good sample: a host without a GPU (backend auto, no
            # NVML) never pages; a collector that worked and stopped does, and so does a failed component.
            "(\n  inferwatch_gpu_collector_up == 0\n  and\n  inferwatch_gpu_collector_last_success_age_seconds >= 0\n)"
            '\nor\ninferwatch_component_up{component="gpu"} == 0',
            300,
            "The sidecar's GPU collector is not returning data.",
            "The GPU collector of {{ $labels.instance }} has returned no device data for @w(300), so GPU "
            "memory, leak and fragmentation alerts are blind. /v1/status shows the NVML error and its fix.",
        ),
        # -- drift ---------------------------------------------------------------------------------------------
        Alert(
            "InferwatchFeatureDrift", "inferwatch-drift", "warning",
            "inferwatch_drift_dataset_drifted_ratio\nand on (model, model_version)\n"
            "(inferwatch_drift_dataset_drifted == 1)",
            900,
            f"The inputs of {_MV} drifted from the reference.",
            f"{{{{ $value | humanizePercentage }}}} of the input features of {_MV} differ significantly from the "
            "reference profile (after multiple-testing correction and effect-size floors) for @w(900).",
        ),
        Alert(
            "InferwatchPredictionDrift", "inferwatch-drift", "warning",
            'inferwatch_drift_feature_drifted{feature=~"@t(feature_regex)"} == 1',
            900,
            f"The predictions of {_MV} drifted from the reference.",
            f"The distribution of the predicted classes of {_MV} (column {{{{ $labels.feature }}}}) differs "
            "significantly from the reference profile for @w(900).",
            (Threshold("feature_regex", PREDICTION_FEATURES,
                       "regex of the prediction column names (the drift metrics have no role label)"),),
        ),
        Alert(
            "InferwatchConfidenceDrop", "inferwatch-drift", "warning",
            'inferwatch_drift_confidence_mean{window="reference"}\n- ignoring (window)\n'
            'inferwatch_drift_confidence_mean{window="current"}\n> @t(drop)',
            1800,
            f"The mean confidence of {_MV} dropped.",
            f"The mean confidence of {_MV} is {{{{ $value | printf \"%.2f\" }}}} below the reference's "
            "(threshold @t(drop)) for @w(1800).",
            (Threshold("drop", 0.1, "absolute drop of the window's mean confidence below the reference's"),),
        ),
        Alert(
            "InferwatchCanaryDiverging", "inferwatch-drift", "warning",
            "inferwatch_drift_canary_drifted_ratio > @t(drifted_ratio)",
            900,
            "Version {{ $labels.model_version }} of {{ $labels.model }} behaves differently from "
            "{{ $labels.baseline_version }}.",
            "{{ $value | humanizePercentage }} of the columns (inputs, predictions, confidence) of "
            f"{_MV} differ significantly from the stable version {{{{ $labels.baseline_version }}}} "
            "for @w(900).",
            (Threshold("drifted_ratio", 0, "share of columns that differ (0: any column; the test already "
                                             "corrects for multiple testing)"),),
        ),
        Alert(
            "InferwatchEstimatedAccuracyLow", "inferwatch-drift", "warning",
            "inferwatch_drift_estimated_accuracy_ratio < @t(accuracy)",
            1800,
            f"The estimated accuracy of {_MV} is low.",
            f"The label-free accuracy estimate (CBPE) of {_MV} is {{{{ $value | humanizePercentage }}}}, below "
            "@t(accuracy), for @w(1800).",
            (Threshold("accuracy", 0.7, "floor of the estimated accuracy"),),
        ),
        # -- the sidecar itself ---------------------------------------------------------------------------------
        Alert(
            "InferwatchSidecarDown", "inferwatch-sidecar", "critical",
            f"up{{{SIDECAR_JOB_SELECTOR}}} == 0",
            300,
            "The inferwatch sidecar {{ $labels.instance }} cannot be scraped.",
            "Prometheus has failed to scrape {{ $labels.instance }} (job {{ $labels.job }}) for @w(300): "
            "no latency, GPU or drift data arrives from that replica.",
        ),
        Alert(
            "InferwatchSidecarAbsent", "inferwatch-sidecar", "critical",
            f"absent(up{{{SIDECAR_JOB_SELECTOR}}})",
            900,
            "No inferwatch sidecar is being scraped.",
            f"Prometheus has had no scrape target of job {{{{ $labels.job }}}} ({{{SIDECAR_JOB_SELECTOR}}}) "
            "for @w(900): the sidecar, its Service or its ServiceMonitor is missing.",
        ),
        Alert(
            "InferwatchSDKDroppingEvents", "inferwatch-sidecar", "warning",
            "sum by (job, instance, reason) (rate(inferwatch_sdk_dropped_events_total[@w(300)])) > @t(rate)",
            600,
            "The SDK in the model server drops events ({{ $labels.reason }}).",
            "Producers reporting to {{ $labels.instance }} drop {{ $value | printf \"%.3g\" }} events/s before sending "
            "(reason {{ $labels.reason }}); latency and drift data are incomplete.",
            (Threshold("rate", 0, "dropped events per second"),),
        ),
        Alert(
            "InferwatchIngestDropping", "inferwatch-sidecar", "warning",
            "(\n  sum by (job, instance, reason) (rate(inferwatch_ingest_dropped_total[@w(300)]))\nor\n  "
            'label_replace(sum by (job, instance) (rate(inferwatch_ingest_socket_queue_dropped_total[@w(300)])), '
            '"reason", "socket_queue", "", "")\nor\n  '
            'label_replace(sum by (job, instance) (rate(inferwatch_ingest_lost_frames_total[@w(300)])), '
            '"reason", "lost_frames", "", "")\n) > @t(rate)',
            600,
            "The sidecar {{ $labels.instance }} loses events ({{ $labels.reason }}).",
            "The sidecar {{ $labels.instance }} lost {{ $value | printf \"%.3g\" }} items/s over the last @w(300) "
            "(reason {{ $labels.reason }}).",
            (Threshold("rate", 0, "dropped items per second"),),
        ),
        Alert(
            "InferwatchIngestDecodeErrors", "inferwatch-sidecar", "warning",
            "sum by (job, instance, scope, reason) (rate(inferwatch_ingest_decode_errors_total[@w(300)])) "
            "> @t(rate)",
            600,
            "The sidecar {{ $labels.instance }} receives malformed events ({{ $labels.reason }}).",
            "{{ $value | printf \"%.3g\" }} {{ $labels.scope }}s/s sent to {{ $labels.instance }} do not decode "
            "(reason {{ $labels.reason }}); they are counted and dropped.",
            (Threshold("rate", 0, "undecodable frames, records or JSON events per second"),),
        ),
        Alert(
            "InferwatchLabelCardinalityOverflow", "inferwatch-sidecar", "warning",
            "increase(inferwatch_label_overflow_total[@w(900)]) > @t(values)",
            0,
            "Values of label {{ $labels.label }} overflow their cardinality budget.",
            "{{ $value | humanize }} values of label {{ $labels.label }} were mapped to __overflow__ by "
            "{{ $labels.instance }} in the last @w(900): the label's budget is spent and new values are "
            "merged.",
            (Threshold("values", 0, "values mapped to __overflow__ within 15 minutes"),),
        ),
    ]
    return out


ALERTS: tuple[Alert, ...] = tuple(_alerts())
RECORDINGS: tuple[Recording, ...] = tuple(_recordings())

#: Group names in file order, with their evaluation interval (None = Prometheus's global one).
GROUPS: tuple[str, ...] = (
    "inferwatch-recording", "inferwatch-slo", "inferwatch-serving", "inferwatch-gpu", "inferwatch-drift",
    "inferwatch-sidecar",
)

_PLACEHOLDER = re.compile(r"@([wt])\(([A-Za-z0-9_.]+)\)")


def _fmt_number(v: float | str) -> str:
    if isinstance(v, str):
        return v
    return f"{v:g}" if not float(v).is_integer() else str(int(v))


def render(text: str, profile: Profile, alert: Alert | None = None) -> str:
    """Expand ``@w(seconds)`` and ``@t(name)`` placeholders."""

    def sub(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "w":
            return profile.duration(float(arg))
        if alert is None:
            raise ValueError(f"@t({arg}) outside an alert")
        for t in alert.thresholds:
            if t.name == arg:
                if isinstance(t.value, str):
                    return t.value
                if t.name == "horizon_seconds":
                    return _fmt_number(profile.seconds(t.value))
                return _fmt_number(t.value)
        raise ValueError(f"alert {alert.name}: unknown threshold {arg!r}")

    return _PLACEHOLDER.sub(sub, text)


Overrides = dict[str, dict[str, float | str]]


def effective_alerts(overrides: Overrides | None = None) -> list[Alert]:
    """The alerts with some thresholds replaced (for tests that need, say, a 50 ms latency target).

    Args:
        overrides: ``{alert name: {threshold name: value}}``; ``"for_s"`` replaces the ``for:`` duration.

    Raises:
        ValueError: an unknown alert or threshold, or a latency target that is not a bucket bound.
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
    _check_latency_targets(out)
    return out


def _check_latency_targets(alerts: list[Alert]) -> None:
    from inferwatch_sidecar.metrics.catalog import by_name

    buckets = by_name()["inferwatch_stage_duration_seconds"].buckets or ()
    for a in alerts:
        for t in a.thresholds:
            if t.name == "target_seconds" and float(t.value) not in buckets:
                raise ValueError(f"{a.name}: target_seconds={t.value} is not a bucket bound of "
                                 f"inferwatch_stage_duration_seconds {buckets}; the burn rate counts whole buckets")


def _slo_alert(alerts: list[Alert], name: str) -> Alert:
    return next(a for a in alerts if a.name == f"InferwatchStageLatency{name.upper()}BudgetBurn")


def groups(profile: Profile = PRODUCTION, overrides: Overrides | None = None) -> list[dict[str, Any]]:
    """Rule groups in Prometheus's rule-file layout, rendered for ``profile``.

    Args:
        profile: duration scaling (``PRODUCTION`` or ``FAST``).
        overrides: thresholds to replace, see :func:`effective_alerts`.
    """
    alerts = effective_alerts(overrides)

    def le(m: re.Match[str]) -> str:
        target = next(t.value for t in _slo_alert(alerts, m.group(1)).thresholds if t.name == "target_seconds")
        return _le(float(target))

    out: list[dict[str, Any]] = []
    for g in GROUPS:
        rules: list[dict[str, Any]] = []
        for r in RECORDINGS:
            if r.group == g:
                expr = re.sub(r"@le\((\w+)\)", le, render(r.expr, profile))
                rule: dict[str, Any] = {"record": r.record, "expr": expr}
                if r.labels:
                    rule["labels"] = dict(r.labels)
                rules.append(rule)
        for a in alerts:
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


def alert_names() -> list[str]:
    """Every alert defined here, in file order."""
    return [a.name for a in ALERTS]


def recording_names() -> list[str]:
    """Every recording rule defined here."""
    return [r.record for r in RECORDINGS]
