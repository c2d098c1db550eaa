"""One series budget for the whole exposition, applied where families are collected (not rendered).

The aggregator's own budget (``labels.max_series``) keeps the request, stage and error families
bounded with ``__overflow__`` label sets. Other families grow with what traffic declares too (the
drift bins: versions x features x bins), so the scrape goes through :class:`ExpositionBudget`: a
view of the registry that passes families through untouched while they fit, and past
``labels.max_family_series`` samples in one family, or ``labels.max_exposition_series`` in all,
keeps whole label sets (a histogram's buckets stay together) in collection order and leaves
the rest out. Every family cut is counted as ``label="exposition"`` in
``inferwatch_label_overflow_total``, which the cardinality alert watches, and the number of
samples left out of the last scrape is in ``/v1/status``. Any renderer (text, OpenMetrics,
protobuf) sits on top of the view; :meth:`ExpositionBudget.render` renders it with the snapshot
families' bytes kept between scrapes (export/render.py), and cuts such a family without building
its samples (one per snapshot value), so a cut family is rendered once per snapshot too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.export.render import FamilyRenderer

_GROUP_SKIP = frozenset(("le", "quantile"))


class ExpositionBudget:
    """A collector view of ``registry`` within a series budget (see the module docstring)."""

    def __init__(self, registry: Any, max_series: int, max_family_series: int) -> None:
        self.registry = registry
        self.max_series = max_series
        self.max_family_series = max_family_series
        #: families cut, counted as label="exposition" of inferwatch_label_overflow_total
        self.overflow = LabelLimiter("exposition", 1)
        #: samples left out of the last scrape
        self.last_dropped = 0
        self._lock = threading.Lock()
        self.renderer = FamilyRenderer()

    def render(self, accept: str, protobuf: bool = True) -> tuple[bytes, str]:
        """The ``/metrics`` body for an ``Accept`` header, and its content type (export/render.py)."""
        return self.renderer.body(self.collect(), accept, protobuf)

    def collect(self) -> Iterator[Metric]:
        left = self.max_series
        dropped = 0
        for fam in self.registry.collect():
            values = getattr(fam, "snapshot_values", None)
            n = len(fam.samples) if values is None else len(values)
            # Samples a snapshot left out as it was built (metrics/samples.py, max_rows): the family was cut.
            before = getattr(fam, "snapshot_cut", 0)
            allow = min(left, self.max_family_series)
            if n <= allow and not before:
                left -= n
                yield fam
                continue
            kept = self._cut(fam, allow) if n > allow else fam
            left -= len(kept.samples)
            dropped += n - len(kept.samples) + before
            with self._lock:
                self.overflow.overflowed += 1
            yield kept
        self.last_dropped = dropped

    @staticmethod
    def _cut(fam: Metric, allow: int) -> Metric:
        values = getattr(fam, "snapshot_values", None)
        if values is not None:  # a snapshot family: one sample per value, cut without building them
            lazy = type(fam)(fam.name, fam.documentation, labels=fam._labelnames, unit=fam.unit)  # type: ignore[call-arg, attr-defined]
            lazy.pending(values[:allow])  # type: ignore[attr-defined]
            lazy.snapshot_key = (*fam.snapshot_key, allow)  # type: ignore[attr-defined]
            return lazy
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        admitted: set[tuple[tuple[str, str], ...]] = set()
        samples: list[Any] = []
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _GROUP_SKIP))
            if key not in admitted:
                if len(samples) >= allow:
                    continue
                admitted.add(key)
            samples.append(s)
        out.samples = samples
        return out
