"""The series one sidecar's aggregator exports, as a function of the workload (docs/scale.md).

:func:`aggregator_series` gives, per family, how many series the aggregator's families hold
for a workload, with classic buckets (text, OpenMetrics) or native histograms (the protobuf
exposition); tests/scale/test_series_budget.py checks it against a real exposition.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.wire import DROP_REASONS
from inferwatch_sidecar.metrics import core

__all__ = ["Workload", "aggregator_series"]


@dataclass(frozen=True)
class Workload:
    """What one sidecar sees.

    Attributes:
        services, models, versions: label values (every combination has traffic).
        stages: stage names per request (a stage named ``queue`` also feeds the queue-wait histogram).
        streaming: how many of those stages stream (time to first token, inter-token latency, length).
        error_types: distinct error types of failed requests (0: no request fails).
        records: whether predictions are recorded (the drift input).
    """

    services: int = 1
    models: int = 3
    versions: int = 2
    stages: tuple[str, ...] = ("queue", "preprocess", "inference", "postprocess", "generate")
    streaming: int = 1
    error_types: int = 1
    records: bool = True


def _hist(buckets: tuple[float, ...], native: bool) -> int:
    """Series of one histogram: one native, or its buckets, ``+Inf``, ``_sum`` and ``_count``."""
    return 1 if native else len(buckets) + 3


def aggregator_series(w: Workload, native: bool) -> dict[str, int]:
    """Series per family name (as exposed, counters with ``_total``) for workload ``w``."""
    sets = w.services * w.models * w.versions
    lat = _hist(core.LATENCY_BUCKETS, native)
    out = {
        core.REQUESTS_TOTAL.name: sets * (1 + (w.error_types > 0)),  # outcome ok, and error when any fails
        core.REQUEST_ERRORS_TOTAL.name: sets * w.error_types,
        core.REQUEST_DURATION_SECONDS.name: sets * lat,
        core.STAGE_DURATION_SECONDS.name: sets * len(w.stages) * lat,
        core.QUEUE_WAIT_SECONDS.name: sets * lat * ("queue" in w.stages),
        core.RECORDS_TOTAL.name: sets * w.records,
        core.TIME_TO_FIRST_TOKEN_SECONDS.name: sets * w.streaming * _hist(core.TTFT_BUCKETS, native),
        core.INTER_TOKEN_LATENCY_SECONDS.name: sets * w.streaming * _hist(core.ITL_BUCKETS, native),
        core.GENERATION_LENGTH_TOKENS.name: sets * w.streaming * _hist(core.TOKEN_BUCKETS, native),
        core.GENERATED_TOKENS_TOTAL.name: sets * w.streaming,
        core.CANCELLED_STREAMS_TOTAL.name: sets * w.streaming,
        core.UNDELIVERED_TOKENS_TOTAL.name: sets * w.streaming,
        core.LABELS_RECEIVED_TOTAL.name: 1,
        core.SDK_DROPPED_EVENTS_TOTAL.name: len(set(DROP_REASONS.values())),
        core.SIDECAR.name: 1,
    }
    return {k: v for k, v in out.items() if v}
