"""Issue 28: after a burst of large objects is freed, the sidecar gives the freed heap back (RSS comes down).

glibc keeps freed heap pages once its mmap threshold has risen (it does after the first large free), so
a burst of 1 MiB bodies, freed while something small sits above them in the heap, stays in the RSS
until ``malloc_trim``. The daemon's housekeeping tick trims when the heap holds enough free. The burst
runs in a process of its own, so the test runner's heap (and what it set with mallopt) plays no part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferwatch_sidecar.daemon.heap import HeapTrimmer
from tests.helpers.paths import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not HeapTrimmer(1, 1).available,
                                reason="needs glibc's malloc_trim and mallinfo2")


SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.daemon import Sidecar
    from inferwatch_sidecar.daemon.heap import rss_bytes

    MIB = 1 << 20
    s = Sidecar(load_config(environ={}, overrides={
        "gpu": {"enabled": False}, "drift": {"enabled": False}, "http": {"port": 0},
        "ingest": {"socket": sys.argv[1]}, "heap_trim_interval_s": 0.01, **json.loads(sys.argv[2])}), environ={})
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    libc.free(libc.malloc(8 * MIB))  # a large block freed (a body, say) raises glibc's mmap threshold to its size
    pins, blocks = [], []
    for i in range(120):  # 120 MiB of 1 MiB bodies, each followed by a 64 KiB object that stays (no hole fits it)
        blocks.append(b"x" * (MIB - 64 - i))
        pins.append(b"y" * (64 * 1024 + i))
    del blocks
    free, before = s.heap.free_bytes(), rss_bytes()
    s.tick()
    print(json.dumps({"free": free, "before": before, "after": rss_bytes(), "heap": s.status()["heap"]}))
""")


def _run(tmp_path: Path, overrides: dict[str, object]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO / "sidecar")])}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "s.sock"), json.dumps(overrides)],
                         capture_output=True, text=True, timeout=120, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_housekeeping_gives_a_freed_burst_back(tmp_path: Path) -> None:
    r = _run(tmp_path, {})
    assert r["free"] >= 100 << 20, r  # the burst really sits freed in the heap
    assert r["before"] - r["after"] >= 80 << 20, r
    assert r["heap"]["trims"] == 1 and r["heap"]["returned_bytes"] >= 80 << 20, r


def test_trimming_can_be_turned_off(tmp_path: Path) -> None:
    r = _run(tmp_path, {"heap_trim_free_bytes": 0})
    assert r["heap"]["trims"] == 0 and r["before"] - r["after"] < 20 << 20, r


def test_a_heap_with_little_free_is_not_trimmed() -> None:
    t = HeapTrimmer(min_free_bytes=1 << 40, interval_s=0.0)
    assert t.maybe_trim(1.0) == 0 and t.trims == 0


def test_the_served_process_runs_with_the_configured_collector_and_is_restored() -> None:
    import gc
    import threading

    from inferwatch_sidecar.daemon.heap import tuned_gc

    before = gc.get_threshold()
    seen: list[tuple[object, ...]] = []
    with tuned_gc((12_345, 7, 99)):
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))
        t = threading.Thread(target=lambda: seen.append((gc.get_threshold(),)))  # the setting is process-wide
        t.start()
        t.join()
    assert seen == [((12_345, 7, 99), True), ((12_345, 7, 99),)]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_collector_clock_counts_the_collections_made_while_serving_and_only_those() -> None:
    import gc

    from inferwatch_sidecar.daemon.heap import GcClock, tuned_gc

    clock = GcClock()
    with tuned_gc((12_345, 7, 99), clock):
        gc.collect(0)
        gc.collect(1)
        assert clock in gc.callbacks
    gc.collect(0)
    assert clock not in gc.callbacks
    assert clock.collections[0] >= 1 and clock.collections[1] >= 1
    st = clock.status()
    assert st["collections"] == clock.collections and all(s >= 0.0 for s in st["seconds"])



def test_glibc_arenas_are_capped_unless_the_environment_chose() -> None:
    """mallopt(M_ARENA_MAX) is called where glibc has it; MALLOC_ARENA_MAX in the environment, or 0, leaves it."""
    import ctypes.util

    from inferwatch_sidecar.daemon.heap import cap_arenas

    assert cap_arenas(0, environ={}) is False
    assert cap_arenas(2, environ={"MALLOC_ARENA_MAX": "8"}) is False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if hasattr(libc, "mallopt"):  # glibc (the CI's and the images' C library)
        assert cap_arenas(64, environ={}) is True  # a high cap: the test process keeps its arenas
    else:
        assert cap_arenas(2, environ={}) is False
