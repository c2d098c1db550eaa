"""The sidecar daemon's lifecycle, run the way uvicorn runs its server.

One validated :class:`~inferwatch_sidecar.config.SidecarConfig`; then
``startup`` (bind sockets, build and start components, start HTTP, start
the OTLP pusher), a main loop that ticks until an exit flag is set, and
``shutdown`` with a time limit:

1. stop ingest (no new frames) and remove the socket file;
2. flush exporters: the OTLP pusher's final push sees every counted event;
3. stop the components;
4. stop HTTP.

SIGTERM and SIGINT set the exit flag. A second one sets ``force_exit``: the
steps not yet begun get no time, :meth:`Sidecar.run` stops waiting for the
one in progress and returns ``128 + signal``. The original signal handlers are
restored when :meth:`Sidecar.run` returns.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.process_collector import ProcessCollector

from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.aggregator import METRICS as AGGREGATOR_METRICS
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus
from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.base import (
    Component,
    ComponentContext,
    Connects,
    Peers,
    ServesAdmin,
    TakesOffline,
)
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.export.http_server import HttpServer, refused_family
from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.export.routes import AdminHandler, Endpoints, Route, scrape_registry, sidecar_routes
from inferwatch_sidecar.export.summary import SinceTracker, verdicts
from inferwatch_sidecar.ingest import otlp_traces
from inferwatch_sidecar.ingest.http_json import JsonDecoder, JsonIngest
from inferwatch_sidecar.ingest.pipeline import EVENT_TYPES, Pipeline
from inferwatch_sidecar.ingest.pipeline import METRICS as PIPELINE_METRICS
from inferwatch_sidecar.ingest.sockets import IngestThread, check_socket_path, resolve_udp
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import COMPONENT_UP, HTTP_REFUSED_TOTAL, PROCESS_METRICS

log = logging.getLogger("inferwatch.sidecar")

#: Signals that start a graceful shutdown (a second one forces it).
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How often the main thread checks on a shutdown in progress (and handles signals).
_SHUTDOWN_POLL_S = 0.05
#: After a forced exit, how long the remaining steps (given no time of their own) may still take.
_FORCED_GRACE_S = 0.5
#: How often the main loop reads the status for the summary's since-when (verdicts first seen bad).
_SUMMARY_EVERY_S = 5.0

#: Components the daemon knows, in start order: config section name -> module (from the registry).
COMPONENTS = tuple((s.name, s.module) for s in registry.REGISTRY)


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


class StartupError(Exception):
    """Start-up failed; the message says what to fix."""


class ComponentSlot:
    """A component and its state: disabled, unavailable, running, failed or stopped."""

    def __init__(self, name: str, state: str, component: Component | None = None, reason: str = "") -> None:
        self.name = name
        self.state = state
        self.component = component
        self.reason = reason

#: What the core collector exports: the aggregator's, the pipeline's and the component states.
CORE_METRICS = (*AGGREGATOR_METRICS, *PIPELINE_METRICS, COMPONENT_UP, HTTP_REFUSED_TOTAL, *otlp_traces.METRICS)
#: The catalog entries of every component the daemon knows (running or not: the names stay reserved).
COMPONENT_METRICS = registry.component_metrics()


class Sidecar:
    """The daemon. Build it with a validated config, then :meth:`run` (or startup/shutdown in tests).

    Args:
        cfg: the validated configuration.
        environ: environment for the OTLP exporter's settings.
        clock: wall-clock seconds (injectable for tests).
    """

    def __init__(
        self,
        cfg: SidecarConfig,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.started_at = clock()
        self.started_mono = time.monotonic()
        self.should_exit = threading.Event()
        self.force_exit = False
        self._force_signal = 0
        self.ready = False
        self.ctx = ComponentContext(default_label_budget=cfg.labels.default_max_values,
                                    baselines=dict(cfg.canary.baselines))
        for label, budget in cfg.labels.max_values.items():
            self.ctx.limiters[label] = LabelLimiter(label, budget, cfg.labels.max_length)
        self.aggregator = Aggregator(self.ctx, frozenset(cfg.ingest.queue_stages), cfg.labels.max_label_sets,
                                     cfg.aggregate.buckets.families, cfg.aggregate.buckets.stages,
                                     cfg.aggregate.native.bucket_schema, cfg.aggregate.native.classic_families,
                                     max_series=cfg.labels.max_series)
        for problem in self.aggregator.alert_bound_problems():
            log.warning("%s", problem)
        self.latency = LatencyStatus(self.aggregator)
        self.pipeline = Pipeline(
            self.aggregator, max_producers=cfg.ingest.max_producers, max_schemas=cfg.ingest.max_schemas,
            max_schema_bytes=cfg.ingest.max_schema_bytes, max_event_rate=cfg.ingest.max_producer_event_rate,
            max_frame_rate=cfg.ingest.max_producer_frame_rate, clock=clock,
        )
        self.json_ingest = JsonIngest(self.pipeline, JsonDecoder(cfg.ingest.max_json_events))
        # Built even when traces.enabled is false (no route then), so its counters export at zero.
        self.traces = otlp_traces.build(cfg.traces, self.pipeline)
        self.slots: list[ComponentSlot] = []
        self.ingest: IngestThread | None = None
        self.http: HttpServer | None = None
        self.otlp: Any = None
        self.otlp_state = "disabled"
        self._rates: deque[tuple[float, int, int, int]] = deque(maxlen=130)
        self._since = SinceTracker()
        self._since_lock = threading.Lock()
        self._summary_at = 0.0
        self.registry = CollectorRegistry()
        # Every collector describes its catalog entries, so the registry refuses a name exported twice.
        self.registry.register(families.CatalogCollector(self._collect_core, CORE_METRICS))
        self.registry.register(families.CatalogCollector(self._collect_components, COMPONENT_METRICS))
        process = ProcessCollector(namespace="inferwatch_sidecar", registry=None)
        self.registry.register(families.CatalogCollector(process.collect, PROCESS_METRICS))
        #: What /metrics renders: the registry within the whole-exposition series budget (export/budget.py).
        self.exposition = ExpositionBudget(self.registry, cfg.labels.max_exposition_series,
                                           cfg.labels.max_family_series)

    # -- collection ------------------------------------------------------------

    def _collect_core(self) -> Iterator[PromMetric]:
        yield from self.aggregator.collect()
        limiters = {**self.ctx.limiters, "label_set": self.aggregator.label_set_overflow,
                    "series": self.aggregator.series_overflow, "exposition": self.exposition.overflow}
        yield from self.pipeline.collect(self.clock(), self.cfg.ingest.producer_timeout_s, limiters)
        yield refused_family(None if self.http is None else self.http.refusals)
        yield from self.traces.collect()
        g = families.gauge(COMPONENT_UP)
        for s in self.slots:
            g.add_metric([s.name], 1.0 if s.state == "running" else 0.0)
        yield g

    def _collect_components(self) -> Iterator[PromMetric]:
        for s in self.slots:
            if s.component is None or s.state != "running":
                continue
            try:
                fams = list(s.component.collect())
            except Exception:
                self.pipeline.count_component_error(s.name, "collect")
                continue
            yield from fams

    def collect(self) -> Iterable[PromMetric]:
        """Everything /metrics shows, as metric families (what the OTLP pusher converts)."""
        return list(self.registry.collect())

    # -- components ------------------------------------------------------------

    def _build_components(self) -> None:
        for spec in registry.REGISTRY:
            name, module = spec.name, spec.module
            section = self.cfg.component(name)
            if not getattr(section, "enabled", True):
                self.slots.append(ComponentSlot(name, "disabled"))
                continue
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name == module:
                    self.slots.append(ComponentSlot(name, "unavailable", reason=f"{module} is not installed in this build"))
                    continue
                raise StartupError(f"{name}: cannot import {module}: {e}") from None
            try:
                comp = mod.build(section, self.ctx)
            except Exception as e:
                # A bad reference file or device setting must stop start-up with its message.
                raise StartupError(f"{name}: {e}") from e
            if comp is None:
                self.slots.append(ComponentSlot(name, "unavailable", reason="build() returned None"))
                continue
            self.slots.append(ComponentSlot(name, "built", comp))
            self.pipeline.register_component(name)
            types = frozenset(comp.record_types)
            if types:
                self.pipeline.dispatch.append((name, types, comp.handle))
        # A component that reads another's results (the canary judge reads the drift estimates) gets the others.
        peers = Peers({s.name: s.component for s in self.slots if s.component is not None})
        for s in self.slots:
            if isinstance(s.component, Connects):
                s.component.connect(peers)

    def admin_route(self, component: str, path: str) -> AdminHandler | None:
        """The running component's admin handler for ``path``, or None; what it raises is counted, then re-raised."""
        for s in self.slots:
            if s.name == component and s.component is not None and s.state == "running":
                if not isinstance(s.component, ServesAdmin):
                    return None
                try:
                    routes = s.component.admin_routes() or {}
                except Exception:
                    self.pipeline.count_component_error(s.name, "admin_routes")
                    return None
                handler = routes.get(path) or routes.get("/" + path)
                return None if handler is None else functools.partial(self._call_admin, s.name, handler)
        return None

    def _call_admin(self, name: str, handler: AdminHandler, query: dict[str, str]) -> tuple[int, str, bytes]:
        try:
            return handler(query)
        except Exception:
            self.pipeline.count_component_error(name, "admin")
            raise

    def admin_routes_index(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for s in self.slots:
            if isinstance(s.component, ServesAdmin) and s.state == "running":
                try:
                    out[s.name] = sorted(s.component.admin_routes() or {})
                except Exception:
                    self.pipeline.count_component_error(s.name, "admin_routes")
        return out

    # -- status ----------------------------------------------------------------

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
                       "ingest_paused_s": round(PRIORITY.paused_s, 3)},
            "otlp": otlp,
            "traces": {"enabled": self.cfg.traces.enabled, **self.traces.status()},
        }
        # What is bad now, from every section above (the status page's and `inferwatch top`'s first lines).
        try:
            found = verdicts(doc)
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

    # -- lifecycle -------------------------------------------------------------

    def check(self) -> None:
        """Check everything :meth:`startup` checks, binding no socket and starting no thread.

        Builds the components (reference profiles, GPU settings), checks the
        socket's directory, resolves the UDP address and reads the OTLP
        settings. ``--check-config`` runs this.

        Raises:
            StartupError, IngestError: what is wrong and how to fix it.
        """
        cfg = self.cfg
        self._build_components()
        if cfg.ingest.socket:
            check_socket_path(cfg.ingest.socket, cfg.ingest.socket_dir_shared, create=False)
        if cfg.ingest.udp_port is not None:
            resolve_udp(cfg.ingest.udp_host, cfg.ingest.udp_port)
        self._build_otlp()

    def startup(self) -> None:
        """Bind, build and start everything. Raises StartupError or IngestError with a clear message."""
        cfg = self.cfg
        # The ingest thread must get the GIL back quickly from a scrape thread when datagrams arrive (the
        # kernel queue of a Unix datagram socket holds only net.unix.max_dgram_qlen frames); 5 ms is too long.
        sys.setswitchinterval(0.0005)
        self._build_components()
        udp = (cfg.ingest.udp_host, cfg.ingest.udp_port) if cfg.ingest.udp_port is not None else None
        self.ingest = IngestThread(
            self.pipeline, cfg.ingest.socket or None, cfg.ingest.socket_mode, udp, cfg.ingest.rcvbuf_bytes,
            unix_dir_shared=cfg.ingest.socket_dir_shared,
        )
        self.ingest.open()
        try:
            self.http = HttpServer(self._routes(), cfg.http)
        except OSError as e:
            self.ingest.close()
            raise StartupError(f"http.port: cannot listen on {cfg.http.host}:{cfg.http.port}: {e.strerror}") from None
        except BaseException:
            self.ingest.close()
            raise
        for s in self.slots:
            if s.component is None:
                continue
            try:
                s.component.start()
                s.state = "running"
            except Exception as e:
                s.state = "failed"
                s.reason = f"start() raised {type(e).__name__}: {e}"
                log.exception("component %s failed to start; the sidecar keeps running without it", s.name)
        self.ingest.start()
        self.http.start()
        self._start_otlp()
        self._sample_rates()
        self.ready = True
        log.info(
            "inferwatch sidecar %s ready: %s; components %s", __version__,
            ", ".join(f"{what} {url}" for what, url in self.urls()),
            ",".join(f"{s.name}:{self._reported_state(s)}" for s in self.slots) or "-",
        )

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

    def _scrape(self, accept: str) -> tuple[bytes, str]:
        """``/metrics``: rendered while the ingest and worker loops step aside (export/priority.py)."""
        with PRIORITY:
            return scrape_registry(self.exposition, accept, protobuf=self.cfg.aggregate.native.protobuf)  # type: ignore[arg-type]

    def _routes(self) -> dict[str, Route]:
        """The HTTP route table, wired to this daemon through narrow callables only."""
        token = self.cfg.http.admin_token
        return sidecar_routes(
            Endpoints(
                scrape=self._scrape,
                ready=lambda: self.ready,
                status=self.status,
                ingest_json=self.json_ingest.post,
                reject_body=self.json_ingest.reject_body,
                admin_route=self.admin_route,
                admin_index=self.admin_routes_index,
                admin_token=None if token is None else token.get_secret_value(),
                max_body_bytes=self.cfg.ingest.max_json_body_bytes,
                ingest_traces=self.traces.handle if self.cfg.traces.enabled else None,
                traces_max_body_bytes=self.cfg.traces.max_body_bytes,
                ingest_skew=self._post_skew,
            )
        )

    def _post_skew(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /v1/skew``: offline values for the skew component's live join (docs/skew.md)."""
        for s in self.slots:
            if isinstance(s.component, TakesOffline):
                status, answer = s.component.post_offline(body)
                return int(status), dict(answer)
        return 404, {"error": "the skew component is not running: set skew.enabled: true in the sidecar config"}

    def _resource(self) -> dict[str, str]:
        res = {
            "inferwatch.sidecar.version": __version__,
            "host.name": socket.gethostname(),
            "process.pid": str(os.getpid()),
        }
        # The pusher applies OTEL_RESOURCE_ATTRIBUTES < OTEL_SERVICE_NAME < this
        # mapping, so only default service.name when the environment sets none.
        env_attrs = self.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        if not self.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in env_attrs:
            res["service.name"] = "inferwatch-sidecar"
        res.update(self.cfg.resource)
        return res

    def _build_otlp(self) -> Any:
        """The OTLP pusher the environment asks for, not started, or None (``otlp_state`` says why)."""
        try:
            otlp_mod = importlib.import_module("inferwatch_sidecar.export.otlp")
        except ModuleNotFoundError as e:
            if e.name == "inferwatch_sidecar.export.otlp":
                self.otlp_state = "unavailable"
                return None
            raise
        try:
            pusher = otlp_mod.OtlpMetricsPusher.from_env(
                self.collect, self._resource(), environ=self.environ, start_time_s=self.started_at
            )
        except Exception as e:
            raise StartupError(f"OTLP exporter: {e}") from e
        if pusher is None:
            self.otlp_state = "disabled"
        return pusher

    def _start_otlp(self) -> None:
        pusher = self._build_otlp()
        if pusher is None:
            return
        pusher.start()
        self.otlp = pusher
        self.otlp_state = "running"

    def tick(self) -> None:
        """Periodic housekeeping from the main loop."""
        self._sample_rates()
        self.latency.sample()
        self.traces.expire()
        mono = time.monotonic()
        if mono - self._summary_at >= _SUMMARY_EVERY_S:
            self._summary_at = mono
            self.status()  # notes when each verdict turned bad, even while nobody reads the status
        if self.ingest is not None and not self.ingest.is_alive() and not self.should_exit.is_set():
            log.error("the ingest thread stopped unexpectedly; shutting down so the supervisor restarts us")
            self.should_exit.set()

    def main_loop(self, tick_s: float = 0.5) -> None:
        while not self.should_exit.wait(tick_s):
            self.tick()

    def shutdown(self) -> bool:
        """Graceful shutdown within ``shutdown_timeout_s``. Returns True when every step finished in time."""
        self.ready = False
        deadline = time.monotonic() + self.cfg.shutdown_timeout_s
        ok = True

        def left() -> float:
            # After a second signal the steps still to come get no time: nothing waits for a flush any more.
            return 0.0 if self.force_exit else max(0.05, deadline - time.monotonic())

        log.info("shutting down (limit %.1f s)", self.cfg.shutdown_timeout_s)
        if self.ingest is not None:
            self.ingest.stop(left())
            self.traces.flush()
            # One line with the final counts: what this instance accepted, for operators and tests.
            t = self.pipeline.totals()
            by_type = {
                name: sum(c[code] for c in self.pipeline.counts.values()) for code, name in EVENT_TYPES.items()
            }
            log.info("final ingest totals: %s", json.dumps({**t, "events_by_type": by_type}, sort_keys=True))
        if self.otlp is not None:
            try:
                self.otlp.stop(left())
                self.otlp_state = "stopped"
            except Exception:
                ok = False
                log.exception("OTLP final flush failed")
        for s in reversed(self.slots):
            if s.component is not None and s.state == "running":
                try:
                    s.component.stop(left())
                    s.state = "stopped"
                except Exception:
                    ok = False
                    log.exception("component %s failed to stop", s.name)
        if self.http is not None:
            self.http.stop(left())
        if time.monotonic() > deadline:
            log.warning("shutdown took longer than shutdown_timeout_s=%.1f", self.cfg.shutdown_timeout_s)
            ok = False
        log.info("stopped")
        return ok

    @contextlib.contextmanager
    def install_signal_handlers(self) -> Iterator[None]:
        """Handle SIGINT and SIGTERM with :meth:`handle_exit` inside the block; restore the original handlers after.

        Signals reach only the main thread, so elsewhere (a test's helper
        thread) this installs nothing.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first signal asks for a graceful shutdown; a second one sets ``force_exit`` to shorten it."""
        if self.should_exit.is_set():
            if not self.force_exit:
                log.warning("second %s: skipping the rest of the graceful shutdown", signal.Signals(sig).name)
                self._force_signal = sig
                self.force_exit = True
            return
        self.should_exit.set()

    def run(self) -> int:
        """Start, serve until signalled, shut down.

        Returns:
            The exit status: 0 after a complete graceful shutdown, 1 when a
            step failed or overran, ``128 + signal`` when a second signal
            forced the exit.
        """
        with self.install_signal_handlers():
            self.startup()
            try:
                self.main_loop()
            finally:
                ok = self._shutdown_from_main_thread()
        if self.force_exit:
            return 128 + self._force_signal
        return 0 if ok else 1

    def _shutdown_from_main_thread(self) -> bool:
        """Run :meth:`shutdown` on a helper thread while this one keeps handling signals.

        Waiting here in short steps is what lets a second signal cut a slow
        step short, and what enforces the time limit even if a component's
        ``stop()`` hangs.
        """
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["ok"] = self.shutdown()
            except BaseException as e:  # re-raised below, in the caller's thread
                outcome["error"] = e

        worker = threading.Thread(target=target, name="inferwatch-shutdown", daemon=True)
        limit = time.monotonic() + self.cfg.shutdown_timeout_s + 1.0
        worker.start()
        while worker.is_alive():
            if self.force_exit:
                worker.join(_FORCED_GRACE_S)
                break
            if time.monotonic() > limit:
                self._shutdown_overrun()
            worker.join(_SHUTDOWN_POLL_S)
        if "error" in outcome:
            raise outcome["error"]
        return bool(outcome.get("ok", False))

    def _shutdown_overrun(self) -> None:
        log.error("graceful shutdown exceeded shutdown_timeout_s=%.1f; exiting now", self.cfg.shutdown_timeout_s)
        logging.shutdown()
        os._exit(1)
