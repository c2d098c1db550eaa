"""Sidecar ingest benchmark: how many events per second one core decodes and aggregates.

Three parts, run side by side in one go:

1. **In-process, same frames** (medians of several runs): decode only; decode + our
   aggregation (the sidecar's pipeline); decode + the same aggregation done with
   prometheus_client's ``labels(...).observe`` (the baseline we replaced). Frames come from
   the SDK's own encoder: each request is a REQUEST event (3 stages) and a RECORD event with
   20 features. The ``--baseline`` revision's own tree (``git archive``) runs the same
   variants in a child process after each round, so its column survives moved modules.
2. **Live sidecar, real SDK senders at rising offered rates**, every default component on
   (drift, tail, canary, engines, saturation, capacity; not the GPU monitor, which needs a device):
   SDK-instrumented producer processes (``inferwatch.configure`` + ``request``/``stage``/``record``) pace themselves to
   the offered rate over the Unix socket. For each rate: events received, the sidecar's CPU
   per 1,000 events (from /proc, all its threads: ingest and the components' workers), events
   per CPU-second (= events/s per core), and the drop rate (SDK-reported drops + sidecar drops
   + lost frames, over events offered), and apart from it the events a component refused because
   its stage was full (``staging_full``: received, but not analysed by that component).
3. **Capacity**: one producer with no pacing; same figures.

On a machine with two or more CPUs the live sidecar (every thread) runs on the last CPU and the producers
on the others (``--no-pin``: no pinning): sharing a core with a producer, the sidecar's CPU per event moved
by 10-20% between runs of the same tree, with which core the scheduler put it on.

``--callgrind`` instead counts instructions per event of the live path in one thread (the
daemon's pipeline and default components, drained as their workers do) under valgrind, this
tree and ``--baseline`` side by side: the figure that does not move with the machine's load.
``--split`` adds each component alone, which says where the instructions go.

An "event" is one wire event (REQUEST or RECORD); a request with a 20-feature record is two.

Usage::

    python bench/ingest.py            # full: rates 5k..160k events/s, 4 s each
    python bench/ingest.py --quick    # 3 rates, 1.5 s each (about 20 s)
    python bench/ingest.py --callgrind --split --baseline c2f34c8   # instructions per event (~20 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The baseline and callgrind runners live beside this script (issue 23); bench/ is a folder of scripts.
import _harness  # noqa: E402, F401  (puts the checkout on sys.path: tests.helpers)
from _ingest_callgrind import DRAIN_FRAMES, N_FEATURES, callgrind_report, replica_child  # noqa: E402
from _ingest_trees import REPO, baseline_tree, read_frames, tree_api, tree_env, write_frames  # noqa: E402

# ---------------------------------------------------------------------------- producer


def producer(sock: str, rate_req: float, duration: float, seed: int) -> None:
    """Run as a subprocess: send requests through the real SDK at ``rate_req`` requests/s (0 = flat out)."""
    import inferwatch

    inferwatch.configure(service="bench", model="m", model_version="v1", sidecar="unix://" + sock,
                         buffer_size=65536, hello_interval_s=0.5)
    feats = {f"f{j}": float(j + seed) for j in range(N_FEATURES)}
    t0 = time.perf_counter()
    n = 0
    end = t0 + duration
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        target = int((now - t0) * rate_req) + 1 if rate_req else n + 200
        while n < target:
            with inferwatch.request():
                with inferwatch.stage("preprocess"):
                    pass
                with inferwatch.stage("inference"):
                    pass
                with inferwatch.stage("postprocess"):
                    pass
                inferwatch.record(prediction="cat", confidence=0.9, features=feats)
            n += 1
        if rate_req:
            time.sleep(0.001)
    inferwatch.flush(timeout=5)
    time.sleep(0.6)  # one HELLO round so the final drop counts reach the sidecar
    inferwatch.flush(timeout=5)
    st = inferwatch.stats()
    inferwatch.shutdown(timeout=5)
    print(json.dumps({"requests": n, "drops": st.get("drops", {})}))


# ---------------------------------------------------------------------------- part 1


#: The commit before the decode/aggregate fast paths: part 1 times its code side by side.
BASELINE_REV = "ae1b302"


class StagingComponent:
    """The component handoff as the drift engine does it: take RECORD events, stage them under a lock."""

    def __init__(self) -> None:
        import threading

        from inferwatch.wire import EV_RECORD

        self.record_types = frozenset({EV_RECORD})
        self.lock = threading.Lock()
        self.staged: list[Any] = []

    def handle(self, pid: int, producer_id: int, records: list[Any]) -> None:
        with self.lock:
            if len(self.staged) < 1_000_000:
                self.staged.extend(records)


def timed_variants(api: dict[str, Any], frames: list[bytes], n_events: int) -> dict[str, Any]:
    """decode / aggregate / pipeline / pipeline + hand-off over ``frames``, with ``api``'s classes."""
    dec = api["Decoder"]()
    decoded = [dec.decode(f).records for f in frames]
    assert sum(len(r) for r in decoded) == n_events
    # CPU time of this thread: "per core" literally, and not inflated by other processes
    # holding the CPU on a busy machine (wall time would be).
    clock = time.thread_time

    def decode() -> float:
        d = api["Decoder"]()
        t = clock()
        for f in frames:
            d.decode(f)
        return clock() - t

    def aggregate() -> float:
        agg = api["Aggregator"](api["ComponentContext"]())
        counts = [0] * 16
        t = clock()
        for r in decoded:
            agg.process(r, counts)
        el = clock() - t
        assert sum(counts) == n_events
        return el

    def pipeline_with(handoff: bool) -> Any:
        def run() -> float:
            comp = StagingComponent()
            pipe = api["Pipeline"](api["Aggregator"](api["ComponentContext"]()),
                                   dispatch=[("drift", comp.record_types, comp.handle)] if handoff else None)
            t = clock()
            for f in frames:
                pipe.datagram(f, "unix")
            el = clock() - t
            assert sum(pipe.counts["unix"]) == n_events
            assert not handoff or len(comp.staged) == n_events // 2
            return el
        return run

    out = {"decode": decode, "aggregate": aggregate, "pipeline": pipeline_with(False),
           "pipeline_handoff": pipeline_with(True)}
    if api.get("loop") is not None:
        def decode_compiled() -> float:
            d = api["Decoder"](loop=api["loop"])
            t = clock()
            for f in frames:
                d.decode(f)
            return clock() - t
        out["decode_compiled"] = decode_compiled
    return out


def variants_child(frames_path: str, n_events: int) -> None:
    """Run as a subprocess with a baseline tree on the path: one timing of each variant, as JSON."""
    fns = timed_variants(tree_api(), read_frames(frames_path), n_events)
    print(json.dumps({k: fn() for k, fn in fns.items()}))


def request_frames(n_req: int) -> tuple[list[bytes], int]:
    """Part 1's frames, from the SDK's encoder: a 3-stage REQUEST and a 20-feature RECORD per request; and the events."""
    import random

    from inferwatch.wire import EV_RECORD, EV_REQUEST, Encoder

    enc = Encoder(os.getpid(), 42)
    now = time.time_ns()
    rnd = random.Random(7)
    evs: list[Any] = []
    for i in range(n_req):
        # Log-normal stage latencies (medians 0.1 ms, 2 ms, 50 us), so the histograms see a spread of buckets.
        d1, d2, d3 = (int(rnd.lognormvariate(mu, 1.0)) for mu in (11.5, 14.5, 10.8))
        evs.append((EV_REQUEST, ("bench", "m", "v1"), now, d1 + d2 + d3 + 50_000, 0, None, f"req-{i:08d}", None,
                    [("preprocess", d1, None), ("inference", d2, None), ("postprocess", d3, None)]))
        evs.append((EV_RECORD, ("bench", "m", "v1"), now, f"req-{i:08d}", "cat", 0.9, None,
                    {f"f{j}": float(i + j) for j in range(N_FEATURES)}))
    return enc.encode(evs), len(evs)


def prometheus_client_variant(decoded: list[list[Any]]) -> Any:
    """The same aggregation (requests, e2e and stage histograms with request-ID exemplars, records) with
    prometheus_client's labels(...).observe: what a daemon without its own arrays would do. One timing per call."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from inferwatch.wire import EV_RECORD, EV_REQUEST
    from inferwatch_sidecar.metrics import core as core_metrics

    clock = time.thread_time

    def prom_baseline() -> float:
        reg = CollectorRegistry()
        lab = ("service", "model", "model_version")
        req = Counter("b_requests", "", (*lab, "outcome"), registry=reg)
        e2e = Histogram("b_e2e_seconds", "", lab, buckets=core_metrics.LATENCY_BUCKETS, registry=reg)
        stg = Histogram("b_stage_seconds", "", (*lab, "stage"), buckets=core_metrics.LATENCY_BUCKETS, registry=reg)
        rec = Counter("b_records", "", lab, registry=reg)
        t = clock()
        for records in decoded:
            for ev in records:
                if ev[0] == EV_REQUEST:
                    svc, mo, ve = ev[1]
                    ex = {"request_id": ev[6]}
                    req.labels(svc, mo, ve, "ok").inc()
                    e2e.labels(svc, mo, ve).observe(ev[3] * 1e-9, ex)
                    for name, dur, _ in ev[8]:
                        stg.labels(svc, mo, ve, name).observe(dur * 1e-9, ex)
                elif ev[0] == EV_RECORD:
                    rec.labels(*ev[1]).inc()
        return clock() - t

    return prom_baseline


def in_process(repeats: int, n_req: int, baseline: str | None) -> dict[str, float]:
    frames, n_events = request_frames(n_req)
    import inferwatch.wire

    decoded = [inferwatch.wire.Decoder().decode(f).records for f in frames]
    tree = baseline_tree(baseline) if baseline else None
    frames_path = write_frames(frames) if tree is not None else None
    prom_baseline = prometheus_client_variant(decoded)

    fns: dict[str, Any] = dict(timed_variants(tree_api(), frames, n_events), prometheus_client=prom_baseline)
    if tree is not None:
        # Side by side, each tree in a child process of its own, in alternating order: the same process
        # history for both columns (a variant timed in this process after the others read up to 30% apart
        # from the same code in a fresh child on the loaded machine).
        fns = {"prometheus_client": prom_baseline}
    res: dict[str, list[float]] = {k: [] for k in fns}
    base_ok = tree is not None

    def child(t: Path | None, suffix: str) -> bool:
        r = subprocess.run([sys.executable, __file__, "--variants-child", str(frames_path), str(n_events)],
                           capture_output=True, text=True, env=tree_env(t), cwd=REPO, check=False)
        if r.returncode != 0:
            print(f"  ({'baseline ' + str(baseline) if t else 'this tree'} could not run the variants: "
                  f"{r.stderr.strip().splitlines()[-1:]})")
            return False
        for k, v in json.loads(r.stdout).items():
            res.setdefault(f"{k}{suffix}", []).append(v)
        return True

    for i in range(repeats):
        for k, fn in fns.items():  # interleaved, so load changes hit every variant alike
            res[k].append(fn())
        if base_ok:
            order = [(None, ""), (tree, "_base")] if i % 2 == 0 else [(tree, "_base"), (None, "")]
            for t, suffix in order:
                if not child(t, suffix):
                    if t is None:
                        raise SystemExit("this tree's variants failed in a child process")
                    base_ok = False
    if tree is not None and not base_ok:  # the baseline failed: time this tree here after all
        fns = timed_variants(tree_api(), frames, n_events)
        for _ in range(repeats):
            for k, fn in fns.items():
                res.setdefault(k, []).append(fn())
    if frames_path:
        os.unlink(frames_path)
    if not base_ok:
        res = {k: v for k, v in res.items() if not k.endswith("_base")}
    return part1_figures(res, n_events, len(frames), baseline if base_ok else None)


def part1_figures(res: dict[str, list[float]], n_events: int, n_frames: int, baseline: str | None) -> dict[str, Any]:
    """Medians of part 1's timings as us per event (decode, aggregate) or events/s (pipelines), per tree."""
    med = {k: statistics.median(v) for k, v in res.items()}
    out: dict[str, Any] = {"events": n_events, "frames": n_frames, "baseline": baseline}
    for k, v in med.items():
        key = k.removesuffix("_base")
        suffix = "_base" if k.endswith("_base") else ""
        if key.startswith("pipeline"):
            out[f"{key}{suffix}_ev_per_s"] = n_events / v
        else:
            out[f"{key}{suffix}_us_per_event"] = v / n_events * 1e6
    return out


# ---------------------------------------------------------------------------- part 2/3


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def scrape_totals(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as r:
        st = json.load(r)
    ing = st["ingest"]
    gc = st.get("heap", {}).get("gc", {})  # trees before the collector's clock: none
    nan = float("nan")
    # Events received but refused by a component's full stage (not in the drop rate: ingest took them).
    staging_full = sum(int(c["dropped"].get("staging_full", 0)) for c in st.get("components", {}).values()
                       if isinstance(c, dict) and isinstance(c.get("dropped"), dict))
    return {"events": ing["events"], "frames": ing["frames"], "dropped": sum(ing["dropped"].values()),
            "lost_frames": ing["lost_frames"], "decode_errors": sum(ing["decode_errors"].values()),
            "gc_n": gc.get("collections", [nan] * 3), "gc_s": gc.get("seconds", [nan] * 3),
            "staging_full": staging_full}


#: The warm-up row: offered events/s and seconds, then a wait for drift's first evaluation (:func:`drift_evaluated`).
#: Its one-time costs (drift's warm-up reference, built from the first ``drift.warmup_events`` = 5,000 records; the
#: first evaluation's import of scipy.special) are a start-up's, not an event's: the row is printed and kept out of the
#: median (until this row existed they fell in the first rates' rows, by when the 5-s evaluation came).
WARMUP = (5000.0, 2.5)


def drained(port: int, sent: float) -> dict[str, float]:
    """The sidecar's totals once it has taken what was queued: the events received reach ``sent``, or stop
    changing (frames lost on the way).

    Each /v1/status answer costs the sidecar about 3 ms of CPU, which a row would count as ingest work (0.5 us
    an event at 20k events/s over 1.5 s, 2 us at 5k, when it was asked three times or more a row), so it is
    asked once where nothing was lost. Until issue 23's third pass the loop asked until two answers agreed.
    """
    time.sleep(0.05)
    after = scrape_totals(port)
    last = -1.0
    while after["events"] < sent and after["events"] != last:
        last = after["events"]
        time.sleep(0.2)
        after = scrape_totals(port)
    return after


def drift_evaluated(port: int, timeout_s: float = 20.0) -> bool:
    """Wait until the drift component has evaluated a window against its warm-up reference (its first
    evaluation imports scipy.special, about 0.3 s of CPU once); False when it has not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as r:
            drift = json.load(r).get("components", {}).get("drift", {})
        models = drift.get("models") if isinstance(drift, dict) else None
        if not isinstance(models, list) or drift.get("state") != "running":
            return False  # no drift component: nothing to wait for
        if any(isinstance(m, dict) and "share_drifted" in m for m in models):
            return True
        time.sleep(0.25)
    print(f"warning: drift had not evaluated its first window {timeout_s:.0f} s after the warm-up")
    return False


def cpu_split(pin: bool) -> tuple[set[int], set[int]] | None:
    """(the sidecar's CPU, the producers' CPUs) when pinning applies: two or more CPUs this process may use."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[-1]}, set(cpus[:-1])) if len(cpus) >= 2 else None


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus``; threads it starts later inherit it from their creator."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, OSError):  # a thread that ended meanwhile
            pass


def live(rates_ev: list[float], duration: float, producers_per_rate: int,
         sets: list[str] | None = None, warmup: tuple[float, float] | None = WARMUP,
         pin: bool = True) -> list[dict[str, Any]]:
    from tests.helpers.sidecar import SidecarProc  # here: the counted children import this file

    tmp = tempfile.mkdtemp(prefix="iw-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    # Every default component but gpu (no device here); its log in tmp.
    sc = SidecarProc(Path(tmp), [a for kv in sets or [] for a in ("--set", kv)],
                     sock=os.path.join(tmp, "ingest.sock"), defaults=("--no-gpu",),
                     launcher=("-m", "inferwatch_sidecar.cli", "--log-level", "WARNING", "sidecar"), ready_timeout=60)
    sock, port = sc.sock, sc.port
    try:
        sc.start()
        startup_s = sc.ready_after
        split = cpu_split(pin)
        if split is not None:
            pin_threads(sc.pid, split[0])
            print(f"sidecar pinned to CPU {min(split[0])}, producers to CPU {', '.join(map(str, sorted(split[1])))}")
        prod_cpus = split[1] if split is not None else None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as r:
            comps = json.load(r).get("components", {})
        running = sorted(n for n, c in comps.items() if isinstance(c, dict) and c.get("state") == "running")
        print(f"sidecar ready {startup_s:.2f} s after launch (target < 2 s); components running: "
              f"{', '.join(running) or 'none'} (every default one but gpu, which needs a device)")
        rows = []
        runs = [(rate, duration, False) for rate in rates_ev]
        if warmup is not None:
            runs.insert(0, (warmup[0], warmup[1], True))
        for rate, duration, warming in runs:
            nprod = 1 if rate == 0 else producers_per_rate
            per_proc_req = rate / 2 / nprod  # two events per request
            before = scrape_totals(port)
            cpu0 = cpu_seconds(sc.pid)
            t0 = time.perf_counter()
            procs = [
                subprocess.Popen([sys.executable, __file__, "--producer", sock, str(per_proc_req), str(duration), str(i)],
                                 stdout=subprocess.PIPE, env=env, cwd=REPO,
                                 preexec_fn=None if prod_cpus is None else lambda: os.sched_setaffinity(0, prod_cpus))
                for i in range(nprod)
            ]
            outs = [json.loads(p.communicate(timeout=duration + 60)[0]) for p in procs]
            offered_req = sum(o["requests"] for o in outs)
            offered_ev = 2 * offered_req
            sdk_drops = sum(sum(o["drops"].values()) for o in outs)
            after = drained(port, before["events"] + offered_ev - sdk_drops)
            if warming:
                drift_evaluated(port)
                after = scrape_totals(port)
            wall = time.perf_counter() - t0
            cpu = cpu_seconds(sc.pid) - cpu0
            got = after["events"] - before["events"]
            # HELLO and DROPS records are events too; count only request/record.
            got_data = min(got, offered_ev)
            lost = sdk_drops + (after["dropped"] - before["dropped"])
            rows.append({
                "warmup": warming,
                "offered_ev_per_s": rate if rate else offered_ev / duration,
                "unpaced": rate == 0,
                "producers": nprod,
                "offered_events": offered_ev,
                "received_events": got_data,
                "sdk_dropped_events": sdk_drops,
                "sidecar_dropped_frames": after["dropped"] - before["dropped"],
                "lost_frames": after["lost_frames"] - before["lost_frames"],
                "staging_full": after["staging_full"] - before["staging_full"],
                "drop_rate": lost / offered_ev if offered_ev else 0.0,
                "sidecar_cpu_s": cpu,
                "cpu_ms_per_1000_events": cpu / got * 1e6 if got else float("nan"),
                "events_per_cpu_s": got / cpu if cpu else float("nan"),
                # The cyclic collector's time over the sidecar's CPU (it holds the interpreter meanwhile).
                "gc_share": (sum(after["gc_s"]) - sum(before["gc_s"])) / cpu if cpu else float("nan"),
                "gc_collections": [a - b for a, b in zip(after["gc_n"], before["gc_n"], strict=True)],
                "gc_seconds": [a - b for a, b in zip(after["gc_s"], before["gc_s"], strict=True)],
                "wall_s": wall,
            })
        return rows
    finally:
        if sc.proc is not None:
            sc.stop(timeout=30)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rates, shorter runs")
    ap.add_argument("--producer", nargs=4, metavar=("SOCK", "RATE_REQ", "DURATION", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--baseline", default=BASELINE_REV, metavar="REV",
                    help=f"git revision whose decoder/aggregator/pipeline part 1 times side by side "
                         f"(default {BASELINE_REV}, before the fast paths; 'none' to skip)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="passed to the live sidecar's --set (e.g. gc_thresholds=[20000,10,100]; repeatable)")
    ap.add_argument("--in-process-only", action="store_true", help="run part 1 only")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the live sidecar and the producers to separate CPUs")
    ap.add_argument("--callgrind", type=int, nargs="?", const=2000, metavar="REQUESTS",
                    help="instructions per event of the live path (pipeline + default components, one thread) "
                         "under valgrind's callgrind, this tree and --baseline side by side, then exit "
                         "(default 2000 requests; about 2 minutes a tree)")
    ap.add_argument("--split", action="store_true",
                    help="with --callgrind: also each component alone on the pipeline (where the instructions go)")
    ap.add_argument("--gc", default="served", metavar="MODE",
                    help="with --callgrind: the replica's collector: served (as the sidecar serves, the default), "
                         "default (CPython's), off, or thresholds A,B,C")
    ap.add_argument("--drain-frames", type=int, default=DRAIN_FRAMES, metavar="N",
                    help=f"with --callgrind: frames between two drains of each component (default {DRAIN_FRAMES}: "
                         f"a worker's 1-s tick at 20k events/s)")
    ap.add_argument("--variants-child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--replica-child", nargs=3, help=argparse.SUPPRESS)
    return ap.parse_args()


def print_part1(p1: dict[str, Any]) -> None:
    base = p1["baseline"]
    print(f"  {'':44} {'now':>10} " + (f"{'base ' + base:>14} {'speed-up':>9}" if base else ""))

    def row(label: str, key: str, unit: str, higher_better: bool) -> None:
        now = p1[key]
        line = f"  {label:44} {now:10.2f} " if unit == "us" else f"  {label:44} {now:10,.0f} "
        bkey = key.replace("_us_per_event", "_base_us_per_event").replace("_ev_per_s", "_base_ev_per_s")
        if base and bkey in p1:
            b = p1[bkey]
            ratio = now / b if higher_better else b / now
            line += (f"{b:14.2f} " if unit == "us" else f"{b:14,.0f} ") + f"{ratio:8.2f}x"
        print(line + ("  us/event" if unit == "us" else "  events/s per core"))

    row("decode (inferwatch.wire.Decoder)", "decode_us_per_event", "us", False)
    if "decode_compiled_us_per_event" in p1:
        row("decode, the sidecar's compiled loop", "decode_compiled_us_per_event", "us", False)
    row("aggregate, inferwatch arrays", "aggregate_us_per_event", "us", False)
    row("aggregate, prometheus_client observe", "prometheus_client_us_per_event", "us", False)
    row("pipeline: decode, account, aggregate", "pipeline_ev_per_s", "ev", True)
    row("pipeline + drift-style component handoff", "pipeline_handoff_ev_per_s", "ev", True)
    ratio = p1["prometheus_client_us_per_event"] / p1["aggregate_us_per_event"]
    print(f"  aggregation: prometheus_client / inferwatch = {ratio:.1f}x;  target: pipeline + handoff >= 100,000 "
          f"events/s per core: {'met' if p1['pipeline_handoff_ev_per_s'] >= 100_000 else 'NOT met'}")


def print_live(rows: list[dict[str, Any]]) -> None:
    hdr = (f"{'offered ev/s':>17} {'producers':>9} {'offered':>9} {'received':>9} {'drop rate':>9} "
           f"{'CPU ms/1k ev':>12} {'ev/s per core':>13} {'GC share':>8} {'staging full':>12}")
    print(hdr)
    for r in rows:
        label = f"{r['offered_ev_per_s']:,.0f}" + (" (max)" if r["unpaced"] else " (warm-up)" if r.get("warmup") else "")
        print(f"{label:>17} {r['producers']:>9} {r['offered_events']:>9,} {r['received_events']:>9,} "
              f"{r['drop_rate']:>9.2%} {r['cpu_ms_per_1000_events']:>12.2f} {r['events_per_cpu_s']:>13,.0f} "
              f"{r['gc_share']:>8.1%} {r['staging_full']:>12,}")
    per_core = statistics.median(r["events_per_cpu_s"] for r in rows
                                 if r["received_events"] > 0 and not r.get("warmup"))
    if any(r.get("warmup") for r in rows):
        print("(warm-up, until drift's first evaluation: its one-time costs, drift's reference from the first 5,000 "
              "records and the evaluation's first import of scipy.special, are a start-up's; not in the median)")
    at20 = [r for r in rows if not r["unpaced"] and r["offered_ev_per_s"] == 20000.0]
    print(f"\nmedian events/s per core (live, default components): {per_core:,.0f}  (target >= 150,000)")
    if at20:
        print(f"drop rate at 20k events/s: {at20[0]['drop_rate']:.3%}  (target 0)")


def main() -> int:
    args = parse_args()
    if args.producer:
        producer(args.producer[0], float(args.producer[1]), float(args.producer[2]), int(args.producer[3]))
        return 0
    if args.variants_child:
        variants_child(args.variants_child[0], int(args.variants_child[1]))
        return 0
    if args.replica_child:
        replica_child(args.replica_child[0] == "1", args.replica_child[1], int(args.replica_child[2]))
        return 0
    if args.callgrind:
        cg = callgrind_report(None if args.baseline == "none" else args.baseline, args.callgrind, args.split,
                              gc_mode=args.gc, drain_frames=args.drain_frames)
        if args.json:
            Path(args.json).write_text(json.dumps({"callgrind": cg}, indent=1))
        return 0
    if args.quick:
        rates, duration, repeats, n_req = [5000.0, 20000.0, 40000.0], 1.5, 5, 5000
    else:
        rates, duration, repeats, n_req = [5000.0, 10000.0, 20000.0, 40000.0, 80000.0, 160000.0], 4.0, 5, 20000

    print(f"== part 1: in-process, same frames ({n_req} requests = {2 * n_req} events, {N_FEATURES} features), "
          f"median of {repeats}, thread CPU time")
    p1 = in_process(repeats, n_req, None if args.baseline == "none" else args.baseline)
    print_part1(p1)
    if args.in_process_only:
        if args.json:
            Path(args.json).write_text(json.dumps({"in_process": p1}, indent=1))
        return 0
    print(f"\n== part 2/3: live sidecar, real SDK senders over the Unix socket, {duration} s per rate")
    rows = live([*rates, 0.0], duration, producers_per_rate=2, sets=args.sets, pin=not args.no_pin)
    print_live(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"in_process": p1, "live": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
