"""``/metrics`` rendered off the request path, so a scrape under load never waits for a render.

Under the hostile mix of issue 28 a render of the 3 MB exposition takes a fraction of a second of
CPU, and several times that of wall clock while ingest threads and load generators share two
cores: every scrape that rendered its own body waited that long (``/metrics`` p99 1.9 s). So one
thread of its own (:class:`ScrapeRenderer`) renders, and a scrape takes a rendered body:

- a scrape asks for a render of its format and waits for one that *started after it arrived*, so
  what it returns includes everything ingested before it (an idle sidecar, and every test that
  ingests and then scrapes, see fresh values, exactly as when the scrape rendered);
- if that takes longer than ``wait_s`` (``http.metrics_wait_s``) *while events keep arriving*,
  the scrape returns the last complete render of its format instead: taken at most one render
  earlier, so its counters are a little old but never go back. The render it asked for goes on
  and serves the next scrape.

Renders happen only when a scrape asks, one at a time (never two of the same body at once, as the
two scrape threads could before), and the render still makes ingest step aside
(export/priority.py). A scrape of a format never asked for before waits for its first render.

Memory: the last body of each format asked for (text, OpenMetrics, protobuf: at most three).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("inferwatch.sidecar.scrape")


class _Rendered:
    """One complete render: its body and content type, or the error it raised, and its sequence number."""

    __slots__ = ("seq", "body", "ctype", "error")

    def __init__(self, seq: int, body: bytes, ctype: str, error: BaseException | None) -> None:
        self.seq, self.body, self.ctype, self.error = seq, body, ctype, error

    def result(self) -> tuple[bytes, str]:
        if self.error is not None:
            raise self.error
        return self.body, self.ctype


class ScrapeRenderer:
    """Renders ``/metrics`` bodies on its own thread and hands them to scrapes (see the module docstring).

    Args:
        render: the ``Accept`` header -> (body, content type), the whole render.
        key: the ``Accept`` header -> the format it selects (its content type); equal keys, equal bodies.
        activity: a number that changes while events arrive (the ingested byte count).
        wait_s: how long a scrape waits for a fresh render while events arrive before it takes the last one.
    """

    def __init__(self, render: Callable[[str], tuple[bytes, str]], key: Callable[[str], str],
                 activity: Callable[[], int], wait_s: float) -> None:
        self._render, self._key, self._activity, self.wait_s = render, key, activity, wait_s
        self._cond = threading.Condition()
        #: format -> the Accept header to render it with, for the next render
        self._wanted: dict[str, str] = {}
        #: format -> its last complete render
        self._done: dict[str, _Rendered] = {}
        #: sequence number of the next render to start
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: scrapes answered with a fresh render, and with the last one while a fresh one was under way
        self.fresh = 0
        self.stale = 0

    def scrape(self, accept: str) -> tuple[bytes, str]:
        """The body and content type for a scrape with this ``Accept`` header (module docstring)."""
        key = self._key(accept)
        t0 = time.monotonic()
        act0 = self._activity()
        with self._cond:
            if self._stopping:
                return self._render(accept)
            self._ensure_thread()
            need = self._next
            self._wanted[key] = accept
            self._cond.notify_all()
            while True:
                done = self._done.get(key)
                if done is not None and done.seq >= need:
                    self.fresh += 1
                    return done.result()
                left = t0 + self.wait_s - time.monotonic()
                if left <= 0 and done is not None and self._activity() != act0:
                    self.stale += 1
                    return done.result()
                if self._stopping:
                    break
                if self._thread is None or not self._thread.is_alive():  # ended by a BaseException: again
                    self._ensure_thread()
                    self._wanted[key] = accept
                self._cond.wait(left if left > 0 else self.wait_s)
        return self._render(accept)  # stopped under way: render here, as before the renderer existed

    def stop(self, timeout: float = 5.0) -> None:
        """End the render thread after the render under way; later scrapes render on their own thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="inferwatch-metrics-render", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                wanted, self._wanted = self._wanted, {}
                seq = self._next
                self._next += 1
            for key, accept in wanted.items():
                try:
                    body, ctype = self._render(accept)
                    out = _Rendered(seq, body, ctype, None)
                except Exception as e:  # the scrape that waits for it answers 500 with the error
                    log.exception("scrape render failed")
                    out = _Rendered(seq, b"", "", e)
                with self._cond:
                    self._done[key] = out
                    self._cond.notify_all()
