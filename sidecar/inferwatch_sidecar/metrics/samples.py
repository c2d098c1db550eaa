"""The one sample container every component fills and exports: values keyed by catalog entries.

A component computes its numbers on its own thread into a :class:`Samples`,
publishes it, and at scrape time :meth:`Samples.families` turns it into
prometheus_client families (the OTLP exporter converts the same families).
Samples are keyed by :class:`~inferwatch_sidecar.metrics.entry.Metric`
entries, never by metric-name strings, so a name cannot drift from the
catalog; :meth:`Samples.families` exports only the entries it is given, in
their catalog order.

Three ways in:

- :meth:`Samples.put`: one sample; None and non-finite values are left out
  (a window without data has no value, not a NaN).
- :meth:`Samples.combine`: fold a sample into the one with the same labels:
  amounts (counters and ``_bytes`` gauges) add up, everything else keeps the
  largest. Several series can share a capped label value (``__overflow__``);
  combining keeps one sample per label set. Only NaN and None are left out.
- :meth:`Samples.put_info`: the one value dict of an info entry's sample.

``Samples(max_rows=N)`` keeps at most ``N`` samples per entry from :meth:`Samples.put` and counts
the rest in :attr:`Samples.cut`: a snapshot need not hold what the exposition's per-family budget
(``labels.max_family_series``) would leave out anyway. The exposition keeps a prefix of each
family and adds the count to what it left out (export/budget.py), so the scrape is the same.

Usage::

    out = Samples()
    out.put(TAIL_WINDOW_REQUESTS, ("svc", "m", "1"), 120)
    families = out.families(METRICS)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch_sidecar.metrics import families as fam
from inferwatch_sidecar.metrics.entry import Metric

__all__ = ["Labels", "Samples", "Snapshot"]

#: Label values of one sample, in the entry's label order.
Labels = tuple[str, ...]


class Samples:
    """Sample values of catalog entries: ``{entry: [(label values, value), ...]}``, filled once, read at scrape."""

    __slots__ = ("_rows", "_index", "_info", "max_rows", "cut")

    def __init__(self, max_rows: int | None = None) -> None:
        self._rows: dict[str, list[tuple[Labels, float]]] = {}
        self._index: dict[tuple[str, Labels], int] = {}
        self._info: dict[str, list[dict[str, str]]] = {}
        #: Most samples :meth:`put` keeps per entry (None: all), and the ones it left out, by entry name.
        self.max_rows = max_rows
        self.cut: dict[str, int] = {}

    def put(self, m: Metric, labels: Labels, value: float | None) -> None:
        """Add one sample of ``m``; a None or non-finite value is left out (and one past ``max_rows`` counted)."""
        if value is None:
            return
        v = float(value)
        if math.isfinite(v):
            rows = self._rows.get(m.name)
            if rows is None:
                rows = self._rows[m.name] = []
            elif self.max_rows is not None and len(rows) >= self.max_rows:
                self.cut[m.name] = self.cut.get(m.name, 0) + 1
                return
            rows.append((labels, v))

    def combine(self, m: Metric, labels: Labels, value: float | None) -> None:
        """Add a sample, or fold it into the one with the same labels (amounts add up, others keep the largest).

        Counters and ``*_bytes`` entries are amounts; flags, rates and ratios keep the worst (largest)
        value. None and NaN are left out; infinities are kept.
        """
        if value is None:
            return
        v = float(value)
        if math.isnan(v):
            return
        key = (m.name, labels)
        i = self._index.get(key)
        rows = self._rows.setdefault(m.name, [])
        if i is None:
            self._index[key] = len(rows)
            rows.append((labels, v))
            return
        old = rows[i][1]
        rows[i] = (labels, old + v if m.type == "counter" or m.name.endswith("_bytes") else max(old, v))

    def put_info(self, m: Metric, value: Mapping[str, str]) -> None:
        """The value dict of one sample of the info entry ``m`` (its keys are ``m.labels``)."""
        self._info.setdefault(m.name, []).append(dict(value))

    def set(self, m: Metric, rows: Iterable[tuple[Labels, float]]) -> None:
        """Replace every sample of ``m`` (live counters added at scrape time); non-finite values are left out."""
        self._rows[m.name] = [(tuple(lab), float(v)) for lab, v in rows if v is not None and math.isfinite(v)]
        self._index = {k: i for k, i in self._index.items() if k[0] != m.name}

    def get(self, m: Metric) -> list[tuple[Labels, float]]:
        """The samples of ``m`` (a copy), in the order they were added."""
        return list(self._rows.get(m.name, ()))

    def value(self, m: Metric, labels: Labels) -> float | None:
        """The first sample of ``m`` with ``labels``, or None."""
        return next((v for lab, v in self._rows.get(m.name, ()) if lab == labels), None)

    def by_name(self) -> dict[str, list[tuple[Labels, float]]]:
        """Every sample by metric name (for tests and reports)."""
        return {k: list(v) for k, v in self._rows.items() if v}

    def merged(self, other: Samples | None) -> Samples:
        """A copy with ``other``'s entries replacing this one's (a snapshot plus the live counters)."""
        # The row lists are shared, not copied: a published snapshot is never changed in place, and the
        # same list object from scrape to scrape is what lets the exposition reuse a family's rendered
        # bytes (export/render.py keys them by the list's identity).
        out = Samples()
        out._rows = dict(self._rows)
        out._info = dict(self._info)
        out.cut = dict(self.cut)
        if other is not None:
            for name in other._rows:
                out.cut.pop(name, None)
            out._rows.update(other._rows)
            out._info.update(other._info)
            out.cut.update(other.cut)
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._rows.values()) + sum(len(v) for v in self._info.values())

    def families(self, metrics: Sequence[Metric] | Iterable[Metric], *, empty: bool = False) -> list[PromMetric]:
        """The families of ``metrics`` (catalog order) with their samples.

        Args:
            metrics: the entries to export; samples of any other entry are not exported.
            empty: also return the families that have no sample (their HELP and TYPE are shown).
        """
        out: list[PromMetric] = []
        for m in metrics:
            rows = self._rows.get(m.name)
            infos = self._info.get(m.name)
            if not rows and not infos and not empty:
                continue
            cut = self.cut.get(m.name, 0)
            if rows and not infos and m.type in ("counter", "gauge"):
                # Built when the exposition needs its samples, rendered once per snapshot (export/render.py).
                for f in fam.from_snapshot((m,), {m.name: rows}):
                    if cut:
                        f.snapshot_cut = cut  # type: ignore[attr-defined]
                    out.append(f)
                continue
            f = fam.family(m)
            if cut:
                f.snapshot_cut = cut  # type: ignore[attr-defined]
            for labels, v in rows or ():
                f.add_metric(list(labels), v)  # type: ignore[attr-defined]
            for d in infos or ():
                f.add_metric([], d)  # type: ignore[attr-defined]
            out.append(f)
        return out


#: What a component publishes after an evaluation and exports until the next one.
Snapshot = Samples
