"""Exported metric families, built from catalog entries.

Every exporter builds its prometheus_client families here, so the name,
HELP, type, labels, unit and histogram buckets come from the one catalog
entry and never from a second copy:

- :func:`counter`, :func:`gauge`, :func:`histogram`, :func:`info` return an
  empty family of that type for an entry, and raise ``ValueError`` when the
  entry has another type (a counter family built from a gauge entry is a
  bug to catch at the first scrape, not a series to export).
- :func:`family` returns the empty family of whatever type the entry has.
- :func:`bucket_les` gives a histogram entry's ``le`` label values, ``+Inf``
  last, in the order that per-bucket counts are kept; configured bounds
  (``aggregate.buckets``) override the entry's for the series they cover.
- :func:`from_snapshot` builds the families a component's last evaluation
  left in a snapshot (``{name: [(label values, value), ...]}``).
- :func:`describe` returns one empty family per entry: what a collector's
  ``describe()`` returns, so ``CollectorRegistry.register`` sees every name
  it will export and refuses a second collector that exports one of them.
- :class:`CatalogCollector` wraps a zero-argument function returning
  families, and the entries it exports, as a registry collector.

Usage, in a component's ``collect()``::

    from inferwatch_sidecar.metrics import families
    from inferwatch_sidecar.metrics.gpu import GPU_MEMORY_USED_BYTES

    fam = families.gauge(GPU_MEMORY_USED_BYTES)
    fam.add_metric(["0"], 1024.0)

Info entries list the label names of their one sample, which
``InfoMetricFamily`` takes as the value dict, so :func:`info` builds the
family with no labels of its own: ``fam.add_metric([], {"gpu": "0", ...})``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.samples import Sample

from inferwatch_sidecar.metrics.entry import Metric

__all__ = ["CatalogCollector", "bucket_les", "counter", "describe", "family", "gauge", "histogram", "info"]


def _require(m: Metric, typ: str) -> None:
    if m.type != typ:
        raise ValueError(f"metric {m.name!r} is a {m.type}, not a {typ}")


def counter(m: Metric) -> CounterMetricFamily:
    """An empty counter family for a counter entry (samples are named ``<name>``, which ends in ``_total``)."""
    _require(m, "counter")
    return CounterMetricFamily(m.name, m.help, labels=m.labels, unit=m.unit)


def gauge(m: Metric) -> GaugeMetricFamily:
    """An empty gauge family for a gauge entry."""
    _require(m, "gauge")
    return GaugeMetricFamily(m.name, m.help, labels=m.labels, unit=m.unit)


def histogram(m: Metric) -> HistogramMetricFamily:
    """An empty histogram family for a histogram entry; its buckets are :func:`bucket_les`."""
    _require(m, "histogram")
    return HistogramMetricFamily(m.name, m.help, labels=m.labels, unit=m.unit)


def info(m: Metric) -> InfoMetricFamily:
    """An empty info family for an info entry; ``m.labels`` are the keys of each sample's value dict."""
    _require(m, "info")
    return InfoMetricFamily(m.name, m.help, labels=())


_BUILDERS: dict[str, Callable[[Metric], PromMetric]] = {
    "counter": counter,
    "gauge": gauge,
    "histogram": histogram,
    "info": info,
}


def family(m: Metric) -> PromMetric:
    """An empty family of the entry's own type."""
    return _BUILDERS[m.type](m)


def bucket_les(m: Metric, bounds: Sequence[float] | None = None) -> list[str]:
    """The ``le`` values of a histogram entry's buckets, ``+Inf`` last.

    Args:
        m: the histogram entry.
        bounds: configured bounds that replace the entry's default buckets for some series
            (``aggregate.buckets``); None for the entry's own.
    """
    _require(m, "histogram")
    if bounds is None:
        bounds = m.buckets
    assert bounds is not None  # every histogram entry has buckets (checked by Metric)
    return [repr(float(b)) for b in bounds] + ["+Inf"]


#: Values of gauges and counters by family name: ``{entry.name: [(label values, value), ...]}``.
Snapshot = Mapping[str, Sequence[tuple[Sequence[str], float]]]


def from_snapshot(metrics: Iterable[Metric], snapshot: Snapshot) -> Iterator[PromMetric]:
    """The families of ``metrics`` that ``snapshot`` holds samples for, in catalog order.

    Components that compute their numbers on their own thread keep the last
    result as a snapshot and export it at scrape time with this.
    """
    for m in metrics:
        samples = snapshot.get(m.name)
        if not samples:
            continue
        yield _LAZY[m.type](m.name, m.help, labels=m.labels, unit=m.unit).pending(samples)


_L = TypeVar("_L", bound="_LazySamples")


class _LazySamples:
    """A snapshot family whose samples are built on first access (mixed into the counter and gauge families).

    A component's snapshot holds up to tens of thousands of samples and changes once per
    evaluation, while scrapes come more often: the exposition (export/render.py) renders such a
    family once per snapshot, by :attr:`snapshot_key`, without building its samples again.
    ``snapshot_values`` are the ``(label values, value)`` pairs it was built from, one sample each.
    """

    snapshot_values: Sequence[tuple[Sequence[str], float]] | None = None
    #: Identifies the snapshot list (the component replaces it, never changes it in place).
    snapshot_key: tuple[int, int] | None = None

    def pending(self: _L, values: Sequence[tuple[Sequence[str], float]]) -> _L:
        self.snapshot_values = values
        self.snapshot_key = (id(values), len(values))
        self.__dict__["_todo"] = values
        return self

    @property
    def samples(self) -> list[Sample]:
        todo = self.__dict__.get("_todo")
        if todo is not None:
            self.__dict__["_todo"] = None
            for labels, v in todo:
                self.add_metric(list(labels), v)  # type: ignore[attr-defined]
        out: list[Sample] = self.__dict__["_samples"]
        return out

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self.__dict__["_samples"] = value


class _LazyCounter(_LazySamples, CounterMetricFamily):
    pass


class _LazyGauge(_LazySamples, GaugeMetricFamily):
    pass


_LAZY: dict[str, type[_LazyCounter] | type[_LazyGauge]] = {"counter": _LazyCounter, "gauge": _LazyGauge}


def describe(metrics: Iterable[Metric]) -> list[PromMetric]:
    """One empty family per entry: a collector's ``describe()``."""
    return [family(m) for m in metrics]


class CatalogCollector:
    """A registry collector: a function returning families, and the catalog entries it exports.

    Args:
        collect: zero-argument callable returning the families of one scrape.
        metrics: every entry ``collect`` may export; :meth:`describe` reports them, so the
            registry refuses a second collector that exports one of the same names.
    """

    def __init__(self, collect: Callable[[], Iterable[PromMetric]], metrics: Iterable[Metric]) -> None:
        self._collect = collect
        self.metrics: tuple[Metric, ...] = tuple(metrics)

    def collect(self) -> Iterable[PromMetric]:
        return self._collect()

    def describe(self) -> list[PromMetric]:
        return describe(self.metrics)
