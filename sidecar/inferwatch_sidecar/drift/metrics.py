"""Catalog entries for the drift component."""

from __future__ import annotations

from inferwatch_sidecar.catalog import Metric

METRICS: tuple[Metric, ...] = ()
