"""Memory freed in the C heap handed back to the system (glibc's ``malloc_trim``), so RSS comes down after a burst.

A burst of large objects (OTLP and JSON bodies, join buffers, a 3 MB exposition, windows replaced at
once) is freed back to malloc, not to the system: glibc raises its mmap threshold after the first
large free (up to 32 MiB), so later large blocks come from the heap, and free pages in the middle
of the heap are kept until something trims them. An attacked sidecar that shed its state still
showed the RSS of its peak (issue 28: 1.85 GiB after the join-buffer bomb; the soak's probe found
12 MiB more given back by ``malloc_trim`` than by ``gc``), which is what a pod's memory limit and
the operator see.

:class:`HeapTrimmer` runs from the daemon's housekeeping tick: at most every ``interval_s`` it asks
glibc how many bytes its heaps hold free (``mallinfo2``), and past ``min_free_bytes`` it calls
``malloc_trim(0)``, which gives whole free pages back (a few milliseconds for a heap of hundreds of
MiB). On a C library without these functions (musl, macOS) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("inferwatch.sidecar")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


#: glibc's mallopt parameter for the most arenas its malloc makes (malloc.h).
_M_ARENA_MAX = -8


def cap_arenas(n: int, environ: Mapping[str, str] | None = None) -> bool:
    """Cap glibc's malloc arenas at ``n`` (``mallopt(M_ARENA_MAX)``); whether it was set.

    glibc gives threads that contend for its lock arenas of their own, up to 8 per core, and each
    keeps its own free memory: under the hostile soak the C heap held 18 MiB more with the default
    than with 2 (docs/benchmarks.md). Called before the sidecar starts its threads. Nothing is done for
    ``n`` 0, where ``MALLOC_ARENA_MAX`` is set in the environment (the operator's choice wins), or on a
    C library without ``mallopt`` (musl, macOS).
    """
    env = os.environ if environ is None else environ
    if n <= 0 or "MALLOC_ARENA_MAX" in env:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, n))


def _glibc() -> tuple[Callable[[int], int] | None, Callable[[], Any] | None]:
    """(``malloc_trim``, ``mallinfo2``) of this process's C library, each None where it has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None, None
    trim = getattr(libc, "malloc_trim", None)
    info = getattr(libc, "mallinfo2", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    if info is not None:
        info.argtypes, info.restype = [], _MallInfo2
    return trim, info


class GcClock:
    """Collections the cyclic collector ran and the CPU seconds they took, per generation (``gc.callbacks``).

    A collection runs on the thread whose allocation triggered it, so that thread's CPU time
    (``time.thread_time``) over it is the collection's cost, not inflated by other processes holding
    the core; every other thread waits for the interpreter meanwhile. The clock costs two calls per
    collection (tens a second under load), not per object.
    """

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
            return
        g = info["generation"]
        self.collections[g] += 1
        self.seconds[g] += time.thread_time() - self._start

    def status(self) -> dict[str, Any]:
        return {"collections": list(self.collections), "seconds": [round(x, 6) for x in self.seconds]}


@contextlib.contextmanager
def tuned_gc(thresholds: tuple[int, int, int], clock: GcClock | None = None) -> Iterator[None]:
    """Inside the block: what start-up made is frozen out of the collector's scans, and its thresholds set.

    ``Sidecar.run`` (the process's own entry) serves inside it: a full collection walks every live
    container while holding the interpreter, so its cost grows with the state an attack makes the
    sidecar hold, and its frequency with the containers that decoded bodies promote; both showed as
    scrape latency (issue 28). The previous thresholds come back after the block, and the frozen
    objects are scanned again, so a process that runs a sidecar and goes on (tests) is left as it was.
    ``clock``, if given, times the collections made inside the block (``/v1/status`` ``heap.gc``).
    """
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    if clock is not None:
        gc.callbacks.append(clock)
    try:
        yield
    finally:
        if clock is not None:
            gc.callbacks.remove(clock)
        gc.set_threshold(*before)
        gc.unfreeze()


def rss_bytes() -> int:
    """This process's resident set size (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` when the C heap holds at least ``min_free_bytes`` free (module docstring).

    Args:
        min_free_bytes: free heap bytes that make a trim worth it (0 disables trimming).
        interval_s: the shortest time between two looks at the heap.
    """

    def __init__(self, min_free_bytes: int, interval_s: float) -> None:
        self.min_free_bytes = min_free_bytes
        self.interval_s = interval_s
        self._trim, self._info = _glibc()
        self._last = float("-inf")
        #: trims done, and the RSS they gave back in all
        self.trims = 0
        self.returned_bytes = 0
        #: the cyclic collector's collections and time while the sidecar serves (``tuned_gc``)
        self.gc = GcClock()

    @property
    def available(self) -> bool:
        return self._trim is not None and self._info is not None and self.min_free_bytes > 0

    def free_bytes(self) -> int:
        """Bytes the C heaps hold free (glibc's ``fordblks``), or 0 where it cannot be asked."""
        return int(self._info().fordblks) if self._info is not None else 0

    def maybe_trim(self, now: float) -> int:
        """Trim if it is time and worth it; returns the RSS bytes given back (0 when it did not trim)."""
        if not self.available or now - self._last < self.interval_s:
            return 0
        self._last = now
        if self.free_bytes() < self.min_free_bytes:
            return 0
        before = rss_bytes()
        assert self._trim is not None
        self._trim(0)
        returned = max(0, before - rss_bytes())
        self.trims += 1
        self.returned_bytes += returned
        if returned >= 64 << 20:
            log.info("gave %.0f MiB of freed heap back to the system", returned / (1 << 20))
        return returned

    def status(self) -> dict[str, Any]:
        return {"trims": self.trims, "returned_bytes": self.returned_bytes, "available": self.available,
                "gc": self.gc.status()}
