"""``/metrics`` rendered off the request path, so a scrape under load never waits for a render.

Under the hostile mix of issue 28 a render of the 3 MB exposition takes a fraction of a second of
CPU, and several times that of wall clock while ingest threads and load generators share two
cores: every scrape that rendered its own body waited that long (``/metrics`` p99 1.9 s). So one
thread of its own (:class:`ScrapeRenderer`) renders, and a scrape takes a rendered body:

- **ahead of the scrape**: for each format scraped, the thread renders again shortly before the
  next scrape is due (the last interval between two scrapes, less 1.5 times the last render's
  duration), so a regularly scraped sidecar has a body ready, about one render old;
- **under ingest**: a scrape takes such a body at once when events arrived between the format's
  previous render and it (made since the last scrape, at most ``max_age_s``,
  ``http.metrics_max_age_s``, old), or when it sees events arrive within ``wait_s``
  (``http.metrics_wait_s``) and the body is at most ``max_age_s`` old: its counters are a little
  old but never go back;
- **otherwise** (an idle sidecar, a first or an irregular scrape, and every test that ingests and
  then scrapes) the scrape waits for a render that *started after it arrived*, so what it returns
  includes everything ingested before it, exactly as when the scrape rendered on its own.

Renders happen one at a time (never two of the same body at once, as the two scrape threads could
before), only for formats scraped in the last few intervals. A render a scrape waits for makes
ingest step aside (``urgent``, export/priority.py); one made ahead does not, since nobody waits.

Memory: the last body of each format asked for (text, OpenMetrics, protobuf: at most three).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger("inferwatch.sidecar.scrape")

#: A format not scraped for this many of its intervals is no longer rendered ahead.
_IDLE_INTERVALS = 3
#: zlib's level for gzipped bodies. The soak's 3.27 MB text body (median of 5, thread CPU): level 1 gives
#: 142 KB in 5.5 ms, 6 gives 117 KB in 17.5 ms, 9 (prometheus_client's gzip.compress) 111 KB in 90 ms.
GZIP_LEVEL = 1


def gzip_body(body: bytes) -> bytes:
    """``body`` as a gzip stream (level 1: 23 times smaller for the soak's exposition, 1.7 ms per MB).

    zlib does the work with the interpreter released, so a compression holds no other thread back.
    """
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    return c.compress(body) + c.flush()


class _Rendered:
    """One complete render: its body (and, once asked for, its gzip form) and content type, or the error it
    raised; its number and start time."""

    __slots__ = ("seq", "started", "act", "body", "ctype", "error", "busy", "gz")

    def __init__(self, seq: int, started: float, act: int, body: bytes, ctype: str,
                 error: BaseException | None) -> None:
        self.seq, self.started, self.act, self.body, self.ctype, self.error = seq, started, act, body, ctype, error
        #: made ahead of a scrape while events were arriving (they did since the format's previous render)
        self.busy = False
        #: the body gzipped, made once (by the render thread when the format's scrapes ask for gzip)
        self.gz: bytes | None = None

    def result(self, gzip: bool = False) -> tuple[bytes, str]:
        if self.error is not None:
            raise self.error
        if not gzip:
            return self.body, self.ctype
        gz = self.gz
        if gz is None:  # two scrapes may both compress it; they make the same bytes
            gz = self.gz = gzip_body(self.body)
        return gz, self.ctype


class _Format:
    """What the thread knows of one format's scrapes: the Accept header, the last arrival and interval."""

    __slots__ = ("accept", "arrived", "interval", "render_s", "skipped", "gzip")

    def __init__(self, accept: str, arrived: float, gzip: bool = False) -> None:
        self.accept, self.arrived, self.gzip = accept, arrived, gzip
        self.interval: float | None = None
        self.render_s = 0.0
        #: when a render ahead was due but left out, nothing having arrived since the last render
        self.skipped = float("-inf")


class ScrapeRenderer:
    """Renders ``/metrics`` bodies on its own thread and hands them to scrapes (see the module docstring).

    Args:
        render: the ``Accept`` header -> (body, content type), the whole render.
        key: the ``Accept`` header -> the format it selects (its content type); equal keys, equal bodies.
        activity: a number that changes while events arrive (the ingested byte count).
        urgent: entered around a render a scrape waits for (the scrape priority), not around one made ahead.
        held: whether ingest is holding events back right now for a scrape (export/priority.py): events
            are arriving then, though ``activity`` does not move.
        wait_s: how long a scrape looks for arriving events before it asks for a fresh render.
        max_age_s: the oldest render (by its start) a scrape under ingest takes instead of a fresh one.
        clock: monotonic seconds.
    """

    def __init__(self, render: Callable[[str], tuple[bytes, str]], key: Callable[[str], str],
                 activity: Callable[[], int], wait_s: float, max_age_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 urgent: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 held: Callable[[], bool] = lambda: False) -> None:
        self._render, self._key, self._activity, self._urgent, self._held = render, key, activity, urgent, held
        self.wait_s, self.max_age_s, self._clock = wait_s, max_age_s, clock
        self._cond = threading.Condition()
        #: format -> the Accept header to render it with, asked for by a waiting scrape
        self._wanted: dict[str, str] = {}
        #: format -> its last complete render
        self._done: dict[str, _Rendered] = {}
        self._formats: dict[str, _Format] = {}
        #: sequence number of the next render to start
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: scrapes answered with a render that started after they arrived, and with one made ahead of them
        self.fresh = 0
        self.ahead = 0
        #: renders made ahead of a scrape
        self.renders_ahead = 0

    def scrape(self, accept: str, gzip: bool = False) -> tuple[bytes, str]:
        """The body and content type for a scrape with this ``Accept`` header (module docstring).

        With ``gzip`` the body is gzipped (:func:`gzip_body`); the render thread then compresses the
        format's later renders itself, so a scrape under load takes the compressed bytes as they are.
        """
        key = self._key(accept)
        t0 = self._clock()
        act0 = self._activity()
        with self._cond:
            if self._stopping:
                done = None
            else:
                self._ensure_thread()
                self._note_arrival(key, accept, t0, gzip)
                done = self._pick(key, accept, t0, act0)
        if done is None:  # stopped under way: render here, as before the renderer existed
            body, ctype = self._render(accept)
            return (gzip_body(body) if gzip else body), ctype
        return done.result(gzip)

    def ready(self, accept: str, gzip: bool = False) -> tuple[bytes, str] | None:
        """The body :meth:`scrape` would answer at once, without waiting or compressing; else None (call
        :meth:`scrape` then). For the HTTP server's event loop: a scrape under load that finds the body made
        ahead of it is answered there, with no hop to a scrape thread and back (each a wait for the
        interpreter on a busy sidecar)."""
        key = self._key(accept)
        t0 = self._clock()
        with self._cond:
            if self._stopping or self._thread is None:
                return None
            done = self._done.get(key)
            f = self._formats.get(key)
            if (done is None or f is None or f.interval is None or not self._takes_ahead(done, f.arrived, t0)
                    or done.error is not None or (gzip and done.gz is None)):
                return None
            self._note_arrival(key, accept, t0, gzip)
            self.ahead += 1
        return done.result(gzip)

    def _takes_ahead(self, done: _Rendered, previous: float, t0: float) -> bool:
        """Whether a scrape at ``t0`` takes ``done``: made ahead of it (after the ``previous`` scrape arrived)
        while events were arriving, and at most ``max_age_s`` old."""
        return done.busy and done.started >= previous and t0 - done.started <= self.max_age_s

    def _pick(self, key: str, accept: str, t0: float, act0: int) -> _Rendered | None:
        """The render a scrape of format ``key`` that arrived at ``t0`` takes; None once stopping (lock held)."""
        done = self._done.get(key)
        f = self._formats[key]
        if done is not None and f.interval is not None and self._takes_ahead(done, t0 - f.interval, t0):
            # Made ahead of this scrape while events were arriving: the sidecar is busy, take it. (Seeing an
            # event arrive, below, is not enough then: a starved ingest thread can show none for 50 ms.)
            self.ahead += 1
            return done
        if done is not None and t0 - done.started <= self.max_age_s:
            # A recent body: take it if events are arriving, else ask for a fresh one.
            deadline = t0 + self.wait_s
            while self._activity() == act0 and not self._held() and (left := deadline - self._clock()) > 0:
                self._cond.wait(min(left, 0.002))
            if self._activity() != act0 or self._held():
                self.ahead += 1
                return self._done[key]
        need = self._next
        self._wanted[key] = accept
        self._cond.notify_all()
        while not self._stopping:
            done = self._done.get(key)
            if done is not None and done.seq >= need:
                self.fresh += 1
                return done
            if self._thread is None or not self._thread.is_alive():  # ended by a BaseException: again
                self._ensure_thread()
                self._wanted[key] = accept
            self._cond.wait(0.5)
        return None

    def stop(self, timeout: float = 5.0) -> None:
        """End the render thread after the render under way; later scrapes render on their own thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _note_arrival(self, key: str, accept: str, now: float, gzip: bool) -> None:
        f = self._formats.get(key)
        if f is None:
            self._formats[key] = _Format(accept, now, gzip)
            return
        f.interval, f.arrived, f.accept, f.gzip = now - f.arrived, now, accept, gzip
        self._cond.notify_all()  # the thread plans its next render ahead from the new interval

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="inferwatch-metrics-render", daemon=True)
            self._thread.start()

    def _due(self, now: float) -> tuple[float, str] | None:
        """(when, format) of the next render ahead of a scrape, or None (lock held)."""
        best: tuple[float, str] | None = None
        for key, f in self._formats.items():
            if f.interval is None or f.interval <= 0 or now - f.arrived > _IDLE_INTERVALS * f.interval:
                continue
            at = f.arrived + f.interval - 1.5 * f.render_s - 0.05
            done = self._done.get(key)
            last = max(f.skipped, done.started if done is not None else float("-inf"))
            if last >= at:
                at = last + f.interval  # this scrape's body is made (or left out): the next one's
                if at - f.arrived > _IDLE_INTERVALS * f.interval:
                    continue
            if best is None or at < best[0]:
                best = (at, key)
        return best

    def _take(self) -> tuple[dict[str, str], int, bool] | None:
        """Wait for work (lock held): the formats to render, the render's number, whether ahead; None: stop."""
        while not self._stopping:
            if self._wanted:
                wanted, self._wanted = self._wanted, {}
                break
            now = self._clock()
            due = self._due(now)
            if due is not None and due[0] <= now:
                f, done = self._formats[due[1]], self._done.get(due[1])
                if done is not None and done.act == self._activity():
                    f.skipped = now  # nothing arrived since the last render: a scrape gets a fresh one quickly
                    continue
                wanted = {due[1]: f.accept}
                self.renders_ahead += 1
                seq = self._next
                self._next += 1
                return wanted, seq, True
            self._cond.wait(None if due is None else min(due[0] - now, 60.0))
        else:
            return None
        seq = self._next
        self._next += 1
        return wanted, seq, False

    def _run(self) -> None:
        while True:
            with self._cond:
                work = self._take()
            if work is None:
                return
            wanted, seq, ahead = work
            for key, accept in wanted.items():
                started, act = self._clock(), self._activity()
                with self._cond:
                    prev = self._done.get(key)
                busy = ahead and prev is not None and prev.act != act
                try:
                    with contextlib.nullcontext() if ahead else self._urgent():
                        body, ctype = self._render(accept)
                    out = _Rendered(seq, started, act, body, ctype, None)
                    with self._cond:
                        f = self._formats.get(key)
                        gzip = f is not None and f.gzip
                    if gzip:  # the format's scrapes take it gzipped: compress here, off their path
                        out.gz = gzip_body(body)
                except Exception as e:  # the scrape that waits for it answers 500 with the error
                    log.exception("scrape render failed")
                    out = _Rendered(seq, started, act, b"", "", e)
                out.busy = busy
                with self._cond:
                    self._done[key] = out
                    f = self._formats.get(key)
                    if f is not None:
                        f.render_s = self._clock() - started
                    self._cond.notify_all()
