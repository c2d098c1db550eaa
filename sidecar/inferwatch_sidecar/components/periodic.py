"""The one skeleton of a sidecar component, after OpenTelemetry's ``BatchProcessor``.

A component takes records on the ingest thread, works on its own thread and
exports what its last pass published. The skeleton of that is the same for
every component, so it is written once here:

- :class:`PeriodicComponent` owns the worker (``start`` / one ``tick`` every
  ``interval_s`` / ``stop``, idempotent), the drop counters by reason, the
  published :class:`~inferwatch_sidecar.metrics.samples.Samples` behind the
  snapshot lock, and ``collect()``. A subclass implements :meth:`~PeriodicComponent.tick`
  (the GPU sampler).
- :class:`StagedComponent` adds the staging between the two threads
  (:class:`~inferwatch_sidecar.components.staging.Staging`): ``handle`` only
  stages and counts what does not fit as ``staging_full``, and wakes the worker at once when the
  stage passes half its budget (events or bytes), so a burst is drained before the tick and the
  stage can be small; each tick drains the
  stage into the subclass's :meth:`~StagedComponent.absorb` (the working state's
  lock held) and, every ``evaluate_interval_s``, calls :meth:`~StagedComponent.evaluate`.

Two locks: ``_state_lock`` guards the working state (windows, monitors) that
the worker thread changes; ``_lock`` guards only what was published (the
snapshot and the reports ``status`` shows), so a scrape never waits for an
evaluation. A subclass's evaluation builds a fresh :class:`Samples` keyed by
catalog entries and hands it to :meth:`~PeriodicComponent.publish`.

A new component::

    class QueueComponent(StagedComponent):
        name = "queue"
        record_types = frozenset({EV_REQUEST})
        metrics = queue_metrics.METRICS
        dropped_metric = QUEUE_DROPPED_EVENTS_TOTAL

        def __init__(self, cfg, ctx):
            super().__init__(ctx, interval_s=1.0, max_staged=cfg.max_staged,
                             evaluate_interval_s=cfg.evaluate_interval_s)
            self.cfg = cfg

        def absorb(self, batch, now): ...          # state lock held
        def evaluate(self, now=None):
            out = Samples(); out.put(QUEUE_DEPTH, key, depth); self.publish(out)
        def status(self): return {"staged": len(self._staging), "dropped": dict(self.dropped)}

and one entry in :mod:`inferwatch_sidecar.components.registry`.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.staging import Staging
from inferwatch_sidecar.components.worker import PeriodicWorker
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.samples import Samples

__all__ = ["PeriodicComponent", "StagedComponent"]


class PeriodicComponent(ABC):
    """A component with a worker thread that publishes samples (see the module docstring).

    Class attributes a subclass sets:
        name: config section name and key in ``/v1/status``.
        record_types: wire record types ``handle`` receives.
        metrics: every catalog entry ``collect`` may export.
        dropped_metric: the counter that exports :attr:`dropped` by reason, live at each scrape; None when
            the component exports its drops itself.
        drop_reasons: reasons counted from the start (exported at zero).
        export_empty: ``collect`` also returns the families without samples (HELP and TYPE shown).
        immediate: the first tick runs at start, not one interval later.
        thread_name: the worker thread's name (default ``inferwatch-<name>``).

    Args:
        ctx: the daemon's context.
        interval_s: seconds between the starts of two ticks.
        log: the component's logger.
        schedule: the clock that decides when an evaluation is due (default ``ctx.monotonic``).
    """

    name: ClassVar[str]
    record_types: ClassVar[frozenset[int]] = frozenset()
    metrics: ClassVar[tuple[Metric, ...]] = ()
    dropped_metric: ClassVar[Metric | None] = None
    drop_reasons: ClassVar[tuple[str, ...]] = ("error",)
    export_empty: ClassVar[bool] = False
    immediate: ClassVar[bool] = False
    thread_name: ClassVar[str | None] = None

    def __init__(self, ctx: ComponentContext, *, interval_s: float, log: logging.Logger | None = None,
                 schedule: Callable[[], float] | None = None) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.log = log or logging.getLogger(f"inferwatch.sidecar.{self.name}")
        self._schedule = schedule or ctx.monotonic
        #: Guards what was published (the snapshot, reports); held for a copy, never for a computation.
        self._lock = threading.Lock()
        #: Guards the working state the worker changes.
        self._state_lock = threading.Lock()
        #: Records or events refused, by reason.
        self.dropped: dict[str, int] = dict.fromkeys(self.drop_reasons, 0)
        self._snapshot = Samples()
        self._worker: PeriodicWorker | None = None
        self._stopped = False
        #: Worker passes ended with :meth:`publish_pass`, and the thread CPU seconds they took.
        self.passes = 0
        self.cpu_s = 0.0

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread; a started component is left alone."""
        if self._worker is not None:
            return
        self._stopped = False
        self.on_start()
        self._worker = PeriodicWorker(self.thread_name or f"inferwatch-{self.name}", self.interval_s, self.tick, self.tick_failed,
                                      immediate=self.immediate)
        self._worker.start()

    def stop(self, timeout: float) -> None:
        """Stop the worker (waiting up to ``timeout`` s for the pass under way), then :meth:`on_stop`. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(timeout)
        try:
            self.on_stop()
        except Exception:
            self.log.exception("%s: stopping failed", self.name)

    def on_start(self) -> None:  # noqa: B027 - an optional hook
        """Called by :meth:`start` before the worker starts (resume from a checkpoint)."""

    def on_stop(self) -> None:  # noqa: B027 - an optional hook
        """Called once by :meth:`stop` after the worker ended (final drain, checkpoint, release a device)."""

    @abstractmethod
    def tick(self) -> bool | None:
        """One pass of the worker thread; True ends the loop (a replay that ran out)."""

    def tick_failed(self, e: Exception) -> None:
        """A pass raised: logged, and the loop goes on."""
        self.log.error("%s: loop error", self.name, exc_info=e)

    # -- ingest thread --------------------------------------------------------------------------------------------

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:  # noqa: B027
        """Records for the component (ingest thread): cheap, bounded, never raises. Default: ignored."""

    def count_drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` refused records under ``reason``."""
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    # -- export ---------------------------------------------------------------------------------------------------

    def publish(self, samples: Samples) -> None:
        """Make ``samples`` what ``collect`` exports until the next publication."""
        with self._lock:
            self._snapshot = samples

    def publish_pass(self, samples: Samples, cpu_start: float) -> None:
        """End a worker pass: :meth:`publish` ``samples``, count the pass in :attr:`passes` and its thread CPU
        time since ``cpu_start`` (``time.thread_time()`` when the pass began) in :attr:`cpu_s`."""
        self.publish(samples)
        self.passes += 1
        self.cpu_s += time.thread_time() - cpu_start

    def live_samples(self) -> Samples | None:
        """Samples computed at scrape time, which replace the snapshot's for their entries.

        The default exports :attr:`dropped` through :attr:`dropped_metric`.
        """
        if self.dropped_metric is None:
            return None
        out = Samples()
        out.set(self.dropped_metric, [((reason,), float(n)) for reason, n in list(self.dropped.items())])
        return out

    def collect(self) -> list[PromMetric]:
        """The families of the last publication plus :meth:`live_samples` (no statistics at scrape time)."""
        with self._lock:
            snap = self._snapshot
        return snap.merged(self.live_samples()).families(self.metrics, empty=self.export_empty)

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """JSON-able state for ``/v1/status``."""


class StagedComponent(PeriodicComponent):
    """A :class:`PeriodicComponent` fed through a bounded stage (see the module docstring).

    Args:
        ctx: the daemon's context.
        interval_s: seconds between drains.
        max_staged / max_staged_bytes: the stage's bounds (events, estimated bytes).
        evaluate_interval_s: seconds between evaluations; None when the component evaluates in :meth:`absorb`.
        log / schedule: as for :class:`PeriodicComponent`.
    """

    drop_reasons: ClassVar[tuple[str, ...]] = ("staging_full", "error")

    def __init__(self, ctx: ComponentContext, *, interval_s: float, max_staged: int,
                 max_staged_bytes: int = 64 << 20, evaluate_interval_s: float | None = None,
                 log: logging.Logger | None = None, schedule: Callable[[], float] | None = None) -> None:
        super().__init__(ctx, interval_s=interval_s, log=log, schedule=schedule)
        self._staging = Staging(max_staged, max_staged_bytes)
        self.evaluate_interval_s = evaluate_interval_s
        self._next_eval = 0.0

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]], nbytes: int | None = None) -> None:
        """Stage records for the worker. Cheap, bounded, never raises. ``nbytes``: see ``Staging.put``."""
        try:
            refused = self._staging.put(records, nbytes)
        except Exception:  # pragma: no cover - defensive: the ingest thread must survive
            self.dropped["error"] = self.dropped.get("error", 0) + 1
            return
        if refused:
            self.dropped["staging_full"] += refused
        if self._staging.past_half():
            worker = self._worker
            if worker is not None:
                worker.wake()

    def drain(self, now: float | None = None) -> int:
        """Take the staged records into :meth:`absorb` (an empty batch too: windows advance); returns how many."""
        batch = self._staging.take()
        now = self.ctx.clock() if now is None else now
        with self._state_lock:
            self.absorb(batch, now)
        return len(batch)

    @abstractmethod
    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Fold a batch of staged records into the working state (``_state_lock`` held; ``now`` wall-clock s)."""

    def evaluate(self, now: float | None = None) -> Any:
        """Evaluate the working state and :meth:`publish` its samples (worker thread). Default: nothing."""
        return None

    def on_start(self) -> None:
        if self.evaluate_interval_s is not None:
            self._next_eval = self._schedule() + self.evaluate_interval_s

    def tick(self) -> bool | None:
        """Drain, then evaluate when it is due, then :meth:`after_tick`."""
        self.drain()
        now = self._schedule()
        if self.evaluate_interval_s is not None and now >= self._next_eval:
            self._next_eval = now + self.evaluate_interval_s
            self.evaluate()
        self.after_tick(now)
        return None

    def after_tick(self, now: float) -> None:
        """Called at the end of each tick with the schedule clock's ``now`` (a checkpoint that is due)."""

    def staged(self) -> int:
        """Records waiting in the stage."""
        return len(self._staging)


#: Wall-clock scheduling for components whose evaluations follow real time even under a test's frozen clock.
REAL_TIME: Callable[[], float] = time.monotonic
