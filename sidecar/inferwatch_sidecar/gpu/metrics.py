"""Catalog entries for the gpu component."""

from __future__ import annotations

from inferwatch_sidecar.catalog import Metric

METRICS: tuple[Metric, ...] = ()
