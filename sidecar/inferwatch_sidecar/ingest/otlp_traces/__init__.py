"""The OTLP trace receiver: ``POST /v1/traces`` spans become the events the SDK sends.

Modules, in the order a body goes through them: :mod:`.decode` (OTLP/HTTP
protobuf and JSON, gzip, bounds), :mod:`.presets` (what Triton's, vLLM's and
generic server spans mean), :mod:`.mapping` (spans to event tuples, joined by
trace ID across export batches), :mod:`.receiver` (the route's callable and
the span counters). ``docs/otlp-traces.md`` describes what to set on each
engine and what comes out.
"""

from __future__ import annotations

from typing import Any

from inferwatch_sidecar.ingest.otlp_traces.decode import Limits
from inferwatch_sidecar.ingest.otlp_traces.mapping import Mapper
from inferwatch_sidecar.ingest.otlp_traces.receiver import METRICS, TraceReceiver
from inferwatch_sidecar.ingest.pipeline import Pipeline

__all__ = ["METRICS", "Mapper", "TraceReceiver", "build"]


def build(cfg: Any, pipeline: Pipeline) -> TraceReceiver:
    """The receiver for a validated ``traces`` config section."""
    mapper = Mapper(
        presets=cfg.presets, stages=cfg.stages, features=cfg.features, model_attribute=cfg.model_attribute,
        version_attribute=cfg.version_attribute, service_attribute=cfg.service_attribute,
        join_timeout_s=cfg.join_timeout_s, max_pending_spans=cfg.max_pending_spans,
        max_pending_bytes=cfg.max_pending_bytes, max_spans_per_trace=cfg.max_spans_per_trace,
    )
    limits = Limits(cfg.max_attributes_per_span, cfg.max_events_per_span, cfg.max_attributes_per_event)
    return TraceReceiver(pipeline, mapper, cfg.max_spans_per_export, cfg.max_decompressed_bytes, limits,
                         cfg.max_json_containers)
