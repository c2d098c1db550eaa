"""Fuzz the OTLP trace receiver (``POST /v1/traces``) and check that every span is accounted for.

Seeded bodies: structurally valid random exports (resource, scope and span
attributes of every ``AnyValue`` kind, IDs of wrong lengths, times out of order
or past 64 bits, huge values, deep kvlist/array nesting, lone surrogates in
JSON) and mutations of the recorded Triton and vLLM exports (field swaps, byte
flips, truncation), as protobuf and OTLP/JSON, with and without gzip (gzip
bombs and broken streams included), plus wrong content types and encodings.
They go through the daemon's :class:`TraceReceiver` in-process and, a bounded
number, over HTTP to a real sidecar subprocess on loopback.

For every body the answer must be 200 with a parseable
``ExportTraceServiceResponse`` (its ``rejected_spans`` equal to the spans the
body had rejected), or 400/413/415 with a parseable ``google.rpc.Status``. A body
that decodes must move ``inferwatch_otlp_spans_total`` plus the pending gauge by
exactly the spans it holds (counted here with an independent parse); one that
does not must move ``inferwatch_ingest_decode_errors_total{scope="otlp"}`` by
one and no span count. Afterwards ``/metrics`` must render as Prometheus text
and OpenMetrics and convert to OTLP.

With ``--attacks N`` it also sends the issue-28 attacks (join-buffer bombs, a parent-cycle trace,
new label values in every export, JSON container bombs) and checks the join buffer's byte and
per-trace bounds and the series budget after every export (:func:`attacks`).

Usage:
    .venv/bin/python scripts/fuzz_otlp.py --count 20000 [--seed 1] [--http 500] [--attacks 400]

Prints the inputs tried, crashes, unaccounted items and RSS before/after; exits 1
unless crashes and unaccounted are both 0. The test suite runs the same checks
on a bounded count (``tests/ingest/otlp_traces/test_fuzz_otlp.py``).
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the checkout's tests.helpers holds the one sidecar starter
    sys.path.append(str(REPO))

from tests.helpers.sidecar import SidecarProc  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests/ingest/otlp_traces): find the sibling
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from otlp_fuzz_bodies import Body, _fixture_docs, body, parse_answer, spans_in  # noqa: E402


@dataclass
class Tally:
    """What a fuzz run saw."""

    inputs: int = 0
    spans: int = 0
    answered: dict[int, int] = field(default_factory=dict)
    rejected_spans: int = 0
    crashes: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)

    def check(self, b: Body, status: int, ctype: str, data: bytes) -> tuple[int | None, int]:
        """Check one answer; returns (spans the body holds if it decoded, rejected spans answered)."""
        self.inputs += 1
        self.answered[status] = self.answered.get(status, 0) + 1
        where = f"body #{self.inputs} ({b.content_type!r}, {b.content_encoding!r}, {len(b.raw)} bytes, {b.raw[:60]!r})"
        from inferwatch_sidecar.ingest.otlp_traces.decode import media_type

        n = spans_in(b.plain, media_type(b.content_type))
        if status not in (200, 400, 413, 415):
            self.crashes.append(f"{where}: answered {status} {data[:200]!r}")
            return None, 0
        try:
            answer = parse_answer(status, ctype, data)
        except Exception as e:
            self.crashes.append(f"{where}: answer {status} does not parse ({type(e).__name__}: {e}): {data[:200]!r}")
            return None, 0
        if status == 200:
            if n is None:
                self.unaccounted.append(f"{where}: answered 200 for a body that does not decode")
                return None, 0
            self.spans += n
            self.rejected_spans += int(answer)
            return n, int(answer)
        if n is not None:
            self.unaccounted.append(f"{where}: a readable export of {n} spans answered {status} {answer!r:.200}")
        return None, 0

    def report(self, label: str) -> str:
        return (f"{label}: inputs tried {self.inputs}, answers {dict(sorted(self.answered.items()))}, spans in "
                f"decoded bodies {self.spans} (rejected in answers {self.rejected_spans}), crashes "
                f"{len(self.crashes)}, unaccounted {len(self.unaccounted)}")


def rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def make_sidecar() -> Any:
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.daemon import Sidecar

    return Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False}}))


def _span_total(s: Any) -> int:
    m = s.traces.mapper
    return int(sum(m.counts.values()) + m.pending)


def _otlp_errors(s: Any) -> int:
    return sum(n for (scope, _), n in s.pipeline.decode_errors.items() if scope == "otlp")


def in_process(count: int, seed: int) -> Tally:
    """Fuzz the daemon's :class:`TraceReceiver` in this process, checking its counters after every body."""
    s = make_sidecar()
    rng = random.Random(seed)
    fixtures = _fixture_docs()
    tally = Tally()
    errors = _ErrorLog()
    logging.getLogger().addHandler(errors)
    try:
        _feed(s, rng, fixtures, tally, count)
    finally:
        logging.getLogger().removeHandler(errors)
    s.traces.flush()
    if _span_total(s) != tally.spans or s.traces.mapper.pending:
        tally.unaccounted.append(f"after flush: {_span_total(s)} spans counted, {tally.spans} sent in decoded bodies")
    internal = {k: n for k, n in s.pipeline.decode_errors.items() if k[1] == "internal_error"}
    if internal:
        tally.crashes.append(f"events the aggregator could not use: {internal}")
    tally.crashes.extend(f"logged: {m}" for m in errors.messages[:5])
    tally.crashes.extend(exposition_failures(s))
    return tally


class _ErrorLog(logging.Handler):
    """Collects ERROR records: the pipeline logs (and counts) an event it could not aggregate, then carries on."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.messages.append(f"{record.getMessage()}: {type(exc).__name__}: {exc}" if exc else record.getMessage())


def _feed(s: Any, rng: random.Random, fixtures: list[dict[str, Any]], tally: Tally, count: int) -> None:
    for _ in range(count):
        b = body(rng, fixtures)
        spans0, err0, rej0 = _span_total(s), _otlp_errors(s), s.traces.mapper.counts
        rej0 = sum(v for (r, _), v in rej0.items() if r == "rejected")
        try:
            status, ctype, data = s.traces.handle(b.raw, b.content_type, b.content_encoding)
        except BaseException as e:  # noqa: BLE001 - a crash is what we are looking for
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({b.content_type!r}, {b.raw[:60]!r}): {type(e).__name__}: {e}")
            continue
        before = len(tally.crashes) + len(tally.unaccounted)
        n, rejected = tally.check(b, status, ctype, data)
        if len(tally.crashes) + len(tally.unaccounted) > before:
            continue
        moved_spans, moved_err = _span_total(s) - spans0, _otlp_errors(s) - err0
        moved_rej = sum(v for (r, _), v in s.traces.mapper.counts.items() if r == "rejected") - rej0
        want = (n, 0, rejected) if n is not None else (0, 1, 0)
        if (moved_spans, moved_err, moved_rej) != want:
            tally.unaccounted.append(f"body #{tally.inputs} ({b.raw[:60]!r}): answered {status}, spans counted "
                                     f"+{moved_spans}, decode errors +{moved_err}, rejected +{moved_rej}; want {want}")


def exposition_failures(s: Any) -> list[str]:
    """Render the sidecar's registry as Prometheus text, OpenMetrics and OTLP; one line per failure."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from inferwatch_sidecar.export.otlp.convert import families_to_request

    out = []
    for name, render_ in (("text", generate_latest), ("OpenMetrics", generate_openmetrics)):
        try:
            render_(s.registry)
        except Exception as e:
            out.append(f"{name} exposition failed: {type(e).__name__}: {e}")
    try:
        req, stats = families_to_request(s.collect(), {"service.name": "fuzz"}, now_s=time.time(), start_time_s=0.0)
        req.SerializeToString()
        if stats.dropped.get("family_error"):
            out.append(f"OTLP conversion dropped families: {stats.dropped}")
    except Exception as e:
        out.append(f"OTLP conversion failed: {type(e).__name__}: {e}")
    return out


def post(url: str, b: Body) -> tuple[int, str, bytes]:
    headers = {"Content-Type": b.content_type}
    if b.content_encoding is not None:
        headers["Content-Encoding"] = b.content_encoding
    req = urllib.request.Request(url, data=b.raw, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def over_http(base_url: str, count: int, seed: int) -> tuple[Tally, int]:
    """Fuzz a running sidecar; returns the tally and the bodies answered with an error."""
    rng = random.Random(seed)
    fixtures = _fixture_docs()
    tally = Tally()
    errors = 0
    for _ in range(count):
        b = body(rng, fixtures)
        try:
            status, ctype, data = post(f"{base_url}/v1/traces", b)
        except OSError as e:
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({b.raw[:60]!r}): no answer: {e}")
            continue
        tally.check(b, status, ctype, data)
        errors += status != 200
    return tally, errors


def scrape_mismatches(base_url: str, tally: Tally, errors: int) -> list[str]:
    """Scrape /metrics (text and OpenMetrics) and compare the OTLP counters with the answers."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    text = ""
    for accept in ("text/plain", "application/openmetrics-text"):
        req = urllib.request.Request(base_url + "/metrics", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                if accept == "text/plain":
                    text = r.read().decode()
        except urllib.error.HTTPError as e:
            out.append(f"/metrics ({accept}) answered {e.code}: {e.read()[:200]!r}")
    spans = decode_errors = 0.0
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in ("inferwatch_otlp_spans_total", "inferwatch_otlp_pending_spans"):
                spans += smp.value
            elif smp.name == "inferwatch_ingest_decode_errors_total" and smp.labels["scope"] == "otlp":
                decode_errors += smp.value
    if spans != tally.spans:
        out.append(f"inferwatch_otlp_spans_total + pending = {spans}, spans in decoded bodies {tally.spans}")
    if decode_errors != errors:
        out.append(f"decode errors (scope=otlp) = {decode_errors}, bodies answered with an error {errors}")
    return out


def run_sidecar(tmp: str) -> SidecarProc:
    """Start ``inferwatch sidecar`` on loopback (join timeout 600 s) and wait until it is ready."""
    return SidecarProc(Path(tmp), ["--set", "traces.join_timeout_s=600"], sock=os.path.join(tmp, "s.sock"),
                       ready_timeout=20).start()


def run_http(count: int, seed: int) -> tuple[Tally, tuple[int, int]]:
    """Fuzz a fresh sidecar subprocess; returns the tally and its RSS (KiB) before and after."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_sidecar(tmp)
        try:
            base = proc.url
            rss0 = rss_kib(proc.pid)
            tally, errors = over_http(base, count, seed)
            tally.unaccounted.extend(scrape_mismatches(base, tally, errors))
            rss1 = rss_kib(proc.pid)
        finally:
            proc.stop(timeout=15)
    return tally, (rss0, rss1)


def _pb_span(trace: int, sid: int, parent: int, kind: int, name: str, attrs: list[tuple[str, Any]],
             events: int) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    sp = Span(trace_id=trace.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
              parent_span_id=parent.to_bytes(8, "big") if parent else b"", name=name, kind=kind,  # type: ignore[arg-type]
              start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_000_001_000_000)
    for k, v in attrs:
        val = AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=str(v))
        sp.attributes.append(KeyValue(key=k, value=val))
    for _ in range(events):
        e = sp.events.add()
        e.name = "e"
        e.time_unix_nano = 1_700_000_000_000_500_000
    return sp


def _pb_export(spans: list[Any], service: str = "svc") -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def attacks(count: int, seed: int) -> list[str]:
    """The issue-28 attacks, ``count`` exports in all, through one receiver; one line per bound broken.

    Join-buffer bombs (big keys, many attributes and events, requests that never come), stage
    spans in a parent cycle with requests touching their trace, the cardinality attack (new
    models, stages and error types in every export) and JSON container bombs, in seeded random
    order. Checked after every export: the join buffer within ``traces.max_pending_bytes`` and
    ``max_spans_per_trace``, the request/stage series within ``labels.max_series``, every span
    counted once, and afterwards the exposition renders within the whole-exposition budget.
    """

    s = make_sidecar()
    r, agg, cfg = s.traces, s.aggregator, s.cfg
    rng = random.Random(seed)
    broken: list[str] = []
    sent = 0
    cycle_trace = rng.randrange(1, 1 << 100)
    for i in range(count):
        kind = rng.randrange(4)
        spans0 = _span_total(s)
        if kind == 0:
            key = "k" * rng.choice((300, 10_000, 200_000))
            sp = _pb_span(rng.randrange(1, 1 << 120), rng.randrange(1, 1 << 60), 99, 1, "stage",
                          [("gen_ai.operation.name", "chat"), (key, "v")]
                          + [(f"a{j}", "x" * 255) for j in range(rng.randrange(0, 400))], rng.randrange(0, 3000))
            raw, n = gzip.compress(_pb_export([sp])), 1
            status = r.handle(raw, "application/x-protobuf", "gzip")[0]
        elif kind == 1:
            n = rng.randrange(1, 400)
            raw = _pb_export([_pb_span(cycle_trace, rng.randrange(1 << 16, 1 << 60), 1 + rng.randrange(64), 1,
                                       "stage", [("gen_ai.operation.name", "op")], 0) for _ in range(n)])
            raw += _pb_export([_pb_span(cycle_trace, rng.randrange(1 << 16, 1 << 60), rng.randrange(1, 80), 2,
                                        "req", [], 0)])  # two messages concatenated are one message
            n += 1
            status = r.handle(raw, "application/x-protobuf", None)[0]
        elif kind == 2:
            k = rng.randrange(1 << 40)
            spans = [_pb_span(k + 1, 1, 0, 2, "req", [("gen_ai.request.model", f"model{k}"),
                                                       ("http.response.status_code", 500 + k % 99)], 0)]
            spans += [_pb_span(k + 1, 2 + j, 1, 1, "op", [("gen_ai.operation.name", f"stage{k}-{j}")], 0)
                      for j in range(rng.randrange(1, 60))]
            raw, n = _pb_export(spans[1:] + spans[:1], service=f"svc{k % 500}"), len(spans)
            status = r.handle(raw, "application/x-protobuf", None)[0]
        else:
            raw = b'{"resourceSpans":[' + b"{}," * rng.randrange(10_000, 1_500_000) + b"{}]}"
            n = 0
            status = r.handle(raw, "application/json", None)[0]
        sent += n if status == 200 else 0
        m = r.mapper
        if m.nbytes > m.max_pending_bytes:
            broken.append(f"export {i}: join buffer {m.nbytes} B > {m.max_pending_bytes}")
        if any(len(e.parents) > m.max_spans_per_trace for e in m.traces.values()):
            broken.append(f"export {i}: a trace remembers more than {m.max_spans_per_trace} spans")
        if agg.series > cfg.labels.max_series:
            broken.append(f"export {i}: {agg.series} series > labels.max_series {cfg.labels.max_series}")
        if status == 200 and _span_total(s) - spans0 != n:
            broken.append(f"export {i}: {n} spans sent, {_span_total(s) - spans0} counted")
        if status not in (200, 413):
            broken.append(f"export {i}: answered {status}")
    s.traces.flush()
    if _span_total(s) != sent:
        broken.append(f"{_span_total(s)} spans counted, {sent} sent in accepted exports")
    from prometheus_client.exposition import generate_latest

    text = generate_latest(s.exposition).decode()  # type: ignore[arg-type]
    samples = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    if samples > cfg.labels.max_exposition_series + 500:  # the core families outside the budgeted view's cut
        broken.append(f"/metrics has {samples} samples > labels.max_exposition_series")
    broken.extend(exposition_failures(s))
    return broken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", type=int, default=0, metavar="N",
                    help="also send N exports of the issue-28 attacks (join, cardinality, byte-budget) and check "
                    "the bounds after each")
    ap.add_argument("--count", type=int, default=20_000, help="bodies through the receiver in-process")
    ap.add_argument("--http", type=int, default=500, help="bodies over HTTP to a real sidecar (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rss0 = rss_kib()
    tally = in_process(args.count, args.seed)
    print(tally.report("in-process") + f" ({time.monotonic() - t0:.1f} s); RSS {rss0 // 1024} MiB -> "
          f"{rss_kib() // 1024} MiB")
    bad = tally.crashes + tally.unaccounted
    if args.http:
        t0 = time.monotonic()
        h, (r0, r1) = run_http(args.http, args.seed + 1)
        print(h.report("over HTTP") + f" ({time.monotonic() - t0:.1f} s); sidecar RSS {r0 // 1024} MiB -> "
              f"{r1 // 1024} MiB")
        bad += h.crashes + h.unaccounted
    if args.attacks:
        t0 = time.monotonic()
        broken = attacks(args.attacks, args.seed + 2)
        print(f"attacks: {args.attacks} exports, {len(broken)} bounds broken ({time.monotonic() - t0:.1f} s); "
              f"RSS {rss_kib() // 1024} MiB")
        bad += broken
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
