"""The single source of inferwatch's Prometheus recording and alerting rules.

Everything an operator may want to tune is a named threshold attached to the
alert it feeds (kubernetes-mixin style); ``docs/alerts.md`` is generated from
the same objects, so the documented values cannot drift from the rules. Every
rule file of ``alerts/`` is rendered from here (:data:`RULE_FILES`).

The rule model is :mod:`alerts.model`, the template language :mod:`alerts.template`, and the rules
themselves one module per domain in :mod:`alerts.domains` (its docstring maps them to the promtool
tests); this module assembles them and re-exports every name, so ``from alerts import source`` keeps
working.

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

from dataclasses import replace
from typing import Any

from alerts.domains.capacity import _capacity_alerts, _capacity_recordings
from alerts.domains.common import _MV, _VERSION_ARGS, _VERSION_MATCH, _WHERE, _version_query
from alerts.domains.drift import (
    _BINS,
    _FLEET,
    _RATIO,
    _REF,
    _TOTALS,
    FLEET_DRIFT_DOC,
    PREDICTION_FEATURES,
    _drift_alerts,
    _fleet_recordings,
)
from alerts.domains.engines import _TRITON, _VLLM, _engine_alerts, _engine_slow_share
from alerts.domains.gpu import _gpu_alerts
from alerts.domains.overload import _overload_alerts, _rate
from alerts.domains.saturation import _saturation_alerts
from alerts.domains.serving import (
    LATENCY_OBJECTIVES,
    _recordings,
    _serving_alerts,
    _slo_alert_name,
    _slo_alerts,
    _tail_note,
)
from alerts.domains.sidecar import _sidecar_alerts
from alerts.domains.skew import _skew_alerts
from alerts.domains.streaming import _streaming_alerts
from alerts.model import (
    FAST,
    PRODUCTION,
    RUNBOOK_BASE_URL,
    SERVING,
    SIDECAR_JOB_SELECTOR,
    STAGE,
    Alert,
    LatencyObjective,
    Profile,
    Recording,
    RuleFile,
    Threshold,
)
from alerts.template import render
from inferwatch_sidecar.components.registry import CATALOG

__all__ = [
    "ALERTS", "FAST", "FLEET_DRIFT_DOC", "FLEET_GROUPS", "GROUPS", "LATENCY_OBJECTIVES", "PREDICTION_FEATURES",
    "PRODUCTION", "RECORDINGS", "RULE_FILES", "RUNBOOK_BASE_URL", "SERVING", "SIDECAR_JOB_SELECTOR", "STAGE",
    "Alert", "LatencyObjective", "Overrides", "Profile", "Recording", "RuleFile", "Threshold", "alert_names",
    "effective_alerts", "groups", "recording_names", "render", "threshold",
    # The domains' helpers, for rules still written here (move them into alerts/domains/).
    "_BINS", "_FLEET", "_MV", "_RATIO", "_REF", "_TOTALS", "_TRITON", "_VERSION_ARGS", "_VERSION_MATCH", "_VLLM",
    "_WHERE", "_drift_alerts", "_engine_alerts", "_engine_slow_share", "_fleet_recordings", "_gpu_alerts",
    "_overload_alerts", "_rate", "_recordings", "_serving_alerts", "_sidecar_alerts", "_skew_alerts",
    "_slo_alert_name", "_slo_alerts", "_streaming_alerts", "_tail_note", "_version_query",
]


ALERTS: tuple[Alert, ...] = (*_slo_alerts(), *_serving_alerts(), *_streaming_alerts(), *_overload_alerts(),
                             *_gpu_alerts(), *_drift_alerts(), *_skew_alerts(), *_sidecar_alerts(), *_engine_alerts(),
                             *_saturation_alerts(), *_capacity_alerts())
RECORDINGS: tuple[Recording, ...] = (*_recordings(), *_fleet_recordings(), *_capacity_recordings())

#: Group names of alerts/inferwatch.rules.yml, in file order.
GROUPS: tuple[str, ...] = (
    "inferwatch-recording", "inferwatch-slo", "inferwatch-serving", "inferwatch-gpu", "inferwatch-drift",
    "inferwatch-sidecar", "inferwatch-engines", "inferwatch-saturation", "inferwatch-capacity",
)
#: Group names of alerts/drift.rules.yml (owned by the drift component).
FLEET_GROUPS: tuple[str, ...] = (_FLEET,)

#: Every rule file of ``alerts/``.
RULE_FILES: tuple[RuleFile, ...] = (
    RuleFile(name="inferwatch.rules.yml", groups=GROUPS),
    RuleFile(name="drift.rules.yml", groups=FLEET_GROUPS, doc=FLEET_DRIFT_DOC),
)


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
    catalog = CATALOG.by_name()
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
