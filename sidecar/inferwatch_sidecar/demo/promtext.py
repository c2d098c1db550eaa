"""Moved to :mod:`inferwatch_sidecar.export.promtext` (``inferwatch top`` reads scrapes with it too); kept for
existing imports."""

from __future__ import annotations

from inferwatch_sidecar.export.promtext import Scrape, delta, fetch, fetch_json, quantile, quantiles

__all__ = ["Scrape", "delta", "fetch", "fetch_json", "quantile", "quantiles"]
