"""Catalog entries for the daemon's own metrics (ingest, requests, stages)."""

from __future__ import annotations

from inferwatch_sidecar.catalog import Metric

METRICS: tuple[Metric, ...] = ()
