"""The issue-28 attacks, in process, against this tree and (``--base DIR``) an older one, side by side.

Each attack runs in a fresh subprocess of the sidecar's receiver and aggregator (no HTTP, so the
figures are the ingest's own), and prints what it cost:

- ``join_bomb``: 40 OTLP exports, each one stage span whose request never comes, with a 3.5 MiB
  attribute key (16 KB gzipped): peak RSS growth and what the join buffer holds after;
- ``events_bomb``: one span with 700,000 events (about 19 KB gzipped): CPU seconds (``events_200k``:
  200,000, which fits the lower inflate limit, so the per-span event cap does the work);
- ``rewalk``: 10,000 stage spans waiting in one trace (parents in a cycle of 64), then 50 exports of
  one request span touching it: CPU ms per export;
- ``parse_bomb``: the largest JSON body of empty objects the inflate limit lets through: peak RSS
  growth while it is decoded;
- ``series``: 1,000 label sets x 51 stages x 1 error type each: /metrics lines, bytes and render ms.

Usage::

    python bench/attacks.py                       # this tree
    python bench/attacks.py --base /tmp/old-tree   # and an older checkout's sdk/ and sidecar/
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import gzip, json, resource, sys, time
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from prometheus_client import generate_latest

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

T0 = time.time_ns()
def span(trace, sid, parent=99, kind=1, name="stage", attrs=(), events=0):
    s = Span(trace_id=trace.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
             parent_span_id=parent.to_bytes(8, "big") if parent else b"", name=name, kind=kind,
             start_time_unix_nano=T0, end_time_unix_nano=T0 + 10**6)
    s.attributes.append(KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")))
    for k, v in attrs:
        s.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    for e in range(events):
        ev = s.events.add(); ev.name = "e"; ev.time_unix_nano = T0
    return s

def body(spans, res=None):
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    for k, v in (res or {"service.name": "svc"}).items():
        rs.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()

s = Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False}}))
r = s.traces
PB = "application/x-protobuf"
out = {}
which = sys.argv[1]
if which == "join_bomb":
    base = rss_mib()
    codes = {}
    for i in range(40):
        b = gzip.compress(body([span(1000 + i, 1, attrs=[("k" * (3500 << 10), "v")])]))
        c = r.handle(b, PB, "gzip")[0]
        codes[c] = codes.get(c, 0) + 1
    out = {"gz_bytes_each": len(b), "answers": codes, "rss_growth_mib": round(rss_mib() - base, 1),
           "peak_growth_mib": round(peak_mib() - base, 1), "pending_spans": r.mapper.pending}
elif which in ("events_bomb", "events_200k"):
    b = gzip.compress(body([span(7, 1, events=700_000 if which == "events_bomb" else 200_000)]))
    t = time.process_time()
    c = r.handle(b, PB, "gzip")[0]
    out = {"gz_bytes": len(b), "answer": c, "cpu_s": round(time.process_time() - t, 2)}
elif which == "rewalk":
    cyc = [span(5, 1_000_000 + i, parent=1_000_000 + (i + 1) % 64, name="link") for i in range(64)]
    st = [span(5, 10 + i, parent=1_000_000 + i % 64) for i in range(10_000)]
    for i in range(0, len(st), 2000):
        r.handle(body((cyc if i == 0 else []) + st[i:i + 2000]), PB, None)
    bodies = [body([span(5, 5_000_000 + i, parent=77, kind=2, name="req")]) for i in range(50)]
    t = time.process_time()
    for b in bodies:
        r.handle(b, PB, None)
    out = {"waiting": r.mapper.pending, "export_bytes": len(bodies[0]),
           "cpu_ms_per_export": round((time.process_time() - t) / 50 * 1e3, 2)}
elif which == "parse_bomb":
    limit = r.max_decompressed_bytes
    b = b'{"resourceSpans":[' + b"{}," * (limit // 3 - 10) + b"{}]}"
    base = rss_mib()
    t = time.process_time()
    c = r.handle(b, "application/json", None)[0]
    out = {"body_mib": round(len(b) / 2**20, 1), "answer": c, "peak_growth_mib": round(peak_mib() - base, 1),
           "cpu_s": round(time.process_time() - t, 2)}
elif which == "series":
    t = time.process_time()
    for ls in range(1000):
        spans = [span(10**6 + ls, 1, parent=0, kind=2, name="req",
                      attrs=[("gen_ai.request.model", f"model{ls}"), ("http.response.status_code", "x")])]
        spans[0].attributes.append(KeyValue(key="http.response.status_code", value=AnyValue(int_value=500 + ls % 99)))
        spans += [span(10**6 + ls, 2 + j, parent=1, name=f"op{j}",
                       attrs=[("gen_ai.operation.name", f"stage{j}")]) for j in range(51)]
        # The stage spans arrive first (as SDKs export them), then the request.
        r.handle(body(spans[1:]), PB, None)
        r.handle(body(spans[:1]), PB, None)
    ingest_s = time.process_time() - t
    t = time.perf_counter()
    text = generate_latest(s.registry)
    render_ms = (time.perf_counter() - t) * 1e3
    lines = sum(1 for ln in text.splitlines() if not ln.startswith(b"#"))
    out = {"spans": 1000 * 52, "ingest_cpu_s": round(ingest_s, 2), "metrics_lines": lines,
           "metrics_mib": round(len(text) / 2**20, 2), "render_ms": round(render_ms, 1),
           "peak_rss_mib": round(peak_mib(), 1)}
print(json.dumps(out))
'''

ATTACKS = ("join_bomb", "events_bomb", "events_200k", "rewalk", "parse_bomb", "series")


def run(tree: Path, attack: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "sdk"), str(tree / "sidecar")])}
    p = subprocess.run([sys.executable, "-c", CHILD, attack], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"}
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", metavar="DIR", help="an older tree (with sdk/ and sidecar/) to run side by side")
    ap.add_argument("--only", choices=ATTACKS, action="append", help="run only this attack (repeatable)")
    args = ap.parse_args(argv)
    trees = [("this", REPO)] + ([("base", Path(args.base))] if args.base else [])
    for attack in args.only or ATTACKS:
        for name, tree in trees:
            print(f"{attack:12s} {name:5s} {json.dumps(run(tree, attack))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
