"""The sidecar daemon's lifecycle, run the way uvicorn runs its server.

The wiring (components, collectors, routes, OTLP) is :mod:`.wiring`, the status document :mod:`.status`.

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
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus
from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.daemon.heap import HeapTrimmer, cap_arenas, tuned_gc
from inferwatch_sidecar.daemon.status import StatusReport
from inferwatch_sidecar.daemon.wiring import COMPONENT_METRICS, CORE_METRICS, ComponentSlot, StartupError, Wiring
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.export.prerender import ScrapeRenderer
from inferwatch_sidecar.export.priority import PRIORITY
from inferwatch_sidecar.export.summary import SinceTracker
from inferwatch_sidecar.http.server import HttpServer
from inferwatch_sidecar.ingest import otlp_traces
from inferwatch_sidecar.ingest.http_json import JsonDecoder, JsonIngest
from inferwatch_sidecar.ingest.pipeline import EVENT_TYPES, Pipeline
from inferwatch_sidecar.ingest.sockets import IngestThread, check_socket_path, resolve_udp
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import PROCESS_METRICS

log = logging.getLogger("inferwatch.sidecar")

#: Signals that start a graceful shutdown (a second one forces it).
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How often the main thread checks on a shutdown in progress (and handles signals).
_SHUTDOWN_POLL_S = 0.05
#: After a forced exit, how long the remaining steps (given no time of their own) may still take.
_FORCED_GRACE_S = 0.5
#: How often the main loop reads the status for the summary's since-when (verdicts first seen bad).
_SUMMARY_EVERY_S = 5.0


class Sidecar(Wiring, StatusReport):
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
                                    baselines=dict(registry.config_of(cfg, CanaryConfig).baselines),
                                    max_family_series=cfg.labels.max_family_series)
        for label, budget in cfg.labels.max_values.items():
            self.ctx.limiters[label] = LabelLimiter(label, budget, cfg.labels.max_length)
        self.aggregator = Aggregator(self.ctx, frozenset(cfg.ingest.queue_stages), cfg.labels.max_label_sets,
                                     cfg.aggregate.buckets.families, cfg.aggregate.buckets.stages,
                                     cfg.aggregate.native.bucket_schema, cfg.aggregate.native.classic_families,
                                     max_series=cfg.labels.max_series, max_family_series=cfg.labels.max_family_series)
        for problem in self.aggregator.alert_bound_problems():
            log.warning("%s", problem)
        self.latency = LatencyStatus(self.aggregator)
        try:
            self.pipeline = Pipeline(
                self.aggregator, max_producers=cfg.ingest.max_producers, max_schemas=cfg.ingest.max_schemas,
                max_schema_bytes=cfg.ingest.max_schema_bytes, max_event_rate=cfg.ingest.max_producer_event_rate,
                max_frame_rate=cfg.ingest.max_producer_frame_rate, clock=clock,
                max_string_chars=cfg.ingest.max_string_chars,
            )
        except ValueError as e:  # INFERWATCH_WIRE_DECODER names no loop
            raise StartupError(str(e)) from None
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
        self.heap = HeapTrimmer(cfg.heap_trim_free_bytes, cfg.heap_trim_interval_s)
        self.scrapes = ScrapeRenderer(self._render_scrape, self._scrape_format, self._ingested_bytes,
                                      cfg.http.metrics_wait_s, cfg.http.metrics_max_age_s,
                                      urgent=self._scrape_priority, held=lambda: PRIORITY.ingest_held > 0)

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
        cap_arenas(cfg.malloc_arena_max)  # before the threads start (daemon/heap.py)
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

    def tick(self) -> None:
        """Periodic housekeeping from the main loop."""
        self._sample_rates()
        self.latency.sample()
        self.traces.expire()
        mono = time.monotonic()
        self.heap.maybe_trim(mono)
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
        self.scrapes.stop(left())
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
                with tuned_gc(self.cfg.gc_thresholds, self.heap.gc):
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
