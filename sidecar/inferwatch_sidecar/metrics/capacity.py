"""Catalog entries for live capacity: the knee from the traffic the sidecar already sees (docs/capacity.md).

Labels: the core metrics' ``service``, ``model`` and ``model_version``. The three gauges exist for a model
version only once its traffic visited enough in-flight levels to show the knee (throughput flat beyond it
while latency climbed).
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_CTX = ("service", "model", "model_version")

CAPACITY_KNEE_CONCURRENCY = Metric(
    name="inferwatch_capacity_knee_concurrency", type="gauge", labels=_CTX, component="capacity",
    help="Requests in flight beyond which throughput stops growing while latency climbs (the live knee).",
)
CAPACITY_KNEE_LOW = Metric(
    name="inferwatch_capacity_knee_low_concurrency", type="gauge", labels=_CTX, component="capacity",
    help="Lower end of the live knee's 90% interval (bootstrap over the table's levels).",
)
CAPACITY_KNEE_HIGH = Metric(
    name="inferwatch_capacity_knee_high_concurrency", type="gauge", labels=_CTX, component="capacity",
    help="Upper end of the live knee's 90% interval (bootstrap over the table's levels).",
)
CAPACITY_MAX_THROUGHPUT_RPS = Metric(
    name="inferwatch_capacity_max_throughput_rps", type="gauge", labels=_CTX, component="capacity",
    help="Completed requests per second on the plateau beyond the knee: the server's capacity.",
)
CAPACITY_HEADROOM_RATIO = Metric(
    name="inferwatch_capacity_headroom_ratio", type="gauge", unit="ratio", labels=_CTX, component="capacity",
    help="1 - (requests in flight now / the knee): 0 at the knee, negative beyond it.",
)
CAPACITY_IN_FLIGHT = Metric(
    name="inferwatch_capacity_in_flight", type="gauge", labels=_CTX, component="capacity",
    help="Requests in flight over the last capacity window (Little's law: summed durations / window).",
)
CAPACITY_DROPPED_EVENTS_TOTAL = Metric(
    name="inferwatch_capacity_dropped_events_total", type="counter", labels=("reason",), component="capacity",
    help="Events the capacity component did not take, by reason (staging_full, too_many_models, error).",
)

SLO_REQUESTS_TOTAL = Metric(
    name="inferwatch_slo_requests_total", type="counter", labels=(*_CTX, "result"), component="capacity",
    help="Requests of a model with capacity.slo objectives, by result: good (met every threshold) or bad "
         "(missed one, failed or was shed).",
)
SLO_GOODPUT_RATIO = Metric(
    name="inferwatch_slo_goodput_ratio", type="gauge", unit="ratio", labels=_CTX, component="capacity",
    help="Share of the requests of the last capacity.goodput_window_seconds that met every objective.",
)
SLO_OBJECTIVE_RATIO = Metric(
    name="inferwatch_slo_objective_ratio", type="gauge", unit="ratio", labels=_CTX, component="capacity",
    help="The configured share of requests that must be good (the burn-rate rules' error budget is 1 minus it).",
)

COLD_START_SECONDS = Metric(
    name="inferwatch_capacity_cold_start_seconds", type="gauge", unit="seconds", labels=_CTX, component="capacity",
    help="Seconds from the start of the latest new process (SDK producer) to the start of its first request.",
)
COLD_LATENCY_RATIO = Metric(
    name="inferwatch_capacity_cold_latency_ratio", type="gauge", unit="ratio", labels=_CTX, component="capacity",
    help="Mean latency of the latest new process's first 10 requests over the median of its requests 50 to 250.",
)

METRICS = (CAPACITY_KNEE_CONCURRENCY, CAPACITY_KNEE_LOW, CAPACITY_KNEE_HIGH, CAPACITY_MAX_THROUGHPUT_RPS,
           CAPACITY_HEADROOM_RATIO, CAPACITY_IN_FLIGHT, CAPACITY_DROPPED_EVENTS_TOTAL, SLO_REQUESTS_TOTAL, SLO_GOODPUT_RATIO,
           SLO_OBJECTIVE_RATIO, COLD_START_SECONDS, COLD_LATENCY_RATIO)
