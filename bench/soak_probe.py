"""Runs ``inferwatch sidecar`` with a probe that bench/soak.py reads at the end (``--probe``).

``python bench/soak_probe.py OUT.json <sidecar flags>`` starts the sidecar as the CLI does and,
on SIGUSR1, writes to OUT.json from inside the process:

- **heap**: the bytes reachable from each part of the sidecar (the aggregator's label sets, the
  pipeline, the OTLP receiver, every component and the largest attributes of each), measured by
  walking the objects (``sys.getsizeof`` over everything reachable, each object counted once,
  in the order listed, so a buffer shared by two parts counts for the first);
- **tracemalloc** (only when ``PYTHONTRACEMALLOC`` is set in the environment): the 25 source lines
  that allocated most of what is still live;
- **scrape**: the CPU seconds one scrape spends in each collector (aggregator, pipeline, OTLP,
  every component) and in rendering the text, OpenMetrics and protobuf expositions, and the
  samples per family; each taken as the median of 3 runs;
- **rss**: the resident set, then after a garbage collection, then after glibc's ``malloc_trim``
  (what freed memory the allocator still held);
- **gc**: the pauses of Python's cyclic garbage collector during the traffic, per generation (count,
  total, max, p99 in ms): a collection holds the interpreter, so every thread, the scrape's too, waits;
- **modules**: how many modules the process has imported (per top-level package of 10 or more), and whether
  ``scipy.stats`` is among them (the idle baseline: bench/idle_rss.py);
- **scrape_wait_ms**: how long the ``/metrics`` route itself took (waiting for, or taking, a render),
  as the server measured it, apart from the time to send the body.
- **scrape_served_ms**: the whole ``/metrics`` request inside the server, from the ASGI call (the
  request parsed) to the answer handed to the socket; what the scraper sees beyond it is the
  connection, the request's parsing and the body's transfer.

It measures the live process the soak attacked, so the figures are of the state the attack left.
"""

from __future__ import annotations

import gc
import json
import signal
import statistics
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
         types.CodeType, types.FrameType, threading.Thread)


def _reach(root: Any, seen: set[int], limit: int = 5_000_000) -> int:
    """Bytes reachable from ``root`` not already in ``seen`` (classes, modules, functions and threads excluded)."""
    total = 0
    stack = [root]
    n = 0
    while stack and n < limit:
        o = stack.pop()
        i = id(o)
        if i in seen or isinstance(o, _SKIP):
            continue
        seen.add(i)
        n += 1
        try:
            total += sys.getsizeof(o)
        except TypeError:
            continue
        if isinstance(o, (str, bytes, bytearray, int, float, bool, type(None))):
            continue
        stack.extend(gc.get_referents(o))
    return total


def _heap(side: Any) -> dict[str, Any]:
    seen: set[int] = set()
    # Shared infrastructure first, so it is not charged to the first part that refers to it.
    for shared in (side.cfg, side.ctx, side.registry, sys.modules):
        _reach(shared, seen)
    parts: dict[str, Any] = {}

    def part(name: str, obj: Any) -> None:
        attrs = {}
        d = getattr(obj, "__dict__", None) or {k: getattr(obj, k) for k in getattr(type(obj), "__slots__", ())
                                                if hasattr(obj, k)}
        for k, v in d.items():
            attrs[k] = _reach(v, seen)
        top = sorted(((v, k) for k, v in attrs.items() if v), reverse=True)[:8]
        parts[name] = {"bytes": sum(attrs.values()) + _reach(obj, seen),
                       "largest": {k: v for v, k in top}}

    part("aggregator", side.aggregator)
    part("pipeline", side.pipeline)
    part("traces", side.traces)
    for s in side.slots:
        if s.component is not None:
            part(f"component:{s.name}", s.component)
    part("http", side.http)
    part("otlp_push", side.otlp)
    return parts


def _median_time(fn: Any, runs: int = 3) -> tuple[float, Any]:
    """The median CPU seconds of this thread in ``fn()`` (not wall time: the machine may be shared)."""
    times, out = [], None
    for _ in range(runs):
        t = time.thread_time()
        out = fn()
        times.append(time.thread_time() - t)
    return statistics.median(times), out


def _scrape(side: Any) -> dict[str, Any]:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_om

    from inferwatch_sidecar.metrics import protobuf

    collect: dict[str, float] = {}
    collect["aggregator"] = _median_time(lambda: list(side.aggregator.collect()))[0]
    collect["pipeline+core rest"] = _median_time(lambda: list(side._collect_core()))[0] - collect["aggregator"]
    collect["traces"] = _median_time(lambda: list(side.traces.collect()))[0]
    for s in side.slots:
        if s.component is not None and s.state == "running":
            collect[f"component:{s.name}"] = _median_time(lambda c=s.component: list(c.collect()))[0]
    samples: dict[str, int] = {}
    for fam in side.exposition.collect():
        samples[fam.name] = samples.get(fam.name, 0) + len(fam.samples)
    render = {
        "text": _median_time(lambda: generate_latest(side.exposition))[0],  # type: ignore[arg-type]
        "openmetrics": _median_time(lambda: generate_om(side.exposition))[0],  # type: ignore[arg-type]
        "protobuf": _median_time(lambda: protobuf.encode(side.exposition))[0],
        "route /metrics text": _median_time(lambda: side._render_scrape("text/plain"))[0],
    }
    return {"collect_s": {k: round(v, 4) for k, v in collect.items()},
            "render_s": {k: round(v, 4) for k, v in render.items()},
            "samples": dict(sorted(samples.items(), key=lambda kv: -kv[1])),
            "text_bytes": len(generate_latest(side.exposition))}  # type: ignore[arg-type]


class _GcPauses:
    """Collects the duration of every cyclic garbage collection, per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms[int(info["generation"])].append((time.perf_counter() - self._t0) * 1e3)

    def summary(self) -> dict[str, Any]:
        return {f"gen{g}": _ms_summary(v) for g, v in self.ms.items()}


def _ms_summary(v: list[float]) -> dict[str, float]:
    if not v:
        return {"count": 0}
    v = sorted(v)
    return {"count": len(v), "total_ms": round(sum(v), 1), "p50_ms": round(v[len(v) // 2], 2),
            "p99_ms": round(v[min(len(v) - 1, int(len(v) * 0.99))], 2), "max_ms": round(v[-1], 2)}


def _pymalloc() -> dict[str, float]:
    """Python's small-object allocator: MiB in its arenas, in live blocks, and free inside them (fragmentation)."""
    import os
    import tempfile

    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, val = line.rpartition("=")
        key = key.strip().lstrip("#").strip()
        if key in ("arenas allocated current", "bytes in allocated blocks", "bytes in available blocks",
                   "bytes in arenas"):
            try:
                n = float(val.replace(",", "").strip())
            except ValueError:
                continue
            out[key] = round(n / 2**20, 1) if key.startswith("bytes") else n
    return out


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _time_scrapes(sidecar: Any) -> tuple[list[float], list[float]]:
    """Time every ``/metrics`` route call (``scrape_wait_ms``) and whole request inside the server
    (``scrape_served_ms``), in ms; the lists fill as scrapes come."""
    waits: list[float] = []
    served: list[float] = []

    def timed(orig: Any) -> Any:
        def timed_scrape(self: Any, accept: str) -> Any:
            t = time.perf_counter()
            try:
                return orig(self, accept)
            finally:
                waits.append((time.perf_counter() - t) * 1e3)

        return timed_scrape

    sidecar._scrape = timed(sidecar._scrape)
    if hasattr(sidecar, "_scrape_gzip"):  # the route a scraper that takes gzip goes through
        sidecar._scrape_gzip = timed(sidecar._scrape_gzip)
    from inferwatch_sidecar.http import server as http_server

    orig_call = http_server._App.__call__

    async def timed_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        t = time.perf_counter()
        try:
            await orig_call(self, scope, receive, send)
        finally:
            if scope.get("type") == "http" and scope.get("path") == "/metrics":
                served.append((time.perf_counter() - t) * 1e3)

    http_server._App.__call__ = timed_call  # type: ignore[method-assign]
    return waits, served


def main() -> int:
    out = Path(sys.argv[1])
    sys.argv = ["inferwatch", "sidecar", *sys.argv[2:]]
    from inferwatch_sidecar import daemon

    holder: list[Any] = []
    orig_init = daemon.Sidecar.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        orig_init(self, *a, **k)
        holder.append(self)

    daemon.Sidecar.__init__ = init  # type: ignore[method-assign]
    pauses = _GcPauses()
    waits, served = _time_scrapes(daemon.Sidecar)

    def probe(signum: int, frame: Any) -> None:
        def work() -> None:
            side = holder[0]
            names = list(sys.modules)  # what the traffic made it import, before this probe's own scrape
            tops: dict[str, int] = {}
            for name in names:
                tops[name.split(".")[0]] = tops.get(name.split(".")[0], 0) + 1
            doc: dict[str, Any] = {"modules": {"count": len(names), "scipy.stats": "scipy.stats" in names,
                                               "by_package": {k: v for k, v in sorted(tops.items()) if v >= 10}},
                                   "gc": {**pauses.summary(), "tracked_objects": len(gc.get_objects()),
                                          "frozen_objects": gc.get_freeze_count(), "thresholds": gc.get_threshold()},
                                   "scrape_wait_ms": _ms_summary(list(waits)),
                                   "scrape_served_ms": _ms_summary(list(served)),
                                   "scrape": _scrape(side), "heap": _heap(side)}
            import tracemalloc

            if tracemalloc.is_tracing():
                snap = tracemalloc.take_snapshot()
                doc["tracemalloc_total_mib"] = round(sum(s.size for s in snap.statistics("filename")) / 2**20, 1)
                doc["tracemalloc"] = [f"{s.size / 2**20:8.2f} MiB {s.count:9d} {s.traceback[0]}"
                                      for s in snap.statistics("lineno")[:25]]
            doc["rss_mib"] = _rss_mib()
            doc["pymalloc_mib"] = _pymalloc()
            gc.collect()
            doc["rss_mib_after_gc"] = _rss_mib()
            try:
                import ctypes

                ctypes.CDLL("libc.so.6").malloc_trim(0)
                doc["rss_mib_after_malloc_trim"] = _rss_mib()
            except (OSError, AttributeError):
                pass
            out.write_text(json.dumps(doc, indent=1) + "\n")

        threading.Thread(target=work, name="soak-probe").start()

    signal.signal(signal.SIGUSR1, probe)
    from inferwatch_sidecar.cli import main as cli_main

    return int(cli_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
