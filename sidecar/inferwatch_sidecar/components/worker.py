"""The thread behind a component: one step every interval until stopped.

A pass that raises is reported to ``on_error`` and the loop goes on: a
component's thread must outlive one bad sample or one failed evaluation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from inferwatch_sidecar.export.priority import PRIORITY


class PeriodicWorker:
    """Call ``step`` every ``interval_s`` seconds on a daemon thread.

    The interval runs from the start of one pass to the start of the next, so a
    slow pass does not stretch the period. ``step`` returning True ends the loop
    (a replay that ran out of samples).

    Args:
        name: the thread's name.
        interval_s: seconds between the starts of two passes.
        step: one pass.
        on_error: called with the exception of a pass that raised.
        immediate: take the first pass at once instead of after one interval.

    :meth:`wake` starts the next pass at once (a stage past half its budget); the interval then runs
    from that pass's start.
    """

    def __init__(self, name: str, interval_s: float, step: Callable[[], bool | None],
                 on_error: Callable[[Exception], None], *, immediate: bool = True) -> None:
        self.name = name
        self.interval_s = interval_s
        self._step = step
        self._on_error = on_error
        self._immediate = immediate
        self._stop = threading.Event()
        #: Set by :meth:`wake` (and by :meth:`stop`, to end the wait); the loop waits on it.
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (again after ``stop``); a running worker is left alone."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Ask the loop to end and wait up to ``timeout`` seconds for the pass under way."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        """Start the next pass now rather than at the interval (any thread; cheap when already woken)."""
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        delay = 0.0 if self._immediate else self.interval_s
        while True:
            self._wake.wait(delay)
            if self._stop.is_set():
                return
            self._wake.clear()
            PRIORITY.pause()
            t0 = time.monotonic()
            try:
                if self._step():
                    return
            except Exception as e:  # noqa: BLE001 - the thread must survive a failed pass
                self._on_error(e)
            delay = max(0.0, self.interval_s - (time.monotonic() - t0))
