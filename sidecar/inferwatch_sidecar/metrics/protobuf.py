"""The Prometheus protobuf exposition: length-delimited ``io.prometheus.client.MetricFamily`` messages.

Prometheus scrapes this format when started with ``--enable-feature=native-histograms``
(2.40 and later): its ``Accept`` header then lists
``application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited``
first. It is the only exposition that carries native histograms in Prometheus 2.42, so
:func:`wants_protobuf` picks it whenever a scraper prefers it, and :func:`encode` writes it
from the same prometheus_client families the text formats are rendered from.

The encoder is written here, against the message definitions in
``prometheus/client_model`` (``io/prometheus/client/metrics.proto``); no protobuf library is
needed. Fields used (proto3, zero values omitted)::

    MetricFamily: name=1 string, help=2 string, type=3 enum, metric=4 repeated Metric, unit=5 string
    Metric:       label=1 repeated LabelPair, gauge=2, counter=3, summary=4, untyped=5, histogram=7
    LabelPair:    name=1, value=2            Gauge/Counter/Untyped: value=1 double (Counter: exemplar=2)
    Summary:      sample_count=1 uint64, sample_sum=2 double, quantile=3 {quantile=1, value=2}
    Histogram:    sample_count=1 uint64, sample_sum=2 double, bucket=3 repeated Bucket,
                  schema=5 sint32, zero_threshold=6 double, zero_count=7 uint64,
                  positive_span=12 repeated BucketSpan, positive_delta=13 packed sint64,
                  exemplars=16 repeated Exemplar (native histograms; later Prometheus releases read them)
    Bucket:       cumulative_count=1 uint64, upper_bound=2 double, exemplar=3 Exemplar
    BucketSpan:   offset=1 sint32, length=2 uint32
    Exemplar:     label=1 repeated LabelPair, value=2 double, timestamp=3 google.protobuf.Timestamp

A native histogram is recognised by its non-zero ``zero_threshold``, so one with no
observation yet is still native. Classic buckets go along only for families that ask
(:attr:`NativeHistogramFamily.classic`); the ``+Inf`` bucket is implied by ``sample_count``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.registry import Collector

from inferwatch_sidecar.metrics.native import NativeHistogram, NativeHistogramFamily

__all__ = ["CONTENT_TYPE", "encode", "encode_families", "wants_protobuf"]

#: The Content-Type of the answer (what Prometheus' parser selects on).
CONTENT_TYPE = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
_MEDIA = "application/vnd.google.protobuf"

# MetricType values.
_COUNTER, _GAUGE, _SUMMARY, _UNTYPED, _HISTOGRAM, _GAUGE_HISTOGRAM = range(6)
_pack_double = struct.Struct("<d").pack


def wants_protobuf(accept: str) -> bool:
    """Whether an ``Accept`` header prefers the delimited protobuf exposition to every text format.

    The protobuf entry must name ``proto=io.prometheus.client.MetricFamily`` and
    ``encoding=delimited``; its quality must be above every other entry's, or equal and listed
    first (Prometheus lists protobuf first, with no quality).
    """
    proto: tuple[float, int] | None = None
    other: tuple[float, int] = (-1.0, 0)
    for i, part in enumerate(accept.split(",")):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        params: dict[str, str] = {}
        for f in fields[1:]:
            k, _, v = f.partition("=")
            params[k.strip().lower()] = v.strip().strip('"')
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if not 0.0 <= q <= 1.0:
            q = 0.0
        if media == _MEDIA:
            if (proto is None and params.get("proto") == "io.prometheus.client.MetricFamily"
                    and params.get("encoding") == "delimited"):
                proto = (q, i)
        elif q > other[0]:
            other = (q, i)
    if proto is None or proto[0] <= 0:
        return False
    return proto[0] > other[0] or (proto[0] == other[0] and proto[1] < other[1])


# -- wire format -----------------------------------------------------------------


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    return (n << 1) if n >= 0 else ((-n << 1) - 1)


def _len_field(key: int, payload: bytes) -> bytes:
    n = len(payload)
    return (bytes((key, n)) if n < 0x80 else bytes((key,)) + _varint(n)) + payload


def _double(key: int, v: float) -> bytes:
    return bytes((key,)) + _pack_double(v) if v else b""


def _uint(key: int, n: int) -> bytes:
    return (bytes((key, n)) if n < 0x80 else bytes((key,)) + _varint(n)) if n else b""


# Field keys: (number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited).
_K_NAME, _K_HELP, _K_TYPE, _K_METRIC, _K_UNIT = 0x0A, 0x12, 0x18, 0x22, 0x2A
_K_M_LABEL, _K_M_GAUGE, _K_M_COUNTER, _K_M_SUMMARY, _K_M_UNTYPED, _K_M_HIST = 0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x3A
_K_VALUE = 0x09  # Gauge/Counter/Untyped value = 1 (double)
_K_EX_VALUE = 0x11  # Exemplar.value = 2
_K_H_COUNT, _K_H_SUM, _K_H_BUCKET = 0x08, 0x11, 0x1A
_K_H_SCHEMA, _K_H_ZT, _K_H_ZC, _K_H_PSPAN, _K_H_PDELTA = 0x28, 0x31, 0x38, 0x62, 0x6A
_K_H_EXEMPLARS = b"\x82\x01"  # field 16, length-delimited: a two-byte key


class _Labels:
    """Encoded ``LabelPair`` runs, cached by (names, values): label sets repeat across families and scrapes."""

    def __init__(self) -> None:
        self.cache: dict[tuple[tuple[str, str], ...], bytes] = {}

    def encode(self, labels: dict[str, str]) -> bytes:
        key = tuple(labels.items())
        out = self.cache.get(key)
        if out is None:
            if len(self.cache) >= 50_000:
                self.cache.clear()
            out = b"".join(
                _len_field(_K_M_LABEL, _len_field(0x0A, k.encode()) + _len_field(0x12, v.encode()))
                for k, v in labels.items()
            )
            self.cache[key] = out
        return out


def _timestamp(seconds: float) -> bytes:
    s = math.floor(seconds)
    ns = round((seconds - s) * 1e9)
    if ns >= 10**9:
        s, ns = s + 1, ns - 10**9
    return (bytes((0x08,)) + _varint(s) if s > 0 else b"") + (bytes((0x10,)) + _varint(ns) if ns > 0 else b"")


def _exemplar(ex: Any, labels: _Labels) -> bytes:
    body = labels.encode(ex.labels) + _double(_K_EX_VALUE, float(ex.value))
    if ex.timestamp is not None:
        ts = float(ex.timestamp)  # prometheus_client Exemplar timestamps are seconds (float or Timestamp)
        body += _len_field(0x1A, _timestamp(ts))
    return body


def _native(h: NativeHistogram, labels: _Labels) -> bytes:
    out = [
        _uint(_K_H_COUNT, h.count), _double(_K_H_SUM, h.sum),
        _uint(_K_H_SCHEMA, _zigzag(h.schema)), _double(_K_H_ZT, h.zero_threshold), _uint(_K_H_ZC, h.zero_count),
    ]
    counts = h.counts
    if counts:
        # Spans: runs of buckets, a gap of up to two empty buckets kept inside a run (cheaper than a new span).
        spans: list[tuple[int, int]] = []
        deltas = bytearray()
        prev = 0
        k, n = 0, len(counts)
        last_end = 0  # native index just after the previous span (the first span's offset is absolute)
        while k < n:
            run_start = k
            end = k + 1
            while end < n:
                if counts[end]:
                    end += 1
                    continue
                gap = end
                while gap < n and not counts[gap]:
                    gap += 1
                if gap < n and gap - end <= 2:
                    end = gap + 1
                else:
                    break
            spans.append((h.start + run_start - last_end, end - run_start))
            for c in counts[run_start:end]:
                deltas += _varint(_zigzag(c - prev))
                prev = c
            last_end = h.start + end
            k = end
            while k < n and not counts[k]:
                k += 1
        for offset, length in spans:
            body = (bytes((0x08,)) + _varint(_zigzag(offset)) if offset else b"") + _uint(0x10, length)
            out.append(_len_field(_K_H_PSPAN, body))
        out.append(_len_field(_K_H_PDELTA, bytes(deltas)))
    for ex in h.exemplars:
        if ex.timestamp is not None:  # native histograms' exemplars must have one
            body = _exemplar(ex, labels)
            out.append(_K_H_EXEMPLARS + _varint(len(body)) + body)
    return b"".join(out)


def _classic_buckets(buckets: list[tuple[float, float, Any]], labels: _Labels) -> bytes:
    out = []
    for le, cum, ex in buckets:
        if le == math.inf:
            continue
        body = _uint(0x08, int(cum)) + bytes((0x11,)) + _pack_double(le)
        if ex is not None:
            body += _len_field(0x1A, _exemplar(ex, labels))
        out.append(_len_field(_K_H_BUCKET, body))
    return b"".join(out)


def _family(name: str, help_: str, typ: int, unit: str, metrics: list[bytes]) -> bytes:
    body = b"".join((
        _len_field(_K_NAME, name.encode()), _len_field(_K_HELP, help_.encode()) if help_ else b"",
        _uint(_K_TYPE, typ), *metrics, _len_field(_K_UNIT, unit.encode()) if unit else b"",
    ))
    return _varint(len(body)) + body


def _value_metrics(samples: Iterable[Any], key: int, labels: _Labels, with_exemplar: bool = False) -> list[bytes]:
    out = []
    for s in samples:
        body = _double(_K_VALUE, float(s.value))
        if with_exemplar and s.exemplar is not None:
            body += _len_field(0x12, _exemplar(s.exemplar, labels))
        m = labels.encode(s.labels) + _len_field(key, body)
        if s.timestamp is not None:
            m += bytes((0x30,)) + _varint(int(float(s.timestamp) * 1000))
        out.append(_len_field(_K_METRIC, m))
    return out


def _histograms(fam: PromMetric, labels: _Labels) -> list[bytes]:
    """Classic series grouped from the family's samples; native ones (with classic buckets if asked) first."""
    native = fam.native if isinstance(fam, NativeHistogramFamily) else []
    classic_too = not native or fam.classic  # type: ignore[attr-defined]
    series: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    if classic_too:
        for s in fam.samples:
            lab = dict(s.labels)
            le = lab.pop("le", None)
            key = tuple(lab.items())
            entry = series.get(key)
            if entry is None:
                entry = series[key] = [lab, 0, 0.0, []]
            if s.name.endswith("_bucket") and le is not None:
                entry[3].append((float(le), s.value, s.exemplar))
            elif s.name.endswith("_count"):
                entry[1] = int(s.value)
            elif s.name.endswith("_sum"):
                entry[2] = float(s.value)
    out = []
    names = fam._labelnames if hasattr(fam, "_labelnames") else ()
    seen = set()
    for values, h in native:
        lab = dict(zip(names, values, strict=True))
        key = tuple(lab.items())
        seen.add(key)
        body = _native(h, labels)
        if classic_too and key in series:
            body += _classic_buckets(series[key][3], labels)
        out.append(_len_field(_K_METRIC, labels.encode(lab) + _len_field(_K_M_HIST, body)))
    for key, (lab, count, total, buckets) in series.items():
        if key in seen:
            continue
        if not count and buckets:
            count = int(buckets[-1][1])
        body = _uint(_K_H_COUNT, count) + _double(_K_H_SUM, total) + _classic_buckets(buckets, labels)
        out.append(_len_field(_K_METRIC, labels.encode(lab) + _len_field(_K_M_HIST, body)))
    return out


def _summaries(fam: PromMetric, labels: _Labels) -> list[bytes]:
    series: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for s in fam.samples:
        lab = dict(s.labels)
        q = lab.pop("quantile", None)
        entry = series.setdefault(tuple(lab.items()), [lab, 0, 0.0, []])
        if q is not None:
            entry[3].append((float(q), float(s.value)))
        elif s.name.endswith("_count"):
            entry[1] = int(s.value)
        elif s.name.endswith("_sum"):
            entry[2] = float(s.value)
    out = []
    for lab, count, total, qs in series.values():
        body = _uint(0x08, count) + _double(0x11, total) + b"".join(
            _len_field(0x1A, _double(0x09, q) + _double(0x11, v)) for q, v in qs)
        out.append(_len_field(_K_METRIC, labels.encode(lab) + _len_field(_K_M_SUMMARY, body)))
    return out


def encode_families(fams: Iterable[PromMetric], labels: _Labels | None = None) -> bytes:
    """The delimited protobuf exposition of prometheus_client families."""
    labels = labels or _Labels()
    out = []
    for fam in fams:
        t = fam.type
        if t == "counter":
            samples = [s for s in fam.samples if s.name.endswith("_total")]
            if samples:
                out.append(_family(fam.name + "_total", fam.documentation, _COUNTER, fam.unit,
                                   _value_metrics(samples, _K_M_COUNTER, labels, with_exemplar=True)))
        elif t == "gauge" and fam.samples:
            out.append(_family(fam.name, fam.documentation, _GAUGE, fam.unit,
                               _value_metrics(fam.samples, _K_M_GAUGE, labels)))
        elif t == "info" and fam.samples:
            out.append(_family(fam.name + "_info", fam.documentation, _GAUGE, "",
                               _value_metrics(fam.samples, _K_M_GAUGE, labels)))
        elif t == "histogram":
            metrics = _histograms(fam, labels)
            if metrics:
                out.append(_family(fam.name, fam.documentation, _HISTOGRAM, fam.unit, metrics))
        elif t == "summary" and fam.samples:
            out.append(_family(fam.name, fam.documentation, _SUMMARY, fam.unit, _summaries(fam, labels)))
        else:  # unknown, stateset, gaugehistogram: each sample name as an untyped family
            by_name: dict[str, list[Any]] = {}
            for s in fam.samples:
                by_name.setdefault(s.name, []).append(s)
            for name, samples in by_name.items():
                out.append(_family(name, fam.documentation, _UNTYPED, "",
                                   _value_metrics(samples, _K_M_UNTYPED, labels)))
    return b"".join(out)


_SHARED_LABELS = _Labels()
#: The label-encoding cache every scrape shares (export/render.py encodes family by family with it).
SHARED_LABELS = _SHARED_LABELS


def encode(registry: Collector) -> bytes:
    """The delimited protobuf exposition of everything ``registry`` collects."""
    return encode_families(registry.collect(), _SHARED_LABELS)
