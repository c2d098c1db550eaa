"""The daemon's wiring: what it builds from the config and how the parts reach each other.

- the components, in the registry's order (``components/registry.py``), their record types registered with
  the pipeline and their declared hooks connected (``connect``, ``admin_routes``, ``post_offline``): checked
  with ``isinstance`` against the protocols of ``components/base.py``;
- the collectors behind ``/metrics`` (core, components; every one describes its catalog entries, so a name
  exported twice is refused);
- the HTTP route table, wired to the daemon through narrow callables only;
- the OTLP pusher the environment asks for.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.aggregator import METRICS as AGGREGATOR_METRICS
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.base import (
    Component,
    ComponentContext,
    Connects,
    Peers,
    ServesAdmin,
    TakesOffline,
)
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.export.prerender import ScrapeRenderer
from inferwatch_sidecar.export.priority import PRIORITY, ScrapePriority
from inferwatch_sidecar.export.render import negotiate
from inferwatch_sidecar.http.routes import AdminHandler, Endpoints, Route, sidecar_routes
from inferwatch_sidecar.http.server import HttpServer, refused_family
from inferwatch_sidecar.ingest import otlp_traces
from inferwatch_sidecar.ingest.http_json import JsonIngest
from inferwatch_sidecar.ingest.pipeline import METRICS as PIPELINE_METRICS
from inferwatch_sidecar.ingest.pipeline import Pipeline
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import COMPONENT_UP, HTTP_REFUSED_TOTAL

log = logging.getLogger("inferwatch.sidecar")

#: Components the daemon knows, in start order: config section name -> module (from the registry).
COMPONENTS = tuple((s.name, s.module) for s in registry.REGISTRY)


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



class Wiring:
    """The building and wiring half of :class:`~inferwatch_sidecar.daemon.lifecycle.Sidecar`."""

    # The daemon's state these methods use; :class:`~inferwatch_sidecar.daemon.lifecycle.Sidecar` sets it.
    cfg: SidecarConfig
    environ: dict[str, str]
    clock: Callable[[], float]
    started_at: float
    ready: bool
    ctx: ComponentContext
    aggregator: Aggregator
    pipeline: Pipeline
    json_ingest: JsonIngest
    traces: Any
    slots: list[ComponentSlot]
    http: HttpServer | None
    otlp: Any
    otlp_state: str
    exposition: ExpositionBudget
    #: renders ``/metrics`` on its own thread (export/prerender.py)
    scrapes: ScrapeRenderer
    registry: CollectorRegistry
    #: ``/v1/status`` (:class:`~inferwatch_sidecar.daemon.status.StatusReport` provides it).
    status: Callable[[], dict[str, Any]]

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

    def _build_components(self) -> None:
        for spec in registry.REGISTRY:
            name, module = spec.name, spec.module
            section = registry.section(self.cfg, name)
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
            # What the component imports only when it first computes (scipy: 26-72 MiB an idle sidecar need not
            # hold) must be installed all the same: found, not imported, so start-up still names what is missing.
            for dep in getattr(mod, "LAZY_IMPORTS", ()):
                if importlib.util.find_spec(dep) is None:
                    raise StartupError(f"{name}: cannot import {module}: No module named {dep!r} "
                                       '(pip install "inferwatch[sidecar]")')
            try:
                comp = mod.build(section, self.ctx)
            except Exception as e:
                # A bad reference file or device setting must stop start-up with its message.
                raise StartupError(f"{name}: {e}") from e
            if comp is None:
                self.slots.append(ComponentSlot(name, "unavailable", reason="build() returned None"))
                continue
            self.slots.append(ComponentSlot(name, "built", comp))
            self.pipeline.subscribe(name, frozenset(comp.record_types), comp.handle,
                                    sized=isinstance(comp, StagedComponent))
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

    def _scrape(self, accept: str) -> tuple[bytes, str]:
        """``/metrics``: a render made on the render thread (export/prerender.py)."""
        return self.scrapes.scrape(accept)

    def _scrape_gzip(self, accept: str) -> tuple[bytes, str]:
        """``/metrics`` for a scraper that takes gzip: the render gzipped on the render thread (export/prerender.py)."""
        return self.scrapes.scrape(accept, gzip=True)

    def _render_scrape(self, accept: str) -> tuple[bytes, str]:
        """One ``/metrics`` render (the renderer makes ingest step aside while a scrape waits for it)."""
        return self.exposition.render(accept, protobuf=self.cfg.aggregate.native.protobuf)

    @staticmethod
    def _scrape_priority() -> ScrapePriority:
        """Entered around a render a scrape waits for: the ingest and worker loops step aside (export/priority.py)."""
        return PRIORITY

    def _scrape_format(self, accept: str) -> str:
        return negotiate(accept, self.cfg.aggregate.native.protobuf)[0]

    def _ingested_bytes(self) -> int:
        """Bytes taken in by every transport so far, plus the times an ingest loop holding events stepped aside
        for a scrape: changes while events arrive (export/prerender.py), even while a scrape holds them back."""
        return sum(list(self.pipeline.bytes.values())) + PRIORITY.ingest_waits

    def _routes(self) -> dict[str, Route]:
        """The HTTP route table, wired to this daemon through narrow callables only."""
        token = self.cfg.http.admin_token
        return sidecar_routes(
            Endpoints(
                scrape=self._scrape,
                scrape_gzip=self._scrape_gzip,
                scrape_priority=PRIORITY.request,
                scrape_ready=self.scrapes.ready,
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
                self.collect, self._resource(), environ=self.environ, start_time_s=self.started_at,
                units=registry.CATALOG.units(),
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
