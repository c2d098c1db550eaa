"""bench/ingest.py's ``--callgrind``: instructions per event of the live path in one thread, under valgrind.

A replica of the daemon (its pipeline and default components, drained every 20 frames as their
workers do) runs in a child process (``ingest.py --replica-child``) once without and once with the
measured pass; the difference over the events is the cost per event, this tree and a baseline's
side by side. Split out of ``ingest.py`` (issue 23).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _harness import STABLE_HASH_ENV, CallgrindFailed, callgrind_run
from _ingest_trees import baseline_tree, tree_env

#: The script whose ``--replica-child`` runs the replica (with the tree under test on its path).
INGEST = Path(__file__).resolve().with_name("ingest.py")
N_FEATURES = 20


def replica_frames(n_req: int, first: int, per_frame: int = 100) -> list[bytes]:
    """Frames as the live SDK producer's: a 3-stage REQUEST and a 20-feature RECORD per request, 100 events a frame."""
    from inferwatch.wire import EV_RECORD, EV_REQUEST, Encoder

    enc = Encoder(4242, 42)
    now = 1_700_000_000_000_000_000
    feats = {f"f{j}": float(j) for j in range(N_FEATURES)}
    out: list[bytes] = []
    evs: list[Any] = []
    for i in range(first, first + n_req):
        d1, d2, d3 = 100_000 + i % 997, 2_000_000 + i % 9973, 50_000 + i % 97
        # The SDK's order: record() inside the request scope is buffered before the REQUEST its exit writes.
        evs.append((EV_RECORD, ("bench", "m", "v1"), now, f"{i:016x}", "cat", 0.9, None, feats))
        evs.append((EV_REQUEST, ("bench", "m", "v1"), now, d1 + d2 + d3 + 50_000, 0, None, f"{i:016x}", None,
                    [("preprocess", d1, None), ("inference", d2, None), ("postprocess", d3, None)]))
        if len(evs) >= per_frame:
            out += enc.encode(evs)
            evs = []
    return out + (enc.encode(evs) if evs else [])


#: The replica's simulated wall clock: its start (inside a 60-s window, so none ends in a run), and the seconds
#: each frame of 100 events advances it (40k events/s).
SIM_START = 1_700_000_010.0
FRAME_S = 100 / 40_000

#: Requests through the replica before the measured pass: past drift's warm-up reference (5,000 records).
REPLICA_WARM = 6000


#: The components of trees without a registry (before issue 23): every one enabled by default then but the GPU monitor.
_OLD_COMPONENTS = ("drift", "tail", "canary")


def replica_components() -> tuple[str, ...]:
    """The components the replica may run: every one enabled by default but the GPU monitor (it needs a device),
    read from the registry of the tree on the path."""
    try:
        from inferwatch_sidecar.components import registry
        from inferwatch_sidecar.config import SidecarConfig
    except ImportError:
        return _OLD_COMPONENTS
    cfg = SidecarConfig()
    return tuple(n for n in registry.names() if n != "gpu" and getattr(getattr(cfg, n, None), "enabled", False))


#: Frames between two drains of each component: a worker's 1-s tick at 20k events/s (frames of 100 events).
#: It sets how long staged events live, so what the collector sees of them (until issue 23's GC pass the
#: replica drained every 20 frames, 2k events/s, and staged events rarely met a young collection).
DRAIN_FRAMES = 200
#: How the replica's collector runs: "served" (as ``Sidecar.run``), "default" (CPython's), "off", or "A,B,C".
GC_MODES = ("served", "default", "off")


def replica_gc(cfg: Any, mode: str) -> None:
    """The collector as ``mode`` says; "served" is what a served sidecar runs (``Sidecar.run``'s ``tuned_gc``:
    start-up's objects frozen, ``cfg.gc_thresholds`` set; trees without the setting were served with CPython's
    defaults and are left so). Until issue 23's GC pass the replica ran every tree at CPython's defaults."""
    import gc

    if mode == "default":
        return
    if mode == "off":
        gc.disable()
        return
    thresholds = getattr(cfg, "gc_thresholds", None) if mode == "served" else tuple(map(int, mode.split(",")))
    if thresholds is not None:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*thresholds)


def replica_child(measure: bool, components: str, n_req: int) -> None:
    """The live sidecar's work in one thread: the daemon's pipeline and ``components`` ("all", "none" or a
    comma-separated list), frames in, each component drained every ``IW_BENCH_DRAIN_FRAMES`` frames (its
    worker's pass; default :data:`DRAIN_FRAMES`), the collector as ``IW_BENCH_GC`` says (:func:`replica_gc`).
    Under callgrind, run once without and once with the measured pass; the difference is what ``n_req`` more
    requests cost."""
    import os

    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar

    known = replica_components()
    on = set(known) if components == "all" else set() if components == "none" else set(components.split(","))
    doc: dict[str, Any] = {"gpu": {"enabled": False}}
    doc.update({name: {"enabled": name in on} for name in known})
    # A simulated wall clock, FRAME_S a frame: windows rotate as a live sidecar's would at 40k events/s, and
    # the two runs under callgrind (without and with the measured pass) see the same times. On the real
    # clock a run that crossed a window's end (tail's 60 s; valgrind runs take minutes) paid its analysis
    # and the other did not: the split's figures moved by 2k instructions an event between runs.
    sim = [SIM_START]
    sc = Sidecar(SidecarConfig.model_validate(doc), clock=lambda: sim[0])
    if on:
        sc._build_components()
    comps = [s.component for s in sc.slots if s.component is not None]
    # Components that take no records (engines, saturation) have nothing staged to drain: they work on
    # their own threads in the daemon, which the replica does not run.
    drained = [c for c in comps if hasattr(c, "drain")]
    datagram = sc.pipeline.datagram
    every = int(os.environ.get("IW_BENCH_DRAIN_FRAMES", DRAIN_FRAMES))
    replica_gc(sc.cfg, os.environ.get("IW_BENCH_GC", "served"))

    passes = [0]

    def run(frames: list[bytes]) -> None:
        for i, f in enumerate(frames):
            sim[0] += FRAME_S
            datagram(f, "unix")
            if i % every == every - 1:
                passes[0] += 1
                for c in drained:
                    c.drain()
        passes[0] += 1
        for c in drained:
            c.drain()

    warm, frames = replica_frames(REPLICA_WARM, 0), replica_frames(n_req, 10**6)
    run(warm)
    if measure:
        run(frames)
        assert sc.pipeline.totals()["events"] == 2 * (REPLICA_WARM + n_req)
    print(json.dumps({"components": [c.name for c in comps], "drain_passes": passes[0]}))


def callgrind_count(tree: Path | None, components: str, n_req: int, measure: int,
                    knobs: dict[str, str]) -> tuple[int, list[str]]:
    """Instructions (all threads, user space) of one replica run from ``tree`` (None: this checkout)."""
    # One string hashing for every run: dict and set layouts (label caches, schemas) then match, and two
    # runs differ only in the work measured (the counts moved by 3-5% between runs without it).
    run = callgrind_run([sys.executable, str(INGEST), "--replica-child", str(measure), components, str(n_req)],
                        base_env=tree_env(tree), env={**STABLE_HASH_ENV, **knobs})
    return run.instructions, json.loads(run.stdout.strip().splitlines()[-1])["components"]


def callgrind_report(baseline: str | None, n_req: int, split: bool = False, jobs: int = 2,
                     gc_mode: str = "served", drain_frames: int = DRAIN_FRAMES) -> dict[str, Any]:
    """Instructions per event: (run with the measured pass - run without) / events, per tree and components.

    The valgrind runs are independent, so ``jobs`` of them run at once (instruction counts do not
    depend on what else runs); the baseline tree is measured without and with every component.
    """
    from concurrent.futures import ThreadPoolExecutor

    trees: list[tuple[str, Path | None]] = [("now", None)]
    if baseline:
        bt = baseline_tree(baseline)
        if bt is not None:
            trees.append((f"base {baseline}", bt))
    knobs = {"IW_BENCH_GC": gc_mode, "IW_BENCH_DRAIN_FRAMES": str(drain_frames)}
    print(f"== callgrind: instructions per event, the live path in one thread ({n_req} requests = {2 * n_req} "
          f"events after {REPLICA_WARM} warm-up requests; frames of 100 events; components drained every "
          f"{drain_frames} frames; collector: {gc_mode})")
    cases = [(label, tree, comps) for label, tree in trees
             for comps in ("none", *(replica_components() if split and tree is None else ()), "all")]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {(label, comps, m): pool.submit(callgrind_count, tree, comps, n_req, m, knobs)
                for label, tree, comps in cases for m in (0, 1)}
        out: dict[str, Any] = {}
        for label, _, comps in cases:
            try:
                (c0, _), (c1, names) = futs[(label, comps, 0)].result(), futs[(label, comps, 1)].result()
            except CallgrindFailed as e:  # a baseline tree that cannot run the replica: its last line says why
                print(f"  {label:14} {comps:44} n/a ({str(e.code).strip().splitlines()[-1]})")
                continue
            ir = (c1 - c0) / (2 * n_req)
            what = f"pipeline + {', '.join(names)}" if names else "pipeline only (decode, account, aggregate)"
            print(f"  {label:14} {what:44} {ir:10,.0f}")
            out[f"{label}/{comps}"] = ir
    return out
