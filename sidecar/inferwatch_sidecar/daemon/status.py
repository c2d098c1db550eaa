"""The daemon's ``/v1/status`` document, its ingest rates and the URLs it serves.

``/v1/status`` needs no token, so credentials in the OTLP endpoint are taken out of it
(:func:`_without_credentials`); its ``summary`` (what is bad now, since when) comes from
``export/summary.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.aggregator import LatencyStatus
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.registry import verdict_readers
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.daemon.heap import HeapTrimmer
from inferwatch_sidecar.daemon.wiring import ComponentSlot
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.export.prerender import ScrapeRenderer
from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.export.summary import SinceTracker, verdicts
from inferwatch_sidecar.http.server import HttpServer
from inferwatch_sidecar.ingest.pipeline import Pipeline
from inferwatch_sidecar.ingest.sockets import IngestThread

log = logging.getLogger("inferwatch.sidecar")


def _without_credentials(fields: dict[str, Any], url: str) -> dict[str, Any]:
    """``fields`` with ``url``'s user info, query and fragment taken out of every string (/v1/status needs no token).

    The OTLP endpoint may carry a credential in them, and an error message may quote the URL.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    public = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    secret = [(url, public), (parts.netloc, netloc)]
    secret += [(sep + part, "") for sep, part in (("?", parts.query), ("#", parts.fragment)) if part]

    def clean(v: Any) -> Any:
        if not isinstance(v, str):
            return v
        for raw, shown in secret:
            v = v.replace(raw, shown)
        return v

    return {k: clean(v) for k, v in fields.items()}



class StatusReport:
    """The status half of :class:`~inferwatch_sidecar.daemon.lifecycle.Sidecar`."""

    # The daemon's state these methods use; :class:`~inferwatch_sidecar.daemon.lifecycle.Sidecar` sets it.
    cfg: SidecarConfig
    clock: Callable[[], float]
    started_at: float
    started_mono: float
    ready: bool
    ctx: ComponentContext
    latency: LatencyStatus
    pipeline: Pipeline
    traces: Any
    slots: list[ComponentSlot]
    ingest: IngestThread | None
    http: HttpServer | None
    otlp: Any
    otlp_state: str
    exposition: ExpositionBudget
    scrapes: ScrapeRenderer
    heap: HeapTrimmer
    _rates: deque[tuple[float, int, int, int]]
    _since: SinceTracker
    _since_lock: threading.Lock

    def status(self) -> dict[str, Any]:
        now = self.clock()
        totals = self.pipeline.totals()
        comps: dict[str, Any] = {}
        for s in self.slots:
            entry: dict[str, Any] = {"state": s.state}
            if s.reason:
                entry["reason"] = s.reason
            if s.component is not None and s.state == "running":
                try:
                    entry.update(s.component.status())
                except Exception as e:
                    self.pipeline.count_component_error(s.name, "status")
                    entry["status_error"] = f"{type(e).__name__}: {e}"
            comps[s.name] = entry
        otlp: dict[str, Any] = {"state": self.otlp_state}
        if self.otlp is not None:
            try:
                otlp.update(self.otlp.status())
            except Exception as e:
                otlp["status_error"] = str(e)
            if isinstance(otlp.get("endpoint"), str):
                otlp = _without_credentials(otlp, otlp["endpoint"])
        doc: dict[str, Any] = {
            "service": "inferwatch-sidecar",
            "version": __version__,
            "python": sys.version.split()[0],
            "pid": os.getpid(),
            "ready": self.ready,
            "uptime_s": round(time.monotonic() - self.started_mono, 3),
            "started_unix": round(self.started_at, 3),
            "listen": {
                "socket": self.cfg.ingest.socket or None,
                "udp": f"{self.cfg.ingest.udp_host}:{self.ingest.udp_port}" if self.ingest and self.ingest.udp_port else None,
                "http": f"{self.cfg.http.host}:{self.http.port}" if self.http else None,
                "rcvbuf_bytes": dict(self.ingest.rcvbuf_effective) if self.ingest else {},
            },
            "ingest": {**totals, "rates": self._rate_summary()},
            "latency": self.latency.status(),
            "producers": self.pipeline.producers_status(now, self.cfg.ingest.producer_timeout_s),
            "labels": {
                name: {"values": len(lim), "budget": lim.max_values, "overflowed": lim.overflowed}
                for name, lim in sorted(self.ctx.limiters.items())
            },
            "components": comps,
            "scrape": {"series_left_out": self.exposition.last_dropped,
                       "exposition_cuts": self.exposition.overflow.overflowed,
                       "ingest_paused_s": round(PRIORITY.paused_s, 3),
                       "priority_denied": PRIORITY.denied,
                       "fresh": self.scrapes.fresh, "ahead": self.scrapes.ahead,
                       "renders_ahead": self.scrapes.renders_ahead},
            "heap": self.heap.status(),
            "otlp": otlp,
            "traces": {"enabled": self.cfg.traces.enabled, **self.traces.status()},
        }
        # What is bad now, from every section above (the status page's and `inferwatch top`'s first lines).
        try:
            found = verdicts(doc, verdict_readers(), now)
            with self._since_lock:
                self._since.update(found, now)
            doc["summary"] = {"verdicts": found, "evaluated_unix": round(now, 3)}
        except Exception as e:  # a section of an unexpected shape must not cost the whole status
            log.exception("status summary failed")
            doc["summary"] = {"verdicts": [], "error": f"{type(e).__name__}: {e}"}
        return doc

    def _sample_rates(self) -> None:
        t = self.pipeline.totals()
        self._rates.append((time.monotonic(), t["frames"], t["events"], t["bytes"]))

    def _rate_summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if len(self._rates) < 2:
            return out
        last = self._rates[-1]
        for window in (10, 60):
            first = next((r for r in self._rates if last[0] - r[0] <= window), self._rates[0])
            dt = last[0] - first[0]
            if dt <= 0:
                continue
            out[f"frames_per_s_{window}s"] = round((last[1] - first[1]) / dt, 2)
            out[f"events_per_s_{window}s"] = round((last[2] - first[2]) / dt, 2)
            out[f"bytes_per_s_{window}s"] = round((last[3] - first[3]) / dt, 2)
        return out

    def _reported_state(self, s: ComponentSlot) -> str:
        """The state /v1/status shows for ``s``: a running component's own (``absent``, ``starting``), else the slot's."""
        if s.component is None or s.state != "running":
            return s.state
        try:
            state = s.component.status().get("state")
        except Exception:
            return s.state
        return state if isinstance(state, str) and state else s.state

    def urls(self) -> list[tuple[str, str]]:
        """What the started sidecar serves, as (what, URL), with the ports it really bound (0 picks one)."""
        assert self.http is not None and self.ingest is not None
        host = self.cfg.http.host
        base = f"http://{f'[{host}]' if ':' in host else host}:{self.http.port}"
        out = [("metrics", base + "/metrics"), ("status page", base + "/"), ("status JSON", base + "/v1/status")]
        if self.cfg.ingest.socket:
            out.append(("events", "unix://" + os.path.abspath(self.cfg.ingest.socket)))
        if self.ingest.udp_port:
            udp = self.cfg.ingest.udp_host
            out.append(("events", f"udp://{f'[{udp}]' if ':' in udp else udp}:{self.ingest.udp_port}"))
        out.append(("JSON events", base + "/v1/events"))
        if self.cfg.traces.enabled:
            out.append(("OTLP traces", base + "/v1/traces"))
        return out
