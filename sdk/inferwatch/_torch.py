"""The optional PyTorch CUDA caching-allocator probe.

It runs on the sender thread, never on the request path, at a low rate
(every 10 s by default). It never imports torch: it samples only when the
serving process has already imported torch and initialised CUDA, so it can
neither slow start-up nor create a CUDA context (hundreds of MB of device
memory) in a process that did not ask for one.

Each sample becomes one ``EV_ALLOC`` event per device: allocated, reserved,
active and inactive-split bytes, the cumulative ``num_alloc_retries`` and
``num_ooms``, and whether ``expandable_segments`` is on. The sidecar uses
them to tell tensor leaks, allocator cache growth and fragmentation, and
native leaks apart.

Turned on where torch is not installed, the probe says so once, when it is
built (at ``configure()``): otherwise it would send nothing without a word.

A confirming second stage (:class:`HistoryCapture`, off by default; on with
``INFERWATCH_TORCH_HISTORY=1``): when the probe's own samples show the
allocated floor of a device rising (live tensors growing, ``TensorSuspect``),
it switches on ``torch.cuda.memory._record_memory_history`` for a bounded time
and number of entries, takes ``torch.cuda.memory._snapshot()``, switches the
history off again and names the allocation sites (file:line of the first
Python frame outside torch) whose allocations made during the recording are
still live: bytes and count per site, at most ``top`` of them, sent to the
sidecar as ``EV_ALLOC_SITE`` events with the sample that ends the recording
(``/v1/status`` shows them by process and on the leak episode). All of it runs
on the sender thread at sample time, never on the request path; a failure
turns the stage off for good and is reported once in ``last_error``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch.wire import EV_ALLOC, EV_ALLOC_SITE, MAX_STRING

logger = logging.getLogger("inferwatch")

#: The one line logged when the probe is on and torch is not installed.
NO_TORCH_NOTICE = (
    "inferwatch: the torch allocator probe is on (torch_probe=True or INFERWATCH_TORCH_PROBE) but torch is not "
    "installed here, so it sends nothing; install torch or turn the probe off"
)

#: ``() -> {device_index: memory_stats mapping}``; what ``torch_stats_source`` must be.
StatsSource = Callable[[], Mapping[int, Mapping[str, Any]]]

#: memory_stats() keys sent, in EV_ALLOC order.
STAT_KEYS = (
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)


def expandable_segments_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the allocator config in the environment turns on expandable segments."""
    env = os.environ if environ is None else environ
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    for part in conf.split(","):
        key, _, value = part.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


def torch_installed() -> bool:
    """Whether torch is loaded or could be imported, found without importing it."""
    return sys.modules.get("torch") is not None or importlib.util.find_spec("torch") is not None


def torch_stats() -> dict[int, Mapping[str, Any]]:
    """Stats of every CUDA device, when torch is loaded and CUDA is initialised; else ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    cuda = torch.cuda
    if not cuda.is_available() or not cuda.is_initialized():
        return {}
    return {i: cuda.memory_stats(i) for i in range(cuda.device_count())}


#: Environment switch of the second stage, and its bounds.
HISTORY_ENV = "INFERWATCH_TORCH_HISTORY"
HISTORY_SECONDS = 60.0
HISTORY_MAX_ENTRIES = 20000
HISTORY_TOP = 10
#: Frames from these path fragments are the allocator's and torch's own, not the caller's site.
_INTERNAL = ("/torch/", "\\torch\\", "<frozen", "/inferwatch/")


def _site_frame(frames: Any) -> tuple[str, int, str] | None:
    """(file, line, function) of the first frame outside torch, or of the first frame when all are inside."""
    if not isinstance(frames, list) or not frames:
        return None
    first = None
    for fr in frames:
        if not isinstance(fr, Mapping):
            continue
        site = (str(fr.get("filename", "?")), _int(fr.get("line", 0)), str(fr.get("name", "?")))
        first = first or site
        if not any(x in site[0] for x in _INTERNAL):
            return site
    return first


def growing_sites(snapshot: Mapping[str, Any], top: int = HISTORY_TOP) -> list[dict[str, Any]]:
    """Allocation sites whose allocations made while the history was recording are still live.

    ``snapshot`` is ``torch.cuda.memory._snapshot()``'s documented structure: ``device_traces`` (per
    device, the recorded actions: ``alloc``, ``free_requested``, ``free_completed`` ... with ``addr``,
    ``size`` and ``frames``), and ``segments`` whose ``blocks`` carry ``state`` and, for allocations made
    while recording, ``frames``. The traces decide (an ``alloc`` not followed by a free of its address);
    without traces, the live (``active_allocated``) blocks that carry frames. Returns at most ``top``
    sites, most bytes first: ``{"file", "line", "function", "device", "bytes", "count"}`` (a site that
    allocated on two devices is two sites: the sidecar judges each device's series).
    """
    live: dict[tuple[int, int], tuple[int, Any]] = {}
    traces = snapshot.get("device_traces") or []
    any_trace = False
    for dev, trace in enumerate(traces if isinstance(traces, list) else []):
        for ev in trace if isinstance(trace, list) else []:
            if not isinstance(ev, Mapping):
                continue
            any_trace = True
            action, addr = ev.get("action"), _int(ev.get("addr", 0))
            if action == "alloc":
                live[(dev, addr)] = (_int(ev.get("size", 0)), ev.get("frames"))
            elif action in ("free_requested", "free_completed"):
                live.pop((dev, addr), None)
    if not any_trace:
        segments = snapshot.get("segments")
        for seg in segments if isinstance(segments, list) else []:
            blocks = seg.get("blocks") if isinstance(seg, Mapping) else None
            for blk in blocks if isinstance(blocks, list) else []:
                if isinstance(blk, Mapping) and blk.get("state") == "active_allocated" and blk.get("frames"):
                    live[(_int(seg.get("device", 0)), _int(blk.get("address", 0)))] = (
                        _int(blk.get("size", 0)), blk.get("frames"))
    sites: dict[tuple[str, int, str, int], list[int]] = {}
    for (dev, _addr), (size, frames) in live.items():
        site = _site_frame(frames)
        if site is None:
            continue
        acc = sites.setdefault((*site, dev), [0, 0])
        acc[0] += size
        acc[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0][0], kv[0][1], kv[0][3]))
    return [{"file": f, "line": ln, "function": fn, "device": dev, "bytes": b, "count": c}
            for (f, ln, fn, dev), (b, c) in ranked[:top]]


def site_events(t_ns: int, sites: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """``EV_ALLOC_SITE`` events of one capture taken at ``t_ns`` (wall-clock ns): one per site. A path longer
    than the wire's strings keeps its end (the file's name), not its start."""
    out = []
    for s in sites:
        path = str(s.get("file") or "?")
        if len(path.encode("utf-8", "replace")) > MAX_STRING:
            path = "..." + path.encode("utf-8", "replace")[-(MAX_STRING - 3):].decode("utf-8", "ignore")
        out.append((EV_ALLOC_SITE, t_ns, _int(s.get("device", 0)) % 256, path, min(_int(s.get("line", 0)), 2**32 - 1),
                    str(s.get("function") or "?"), _int(s.get("bytes", 0)), min(_int(s.get("count", 0)), 2**32 - 1)))
    return out


class TensorSuspect:
    """A cheap local check of the probe's samples: the allocated floor of a device is rising.

    Over the last ``window_s``, the lowest allocated bytes of its last third exceed those of its first
    third by ``min_growth`` bytes (live tensors that are never freed; a transient peak cannot do that).
    """

    def __init__(self, window_s: float = 900.0, min_growth: int = 256 * 2**20) -> None:
        self.window_s = window_s
        self.min_growth = min_growth
        self.samples: dict[int, list[tuple[float, int]]] = {}

    def add(self, t: float, device: int, allocated: int) -> bool:
        """Record one sample; True when the device's allocated floor is rising."""
        s = self.samples.setdefault(device, [])
        s.append((t, allocated))
        while s and t - s[0][0] > self.window_s:
            s.pop(0)
        if len(s) < 6 or t - s[0][0] < 0.9 * self.window_s:
            return False
        third = self.window_s / 3
        first = min(v for ts, v in s if ts <= s[0][0] + third)
        last = min(v for ts, v in s if ts >= t - third)
        return last - first >= self.min_growth


class HistoryCapture:
    """The second stage: one bounded recording of the allocator's history, then the growing sites.

    Args:
        seconds: how long the history records.
        max_entries: the history's ring size (``max_entries`` of ``_record_memory_history``).
        top: sites reported.
        cooldown_s: no new recording sooner than this after one ended.
        torch_module: the torch module (default: the loaded one, never imported here).
        clock: monotonic seconds.
    """

    def __init__(self, seconds: float = HISTORY_SECONDS, max_entries: int = HISTORY_MAX_ENTRIES,
                 top: int = HISTORY_TOP, cooldown_s: float = 3600.0, torch_module: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self.top = top
        self.cooldown_s = cooldown_s
        self._torch = torch_module
        self.clock = clock
        self.state = "idle"  # idle | recording | failed
        self.until = 0.0
        self.ended = -float("inf")
        self.sites: list[dict[str, Any]] = []
        self.captures = 0
        self.last_error = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HistoryCapture | None:
        """A capture when ``INFERWATCH_TORCH_HISTORY`` is 1/true/yes, else None."""
        env = os.environ if environ is None else environ
        return cls() if env.get(HISTORY_ENV, "").strip().lower() in ("1", "true", "yes") else None

    def _memory(self) -> Any:
        torch = self._torch if self._torch is not None else sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return torch.cuda.memory

    def start(self) -> bool:
        """Switch the history on (True), unless recording, failed, cooling down or torch/CUDA is not up."""
        now = self.clock()
        if self.state != "idle" or now - self.ended < self.cooldown_s:
            return False
        try:
            mem = self._memory()
            if mem is None:
                return False
            mem._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=self.max_entries)
        except Exception as e:
            self._fail(e)
            return False
        self.state, self.until = "recording", now + self.seconds
        return True

    def poll(self) -> list[dict[str, Any]] | None:
        """When the recording is due to end: snapshot, switch off, and return the sites (else None)."""
        if self.state != "recording" or self.clock() < self.until:
            return None
        mem = None
        try:
            mem = self._memory()
            if mem is None:
                raise RuntimeError("CUDA is no longer initialised")
            snap = mem._snapshot()
        except Exception as e:
            self._fail(e, mem)
            return None
        self._stop(mem)
        if self.state == "failed":
            return None
        self.state, self.ended = "idle", self.clock()
        try:
            self.sites = growing_sites(snap if isinstance(snap, Mapping) else {}, self.top)
        except Exception as e:  # a snapshot of another shape than documented
            self.last_error = f"{type(e).__name__}: {e}"
            self.sites = []
        self.captures += 1
        return self.sites

    def _stop(self, mem: Any) -> None:
        try:
            if mem is not None:
                mem._record_memory_history(enabled=None)
        except Exception as e:
            self._fail(e)

    def _fail(self, e: Exception, mem: Any = None) -> None:
        self.last_error = f"{type(e).__name__}: {e}"
        if self.state == "recording":
            self.state = "idle"  # switch it off before giving up
            self._stop(mem)
        self.state = "failed"


class AllocatorProbe:
    """Samples allocator stats at a fixed interval.

    Args:
        interval_s: seconds between samples.
        source: the stats source; default :func:`torch_stats`.
        clock: wall-clock nanoseconds for the sample time.
        history: the second stage (default: :meth:`HistoryCapture.from_env`, off unless
            ``INFERWATCH_TORCH_HISTORY`` is set); it starts when ``suspect`` says the allocated floor rises.
        suspect: the check that starts the second stage (default :class:`TensorSuspect`).
    """

    def __init__(
        self, interval_s: float, source: StatsSource | None = None, clock: Callable[[], int] = time.time_ns,
        history: HistoryCapture | None = None, suspect: TensorSuspect | None = None,
    ) -> None:
        self.history = history if history is not None else HistoryCapture.from_env()
        self.suspect = suspect or TensorSuspect()
        self.interval_s = interval_s
        if source is None and not torch_installed():
            logger.warning(NO_TORCH_NOTICE)
        self.source: StatsSource = source or torch_stats
        self.clock = clock
        self.next_due = 0.0
        self.samples = 0
        self.errors = 0
        self.last_error = ""

    def due(self, now: float) -> bool:
        """True when a sample is due at monotonic time ``now`` (and schedules the next)."""
        if now < self.next_due:
            return False
        self.next_due = now + self.interval_s
        return True

    def sample(self) -> list[tuple[Any, ...]]:
        """One EV_ALLOC event per device. Never raises; failures set ``last_error``."""
        self.last_error = ""
        try:
            stats = self.source()
            t = self.clock()
            out: list[tuple[Any, ...]] = []
            default_exp = None
            for dev, st in stats.items():
                vals = [_int(st.get(k, 0)) for k in STAT_KEYS]
                exp = st.get("expandable_segments")
                if exp is None:
                    if default_exp is None:
                        default_exp = expandable_segments_from_env()
                    exp = default_exp
                out.append((EV_ALLOC, t, int(dev), *vals, bool(exp)))
                if self.history is not None and self.suspect.add(t / 1e9, int(dev), vals[0]):
                    self.history.start()
            self.samples += len(out)
            if self.history is not None and self.history.poll() is not None and self.history.sites:
                logger.warning("inferwatch: live tensor bytes grew at: %s", "; ".join(
                    f"{s['file']}:{s['line']} ({s['function']}) {s['bytes']} bytes in {s['count']}"
                    for s in self.history.sites))
                # The sites travel to the sidecar once, with this sample (/v1/status and the episode show them).
                out.extend(site_events(t, self.history.sites))
            return out
        except Exception as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return []


def _int(v: Any) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):
        return 0
    return n if n > 0 else 0
