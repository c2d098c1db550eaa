"""The background thread that POSTs the sidecar's metrics to an OTLP/HTTP receiver.

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

import base64
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
from email.utils import parsedate_to_datetime
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from inferwatch_sidecar import __version__
from inferwatch_sidecar.export.otlp.convert import families_to_request
from inferwatch_sidecar.export.otlp.env import OtlpConfigError, check_url, settings_from_env
from inferwatch_sidecar.metrics import catalog

log = logging.getLogger("inferwatch.sidecar.otlp")

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


#: A credential in free text: an Authorization-like header or parameter and its value, or a bearer/basic token.
_CREDENTIAL = re.compile(
    r"((?:authorization|proxy-authorization|x-api-key|api[-_]?key|token|password|secret)[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?:bearer|basic)\s+)?|(?:bearer|basic)\s+)[^\s,;\"'&]+",
    re.IGNORECASE)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic Authorization value it carried (or None).

    urllib cannot send a URL's userinfo (``http.client`` reads ``user:pw@host`` as a host with a bad
    port), so an endpoint written that way never pushed; the credentials become a header instead.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    user = urllib.parse.unquote(parts.username or "")
    pw = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{pw}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


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
            (default: the core catalog entries', ``ProcessCollector``'s among them; the daemon passes the
            whole catalog's).
        exponential_histograms: send native-histogram families as OTLP base-2 exponential histograms
            (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``).
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
        exponential_histograms: bool = False,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        endpoint, basic = split_userinfo(check_url(endpoint, "endpoint"))
        #: The URL pushed to, without any user:password@ (that becomes the Authorization header).
        self.endpoint = endpoint
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise OtlpConfigError(f"interval_s={interval_s!r}: must be a positive number of seconds")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise OtlpConfigError(f"timeout_s={timeout_s!r}: must be a positive number of seconds")
        compression = compression.strip().lower()
        if compression not in ("gzip", "none"):
            raise OtlpConfigError(f"compression={compression!r}: must be 'gzip' or 'none'")
        self._collect = collect
        self.headers = {str(k).strip(): str(v) for k, v in (headers or {}).items()}
        if basic is not None and not any(k.lower() == "authorization" for k in self.headers):
            self.headers["Authorization"] = basic
        #: Strings never shown in last_error, the log or /v1/status: every header value (they hold secrets).
        self._secrets = sorted({v for v in self.headers.values() if len(v) >= 4}, key=len, reverse=True)
        self.resource = dict(resource)
        self.resource.setdefault("service.name", "unknown_service")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.compression = compression
        self._clock = clock
        self._mono = monotonic
        self.start_time_s = clock() if start_time_s is None else float(start_time_s)
        self._units = dict(units) if units is not None else catalog.core_units()
        #: Native-histogram families go as base-2 exponential histograms (the OTel env var above).
        self.exponential_histograms = exponential_histograms
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
        """Build a pusher from the standard OTEL_* variables (see :func:`settings_from_env`).

        Args:
            collect: see the class.
            resource: resource attributes from the sidecar's config; they
                override OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.
            environ: the environment to read.
            **overrides: constructor keywords that win over the environment
                (e.g. ``interval_s`` from the config file, ``start_time_s``).

        Returns:
            None when the environment configures no OTLP metrics export.

        Raises:
            OtlpConfigError: a variable is set to something unusable.
        """
        settings = settings_from_env(environ, resource)
        if settings is None:
            return None
        return cls(collect, **{**settings, **overrides})

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
                families, self.resource, now_s=self._clock(), start_time_s=self.start_time_s, units=self._units,
                exponential=self.exponential_histograms,
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
            self.last_error = self.redact(
                f"receiver rejected {rejected} data points: {resp.partial_success.error_message}")
            self._log(logging.WARNING, "OTLP partial success: %s", self.last_error)

    def redact(self, text: str) -> str:
        """``text`` without the configured header values or anything shaped like a credential.

        A receiver's error body may echo the request's headers (some gateways do), and
        ``/v1/status`` is not authenticated.
        """
        for v in self._secrets:
            text = text.replace(v, "<redacted>")
        return _CREDENTIAL.sub(lambda m: m.group(1) + "<redacted>", text)

    def _count_failure(self, reason: str, message: str) -> None:
        if reason not in FAILURE_REASONS:
            reason = "other"
        self.pushes_failed += 1
        self.failures[reason] = self.failures.get(reason, 0) + 1
        message = self.redact(message)
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
