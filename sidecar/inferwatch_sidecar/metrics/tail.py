"""Catalog entries for tail attribution (docs/tail.md).

Labels: the core metrics' ``service``, ``model`` and ``model_version``;
``tail`` is ``p99`` or ``p999`` (the slowest 1% and 0.1% of the window's
requests by end-to-end latency); ``group`` is ``median`` (the requests around
the median), ``p99`` or ``p999``; ``stage`` and ``feature`` are capped by the
daemon's limiters of the same names.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_CTX = ("service", "model", "model_version")

TAIL_WINDOW_REQUESTS = Metric(
    name="inferwatch_tail_window_requests", type="gauge", labels=_CTX, component="tail",
    help="Requests in the last complete tail-attribution window.",
)
TAIL_REQUESTS = Metric(
    name="inferwatch_tail_requests", type="gauge", labels=(*_CTX, "tail"), component="tail",
    help="Requests in the tail group (the slowest 1% or 0.1% of the window, at most tail.max_tail).",
)
TAIL_THRESHOLD_SECONDS = Metric(
    name="inferwatch_tail_threshold_seconds", type="gauge", unit="seconds", labels=(*_CTX, "tail"), component="tail",
    help="End-to-end latency of the fastest request of the tail group.",
)
TAIL_LATENCY_SECONDS = Metric(
    name="inferwatch_tail_latency_seconds", type="gauge", unit="seconds", labels=(*_CTX, "group"), component="tail",
    help="Mean end-to-end latency of a group: the median requests (40th to 60th percentile) or a tail group.",
)
TAIL_STAGE_SECONDS = Metric(
    name="inferwatch_tail_stage_seconds", type="gauge", unit="seconds", labels=(*_CTX, "stage", "group"),
    component="tail",
    help="Mean time the requests of a group spent in the stage (the stage breakdown of median and slow requests).",
)
TAIL_STAGE_SHARE_RATIO = Metric(
    name="inferwatch_tail_stage_share_ratio", type="gauge", unit="ratio", labels=(*_CTX, "stage", "tail"),
    component="tail",
    help="Share of the tail group's end-to-end latency spent in the stage.",
)
TAIL_STAGE_EXCESS_RATIO = Metric(
    name="inferwatch_tail_stage_excess_ratio", type="gauge", unit="ratio", labels=(*_CTX, "stage", "tail"),
    component="tail",
    help="Share of the tail group's extra latency over the median requests that the stage's growth explains.",
)
TAIL_FEATURE_RATIO = Metric(
    name="inferwatch_tail_feature_ratio", type="gauge", unit="ratio", labels=(*_CTX, "feature", "tail"),
    component="tail",
    help="Median of a numeric feature in the tail group over its median in the rest of the window.",
)
TAIL_FEATURE_ADJUSTED_P_VALUE = Metric(
    name="inferwatch_tail_feature_adjusted_p_value", type="gauge", labels=(*_CTX, "feature", "tail"),
    component="tail",
    help="Benjamini-Hochberg adjusted p-value of the drift engine's test of the tail group against the rest.",
)
TAIL_FEATURE_DISTINGUISHES = Metric(
    name="inferwatch_tail_feature_distinguishes", type="gauge", labels=(*_CTX, "feature", "tail"), component="tail",
    help="1 when the feature tells the tail group from the rest (adjusted p <= alpha and effect above its floor).",
)
TAIL_JOINED_RATIO = Metric(
    name="inferwatch_tail_joined_ratio", type="gauge", unit="ratio", labels=_CTX, component="tail",
    help="Share of the window's kept requests whose recorded features were joined to them by request ID.",
)
TAIL_DROPPED_EVENTS_TOTAL = Metric(
    name="inferwatch_tail_dropped_events_total", type="counter", labels=("reason",), component="tail",
    help="Events tail attribution dropped, by reason (staging_full, too_many_models, unmatched_record, window_full, "
    "error).",
)
TAIL_LAST_WINDOW_END_TIMESTAMP_SECONDS = Metric(
    name="inferwatch_tail_last_window_end_timestamp_seconds", type="gauge", unit="seconds", component="tail",
    help="Unix time at which the last analysed window ended.",
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    TAIL_WINDOW_REQUESTS, TAIL_REQUESTS, TAIL_THRESHOLD_SECONDS, TAIL_LATENCY_SECONDS, TAIL_STAGE_SECONDS,
    TAIL_STAGE_SHARE_RATIO, TAIL_STAGE_EXCESS_RATIO, TAIL_FEATURE_RATIO, TAIL_FEATURE_ADJUSTED_P_VALUE,
    TAIL_FEATURE_DISTINGUISHES, TAIL_JOINED_RATIO, TAIL_DROPPED_EVENTS_TOTAL, TAIL_LAST_WINDOW_END_TIMESTAMP_SECONDS,
)
