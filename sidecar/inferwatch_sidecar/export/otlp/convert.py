"""Prometheus metric families -> one OTLP ``ExportMetricsServiceRequest``.

The mapping follows the OpenTelemetry specification's "Prometheus and
OpenMetrics Compatibility" document; ``docs/otlp.md`` describes it field by
field. Everything exported is cumulative.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar import __version__

try:  # Installed with the sidecar extra (a dependency of opentelemetry-exporter-otlp-proto-http).
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
    from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('OTLP export needs opentelemetry-proto: pip install "inferwatch[sidecar]"') from exc

log = logging.getLogger("inferwatch.sidecar.otlp")

#: Scope name of everything we push (the spec asks for the translating entity).
SCOPE_NAME = "inferwatch_sidecar"
_CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-fA-F]{16}$")

# Prometheus unit words -> UCUM, as the compatibility spec asks ("seconds" -> "s", "ratio" -> "1").
_UCUM = {
    "seconds": "s",
    "milliseconds": "ms",
    "microseconds": "us",
    "nanoseconds": "ns",
    "minutes": "min",
    "hours": "h",
    "days": "d",
    "bytes": "By",
    "kilobytes": "kBy",
    "megabytes": "MBy",
    "gigabytes": "GBy",
    "kibibytes": "KiBy",
    "mebibytes": "MiBy",
    "gibibytes": "GiBy",
    "bits": "bit",
    "ratio": "1",
    "percent": "%",
    "celsius": "Cel",
    "hertz": "Hz",
    "joules": "J",
    "watts": "W",
    "volts": "V",
    "amperes": "A",
    "meters": "m",
    "grams": "g",
}


def _unit_from_name(name: str) -> str:
    """The unit a Prometheus-convention name ends with (``..._seconds`` -> ``seconds``), else ""."""
    for unit in _UCUM:
        if name.endswith("_" + unit):
            return unit
    return ""


def prometheus_unit_to_ucum(unit: str) -> str:
    """Translate a Prometheus unit word to the UCUM unit OpenTelemetry uses.

    ``seconds`` -> ``s``, ``bytes`` -> ``By``, ``ratio`` -> ``1`` and
    ``x_per_y`` -> ``x/y``. Unknown words pass through unchanged.

    Args:
        unit: the Prometheus unit, e.g. ``"seconds"``; ``""`` for none.
    """
    if not unit:
        return ""
    if "_per_" in unit:
        num, _, den = unit.partition("_per_")
        return f"{prometheus_unit_to_ucum(num)}/{prometheus_unit_to_ucum(den)}"
    # The "per" side is singular ("bytes_per_second"), so try the plural form too.
    return _UCUM.get(unit) or _UCUM.get(unit + "s") or unit


@dataclass
class ConversionStats:
    """What one conversion produced and what it had to leave out.

    Attributes:
        metrics: OTLP metrics written.
        data_points: OTLP data points written.
        dropped: data points or families left out, by reason.
    """

    metrics: int = 0
    data_points: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def _ns(seconds: float) -> int:
    # A u64 nanosecond time (2**64 - 1) read back from float seconds rounds to 2**64, past the fixed64 field.
    return min(int(round(seconds * 1e9)), 0xFFFFFFFFFFFFFFFF)


def _ts_ns(ts: Any, default_ns: int) -> int:
    """A prometheus_client timestamp (float seconds or ``Timestamp``) in ns."""
    if ts is None:
        return default_ns
    try:
        return _ns(float(ts))
    except (TypeError, ValueError):
        return default_ns


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _attributes(labels: Mapping[str, str], skip: tuple[str, ...] = ()) -> list[KeyValue]:
    # An empty label value means "no label" in Prometheus; keep that meaning in OTLP.
    return [_kv(k, str(v)) for k, v in labels.items() if v != "" and k not in skip]


def _series_key(labels: Mapping[str, str], skip: tuple[str, ...] = ()) -> frozenset[tuple[str, str]]:
    # A frozenset: label order does not matter, and it is cheaper than sorting per sample.
    if skip and any(k in labels for k in skip):
        return frozenset((k, v) for k, v in labels.items() if k not in skip)
    return frozenset(labels.items())


def _exemplar(ex: Any, default_ns: int) -> pb.Exemplar:
    """Convert a prometheus_client ``Exemplar`` (labels, value, timestamp).

    ``trace_id`` / ``span_id`` labels that look like W3C IDs (32 / 16 hex
    digits, not all zero) fill the binary fields; every other label (for
    example ``request_id``) becomes a filtered attribute, as the spec asks.
    """
    out = pb.Exemplar(time_unix_nano=_ts_ns(ex.timestamp, default_ns), as_double=float(ex.value))
    for key, value in ex.labels.items():
        value = str(value)
        if key == "trace_id" and _TRACE_ID.match(value) and int(value, 16):
            out.trace_id = bytes.fromhex(value)
        elif key == "span_id" and _SPAN_ID.match(value) and int(value, 16):
            out.span_id = bytes.fromhex(value)
        else:
            out.filtered_attributes.append(_kv(key, value))
    return out


class _Converter:
    """Converts one collection (a list of families) into OTLP metrics."""

    def __init__(self, now_ns: int, default_start_ns: int, units: Mapping[str, str],
                 exponential: bool = False) -> None:
        self.exponential = exponential
        self.now_ns = now_ns
        self.default_start_ns = min(default_start_ns, now_ns)
        self.units = units
        self.stats = ConversionStats()

    def _start(self, created: dict[frozenset[tuple[str, str]], float], key: frozenset[tuple[str, str]]) -> int:
        c = created.get(key)
        if c is None or not math.isfinite(c) or c <= 0:
            return self.default_start_ns
        return min(_ns(c), self.now_ns)

    def _metric(self, fam: Any, name: str) -> pb.Metric:
        unit = fam.unit or self.units.get(fam.name, "") or _unit_from_name(fam.name)
        m = pb.Metric(name=name, description=fam.documentation or "", unit=prometheus_unit_to_ucum(unit))
        m.metadata.append(_kv("prometheus.type", fam.type))
        return m

    def convert(self, fam: Any) -> pb.Metric | None:
        typ = fam.type
        if any(getattr(s, "native_histogram", None) is not None for s in fam.samples):
            self.stats.drop("native_histogram", 1)
            return None
        if typ == "counter":
            return self._counter(fam)
        if typ in ("gauge", "unknown"):
            return self._gauge(fam)
        if typ == "histogram":
            if self.exponential and getattr(fam, "native", None):
                return self._exponential(fam)
            return self._histogram(fam)
        if typ == "summary":
            return self._summary(fam)
        if typ == "info":
            return self._info(fam)
        if typ == "stateset":
            return self._stateset(fam)
        # The spec says GaugeHistogram MUST be dropped; anything else is unknown to us.
        self.stats.drop(f"type_{typ}" if typ == "gaugehistogram" else "type_other", 1)
        return None

    def _created(self, fam: Any, skip: tuple[str, ...] = ()) -> dict[frozenset[tuple[str, str]], float]:
        suffix = fam.name + "_created"
        return {_series_key(s.labels, skip): float(s.value) for s in fam.samples if s.name == suffix}

    def _counter(self, fam: Any) -> pb.Metric | None:
        created = self._created(fam)
        total = fam.name + "_total"
        m = self._metric(fam, fam.name)
        m.sum.aggregation_temporality = _CUMULATIVE
        m.sum.is_monotonic = True
        for s in fam.samples:
            # CounterMetricFamily names samples <family>_total; a hand-built family may use the bare name.
            if s.name not in (total, fam.name):
                continue
            p = m.sum.data_points.add(
                start_time_unix_nano=self._start(created, _series_key(s.labels)),
                time_unix_nano=_ts_ns(s.timestamp, self.now_ns),
                as_double=float(s.value),
            )
            p.attributes.extend(_attributes(s.labels))
            if s.exemplar is not None:
                p.exemplars.append(_exemplar(s.exemplar, self.now_ns))
        return m if m.sum.data_points else None

    def _plain_points(self, fam: Any, sample_name: str, container: Any, start: bool) -> None:
        for s in fam.samples:
            if s.name != sample_name:
                continue
            p = container.data_points.add(time_unix_nano=_ts_ns(s.timestamp, self.now_ns), as_double=float(s.value))
            if start:
                p.start_time_unix_nano = self.default_start_ns
            p.attributes.extend(_attributes(s.labels))

    def _gauge(self, fam: Any) -> pb.Metric | None:
        m = self._metric(fam, fam.name)
        self._plain_points(fam, fam.name, m.gauge, start=False)
        return m if m.gauge.data_points else None

    def _info(self, fam: Any) -> pb.Metric | None:
        # Spec: Info -> non-monotonic Sum of 1. Named as the exposed sample (<family>_info, as
        # prometheus_client names it) so the name survives the trip back into Prometheus unchanged.
        names = {s.name for s in fam.samples}
        name = fam.name + "_info" if fam.name + "_info" in names else fam.name
        m = self._metric(fam, name)
        m.sum.aggregation_temporality = _CUMULATIVE
        m.sum.is_monotonic = False
        self._plain_points(fam, name, m.sum, start=True)
        return m if m.sum.data_points else None

    def _stateset(self, fam: Any) -> pb.Metric | None:
        m = self._metric(fam, fam.name)
        m.sum.aggregation_temporality = _CUMULATIVE
        m.sum.is_monotonic = False
        self._plain_points(fam, fam.name, m.sum, start=True)
        return m if m.sum.data_points else None

    def _exponential(self, fam: Any) -> pb.Metric:
        """A native histogram family as an OTLP base-2 exponential histogram (scale = schema).

        Prometheus' bucket ``i`` is ``(base^(i-1), base^i]``, OTLP's is ``(base^i, base^(i+1)]``, so the
        offset is the first Prometheus index minus one; the zero bucket and its threshold carry over.
        """
        m = self._metric(fam, fam.name)
        m.exponential_histogram.aggregation_temporality = _CUMULATIVE
        names = fam._labelnames
        for values, h in fam.native:
            dp = m.exponential_histogram.data_points.add(
                start_time_unix_nano=self.default_start_ns, time_unix_nano=self.now_ns, count=h.count, sum=h.sum,
                scale=h.schema, zero_count=h.zero_count, zero_threshold=h.zero_threshold,
            )
            dp.attributes.extend(_attributes(dict(zip(names, values, strict=True))))
            if h.counts:
                dp.positive.offset = h.start - 1
                dp.positive.bucket_counts.extend(h.counts)
            for ex in h.exemplars:
                dp.exemplars.append(_exemplar(ex, self.now_ns))
        return m

    def _histogram(self, fam: Any) -> pb.Metric | None:
        skip = ("le",)
        created = self._created(fam, skip)
        series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}

        def entry(s: Any) -> dict[str, Any]:
            key = _series_key(s.labels, skip)
            e = series.get(key)
            if e is None:
                e = series[key] = {"labels": s.labels, "buckets": [], "sum": None, "count": None, "ts": None}
            return e

        bucket, count, total = fam.name + "_bucket", fam.name + "_count", fam.name + "_sum"
        for s in fam.samples:
            if s.name == bucket:
                e = entry(s)
                try:
                    le = float(s.labels["le"])
                except (KeyError, ValueError):
                    e["bad"] = True
                    continue
                e["buckets"].append((le, float(s.value), s.exemplar))
                e["ts"] = s.timestamp
            elif s.name == count:
                entry(s)["count"] = float(s.value)
            elif s.name == total:
                entry(s)["sum"] = float(s.value)

        m = self._metric(fam, fam.name)
        m.histogram.aggregation_temporality = _CUMULATIVE
        for key, e in series.items():
            if e.get("bad"):
                self.stats.drop("histogram_bad_le")
                continue
            buckets = sorted(e["buckets"], key=lambda b: b[0])
            if not buckets and e["count"] is None:
                continue
            # prometheus_client always ends with +Inf; a hand-built family might not, and then
            # _count closes the last bucket.
            if not buckets or not math.isinf(buckets[-1][0]):
                if e["count"] is None:
                    self.stats.drop("histogram_no_count")
                    continue
                buckets.append((math.inf, e["count"], None))
            # The spec drops a histogram without _count; the +Inf bucket is the count by definition,
            # so we use it instead of losing the series.
            n = e["count"] if e["count"] is not None else buckets[-1][1]
            counts: list[int] = []
            prev = 0.0
            ok = True
            for _, cum, _ex in buckets:
                if cum < prev or not math.isfinite(cum):
                    ok = False
                    break
                counts.append(int(round(cum - prev)))
                prev = cum
            if not ok:
                self.stats.drop("histogram_decreasing_buckets")
                continue
            p = m.histogram.data_points.add(
                start_time_unix_nano=self._start(created, key),
                time_unix_nano=_ts_ns(e["ts"], self.now_ns),
                count=int(round(n)),
            )
            if e["sum"] is not None:
                p.sum = e["sum"]
            p.explicit_bounds.extend(b[0] for b in buckets[:-1])
            p.bucket_counts.extend(counts)
            p.attributes.extend(_attributes(e["labels"], skip))
            for _, _, ex in buckets:
                if ex is not None:
                    p.exemplars.append(_exemplar(ex, self.now_ns))
        return m if m.histogram.data_points else None

    def _summary(self, fam: Any) -> pb.Metric | None:
        skip = ("quantile",)
        created = self._created(fam, skip)
        series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
        count, total = fam.name + "_count", fam.name + "_sum"
        for s in fam.samples:
            key = _series_key(s.labels, skip)
            e = series.setdefault(key, {"labels": s.labels, "q": [], "sum": 0.0, "count": None, "ts": s.timestamp})
            if s.name == fam.name and "quantile" in s.labels:
                try:
                    e["q"].append((float(s.labels["quantile"]), float(s.value)))
                except ValueError:
                    self.stats.drop("summary_bad_quantile")
            elif s.name == count:
                e["count"] = float(s.value)
            elif s.name == total:
                e["sum"] = float(s.value)
        m = self._metric(fam, fam.name)
        for key, e in series.items():
            if e["count"] is None:  # spec: a summary without _count is dropped
                self.stats.drop("summary_no_count")
                continue
            p = m.summary.data_points.add(
                start_time_unix_nano=self._start(created, key),
                time_unix_nano=_ts_ns(e["ts"], self.now_ns),
                count=int(round(e["count"])),
                sum=e["sum"],
            )
            for q, v in sorted(e["q"]):
                p.quantile_values.add(quantile=q, value=v)
            p.attributes.extend(_attributes(e["labels"], skip))
        return m if m.summary.data_points else None


def families_to_request(
    families: Iterable[Any],
    resource: Mapping[str, str],
    *,
    now_s: float,
    start_time_s: float,
    units: Mapping[str, str] | None = None,
    exponential: bool = False,
) -> tuple[ExportMetricsServiceRequest, ConversionStats]:
    """Convert prometheus_client metric families into one OTLP export request.

    Args:
        families: ``prometheus_client.metrics_core.Metric`` objects, as a
            collector yields them at scrape time.
        resource: resource attributes (``service.name``, ...).
        now_s: collection time (wall clock, seconds), used for points
            without their own timestamp.
        start_time_s: start time for cumulative points that carry no
            ``_created`` sample.
        units: Prometheus unit by family name, for families built without a
            ``unit`` (the catalog knows every unit).
        exponential: send the histograms that keep a native histogram as base-2 exponential
            histograms (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=
            base2_exponential_bucket_histogram``); the others stay explicit-bucket histograms.

    Returns:
        The request and what was converted or dropped.
    """
    conv = _Converter(_ns(now_s), _ns(start_time_s), units or {}, exponential)
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.CopyFrom(Resource(attributes=[_kv(k, v) for k, v in resource.items()]))
    sm = rm.scope_metrics.add()
    sm.scope.CopyFrom(InstrumentationScope(name=SCOPE_NAME, version=__version__))
    for fam in families:
        try:
            m = conv.convert(fam)
        except Exception:  # one malformed family must not cost the others
            log.debug("OTLP: could not convert family %r", getattr(fam, "name", fam), exc_info=True)
            conv.stats.drop("family_error")
            continue
        if m is None:
            continue
        sm.metrics.append(m)
        conv.stats.metrics += 1
        kind = m.WhichOneof("data")
        conv.stats.data_points += len(getattr(m, kind).data_points) if kind else 0
    return req, conv.stats
