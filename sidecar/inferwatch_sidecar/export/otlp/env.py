"""The OTLP exporter's OTEL_* environment variables (OTLP/HTTP), parsed strictly.

A bad endpoint, header list, timeout, compression or protocol raises
:class:`OtlpConfigError` at start-up with a message that names the variable
and says what to fix.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("inferwatch.sidecar.otlp")


class OtlpConfigError(ValueError):
    """The OTLP configuration (arguments or OTEL_* variables) is invalid."""


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


def check_url(url: str, what: str) -> str:
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
        check_url(signal, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        parts = urllib.parse.urlsplit(signal)
        return signal if parts.path else urllib.parse.urlunsplit(parts._replace(path="/"))
    base = _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if base is None:
        return None
    check_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT")
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


def settings_from_env(environ: Mapping[str, str], resource: Mapping[str, str]) -> dict[str, Any] | None:
    """The pusher's constructor keywords from the standard OTEL_* variables.

    Args:
        environ: the environment to read.
        resource: resource attributes from the sidecar's config; they
            override OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.

    Returns:
        ``endpoint``, ``resource`` and whichever of ``headers``,
        ``timeout_s``, ``interval_s``, ``compression`` and ``ssl_context``
        the environment sets; None when neither
        ``OTEL_EXPORTER_OTLP_ENDPOINT`` nor
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
    aggregation = _env(environ, "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION")
    if aggregation is not None:
        a = aggregation.lower()
        if a not in ("explicit_bucket_histogram", "base2_exponential_bucket_histogram"):
            raise OtlpConfigError(
                f"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION={aggregation!r}: expected "
                "explicit_bucket_histogram or base2_exponential_bucket_histogram"
            )
        kwargs["exponential_histograms"] = a == "base2_exponential_bucket_histogram"
    ctx = _ssl_context(environ)
    if ctx is not None:
        kwargs["ssl_context"] = ctx
    kwargs["resource"] = resource_from_env(environ, resource)
    return kwargs
