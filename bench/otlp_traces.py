"""OTLP trace ingest benchmark: spans per second per core through decode and mapping, beside the datagram path.

Three parts:

1. **In-process, CPU time** (medians, this thread's CPU time): ``TraceReceiver.handle`` (decode, map to events,
   aggregate: everything ``POST /v1/traces`` does after the HTTP layer) on exports built from the recorded
   engine exports (``tests/fixtures/triton_spans.json``: Triton's 3 spans per request, OTLP/JSON as Triton
   sends it; ``vllm_spans.json``: vLLM's one ``llm_request`` span per request), each in protobuf and JSON,
   with fresh trace and span IDs per request. Beside them the datagram path: SDK wire frames (a request with
   3 stages and a 20-feature record, as in ``bench/ingest.py``) through ``Pipeline.datagram``, in events.
2. **Callgrind** (noise-free on a shared machine): instructions per span (per event for the datagram path),
   from two runs of each workload under ``valgrind --tool=callgrind`` that differ by one pass, so start-up and
   input building cancel. Converted to spans/s per core with this machine's instructions per CPU-second,
   measured in the same run (callgrind's instructions of a pass over part 1's CPU time of that pass).
3. **Live**: a real sidecar (``inferwatch sidecar``) on loopback, Triton-shaped OTLP/JSON exports POSTed at a
   paced rate (5,000 spans/s by default) for a bounded time; every span must come out accepted
   (``inferwatch_otlp_spans_total``), every request counted (``inferwatch_requests_total``), no HTTP error.

The wall-clock parts lower their priority to nice 10 (the machine may be shared). Usage::

    python bench/otlp_traces.py                 # all three parts
    python bench/otlp_traces.py --quick         # fewer repeats, shorter live run
    python bench/otlp_traces.py --no-callgrind  # parts 1 and 3
"""

from __future__ import annotations

import argparse
import base64
import copy
import http.client
import itertools
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import REPO, STABLE_HASH_ENV, callgrind_instructions, require_valgrind  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
#: Requests per export body (Triton: 3 spans each, vLLM: 1).
BATCH_REQUESTS = 50
#: Concurrent connections posting exports in the live part.
POSTERS = 4
N_FEATURES = 20
TARGET_SPANS_PER_S = 20_000
PROTOBUF = "application/x-protobuf"
JSON_TYPE = "application/json"


# ---------------------------------------------------------------------------------------------------- inputs


def _requests_of(engine: str) -> list[list[dict[str, Any]]]:
    """The recorded export's request spans grouped by trace, with their resource and scope: one list per request."""
    doc = json.loads((FIXTURES / f"{engine}_spans.json").read_text())
    out: dict[str, list[dict[str, Any]]] = {}
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            if engine == "vllm" and not any(s["name"] == "llm_request" for s in ss["spans"]):
                continue  # vLLM's start-up spans are sent once, not per request
            for s in ss["spans"]:
                key = s["traceId"] if engine == "triton" else s["spanId"]
                out.setdefault(key, []).append({"resource": rs["resource"], "scope": ss["scope"], "span": s})
    return list(out.values())


def exports(engine: str, n_requests: int, seed: int) -> tuple[list[dict[str, Any]], int]:
    """OTLP/JSON export documents with ``n_requests`` requests copied from the recording, fresh IDs each.

    Returns:
        The documents (``BATCH_REQUESTS`` requests each) and the number of spans in them.
    """
    rnd = random.Random(seed)
    templates = _requests_of(engine)
    docs, spans = [], 0
    for start in range(0, n_requests, BATCH_REQUESTS):
        scopes: dict[int, dict[str, Any]] = {}
        for i in range(start, min(start + BATCH_REQUESTS, n_requests)):
            trace = f"{rnd.getrandbits(128):032x}"
            ids: dict[str, str] = {}
            for item in templates[i % len(templates)]:
                s = copy.deepcopy(item["span"])
                s["traceId"] = trace
                s["spanId"] = ids.setdefault(s["spanId"], f"{rnd.getrandbits(64):016x}")
                if s.get("parentSpanId"):
                    s["parentSpanId"] = ids.setdefault(s["parentSpanId"], f"{rnd.getrandbits(64):016x}")
                rs = scopes.setdefault(id(item["scope"]), {"resource": item["resource"],
                                                           "scopeSpans": [{"scope": item["scope"], "spans": []}]})
                rs["scopeSpans"][0]["spans"].append(s)
                spans += 1
        docs.append({"resourceSpans": list(scopes.values())})
    return docs, spans


def _hex_to_b64(doc: Any) -> Any:
    """OTLP/JSON IDs (hex) as protobuf's canonical JSON wants them (base64), so json_format can parse it."""
    if isinstance(doc, list):
        return [_hex_to_b64(x) for x in doc]
    if isinstance(doc, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") and v
                else _hex_to_b64(v) for k, v in doc.items()}
    return doc


def bodies(engine: str, encoding: str, n_requests: int, seed: int = 7) -> tuple[list[bytes], int]:
    """Export bodies in ``encoding`` (``json`` or ``protobuf``) and their span count."""
    docs, spans = exports(engine, n_requests, seed)
    if encoding == "json":
        return [json.dumps(d).encode() for d in docs], spans
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return [json_format.ParseDict(_hex_to_b64(d), ExportTraceServiceRequest()).SerializeToString()
            for d in docs], spans


def frames(n_requests: int) -> tuple[list[bytes], int]:
    """SDK wire frames for the datagram path (as bench/ingest.py) and their event count."""
    from inferwatch.wire import EV_RECORD, EV_REQUEST, Encoder

    enc = Encoder(os.getpid(), 42)
    now = time.time_ns()
    rnd = random.Random(7)
    evs: list[Any] = []
    for i in range(n_requests):
        d1, d2, d3 = (int(rnd.lognormvariate(mu, 1.0)) for mu in (11.5, 14.5, 10.8))
        evs.append((EV_REQUEST, ("bench", "m", "v1"), now, d1 + d2 + d3 + 50_000, 0, None, f"req-{i:08d}", None,
                    [("preprocess", d1, None), ("inference", d2, None), ("postprocess", d3, None)]))
        evs.append((EV_RECORD, ("bench", "m", "v1"), now, f"req-{i:08d}", "cat", 0.9, None,
                    {f"f{j}": float(i + j) for j in range(N_FEATURES)}))
    return enc.encode(evs), len(evs)


# ---------------------------------------------------------------------------------------------------- workloads


#: name -> (engine or "datagram", encoding, unit)
WORKLOADS: dict[str, tuple[str, str, str]] = {
    "triton/json": ("triton", "json", "span"),
    "triton/protobuf": ("triton", "protobuf", "span"),
    "vllm/json": ("vllm", "json", "span"),
    "vllm/protobuf": ("vllm", "protobuf", "span"),
    "datagram": ("datagram", "wire", "event"),
}


def prepare(name: str, n_requests: int) -> tuple[Any, int]:
    """A function running one pass of workload ``name`` over fresh state, and the units (spans or events) per pass."""
    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.ingest.otlp_traces import Mapper, TraceReceiver
    from inferwatch_sidecar.ingest.otlp_traces.mapping import ACCEPTED
    from inferwatch_sidecar.ingest.pipeline import Pipeline

    engine, encoding, _ = WORKLOADS[name]
    if engine == "datagram":
        fr, n_events = frames(n_requests)

        def run_frames() -> None:
            pipe = Pipeline(Aggregator(ComponentContext()))
            for f in fr:
                pipe.datagram(f, "unix")
            assert sum(pipe.counts["unix"]) == n_events

        return run_frames, n_events
    body, n_spans = bodies(engine, encoding, n_requests)
    ctype = JSON_TYPE if encoding == "json" else PROTOBUF

    def run_bodies() -> None:
        # A clock that advances 10 ms per export instead of the real one: under callgrind a pass takes 50x
        # longer, and with real time the join's 5 s timeout would start expiring traces mid-pass, adding work
        # that the native run never does.
        ticks = itertools.count()
        rec = TraceReceiver(Pipeline(Aggregator(ComponentContext())), Mapper(clock=lambda: next(ticks) * 0.01))
        for b in body:
            status, _, _ = rec.handle(b, ctype, None)
            assert status == 200
        assert sum(n for (result, _), n in rec.mapper.counts.items() if result == ACCEPTED) == n_spans

    return run_bodies, n_spans


def cpu_times(name: str, n_requests: int, repeats: int) -> tuple[float, int]:
    """Median CPU seconds of one pass, and units per pass."""
    run, units = prepare(name, n_requests)
    run()  # warm caches and imports
    times = []
    for _ in range(repeats):
        t = time.thread_time()
        run()
        times.append(time.thread_time() - t)
    return statistics.median(times), units


def work(name: str, n_requests: int, passes: int) -> None:
    """Run as a subprocess under callgrind: prepare, then ``passes`` passes."""
    run, _ = prepare(name, n_requests)
    for _ in range(passes):
        run()


def _callgrind_instructions(name: str, n_requests: int, passes: int) -> int:
    # The same hashing in both runs, so only the pass differs.
    return callgrind_instructions([sys.executable, __file__, "--work", name, str(n_requests), str(passes)],
                                  env=STABLE_HASH_ENV)


def callgrind(names: list[str], n_requests: int) -> dict[str, float]:
    """Instructions per pass of each workload (two runs, 1 and 2 passes, subtracted)."""
    require_valgrind("--no-callgrind")
    out = {}
    for name in names:
        one = _callgrind_instructions(name, n_requests, 1)
        two = _callgrind_instructions(name, n_requests, 2)
        out[name] = float(two - one)
        print(f"  callgrind {name}: {two - one:,} instructions per pass", flush=True)
    return out


# ---------------------------------------------------------------------------------------------------- live


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(inferwatch_otlp_spans_total|inferwatch_requests_total)\{(.*)\} (\S+)$", line)
        if m:
            out[(m.group(1), tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2)))))] = float(m.group(3))
    return out


def live(rate: float, seconds: float) -> dict[str, Any]:
    """POST Triton-shaped OTLP/JSON exports to a real sidecar at ``rate`` spans/s for ``seconds``."""
    n_requests = int(rate * seconds / 3)
    body, n_spans = bodies("triton", "json", n_requests, seed=11)
    from tests.helpers.sidecar import SidecarProc  # here: the counted children import this file

    tmp = tempfile.mkdtemp(prefix="iw-bench-otlp-")
    sc = SidecarProc(Path(tmp), sock=os.path.join(tmp, "ingest.sock"),
                     launcher=("-m", "inferwatch_sidecar.cli", "--log-level", "WARNING", "sidecar"), ready_timeout=30)
    port = sc.port
    try:
        sc.start()
        cpu0 = _cpu_seconds(sc.pid)
        interval = seconds / len(body)
        results: list[tuple[int, float, float, bool]] = []  # (status, lag behind schedule, latency, reconnected)
        lock = threading.Lock()
        t0 = time.perf_counter() + 0.1

        def poster(k: int) -> None:
            # Exports go out on POSTERS connections, like several exporting processes; each keeps to its share
            # of the schedule, so the offered rate holds while a POST waits for its answer.
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            for i in range(k, len(body), POSTERS):
                due = t0 + i * interval
                now = time.perf_counter()
                if now < due:
                    time.sleep(due - now)
                sent = time.perf_counter()
                conn.request("POST", "/v1/traces", body=body[i], headers={"Content-Type": JSON_TYPE})
                resp = conn.getresponse()
                resp.read()
                done = time.perf_counter()
                if resp.will_close:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                with lock:
                    results.append((resp.status, max(0.0, sent - due), done - sent, resp.will_close))
            conn.close()

        threads = [threading.Thread(target=poster, args=(k,)) for k in range(POSTERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sent_s = time.perf_counter() - t0
        statuses: dict[int, int] = {}
        for status, *_ in results:
            statuses[status] = statuses.get(status, 0) + 1
        cpu = _cpu_seconds(sc.pid) - cpu0
        m = _metrics(port)
    finally:
        if sc.proc is not None:
            sc.stop(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    spans = {dict(k[1])["result"] + "/" + dict(k[1])["reason"]: v for k, v in m.items()
             if k[0] == "inferwatch_otlp_spans_total" and v}
    accepted = sum(v for k, v in spans.items() if k.startswith("accepted/"))
    requests = sum(v for k, v in m.items() if k[0] == "inferwatch_requests_total")
    return {"offered_spans": n_spans, "offered_requests": n_requests, "posts": len(body), "seconds": sent_s,
            "offered_rate": n_spans / sent_s, "max_lag_s": max(r[1] for r in results),
            "post_latency_ms_p50": statistics.median(r[2] for r in results) * 1e3,
            "post_latency_ms_max": max(r[2] for r in results) * 1e3,
            "connections_closed_by_server": sum(r[3] for r in results), "http": statuses, "spans": spans,
            "accepted": accepted, "lost": n_spans - accepted, "requests_counted": requests,
            "sidecar_cpu_s": cpu, "sidecar_us_per_span": cpu / n_spans * 1e6}


# ---------------------------------------------------------------------------------------------------- main


def _nice(level: int = 10) -> None:
    current = os.nice(0)
    if current < level:
        os.nice(level - current)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and a 5 s live run")
    ap.add_argument("--no-callgrind", action="store_true", help="skip part 2")
    ap.add_argument("--no-live", action="store_true", help="skip part 3")
    ap.add_argument("--rate", type=float, default=5000, help="live part: spans per second offered")
    ap.add_argument("--seconds", type=float, default=20, help="live part: how long")
    ap.add_argument("--work", nargs=3, metavar=("NAME", "REQUESTS", "PASSES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.work:
        work(args.work[0], int(args.work[1]), int(args.work[2]))
        return 0
    _nice()
    repeats, n_requests = (5, 1000) if args.quick else (9, 3000)
    seconds = 5 if args.quick else args.seconds
    print(f"nice {os.nice(0)}, {os.cpu_count()} CPUs (shared with other work: wall-clock figures are noisy)\n")

    print(f"1. in-process, this thread's CPU time, median of {repeats} passes of {n_requests} requests")
    cpu: dict[str, tuple[float, int]] = {}
    for name in WORKLOADS:
        cpu[name] = cpu_times(name, n_requests, repeats)
        t, units = cpu[name]
        print(f"  {name:16s} {units:7d} {WORKLOADS[name][2]}s  {t / units * 1e6:7.2f} us/{WORKLOADS[name][2]}  "
              f"{units / t:10,.0f} {WORKLOADS[name][2]}s/s", flush=True)

    cg: dict[str, float] = {}
    if not args.no_callgrind:
        cg_requests = 300
        print(f"\n2. callgrind, {cg_requests} requests per pass")
        cg = callgrind(list(WORKLOADS), cg_requests)
        # instructions per unit, and this machine's instructions per CPU-second for the same pass
        per_unit = {n: cg[n] / prepare_units(n, cg_requests) for n in cg}
        ips = statistics.median(per_unit[n] * cpu[n][1] / cpu[n][0] for n in cg)
        print(f"  this machine: {ips / 1e9:.2f} G instructions per CPU-second (median over the workloads)")

    print("\n| path | encoding | unit | CPU us/unit | units/s/core (CPU time) | instructions/unit | "
          "units/s/core (callgrind) | units/s vs datagram events/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base = cg["datagram"] / prepare_units("datagram", 300) if cg else None
    for name, (engine, enc, unit) in WORKLOADS.items():
        t, units = cpu[name]
        row = f"| {engine} | {enc} | {unit} | {t / units * 1e6:.2f} | {units / t:,.0f} |"
        if cg:
            ipu = cg[name] / prepare_units(name, 300)
            row += f" {ipu:,.0f} | {ips / ipu:,.0f} | {base / ipu:.2f}x |" if base else ""
        else:
            row += " - | - | - |"
        print(row)
    if cg:
        worst = min(ips / (cg[n] / prepare_units(n, 300)) for n in cg if n != "datagram")
        print(f"\nslowest span path: {worst:,.0f} spans/s/core (target {TARGET_SPANS_PER_S:,}): "
              f"{'met' if worst >= TARGET_SPANS_PER_S else 'NOT met'}")

    if not args.no_live:
        print(f"\n3. live sidecar, Triton-shaped OTLP/JSON, {args.rate:,.0f} spans/s for {seconds:g} s")
        r = live(args.rate, seconds)
        print(json.dumps(r, indent=2))
        ok = r["lost"] == 0 and set(r["http"]) == {200} and r["requests_counted"] == r["offered_requests"]
        print(f"no drops at {r['offered_rate']:,.0f} spans/s offered: {'yes' if ok else 'NO'}")
        if not ok:
            return 1
    return 0


def prepare_units(name: str, n_requests: int) -> int:
    """Units (spans or events) one pass of ``name`` handles for ``n_requests`` requests."""
    engine = WORKLOADS[name][0]
    if engine == "datagram":
        return 2 * n_requests
    return exports(engine, n_requests, 7)[1]


if __name__ == "__main__":
    sys.exit(main())
