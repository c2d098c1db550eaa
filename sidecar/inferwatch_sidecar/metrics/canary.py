"""Catalog entries for the canary judge (docs/canary.md).

``model_version`` is the judged (canary) version and ``baseline_version`` the
stable one it is compared with, both capped by the daemon's ``model_version``
limiter; ``metric`` is one of the judge's fixed metric names and ``stage`` a
capped stage name (empty for metrics of the whole request).
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_CTX = ("service", "model", "model_version")
_PAIR = (*_CTX, "baseline_version")

CANARY_SCORE = Metric(
    name="inferwatch_canary_score", type="gauge", labels=_PAIR, component="canary",
    help="Score of the canary version against the stable one over the same window, 0 to 100 (weighted share of "
         "passing metrics).",
)
CANARY_VERDICT = Metric(
    name="inferwatch_canary_verdict", type="gauge", labels=(*_PAIR, "verdict"), component="canary",
    help="1 for the judge's current verdict (pass, marginal, fail), 0 for the other two.",
)
CANARY_METRIC_FAILED = Metric(
    name="inferwatch_canary_metric_failed", type="gauge", labels=(*_PAIR, "metric", "stage"), component="canary",
    help="1 when the judged metric is significantly worse than the stable version's beyond its tolerance.",
)
CANARY_METRIC_EFFECT = Metric(
    name="inferwatch_canary_metric_effect", type="gauge", labels=(*_PAIR, "metric", "stage"), component="canary",
    help="Effect size the metric's tolerance applies to (error-rate increase, AUC shift, P99 ratio, PSI, drop).",
)
CANARY_WINDOW_REQUESTS = Metric(
    name="inferwatch_canary_window_requests", type="gauge", labels=_CTX, component="canary",
    help="Requests of the version in the judge's sliding window.",
)
CANARY_TRAFFIC_RATIO = Metric(
    name="inferwatch_canary_traffic_ratio", type="gauge", unit="ratio", labels=_CTX, component="canary",
    help="The version's share of its model's requests in the judge's window (the gateway's split, as served).",
)
CANARY_DROPPED_EVENTS_TOTAL = Metric(
    name="inferwatch_canary_dropped_events_total", type="counter", labels=("reason",), component="canary",
    help="Events the canary judge dropped, by reason (staging_full, too_many_versions, too_many_stages, error).",
)
CANARY_LAST_EVALUATION_TIMESTAMP_SECONDS = Metric(
    name="inferwatch_canary_last_evaluation_timestamp_seconds", type="gauge", unit="seconds", component="canary",
    help="Unix time of the judge's last evaluation.",
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    CANARY_SCORE, CANARY_VERDICT, CANARY_METRIC_FAILED, CANARY_METRIC_EFFECT, CANARY_WINDOW_REQUESTS,
    CANARY_TRAFFIC_RATIO, CANARY_DROPPED_EVENTS_TOTAL, CANARY_LAST_EVALUATION_TIMESTAMP_SECONDS,
)
