"""Catalog entries for training-serving skew (docs/skew.md).

Labels: the core metrics' ``service``, ``model`` and ``model_version``; ``feature`` is capped by the daemon's
limiter of that name; ``reason`` and ``outcome`` are fixed sets.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_CTX = ("service", "model", "model_version")

SKEW_MATCH_RATIO = Metric(
    name="inferwatch_skew_match_ratio", type="gauge", unit="ratio", labels=(*_CTX, "feature"), component="skew",
    help="Share of the last skew.window_rows joined rows whose served value matches the offline value.",
)
SKEW_EXPLAINED_RATIO = Metric(
    name="inferwatch_skew_explained_ratio", type="gauge", unit="ratio", labels=(*_CTX, "feature", "kind"),
    component="skew",
    help="Share of the joined rows the diagnosed kind of skew explains (one series per feature: its current kind).",
)
SKEW_JOINED_ROWS_TOTAL = Metric(
    name="inferwatch_skew_joined_rows_total", type="counter", labels=_CTX, component="skew",
    help="Served rows joined with their offline values by request ID.",
)
SKEW_OFFLINE_ROWS_TOTAL = Metric(
    name="inferwatch_skew_offline_rows_total", type="counter", labels=("outcome",), component="skew",
    help="Offline rows, by outcome (joined with their served row, at once or later; waiting: came before it; "
         "unmatched: evicted before it came; duplicate; bad).",
)
SKEW_SERVED_ROWS_EXPIRED_TOTAL = Metric(
    name="inferwatch_skew_served_rows_expired_total", type="counter", labels=("reason",), component="skew",
    help="Served rows that left the live join without offline values (max_ids, max_age, max_pending_bytes).",
)
SKEW_PENDING_ROWS = Metric(
    name="inferwatch_skew_pending_rows", type="gauge", labels=("side",), component="skew",
    help="Rows the live join holds waiting for the other side (served, offline); at most skew.max_ids each.",
)
SKEW_SERVED_ROWS_WRITTEN_TOTAL = Metric(
    name="inferwatch_skew_served_rows_written_total", type="counter", component="skew",
    help="Sampled served rows written to the Parquet files of skew.served_dir.",
)
SKEW_SERVED_ROWS_DROPPED_TOTAL = Metric(
    name="inferwatch_skew_served_rows_dropped_total", type="counter", labels=("reason",), component="skew",
    help="Served rows dropped, by reason (staging_full, no_request_id, too_many_models, write_error, size_cap: "
         "in files deleted to keep skew.served_dir under skew.max_bytes; window_full: joined rows that left a "
         "window for skew.max_window_bytes).",
)
SKEW_SERVED_BYTES = Metric(
    name="inferwatch_skew_served_bytes", type="gauge", unit="bytes", component="skew",
    help="Bytes the Parquet files of skew.served_dir hold (at most skew.max_bytes).",
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    SKEW_MATCH_RATIO, SKEW_EXPLAINED_RATIO, SKEW_JOINED_ROWS_TOTAL, SKEW_OFFLINE_ROWS_TOTAL,
    SKEW_SERVED_ROWS_EXPIRED_TOTAL, SKEW_PENDING_ROWS, SKEW_SERVED_ROWS_WRITTEN_TOTAL, SKEW_SERVED_ROWS_DROPPED_TOTAL,
    SKEW_SERVED_BYTES,
)
