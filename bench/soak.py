"""Soak: a real sidecar under a bounded mix of hostile traffic, watched from outside (issue 28).

One ``inferwatch sidecar`` subprocess (drift on, warm-up reference) gets, at once, from separate
processes so the load generators do not share a GIL with each other:

- **datagrams**: SDK frames over UDP, a fifth of them mutated (random bytes flipped), with
  unique request IDs and fat records (64 categorical features of 255 characters, 16 versions);
- **HTTP JSON**: ``POST /v1/events`` batches with new label values (services, models, stages,
  error types) every time: the series attack;
- **OTLP**: stage spans whose request never comes carrying big attributes and many events
  (the join-buffer bomb), stage spans in one trace in a parent cycle (the re-walk attack), and
  bodies of empty JSON objects (the parse bomb);
- **a scraper**: ``GET /metrics`` every ``--scrape-every`` seconds, timed, as Prometheus scrapes: asking
  for gzip over one kept-alive connection (``--scrape-encoding identity`` for the uncompressed body,
  ``metrics_bytes`` being what crossed the wire; ``--scrape-connection close`` for a connection per scrape).

Every ``--report-every`` seconds it prints one line: RSS (MiB), threads, open fds, the scrape
latency p50/p99 (ms) since the start, the last /metrics size, and the attack counters. The
last line is the summary. The traffic is bounded by rate and duration (``--seconds``, default
600), so the run measures what a 512 MiB pod would see, not how fast this machine can send.

Usage::

    flock /tmp/bench.lock python bench/soak.py --seconds 600
    python bench/soak.py --seconds 60 --json out.json     # a shorter run
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]  # _harness, and tests.helpers (the one sidecar starter)
from tests.helpers.sidecar import SIDECAR_CLI, SidecarProc  # noqa: E402

from _harness import free_port  # noqa: E402  (bench/ is a folder of scripts, not a package)


def _post(url: str, body: bytes, ctype: str) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        e.read()
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return 0


def _pace(start: float, n: int, rate: float) -> None:
    ahead = start + n / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)


# -- load generators (each in its own process) ----------------------------------------------------


def datagrams(udp_port: int, seconds: float, rate: float, seed: int) -> None:
    """SDK frames over UDP at ``rate`` frames/s; a fifth mutated."""
    from inferwatch.wire import EV_RECORD, EV_REQUEST, Encoder

    rng = random.Random(seed)
    enc = Encoder(os.getpid(), seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        events: list[tuple[Any, ...]] = []
        for _ in range(4):
            i = rng.randrange(1 << 30)
            ctx = ("soak", "m", f"v{i % 16}")
            rid = f"rid-{seed}-{n}-{i}"
            cats = {f"c{j}": (f"{i}.{j}." + "x" * 255)[:255] for j in range(64)}
            events.append((EV_RECORD, ctx, time.time_ns(), rid, None, None, None, cats))
            events.append((EV_REQUEST, ctx, time.time_ns(), rng.randrange(10**6, 10**9), 0, None, rid, None,
                           [("queue", rng.randrange(10**6), None)]))
        try:
            frames = enc.encode(events)
        except Exception:
            frames = []
        for f in frames:
            if rng.random() < 0.2:
                b = bytearray(f)
                for _ in range(rng.randrange(1, 6)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
                f = bytes(b)
            try:
                sock.sendto(f, ("127.0.0.1", udp_port))
            except OSError:
                pass
            n += 1
            _pace(start, n, rate)


def http_json(base: str, seconds: float, rate: float, seed: int) -> None:
    """``POST /v1/events`` batches, every one with new label values (the series attack)."""
    rng = random.Random(seed)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        k = rng.randrange(1 << 40)
        events = [{"type": "request", "duration_s": rng.random(), "outcome": "error", "error_type": f"e{k}-{j}",
                   "stages": {f"stage{k}-{j}-{s}": 0.01 for s in range(8)}} for j in range(20)]
        body = json.dumps({"service": f"svc{k % 1000}", "model": f"model{k}", "model_version": f"v{k % 7}",
                           "events": events}).encode()
        _post(base + "/v1/events", body, "application/json")
        n += 1
        _pace(start, n, rate)


def otlp(base: str, seconds: float, rate: float, seed: int) -> None:
    """OTLP exports: join-buffer bombs, a parent-cycle trace, and JSON parse bombs, in turn."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    rng = random.Random(seed)
    t0 = time.time_ns()

    def span(trace: int, sid: int, parent: int, attrs: int, events: int, key_len: int = 16) -> Span:
        s = Span(trace_id=trace.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
                 parent_span_id=parent.to_bytes(8, "big"), name="stage", kind=1,  # type: ignore[arg-type]
                 start_time_unix_nano=t0, end_time_unix_nano=t0 + 10**6)
        s.attributes.append(KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")))
        for a in range(attrs):
            s.attributes.append(KeyValue(key=f"k{a}".ljust(key_len, "k"), value=AnyValue(string_value="v" * 255)))
        for e in range(events):
            ev = s.events.add()
            ev.name = f"e{e}"
            ev.time_unix_nano = t0
        return s

    def body(spans: list[Span]) -> bytes:
        return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
            scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()  # type: ignore[arg-type]

    start = time.monotonic()
    n = 0
    cycle_trace = rng.randrange(1, 1 << 100)
    while time.monotonic() - start < seconds:
        kind = n % 4
        if kind == 0:  # the join-buffer bomb: big keys, many attributes and events, requests never come
            b = body([span(rng.randrange(1, 1 << 120), rng.randrange(1, 1 << 60), 99, 150, 5000, key_len=16 << 10)])
            _post(base + "/v1/traces", b, "application/x-protobuf")
        elif kind == 1:  # the re-walk attack: stage spans of one trace, parents in a cycle of 64
            b = body([span(cycle_trace, rng.randrange(1 << 16, 1 << 60), 1 + (i % 64), 0, 0) for i in range(300)])
            _post(base + "/v1/traces", b, "application/x-protobuf")
        elif kind == 2:  # a request span touching that trace
            s = span(cycle_trace, rng.randrange(1 << 16, 1 << 60), 7777, 0, 0)
            s.kind = 2  # type: ignore[assignment]
            _post(base + "/v1/traces", body([s]), "application/x-protobuf")
        else:  # the parse bomb: a JSON array of empty objects just under the inflate limit
            b = b'{"resourceSpans":[' + b"{}," * 1_300_000 + b"{}]}"
            _post(base + "/v1/traces", b, "application/json")
        n += 1
        _pace(start, n, rate)


# -- the watcher ------------------------------------------------------------------------------------


def _proc(pid: int) -> tuple[float, int, int]:
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024, threads, len(os.listdir(f"/proc/{pid}/fd"))


class _Scraper:
    """``GET /metrics`` as Prometheus sends it: gzip asked for, one kept-alive connection (``keep_alive``), or a
    fresh connection per scrape."""

    def __init__(self, base: str, gzip: bool, keep_alive: bool) -> None:
        u = urllib.parse.urlsplit(base)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.gzip, self.keep_alive = gzip, keep_alive
        self.conn: http.client.HTTPConnection | None = None

    def scrape(self) -> tuple[float, int, bytes]:
        """(ms, bytes on the wire, the body as text) of one scrape; an empty body when it failed."""
        headers = {"Accept-Encoding": "gzip" if self.gzip else "identity"}
        if not self.keep_alive:
            headers["Connection"] = "close"
        t = time.perf_counter()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.conn.request("GET", "/metrics", headers=headers)
            r = self.conn.getresponse()
            data = r.read()
            coded = r.getheader("Content-Encoding", "") == "gzip"
            if not self.keep_alive or r.will_close:
                self.conn.close()
                self.conn = None
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn, data, coded = None, b"", False
        ms = (time.perf_counter() - t) * 1e3
        return ms, len(data), zlib.decompress(data, wbits=31) if coded else data


def _counter(text: bytes, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.decode("utf-8", "replace").splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def _probe(side: subprocess.Popen[bytes], out: Path) -> dict[str, Any] | None:
    """Ask the sidecar (under bench/soak_probe.py) for its heap breakdown and scrape timings."""
    out.unlink(missing_ok=True)
    side.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and side.poll() is None:
        if out.exists() and out.read_text().endswith("}\n"):
            doc: dict[str, Any] = json.loads(out.read_text())
            print("soak probe: " + json.dumps(doc, indent=1), flush=True)
            return doc
        time.sleep(0.5)
    print("soak probe: no answer", flush=True)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="length of the hostile traffic (default 600)")
    ap.add_argument("--scrape-every", type=float, default=0.5, help="seconds between scrapes (default 0.5)")
    ap.add_argument("--report-every", type=float, default=30.0, help="seconds between report lines (default 30)")
    ap.add_argument("--datagram-rate", type=float, default=2000.0, help="UDP frames per second (default 2000)")
    ap.add_argument("--json-rate", type=float, default=20.0, help="POST /v1/events per second (default 20)")
    ap.add_argument("--otlp-rate", type=float, default=8.0, help="POST /v1/traces per second (default 8)")
    ap.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    ap.add_argument("--scrape-encoding", choices=("gzip", "identity"), default="gzip",
                    help="the scraper's Accept-Encoding: gzip, as Prometheus sends (default), or identity")
    ap.add_argument("--scrape-connection", choices=("keep-alive", "close"), default="keep-alive",
                    help="the scraper keeps its connection open between scrapes, as Prometheus does (default), or "
                    "opens one per scrape")
    ap.add_argument("--save-metrics", metavar="FILE", help="write the last /metrics body to FILE")
    ap.add_argument("--probe", metavar="FILE",
                    help="run the sidecar under bench/soak_probe.py and, after the traffic, write its heap breakdown "
                    "and per-collector scrape timings to FILE (set PYTHONTRACEMALLOC=1 for allocation sites too)")
    ap.add_argument("--repo", metavar="DIR", default=str(REPO),
                    help="run the sidecar from this source tree (default: this one), e.g. an older commit's")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="passed to the sidecar's --set (e.g. gc_thresholds=[10000,50,100]; repeatable)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="iw-soak-"))
    udp = free_port(socket.SOCK_DGRAM)
    launcher = [str(REPO / "bench" / "soak_probe.py"), str(Path(args.probe).resolve())] if args.probe else SIDECAR_CLI
    sc = SidecarProc(tmp, ["--udp-port", str(udp), *(a for kv in args.sets for a in ("--set", kv))], sock=str(tmp / "s.sock"), defaults=("--no-gpu",),
                     launcher=launcher, repo=Path(args.repo), ready_timeout=30)
    base = sc.url
    try:
        sc.start()
    except AssertionError as e:  # not ready: the message holds its log
        sc.stop(signal.SIGKILL, check=False)
        print(e, file=sys.stderr)
        return 1
    assert sc.proc is not None
    side = sc.proc
    print(f"soak: sidecar pid {side.pid} on {base}, UDP {udp}; {args.seconds:.0f} s of hostile traffic", flush=True)
    ctx = mp.get_context("spawn")
    gens = [
        ctx.Process(target=datagrams, args=(udp, args.seconds, args.datagram_rate, 1)),
        ctx.Process(target=http_json, args=(base, args.seconds, args.json_rate, 2)),
        ctx.Process(target=otlp, args=(base, args.seconds, args.otlp_rate, 3)),
    ]
    for g in gens:
        g.start()
    scraper = _Scraper(base, args.scrape_encoding == "gzip", args.scrape_connection == "keep-alive")
    lat: list[float] = []
    peak = {"rss_mib": 0.0, "threads": 0, "fds": 0}
    size = 0
    text = b""
    start = time.monotonic()
    next_report = start + args.report_every
    print("   t_s  rss_mib threads fds  scrape_p50_ms scrape_p99_ms metrics_bytes", flush=True)
    try:
        while time.monotonic() - start < args.seconds:
            ms, size, text = scraper.scrape()
            lat.append(ms)
            rss, th, fds = _proc(side.pid)
            peak = {"rss_mib": max(peak["rss_mib"], rss), "threads": max(peak["threads"], th),
                    "fds": max(peak["fds"], fds)}
            now = time.monotonic()
            if now >= next_report:
                q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
                print(f"{now - start:6.0f} {rss:8.1f} {th:7d} {fds:4d} {q[49]:14.1f} {q[98]:13.1f} {size:13d}",
                      flush=True)
                next_report = now + args.report_every
            time.sleep(max(0.0, args.scrape_every - ms / 1e3))
    finally:
        for g in gens:
            g.join(timeout=5)
            if g.is_alive():
                g.kill()
    rss, th, fds = _proc(side.pid)
    probe = _probe(side, Path(args.probe)) if args.probe else None
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    summary = {
        "seconds": args.seconds, "scrapes": len(lat), "scrape_p50_ms": round(q[49], 1),
        "scrape_p99_ms": round(q[98], 1), "scrape_max_ms": round(max(lat), 1),
        "peak_rss_mib": round(peak["rss_mib"], 1), "end_rss_mib": round(rss, 1),
        "peak_threads": peak["threads"], "peak_fds": peak["fds"], "metrics_bytes": size,
        "metrics_text_bytes": len(text), "scrape_encoding": args.scrape_encoding,
        "scrape_connection": args.scrape_connection,
        "series_overflowed": _counter(text, "inferwatch_label_overflow_total", label="series"),
        "otlp_cut": _counter(text, "inferwatch_otlp_cut_total"),
        "otlp_pending_bytes": _counter(text, "inferwatch_otlp_pending_bytes"),
        "lost_frames": _counter(text, "inferwatch_ingest_lost_frames_total"),
        "alive": side.poll() is None,
    }
    if probe is not None:
        summary["probe"] = probe
    sc.stop(timeout=10, check=False)
    print("soak summary: " + json.dumps(summary), flush=True)
    if args.save_metrics:
        Path(args.save_metrics).write_bytes(text)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
