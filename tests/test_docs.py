"""Docs generated from code must match it."""

from __future__ import annotations

from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.config import reference_yaml
from tests.helpers.sidecar import REPO


def test_metrics_md_matches_the_catalog() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    assert doc == CATALOG.markdown(), "docs/metrics.md is stale: python scripts/gen_docs.py"


def test_config_md_contains_the_generated_reference() -> None:
    doc = (REPO / "docs" / "config.md").read_text()
    assert "```yaml\n" + reference_yaml() + "```" in doc, (
        "docs/config.md is stale: paste `python -m inferwatch_sidecar.config --reference` into its Reference block"
    )


def test_core_catalog_covers_what_the_issue_requires() -> None:
    from inferwatch_sidecar.metrics import core as core_metrics

    names = {m.name for m in core_metrics.METRICS}
    for required in (
        "inferwatch_requests_total", "inferwatch_request_errors_total", "inferwatch_request_duration_seconds",
        "inferwatch_stage_duration_seconds", "inferwatch_queue_wait_seconds", "inferwatch_queue_depth",
        "inferwatch_batch_size", "inferwatch_time_to_first_token_seconds", "inferwatch_inter_token_latency_seconds",
        "inferwatch_generated_tokens_total", "inferwatch_sdk_dropped_events_total", "inferwatch_ingest_frames_total",
        "inferwatch_ingest_events_total", "inferwatch_ingest_bytes_total", "inferwatch_ingest_decode_errors_total",
        "inferwatch_ingest_dropped_total", "inferwatch_ingest_lag_seconds", "inferwatch_label_overflow_total",
        "inferwatch_sidecar_process_cpu_seconds_total",
    ):
        assert required in names, required
    for m in core_metrics.METRICS:
        assert "request_id" not in m.labels and "trace_id" not in m.labels
