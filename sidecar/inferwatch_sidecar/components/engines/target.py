"""One engine endpoint: fetch with a timeout and a bounded body, parse, keep interval state.

Failures never raise: each is counted by reason (:data:`REASONS`) and shown in
``/v1/status`` with the last message.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.components.engines import kinds, promtext

#: Scrape results (the ``result`` label): ``ok`` and the failure reasons.
REASONS = ("ok", "refused", "timeout", "http_error", "too_large", "garbage", "unrecognised", "error")
FIX = {
    "refused": "nothing listens at the URL: is the engine up, and is the port its metrics port?",
    "timeout": "the engine did not answer within engines.timeout_s: it may be overloaded or hung",
    "http_error": "the engine answered with an HTTP error: check the path (vLLM and SGLang serve /metrics; "
    "Triton serves it on its metrics port, 8002 by default)",
    "too_large": "the body exceeded engines.max_body_bytes: raise it, or point at a smaller endpoint",
    "garbage": "the body is not Prometheus text exposition",
    "unrecognised": "no vLLM, SGLang, Triton or TensorRT-LLM series were found: set kind, or check the URL "
    "(SGLang needs --enable-metrics)",
    "error": "an unexpected error; see the message",
}


@dataclass
class Interval:
    """What changed between two scrapes of one model (rates and shares over the interval)."""

    dt: float
    preemptions: float = 0.0
    prefix_hit_ratio: float | None = None
    queue_share: float | None = None
    prefill_share: float | None = None


@dataclass
class ModelState:
    """The exported state of one engine model."""

    reading: kinds.ModelReading
    #: Preemptions counted by the sidecar (reset-safe: engine restarts add, never subtract).
    preemptions_total: float = 0.0
    prefix_hit_ratio: float | None = None
    last: Interval | None = None


def _delta(new: float | None, old: float | None) -> float | None:
    if new is None or old is None:
        return None
    return new - old if new >= old else new  # a counter reset starts again from 0


def fetch(url: str, timeout_s: float, max_bytes: int) -> tuple[str, str, str]:
    """GET ``url``; return (result, body, message). Never raises."""
    try:
        req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "inferwatch"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - URL comes from the config
            data = r.read(max_bytes + 1)
        if len(data) > max_bytes:
            return "too_large", "", f"body larger than {max_bytes} bytes"
        return "ok", data.decode("utf-8", errors="replace"), ""
    except urllib.error.HTTPError as e:
        return "http_error", "", f"HTTP {e.code} {e.reason}"
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            return "timeout", "", f"timed out after {timeout_s} s"
        if isinstance(e.reason, ConnectionRefusedError):
            return "refused", "", f"connection refused: {e.reason}"
        return "error", "", f"{type(e.reason).__name__}: {e.reason}"
    except TimeoutError:
        return "timeout", "", f"timed out after {timeout_s} s"
    except (ConnectionError, http.client.HTTPException, OSError, ValueError) as e:
        return "error", "", f"{type(e).__name__}: {e}"


@dataclass
class Target:
    """One configured engine endpoint.

    Args:
        url: the engine's metrics URL.
        name: the ``target`` label value (from the config, so bounded by it).
        kind: ``auto`` or one of :data:`kinds.KINDS`.
        max_models: engine models kept; more are counted as ``models_dropped``.
    """

    url: str
    name: str
    kind: str = "auto"
    timeout_s: float = 2.0
    max_body_bytes: int = 8 << 20
    max_models: int = 16
    fetch_fn: Callable[[str, float, int], tuple[str, str, str]] = fetch
    monotonic: Callable[[], float] = time.monotonic
    results: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    detected: str | None = None
    up: bool = False
    last_error: str = ""
    last_reason: str = ""
    last_ok: float | None = None
    scrape_seconds: float = 0.0
    bad_lines: int = 0
    models_dropped: int = 0
    series_seen: int = 0
    models: dict[tuple[str, str], ModelState] = field(default_factory=dict)
    cpu_cores: float | None = None
    host_cpu_ratio: float | None = None
    _prev: kinds.Reading | None = None
    _prev_t: float | None = None

    def scrape(self) -> str:
        """One scrape; returns its result reason. Never raises."""
        t0 = self.monotonic()
        try:
            result, body, msg = self.fetch_fn(self.url, self.timeout_s, self.max_body_bytes)
            if result == "ok":
                result, msg = self._ingest(body, t0)
        except Exception as e:  # noqa: BLE001 - a scrape must never take the sidecar down
            result, msg = "error", f"{type(e).__name__}: {e}"
        self.scrape_seconds = max(0.0, self.monotonic() - t0)
        self.results[result] = self.results.get(result, 0) + 1
        self.up = result == "ok"
        if result != "ok":
            self.last_error, self.last_reason = msg, result
        return result

    def _ingest(self, body: str, t: float) -> tuple[str, str]:
        parsed = promtext.parse(body, kinds.wanted)
        self.bad_lines += parsed.bad_lines
        self.series_seen = parsed.lines
        if parsed.lines == 0 or parsed.bad_lines > parsed.lines:
            return "garbage", f"no samples in the body (first bad line: {parsed.first_bad!r})" if parsed.first_bad \
                else "no samples in the body"
        kind = self.kind if self.kind != "auto" else kinds.detect(n for n, _, _ in parsed.series)
        if kind is None:
            return "unrecognised", f"{parsed.lines} series, none from a known engine"
        self.detected = kind
        reading = kinds.extract(kind, parsed.series)
        self._update(reading, t)
        self.last_ok = t
        return "ok", ""

    def _update(self, reading: kinds.Reading, t: float) -> None:
        prev, prev_t = self._prev, self._prev_t
        dt = None if prev_t is None else t - prev_t
        if dt is not None and dt > 0 and prev is not None:
            d = _delta(reading.cpu_seconds, prev.cpu_seconds)
            self.cpu_cores = None if d is None else d / dt
        self.host_cpu_ratio = reading.host_cpu_ratio
        for key, mr in reading.models.items():
            st = self.models.get(key)
            if st is None:
                if len(self.models) >= self.max_models:
                    self.models_dropped += 1
                    continue
                st = self.models[key] = ModelState(mr)
                # The first scrape sets the baseline; the engine's count so far is history, not this sidecar's.
                old = None
            else:
                old = st.reading
                st.reading = mr
            if old is None or dt is None or dt <= 0:
                if mr.prefix_hit_rate is not None:
                    st.prefix_hit_ratio = mr.prefix_hit_rate
                continue
            iv = Interval(dt)
            p = _delta(mr.preemptions, old.preemptions)
            if p is not None:
                iv.preemptions = p
                st.preemptions_total += p
            dh, dq = _delta(mr.prefix_hits, old.prefix_hits), _delta(mr.prefix_queries, old.prefix_queries)
            if dh is not None and dq:
                iv.prefix_hit_ratio = min(1.0, max(0.0, dh / dq))
            elif mr.prefix_hit_rate is not None:
                iv.prefix_hit_ratio = mr.prefix_hit_rate
            if iv.prefix_hit_ratio is not None:
                st.prefix_hit_ratio = iv.prefix_hit_ratio
            dqs, de = _delta(mr.queue_s, old.queue_s), _delta(mr.e2e_s, old.e2e_s)
            if dqs is not None and de:
                iv.queue_share = min(1.0, max(0.0, dqs / de))
            dp, dd = _delta(mr.prefill_s, old.prefill_s), _delta(mr.decode_s, old.decode_s)
            if dp is not None and dd is not None and dp + dd > 0:
                iv.prefill_share = dp / (dp + dd)
            st.last = iv
        self._prev, self._prev_t = reading, t

    def status(self) -> dict[str, Any]:
        parts = urllib.parse.urlsplit(self.url)
        out: dict[str, Any] = {
            "url": urllib.parse.urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
            if parts.port is None else urllib.parse.urlunsplit(
                (parts.scheme, f"{parts.hostname}:{parts.port}", parts.path, "", "")),
            "kind": self.kind if self.kind != "auto" else (self.detected or "unknown"),
            "up": self.up,
            "scrapes": {k: v for k, v in self.results.items() if v},
            "models": [m or "(unlabelled)" for m, _ in self.models],
        }
        if self.bad_lines:
            out["bad_lines"] = self.bad_lines
        if self.models_dropped:
            out["models_dropped"] = self.models_dropped
        if not self.up and self.last_reason:
            out["error"] = {"reason": self.last_reason, "message": self.last_error,
                            "fix": FIX.get(self.last_reason, FIX["error"])}
        return out
