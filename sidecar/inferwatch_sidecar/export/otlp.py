"""Push the sidecar's metrics over OTLP/HTTP (protobuf).

The same prometheus_client metric families that ``/metrics`` serves are
converted to OTLP and POSTed to an OpenTelemetry Collector (or any OTLP/HTTP
receiver) every ``interval_s`` seconds, on a background thread. The mapping
follows the OpenTelemetry specification's "Prometheus and OpenMetrics
Compatibility" document; ``docs/otlp.md`` describes it field by field.

Design points (why it looks the way it does):

- Everything exported is cumulative, so a failed push loses nothing: the next
  push carries the latest totals. There is therefore no retry queue at all,
  only "try again next interval" (or later, when the receiver asks for it with
  ``Retry-After``). Memory never grows with the length of an outage.
- The pusher runs on its own daemon thread and calls ``collect()`` itself, so
  the scrape path never waits for a network round trip, and a slow or dead
  collector never delays ``/metrics``.
- ``push_once`` never raises: every failure is counted by reason, shown in
  ``status()`` and logged at a bounded rate.
- Configuration is strict: a bad endpoint, header list, timeout, compression
  or protocol raises :class:`OtlpConfigError` at start-up with a message that
  names the environment variable and says what to fix.

The protobuf messages come from ``opentelemetry-proto``; the HTTP request is a
plain ``urllib`` POST. See ``docs/otlp.md`` for why the SDK's exporter is not
used.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from inferwatch_sidecar import __version__

try:  # Installed with the sidecar extra (a dependency of opentelemetry-exporter-otlp-proto-http).
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
    from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'OTLP export needs opentelemetry-proto: pip install "inferwatch[sidecar]"'
    ) from exc

__all__ = [
    "FAILURE_REASONS",
    "ConversionStats",
    "OtlpConfigError",
    "OtlpMetricsPusher",
    "endpoint_from_env",
    "families_to_request",
    "parse_key_value_list",
    "prometheus_unit_to_ucum",
    "resource_from_env",
]

log = logging.getLogger("inferwatch.sidecar.otlp")

#: Scope name of everything we push (the spec asks for the translating entity).
SCOPE_NAME = "inferwatch_sidecar"
_CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_DEFAULT_TIMEOUT_S = 10.0
_DEFAULT_INTERVAL_S = 15.0
#: Longest a ``Retry-After`` answer may postpone the next push.
_MAX_RETRY_AFTER_S = 300.0
#: Largest response body read back (a partial-success message or an error text).
_MAX_RESPONSE_BYTES = 64 * 1024
#: At most one failure log line per this many seconds (the counts keep going).
_LOG_EVERY_S = 60.0

#: Failure reasons counted in ``status()["failures"]``: a closed set, whatever happens.
FAILURE_REASONS = (
    "connect",  # connection refused, DNS, network unreachable
    "timeout",  # connect or read exceeded timeout_s
    "tls",  # certificate or handshake problem
    "http_429",  # the receiver is throttling us
    "http_4xx",  # the receiver rejected the request (auth, path, payload)
    "http_5xx",  # the receiver failed
    "collect",  # collect() raised
    "encode",  # conversion or serialisation failed
    "shutdown_timeout",  # no time left for the final flush
    "other",
)

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


class OtlpConfigError(ValueError):
    """The OTLP configuration (arguments or OTEL_* variables) is invalid."""


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


def parse_key_value_list(text: str, what: str) -> dict[str, str]:
    """Parse ``k1=v1,k2=v2`` (W3C-baggage style, values percent-encoded).

    This is the format of ``OTEL_EXPORTER_OTLP_HEADERS`` and
    ``OTEL_RESOURCE_ATTRIBUTES``.

    Args:
        text: the variable's value.
        what: the variable name, for the error message.

    Raises:
        OtlpConfigError: an entry without ``=`` or with an empty key. The
            message names the entry's position, never its value (headers
            carry secrets).
    """
    out: dict[str, str] = {}
    for pos, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        key = urllib.parse.unquote(key.strip())
        if not sep or not key:
            raise OtlpConfigError(
                f"{what}: entry {pos} is not of the form key=value (expected 'k1=v1,k2=v2', values percent-encoded)"
            )
        out[key] = urllib.parse.unquote(value.strip())
    return out


# --------------------------------------------------------------------------------------------
# Prometheus families -> OTLP
# --------------------------------------------------------------------------------------------


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
    return int(round(seconds * 1e9))


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

    def __init__(self, now_ns: int, default_start_ns: int, units: Mapping[str, str]) -> None:
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

    Returns:
        The request and what was converted or dropped.
    """
    conv = _Converter(_ns(now_s), _ns(start_time_s), units or {})
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


def _catalog_units() -> dict[str, str]:
    """Units by prometheus_client family name, from the one catalog."""
    try:
        from inferwatch_sidecar.metrics.catalog import all_metrics

        return {m.family: m.unit for m in all_metrics() if m.unit}
    except Exception:  # the catalog is a convenience here; the family's own unit wins anyway
        log.debug("OTLP: metric catalog unavailable for units", exc_info=True)
        return {}


# --------------------------------------------------------------------------------------------
# Environment (OTLP exporter spec, OTLP/HTTP)
# --------------------------------------------------------------------------------------------


def _env(environ: Mapping[str, str], name: str) -> str | None:
    # The spec: an empty value means the same as unset.
    v = environ.get(name, "").strip()
    return v or None


def _signal_env(environ: Mapping[str, str], suffix: str) -> tuple[str, str] | None:
    """(variable name, value) of OTEL_EXPORTER_OTLP_METRICS_<suffix>, else the generic one."""
    for name in (f"OTEL_EXPORTER_OTLP_METRICS_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}"):
        v = _env(environ, name)
        if v is not None:
            return name, v
    return None


def _check_url(url: str, what: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtlpConfigError(
            f"{what}={url!r}: expected an http:// or https:// URL with a host, e.g. http://otel-collector:4318"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise OtlpConfigError(f"{what}={url!r}: {exc}") from None
    return url


def endpoint_from_env(environ: Mapping[str, str]) -> str | None:
    """The metrics URL the OTel spec derives from the environment, or None.

    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is used as is (a URL without a
    path gets ``/``); otherwise ``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL
    to which ``v1/metrics`` is appended.
    """
    signal = _env(environ, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if signal is not None:
        _check_url(signal, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        parts = urllib.parse.urlsplit(signal)
        return signal if parts.path else urllib.parse.urlunsplit(parts._replace(path="/"))
    base = _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if base is None:
        return None
    _check_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT")
    parts = urllib.parse.urlsplit(base)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit(parts._replace(path=path + "v1/metrics"))


def _positive_ms(environ: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        v = _env(environ, name)
        if v is None:
            continue
        try:
            ms = float(v)
        except ValueError:
            ms = -1.0
        if not (ms > 0 and math.isfinite(ms)):
            raise OtlpConfigError(f"{name}={v!r}: expected a positive number of milliseconds, e.g. 10000")
        return ms / 1000.0
    return None


def resource_from_env(environ: Mapping[str, str], resource: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes: OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME, then ``resource``.

    Later sources win, as in the OTel SDK's ``Resource.create``: attributes
    the daemon passes explicitly override the environment. Empty values in
    ``resource`` are ignored so that an unset config field never hides an
    environment value. ``service.name`` defaults to ``unknown_service``.
    """
    attrs: dict[str, str] = {}
    raw = _env(environ, "OTEL_RESOURCE_ATTRIBUTES")
    if raw is not None:
        attrs.update(parse_key_value_list(raw, "OTEL_RESOURCE_ATTRIBUTES"))
    svc = _env(environ, "OTEL_SERVICE_NAME")
    if svc is not None:
        attrs["service.name"] = svc
    attrs.update({k: str(v) for k, v in resource.items() if v is not None and str(v) != ""})
    attrs.setdefault("service.name", "unknown_service")
    return attrs


def _ssl_context(environ: Mapping[str, str]) -> ssl.SSLContext | None:
    ca = _signal_env(environ, "CERTIFICATE")
    cert = _signal_env(environ, "CLIENT_CERTIFICATE")
    key = _signal_env(environ, "CLIENT_KEY")
    if ca is None and cert is None and key is None:
        return None
    for item in (ca, cert, key):
        if item is not None and not os.path.isfile(item[1]):
            raise OtlpConfigError(f"{item[0]}={item[1]!r}: no such file")
    if key is not None and cert is None:
        raise OtlpConfigError(f"{key[0]} is set but OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE is not")
    try:
        ctx = ssl.create_default_context(cafile=ca[1] if ca else None)
        if cert is not None:
            ctx.load_cert_chain(cert[1], key[1] if key else None)
    except (ssl.SSLError, OSError) as exc:
        raise OtlpConfigError(f"OTLP TLS files could not be loaded: {exc}") from None
    return ctx


# --------------------------------------------------------------------------------------------
# The pusher
# --------------------------------------------------------------------------------------------


class _PushFailed(Exception):
    def __init__(self, reason: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


def _retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError):
        return None


def _printable(body: bytes) -> str:
    text = body[:300].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()


class OtlpMetricsPusher:
    """Pushes the metric families from ``collect`` to an OTLP/HTTP endpoint.

    Args:
        collect: returns prometheus_client metric families; called on the
            pusher's thread once per push (the scrape path's own collect).
        endpoint: the full metrics URL, e.g.
            ``http://otel-collector:4318/v1/metrics``.
        headers: extra HTTP headers (authentication, tenant).
        resource: resource attributes, e.g. ``{"service.name": "fraud-api",
            "inferwatch.model": "xgb"}``. ``service.name`` defaults to
            ``unknown_service``.
        interval_s: seconds between pushes.
        timeout_s: time limit for connecting and for each read of one push.
        compression: ``"gzip"`` or ``"none"``.
        ssl_context: TLS settings for https endpoints (None: system defaults).
        start_time_s: start of cumulative series without ``_created``
            (default: when the pusher was built; pass the daemon's start time).
        units: Prometheus unit by family name, for families without a unit
            (default: from the metric catalog).
        clock: wall-clock seconds (injectable for tests).
        monotonic: monotonic seconds (injectable for tests).

    Raises:
        OtlpConfigError: an invalid endpoint, interval, timeout or compression.
    """

    def __init__(
        self,
        collect: Callable[[], Iterable[Any]],
        *,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        resource: Mapping[str, str] = {},  # noqa: B006 - read-only, never mutated
        interval_s: float = _DEFAULT_INTERVAL_S,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
        compression: str = "none",
        ssl_context: ssl.SSLContext | None = None,
        start_time_s: float | None = None,
        units: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = _check_url(endpoint, "endpoint")
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise OtlpConfigError(f"interval_s={interval_s!r}: must be a positive number of seconds")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise OtlpConfigError(f"timeout_s={timeout_s!r}: must be a positive number of seconds")
        compression = compression.strip().lower()
        if compression not in ("gzip", "none"):
            raise OtlpConfigError(f"compression={compression!r}: must be 'gzip' or 'none'")
        self._collect = collect
        self.headers = {str(k).strip(): str(v) for k, v in (headers or {}).items()}
        self.resource = dict(resource)
        self.resource.setdefault("service.name", "unknown_service")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.compression = compression
        self._clock = clock
        self._mono = monotonic
        self.start_time_s = clock() if start_time_s is None else float(start_time_s)
        self._units = dict(units) if units is not None else _catalog_units()
        handlers: list[Any] = [urllib.request.HTTPSHandler(context=ssl_context)] if ssl_context else []
        # build_opener keeps the standard ProxyHandler: HTTPS_PROXY / NO_PROXY work as users expect.
        self._opener = urllib.request.build_opener(*handlers)

        self._push_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop_deadline: float | None = None
        self._defer_until = 0.0
        self._last_log = -math.inf
        self._failing = False
        # status counters
        self.pushes_ok = 0
        self.pushes_failed = 0
        self.failures: dict[str, int] = {}
        self.skipped_retry_after = 0
        self.rejected_data_points = 0
        self.dropped_points: dict[str, int] = {}
        self.last_error: str | None = None
        self._last_success_mono: float | None = None
        self._last_bytes = 0
        self._last_points = 0
        self._last_duration_s: float | None = None
        self.final_flush: str | None = None

    # -- construction from the environment --------------------------------------------------

    @classmethod
    def from_env(
        cls,
        collect: Callable[[], Iterable[Any]],
        resource: Mapping[str, str],
        environ: Mapping[str, str] = os.environ,
        **overrides: Any,
    ) -> OtlpMetricsPusher | None:
        """Build a pusher from the standard OTEL_* variables (OTLP/HTTP).

        Args:
            collect: see the class.
            resource: resource attributes from the sidecar's config; they
                override OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.
            environ: the environment to read.
            **overrides: constructor keywords that win over the environment
                (e.g. ``interval_s`` from the config file, ``start_time_s``).

        Returns:
            None when neither ``OTEL_EXPORTER_OTLP_ENDPOINT`` nor
            ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set (or
            ``OTEL_SDK_DISABLED=true`` / ``OTEL_METRICS_EXPORTER=none``).

        Raises:
            OtlpConfigError: a variable is set to something unusable; the
                message names it and says what to fix.
        """
        endpoint = endpoint_from_env(environ)
        if endpoint is None:
            return None
        if (_env(environ, "OTEL_SDK_DISABLED") or "").lower() == "true":
            log.info("OTLP push disabled: OTEL_SDK_DISABLED=true")
            return None
        exporters = [e.strip().lower() for e in (_env(environ, "OTEL_METRICS_EXPORTER") or "").split(",")]
        if exporters == ["none"]:
            log.info("OTLP push disabled: OTEL_METRICS_EXPORTER=none")
            return None

        proto = _signal_env(environ, "PROTOCOL")
        if proto is not None and proto[1] != "http/protobuf":
            raise OtlpConfigError(
                f"{proto[0]}={proto[1]!r}: the sidecar pushes OTLP over HTTP with protobuf only; set it to "
                "'http/protobuf' (or unset it) and point the endpoint at the collector's OTLP/HTTP port (usually 4318)"
            )
        kwargs: dict[str, Any] = {"endpoint": endpoint}
        hdr = _signal_env(environ, "HEADERS")
        if hdr is not None:
            # The metrics-specific list replaces the generic one, as in the OTel SDKs.
            kwargs["headers"] = {k.lower(): v for k, v in parse_key_value_list(hdr[1], hdr[0]).items()}
        timeout = _positive_ms(environ, ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"))
        if timeout is not None:
            kwargs["timeout_s"] = timeout
        interval = _positive_ms(environ, ("OTEL_METRIC_EXPORT_INTERVAL",))
        if interval is not None:
            kwargs["interval_s"] = interval
        comp = _signal_env(environ, "COMPRESSION")
        if comp is not None:
            if comp[1].lower() not in ("gzip", "none"):
                raise OtlpConfigError(f"{comp[0]}={comp[1]!r}: supported values are 'gzip' and 'none'")
            kwargs["compression"] = comp[1].lower()
        temporality = _env(environ, "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")
        if temporality is not None:
            t = temporality.lower()
            if t not in ("cumulative", "delta", "lowmemory"):
                raise OtlpConfigError(
                    f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={temporality!r}: "
                    "expected cumulative, delta or lowmemory"
                )
            if t != "cumulative":
                log.warning(
                    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=%s: the sidecar exports Prometheus "
                    "counters, which are cumulative; pushing cumulative (a collector's cumulativetodelta "
                    "processor can convert)",
                    temporality,
                )
        ctx = _ssl_context(environ)
        if ctx is not None:
            kwargs["ssl_context"] = ctx
        kwargs["resource"] = resource_from_env(environ, resource)
        kwargs.update(overrides)
        return cls(collect, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread that pushes every ``interval_s`` seconds."""
        with self._state_lock:
            if self._thread is not None or self._stop.is_set():
                log.warning("OTLP pusher already started or stopped; ignoring start()")
                return
            self._thread = threading.Thread(target=self._run, name="inferwatch-otlp", daemon=True)
            self._thread.start()
        log.info("OTLP push to %s every %.3g s", self.endpoint, self.interval_s)

    def stop(self, timeout_s: float) -> None:
        """Stop pushing, after one final push of the latest values.

        Returns within ``timeout_s`` seconds (plus scheduling noise). A
        final push that cannot finish in time is abandoned and counted as
        ``shutdown_timeout``; it never delays the daemon's exit further.

        Args:
            timeout_s: the time limit for stopping, final push included.
        """
        deadline = self._mono() + max(0.0, timeout_s)
        with self._state_lock:
            if self._stop.is_set():
                return
            self._stop_deadline = deadline
            self._stop.set()
            thread = self._thread
        if thread is None:  # never started: flush here, in the caller's thread
            self._final_flush(deadline)
            return
        thread.join(max(0.0, deadline - self._mono()))
        if thread.is_alive():
            log.warning("OTLP pusher did not stop within %.3g s; abandoning the final push", timeout_s)
            if self.final_flush is None:
                self.final_flush = "timed_out"

    def _run(self) -> None:
        next_at = self._mono() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - self._mono())):
            now = self._mono()
            # Never try to catch up missed intervals with a burst of pushes.
            next_at = max(next_at + self.interval_s, now + self.interval_s / 2)
            if now < self._defer_until:
                self.skipped_retry_after += 1
                continue
            self.push_once()
        self._final_flush(self._stop_deadline if self._stop_deadline is not None else self._mono())

    def _final_flush(self, deadline: float) -> None:
        remaining = deadline - self._mono()
        if remaining < 0.05:
            self._count_failure("shutdown_timeout", "no time left for the final push")
            self.final_flush = "skipped"
            return
        ok = self._push(timeout_s=min(self.timeout_s, remaining), wait_s=remaining)
        self.final_flush = "ok" if ok else "failed"

    # -- one push ----------------------------------------------------------------------------

    def push_once(self) -> bool:
        """Collect, convert and POST once, now.

        Never raises. Failures are counted by reason (see ``status()``) and
        the next interval tries again with fresh values.

        Returns:
            True when the receiver accepted the request.
        """
        return self._push(timeout_s=self.timeout_s, wait_s=None)

    def _push(self, *, timeout_s: float, wait_s: float | None) -> bool:
        # Serialise pushes (the loop, a final flush, a manual push_once) without ever waiting
        # longer than the caller may.
        if not self._push_lock.acquire(timeout=-1 if wait_s is None else max(0.0, wait_s)):
            self._count_failure("shutdown_timeout", "a previous push was still running")
            return False
        try:
            t0 = self._mono()
            try:
                body, points = self._encode()
                self._post(body, timeout_s)
            except _PushFailed as exc:
                self._count_failure(exc.reason, str(exc))
                if exc.retry_after_s is not None:
                    self._defer_until = self._mono() + min(exc.retry_after_s, _MAX_RETRY_AFTER_S)
                return False
            except Exception as exc:  # never into the daemon
                self._count_failure("other", f"{type(exc).__name__}: {exc}")
                return False
            self._last_duration_s = self._mono() - t0
            self._last_success_mono = self._mono()
            self._last_bytes = len(body)
            self._last_points = points
            self.pushes_ok += 1
            if self._failing:
                log.info("OTLP push to %s recovered", self.endpoint)
                self._failing = False
            return True
        finally:
            self._push_lock.release()

    def _encode(self) -> tuple[bytes, int]:
        try:
            families = list(self._collect())
        except Exception as exc:
            raise _PushFailed("collect", f"collect() raised {type(exc).__name__}: {exc}") from exc
        try:
            req, stats = families_to_request(
                families, self.resource, now_s=self._clock(), start_time_s=self.start_time_s, units=self._units
            )
            body = req.SerializeToString()
        except Exception as exc:
            raise _PushFailed("encode", f"encoding failed: {type(exc).__name__}: {exc}") from exc
        for reason, n in stats.dropped.items():
            self.dropped_points[reason] = self.dropped_points.get(reason, 0) + n
        return body, stats.data_points

    def _post(self, body: bytes, timeout_s: float) -> None:
        headers = {
            **self.headers,
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"inferwatch-sidecar/{__version__}",
        }
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=timeout_s) as resp:
                payload = resp.read(_MAX_RESPONSE_BYTES)
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            try:
                detail = _printable(exc.read(_MAX_RESPONSE_BYTES) or b"")
            except Exception:  # the error body is only a hint for last_error
                detail = ""
            finally:
                exc.close()
            code = exc.code
            retry = _retry_after(exc.headers.get("Retry-After") if exc.headers else None, self._clock())
            reason = "http_429" if code == 429 else "http_5xx" if code >= 500 else "http_4xx"
            msg = f"HTTP {code} from {self.endpoint}" + (f": {detail}" if detail else "")
            raise _PushFailed(reason, msg, retry if code in (429, 502, 503, 504) else None) from None
        except urllib.error.URLError as exc:
            raise self._network_failure(exc.reason) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._network_failure(exc) from None
        self._check_partial_success(payload, ctype)

    def _network_failure(self, err: Any) -> _PushFailed:
        if isinstance(err, (socket.timeout, TimeoutError)):
            return _PushFailed("timeout", f"no answer from {self.endpoint} within {self.timeout_s:.3g} s")
        if isinstance(err, ssl.SSLError | ssl.CertificateError):
            return _PushFailed("tls", f"TLS error talking to {self.endpoint}: {err}")
        if isinstance(err, OSError):
            return _PushFailed("connect", f"cannot reach {self.endpoint}: {err}")
        return _PushFailed("other", f"{self.endpoint}: {err}")

    def _check_partial_success(self, payload: bytes, ctype: str) -> None:
        if not payload or "json" in ctype:
            return
        try:
            resp = ExportMetricsServiceResponse.FromString(payload)
        except Exception:  # an odd but successful answer is still a success
            return
        rejected = resp.partial_success.rejected_data_points
        if rejected or resp.partial_success.error_message:
            self.rejected_data_points += rejected
            self.last_error = f"receiver rejected {rejected} data points: {resp.partial_success.error_message}"
            self._log(logging.WARNING, "OTLP partial success: %s", self.last_error)

    def _count_failure(self, reason: str, message: str) -> None:
        if reason not in FAILURE_REASONS:
            reason = "other"
        self.pushes_failed += 1
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_error = message
        first = not self._failing
        self._failing = True
        self._log(logging.WARNING, "OTLP push failed (%s): %s", reason, message, force=first)

    def _log(self, level: int, fmt: str, *args: Any, force: bool = False) -> None:
        now = self._mono()
        if force or now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.log(level, fmt, *args)

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """JSON-able state for ``/v1/status`` (header values are never shown)."""
        age = None if self._last_success_mono is None else round(self._mono() - self._last_success_mono, 3)
        thread = self._thread
        return {
            "endpoint": self.endpoint,
            "running": thread is not None and thread.is_alive(),
            "interval_s": self.interval_s,
            "timeout_s": self.timeout_s,
            "compression": self.compression,
            "headers": sorted(self.headers),
            "resource": dict(self.resource),
            "pushes_ok": self.pushes_ok,
            "pushes_failed": self.pushes_failed,
            "failures": dict(self.failures),
            "skipped_retry_after": self.skipped_retry_after,
            "rejected_data_points": self.rejected_data_points,
            "dropped_points": dict(self.dropped_points),
            "last_error": self.last_error,
            "last_success_age_s": age,
            "last_push_bytes": self._last_bytes,
            "last_push_data_points": self._last_points,
            "last_push_duration_s": None if self._last_duration_s is None else round(self._last_duration_s, 4),
            "final_flush": self.final_flush,
        }

