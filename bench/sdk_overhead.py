"""SDK overhead per request, side by side against the named baselines.

Variants, each one "request" of the same work (five tiny stage functions):

  (a) bare       the five functions, no instrumentation
  (b) sdk        inferwatch: request scope, 5 stages (decorators), record() with 20 features,
                 configured and sending to a real Unix datagram receiver in another process
  (c) prom       the five functions plus five cached prometheus_client Histogram.observe calls
  (c') prom+t    the same, timing each stage with perf_counter (what instrumenting really costs)
  (d) otel       five OpenTelemetry SDK spans, BatchSpanProcessor with a no-op exporter
  (f) prom-equiv what a user would write with prometheus_client to record what (b) records:
                 five timed stage histograms, twenty feature histograms, a prediction
                 counter and a confidence histogram (cached children, labels by name)
  (e) off        inferwatch code path of (b) before configure()
  (e') off/stage the five decorated stage functions alone, before configure()

Rounds interleave the variants so that machine noise hits them alike; we print the
median per-request time of each, the overhead over (a), and the ratios the targets
name. Absolute numbers on a shared machine are noise; the ratios are the result.

The sender thread encodes and sends off the request path, but it still uses CPU
and, in CPython, the GIL: in a CPU-bound loop every microsecond it spends is a
microsecond the request thread waits. So (b) is timed with the sender held off
(a long flush interval), in chunks of 200 requests with an untimed flush() in
between, as the sender would drain every few milliseconds; the flushes (encode
and send) are timed on their own and divided per request. Both are printed, and
so is their sum: the SDK's total, set against (f).

``--instructions`` (valgrind on PATH) also counts user-space CPU instructions per
request under callgrind for (a), (b) with its flushes (the SDK's total: hot path plus
the sender's encoding and sending), (c), (d) and (f): each variant runs in its own
interpreter twice, with two call counts after the same warm-up, and the difference
leaves start-up and shutdown out. Unlike the wall-clock figures it does not move with
the machine's load, so on a shared machine it is the figure to quote. It also counts the
instructions of ``import inferwatch`` (over an interpreter that imports nothing), the noise-free
twin of the import time. ``--instructions-only`` skips the wall-clock rounds.

Usage:
    python bench/sdk_overhead.py                      # full run (about a minute)
    python bench/sdk_overhead.py --quick              # under ~30 s
    python bench/sdk_overhead.py --instructions-only  # instructions per request under callgrind (5-10 min)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # loaded by path (the tests): find _harness
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import inferwatch  # noqa: E402
from inferwatch import _core  # noqa: E402
from inferwatch.wire import EV_RECORD, EV_REQUEST, Decoder, Encoder  # noqa: E402

FEATURES = {f"feature_{i}": float(i) * 0.5 for i in range(20)}
STAGES = ("ingress", "queue", "preprocess", "inference", "postprocess")
#: Requests per timed chunk of (b); about what a busy server buffers between two sender wake-ups.
CHUNK = 200


def _f1(x: int) -> int:
    return x + 1


def _f2(x: int) -> int:
    return x + 1


def _f3(x: int) -> int:
    return x + 1


def _f4(x: int) -> int:
    return x + 1


def _f5(x: int) -> int:
    return x + 1


def bare() -> int:
    return _f5(_f4(_f3(_f2(_f1(0)))))


# The SDK variant: the decorators are applied at import time, before configure(),
# exactly as serving code does; (e) runs the same code unconfigured.
s1 = inferwatch.stage("ingress")(_f1)
s2 = inferwatch.stage("queue")(_f2)
s3 = inferwatch.stage("preprocess")(_f3)
s4 = inferwatch.stage("inference")(_f4)
s5 = inferwatch.stage("postprocess")(_f5)
_request = inferwatch.request
_record = inferwatch.record


def sdk() -> int:
    with _request():
        y = s5(s4(s3(s2(s1(0)))))
        _record(prediction="cat", confidence=0.93, features=FEATURES)
    return y


def sdk_stages_only() -> int:
    return s5(s4(s3(s2(s1(0)))))


def make_prom() -> tuple[Callable[[], int], Callable[[], int]]:
    from prometheus_client import CollectorRegistry, Histogram

    reg = CollectorRegistry()
    h = Histogram("stage_seconds", "stage time", ["stage"], registry=reg)
    c1, c2, c3, c4, c5 = (h.labels(n) for n in ("ingress", "queue", "preprocess", "inference", "postprocess"))

    def prom() -> int:
        x = _f1(0)
        c1.observe(0.001)
        x = _f2(x)
        c2.observe(0.001)
        x = _f3(x)
        c3.observe(0.001)
        x = _f4(x)
        c4.observe(0.001)
        x = _f5(x)
        c5.observe(0.001)
        return x

    pc = time.perf_counter

    def prom_timed() -> int:
        t = pc()
        x = _f1(0)
        t2 = pc()
        c1.observe(t2 - t)
        x = _f2(x)
        t = pc()
        c2.observe(t - t2)
        x = _f3(x)
        t2 = pc()
        c3.observe(t2 - t)
        x = _f4(x)
        t = pc()
        c4.observe(t - t2)
        x = _f5(x)
        c5.observe(pc() - t)
        return x

    return prom, prom_timed


def make_prom_equivalent() -> tuple[Callable[[], int], Any]:
    """(f): the prometheus_client code that records what (b) records, and the registry it records into.

    Per request: each of the five stages timed with ``perf_counter`` into its stage
    histogram, the twenty features observed into their histograms, the prediction
    counted by class and the confidence observed. Children are looked up once where the
    label value is fixed (stage, feature); the prediction's class is the request's, so
    its child is looked up per request, as user code does.
    """
    from prometheus_client import CollectorRegistry, Counter, Histogram

    reg = CollectorRegistry()
    stage = Histogram("stage_seconds", "Stage latency.", ["stage"], registry=reg)
    feature = Histogram("feature_value", "Feature values.", ["feature"], registry=reg)
    predictions = Counter("predictions", "Predictions by class.", ["prediction"], registry=reg)
    confidence = Histogram(
        "confidence", "Prediction confidence.", buckets=[i / 20 for i in range(1, 21)], registry=reg
    )
    c1, c2, c3, c4, c5 = (stage.labels(n) for n in STAGES)
    features = [(feature.labels(name).observe, name) for name in FEATURES]
    by_class = predictions.labels
    conf = confidence.observe
    pc = time.perf_counter

    def prom_equivalent() -> int:
        t = pc()
        x = _f1(0)
        t2 = pc()
        c1.observe(t2 - t)
        x = _f2(x)
        t = pc()
        c2.observe(t - t2)
        x = _f3(x)
        t2 = pc()
        c3.observe(t2 - t)
        x = _f4(x)
        t = pc()
        c4.observe(t - t2)
        x = _f5(x)
        c5.observe(pc() - t)
        values = FEATURES
        for observe, name in features:
            observe(values[name])
        by_class("cat").inc()
        conf(0.93)
        return x

    return prom_equivalent, reg


def make_otel() -> tuple[Callable[[], int], Callable[[], None]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class NullExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    tracer = provider.get_tracer("bench")
    span = tracer.start_as_current_span

    def otel() -> int:
        with span("ingress"):
            x = _f1(0)
        with span("queue"):
            x = _f2(x)
        with span("preprocess"):
            x = _f3(x)
        with span("inference"):
            x = _f4(x)
        with span("postprocess"):
            x = _f5(x)
        return x

    return otel, provider.shutdown


def run(fn: Callable[[], int], n: int) -> tuple[float, float, float]:
    """Per-call wall ns, plus process and thread CPU ns, for n calls."""
    p0, t0, w0 = time.process_time_ns(), time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        fn()
    w1, t1, p1 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
    return (w1 - w0) / n, (p1 - p0) / n, (t1 - t0) / n


RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
print("ready", flush=True)
while True:
    s.recv(70000)
"""


def import_time_ms(repeats: int) -> float:
    code = "import time; t = time.perf_counter(); import inferwatch; print((time.perf_counter() - t) * 1e3)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout)
        for _ in range(repeats)
    ]
    return statistics.median(times)


def wire_costs(n_events: int) -> dict[str, float]:
    """Encoder/decoder cost per event (us), the sender's and the sidecar's per-event work."""
    ctx = ("svc", "model", "v1")
    req = (EV_REQUEST, ctx, time.time_ns(), 123456, 0, None, "abcdef-12", None,
           [(n, 1000 * i, None) for i, n in enumerate(("ingress", "queue", "preprocess", "inference", "postprocess"))])
    rec = (EV_RECORD, ctx, time.time_ns(), "abcdef-12", "cat", 0.93, None, FEATURES)
    out = {}
    for name, ev in (("request_5_stages", req), ("record_20_features", rec)):
        enc = Encoder(1, 2)
        dec = Decoder()
        for f in enc.encode([ev]):
            dec.decode(f)  # learn the schema
        evs = [ev] * 100
        rounds = max(1, n_events // 100)
        t = time.perf_counter_ns()
        for _ in range(rounds):
            frames = enc.encode(evs)
        enc_us = (time.perf_counter_ns() - t) / (rounds * 100) / 1e3
        t = time.perf_counter_ns()
        for _ in range(rounds):
            for f in frames:
                dec.decode(f)
        dec_us = (time.perf_counter_ns() - t) / (rounds * 100) / 1e3
        out[f"encode {name}"] = enc_us
        out[f"decode {name}"] = dec_us
    return out


#: What --instructions counts, in order: (b) is the SDK's total, its flushes (the sender's work) included.
COUNTED = ("a", "b", "c", "d", "f")
LABELS = {
    "a": "(a)  bare function",
    "b": "(b)  inferwatch: request + 5 stages + record(20 features)",
    "c": "(c)  5 cached prometheus Histogram.observe",
    "c'": "(c') 5 cached observe + perf_counter timing",
    "d": "(d)  5 OpenTelemetry SDK spans (BatchSpanProcessor)",
    "e": "(e)  inferwatch before configure(): request+stages+record",
    "e'": "(e') inferwatch before configure(): the 5 stages alone",
    "f": "(f)  prometheus_client equivalent of (b)",
}


def count_child(variant: str, calls: int, sidecar: str) -> None:
    """The ``--count`` child run under callgrind: a fixed warm-up, then ``calls`` calls of one variant.

    (b) flushes after every ``CHUNK`` calls, from this thread, as its sender thread
    would every few milliseconds: its count is the SDK's total, encoding and sending included.
    """
    otel_shutdown = None
    if variant == "a":
        fn = bare
    elif variant == "b":
        inferwatch.configure(
            service="bench", model="m", model_version="v1", sidecar=sidecar,
            buffer_size=4 * CHUNK + 16, flush_interval_ms=10_000,
        )
        fn = sdk
    elif variant == "c":
        fn = make_prom()[0]
    elif variant == "d":
        fn, otel_shutdown = make_otel()
    elif variant == "f":
        fn = make_prom_equivalent()[0]
    else:
        raise SystemExit(f"--count: unknown variant {variant!r}; one of {', '.join(COUNTED)}")
    for n in (2 * CHUNK, calls):  # the warm-up, then the counted calls
        for _ in range(n // CHUNK):
            for _ in range(CHUNK):
                fn()
            if variant == "b":
                inferwatch.flush(timeout=30)
    if variant == "b":
        drops = inferwatch.stats()["drops"]
        inferwatch.shutdown(timeout=10)
        if drops:
            raise SystemExit(f"--count b: the SDK dropped events: {drops}")
    if otel_shutdown is not None:
        otel_shutdown()


def instructions(sidecar: str, small: int, large: int) -> dict[str, float]:
    """User-space instructions per request of each ``COUNTED`` variant, from two callgrind runs of ``count_child``."""
    from _harness import STABLE_HASH_ENV, callgrind_instructions  # here: the counted children run this file

    out = {}
    for variant in COUNTED:
        counts = [callgrind_instructions([sys.executable, os.path.abspath(__file__), "--count", variant, "--calls",
                                          str(n), "--sidecar", sidecar], env=STABLE_HASH_ENV)
                  for n in (small, large)]
        out[variant] = (counts[1] - counts[0]) / (large - small)
        print(f"  callgrind ({variant}): {out[variant]:,.0f} instructions per request", file=sys.stderr)
    return out


def import_instructions() -> float:
    """User-space instructions of ``import inferwatch`` under callgrind, over an interpreter that imports nothing.

    The wall-clock import time moves with the machine's load; this count does not (bytecode cached: one
    untimed import first).
    """
    from _harness import STABLE_HASH_ENV, callgrind_run

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import inferwatch"], check=True, env=env)
    counts = [callgrind_run([sys.executable, "-c", code], base_env=env, env=STABLE_HASH_ENV, timeout=600).instructions
              for code in ("pass", "import inferwatch")]
    return float(counts[1] - counts[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and calls (finishes in under ~30 s)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 15, quick 5)")
    ap.add_argument("--calls", type=int, help="calls per variant per round (default 20000, quick 4000)")
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions per request under valgrind's callgrind (5-10 minutes)")
    ap.add_argument("--instructions-only", action="store_true",
                    help="count instructions under callgrind and skip the wall-clock rounds")
    ap.add_argument("--count", help=argparse.SUPPRESS)
    ap.add_argument("--sidecar", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.count:
        count_child(args.count, args.calls, args.sidecar)
        return 0
    rounds = args.rounds or (5 if args.quick else 15)
    calls = args.calls or (4000 if args.quick else 20000)
    if rounds < 1 or calls < CHUNK:
        ap.error(f"--rounds must be positive and --calls at least {CHUNK}")
    counting = args.instructions or args.instructions_only
    if counting and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind on PATH (Debian: apt-get install valgrind)")

    tmp = tempfile.mkdtemp(prefix="iwbench")
    path = os.path.join(tmp, "ingest.sock")
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER, path], stdout=subprocess.PIPE, text=True)
    assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
    try:
        instr = {}
        if counting:
            print("counting instructions under callgrind (about a minute a variant)...", file=sys.stderr)
            instr = instructions(path, 1000, 6000)
            imp_instr = import_instructions()
        if not args.instructions_only:
            wall_clock(args, rounds, calls, path)
    finally:
        rx.kill()
        rx.wait()
        try:
            os.unlink(path)
            os.rmdir(tmp)
        except OSError:
            pass
    if instr:
        over = {k: instr[k] - instr["a"] for k in instr}
        print()
        print("Instructions per request (callgrind, user space, all threads; (b) with its flushes: the SDK's total):")
        print(f"{'variant':60s} {'instructions':>12s} {'over (a)':>10s}")
        for k in COUNTED:
            print(f"{LABELS[k]:60s} {instr[k]:12,.0f} {over[k]:10,.0f}")
        print(f"  (f)/(b) = {over['f'] / over['b']:.2f}: the prometheus_client equivalent costs that many times the "
              f"SDK's total")
        print(f"  (b)/(c) = {over['b'] / over['c']:.2f}; (d)/(b) = {over['d'] / over['b']:.2f}")
        print(f"import inferwatch: {imp_instr:,.0f} instructions over an interpreter that imports nothing")
    return 0


def wall_clock(args: argparse.Namespace, rounds: int, calls: int, path: str) -> None:
    """The interleaved wall-clock rounds and their report."""
    results, bg_cost, drops, sent = wall_clock_rounds(rounds, calls, path)
    b_over, ratio_bc, ratio_db, per_stage_off = report_overheads(results)
    bg = statistics.median(bg_cost)
    over_f, over_d = (statistics.median(results[k]) - statistics.median(results["a"]) for k in ("f", "d"))
    print()
    print("The background sender (off the request path, but the same process and GIL):")
    print(f"  encode + send, CPU per request (2 events), timed in flush(): {bg / 1e3:.3f} us (median)")
    print(f"  hot path + background = {(b_over + bg) / 1e3:.3f} us per request of CPU in all (the SDK's total)")
    print(f"  (f)/(hot path + background) = {over_f / (b_over + bg):.2f}: the prometheus_client equivalent "
          f"({over_f / 1e3:.3f} us) against the SDK's total")
    print(f"  (d)/(hot path + background) = {over_d / (b_over + bg):.2f}")
    wire = wire_costs(2000 if args.quick else 10000)
    for k, v in wire.items():
        print(f"  {k:32s} {v:6.2f} us/event")
    print(f"  events sent {sent}, drops {drops or 'none'}")
    imp = import_time_ms(3 if args.quick else 7)
    print()
    print(f"import inferwatch: {imp:.1f} ms (median, fresh interpreter, bytecode cached)   target < 50 ms")
    ok = b_over <= 5000 and ratio_bc <= 1.5 and ratio_db >= 15 and per_stage_off <= 100 and imp < 50
    print()
    print("targets:", "all met" if ok else "NOT all met (see above)")


def wall_clock_rounds(rounds: int, calls: int, path: str
                      ) -> tuple[dict[str, list[float]], list[float], dict[str, int], int]:
    """Every variant timed once per round, interleaved: (ns per request by variant, the sender's CPU per request
    per round, the SDK's drops, the events it sent)."""
    prom, prom_timed = make_prom()
    prom_equivalent = make_prom_equivalent()[0]
    otel, otel_shutdown = make_otel()
    results: dict[str, list[float]] = {k: [] for k in LABELS}
    bg_cost: list[float] = []
    drops: dict[str, int] = {}
    sent = 0
    print(f"sdk_overhead: {rounds} rounds x {calls} calls per variant, interleaved; python {sys.version.split()[0]}; "
          f"load average {os.getloadavg()[0]:.1f}")
    t_start = time.monotonic()
    try:
        for r in range(rounds):
            assert _core._rt is None
            for _ in range(2):  # warm-up both paths a little each round
                bare()
                sdk()
            results["a"].append(run(bare, calls)[0])
            results["e"].append(run(sdk, calls)[0])
            results["e'"].append(run(sdk_stages_only, calls)[0])
            hot, bg, st = sdk_round(calls, path)
            results["b"].append(hot)
            bg_cost.append(bg)
            for k, v in st["drops"].items():
                drops[k] = drops.get(k, 0) + v
            sent += st["sent_events"]
            results["c"].append(run(prom, calls)[0])
            results["c'"].append(run(prom_timed, calls)[0])
            results["f"].append(run(prom_equivalent, calls)[0])
            results["d"].append(run(otel, calls)[0])
            print(f"  round {r + 1}/{rounds} done ({time.monotonic() - t_start:.1f} s)", file=sys.stderr)
    finally:
        otel_shutdown()
    return results, bg_cost, drops, sent


def sdk_round(calls: int, path: str) -> tuple[float, float, dict[str, Any]]:
    """The SDK configured and sending to ``path``: (hot path ns per request, sender CPU ns per request, its stats)."""
    inferwatch.configure(
        service="bench", model="m", model_version="v1", sidecar=path,
        buffer_size=4 * calls + 16, flush_interval_ms=10_000,
    )
    inferwatch.flush()  # HELLO out of the way
    # Time the hot path in chunks of CHUNK requests and flush between them, untimed,
    # as the sender thread would every few ms; the flushes are timed on their own.
    # (Holding a whole run's events in the buffer would make the garbage collector
    # walk them again and again, a cost a real server with a draining sender never sees.)
    hot = flush_ns = 0.0
    for _ in range(calls // CHUNK):
        hot += run(sdk, CHUNK)[0] * CHUNK
        t = time.thread_time_ns()  # CPU, not wall: a receiver that lags makes the sender wait
        inferwatch.flush(timeout=30)
        flush_ns += time.thread_time_ns() - t
    st = inferwatch.stats()
    inferwatch.shutdown(timeout=10)
    return hot / (calls // CHUNK * CHUNK), flush_ns / (calls // CHUNK * CHUNK), st


def report_overheads(results: dict[str, list[float]]) -> tuple[float, float, float, float]:
    """The medians per variant and the overhead ratios against their targets; returns ((b)'s overhead, (b)/(c),
    (d)/(b), (e')'s overhead per stage)."""
    med = {k: statistics.median(v) for k, v in results.items()}
    over = {k: med[k] - med["a"] for k in med}
    print()
    print(f"{'variant':60s} {'median/request':>15s} {'over (a)':>12s}")
    for k in ("a", "b", "c", "c'", "f", "d", "e", "e'"):
        print(f"{LABELS[k]:60s} {med[k] / 1e3:12.3f} us {over[k] / 1e3:9.3f} us")
    b_over = over["b"]
    ratio_bc = b_over / over["c"]
    ratio_db = over["d"] / b_over
    per_stage_off = over["e'"] / 5
    print()
    print("Ratios of overheads (over the bare function):")
    print(f"  (b)/(c)  = {ratio_bc:6.2f}   target <= 1.5")
    print(f"  (b)/(c') = {b_over / over[chr(99) + chr(39)]:6.2f}   (prometheus with the timing it would need)")
    print(f"  (d)/(b)  = {ratio_db:6.2f}   target >= 15")
    print(f"  (b) overhead = {b_over / 1e3:.3f} us per request   target <= 5 us")
    print(f"  (e') overhead = {per_stage_off:.0f} ns per stage   target <= 100 ns")
    print(f"  (e) overhead = {over['e'] / 5:.0f} ns per stage if the request scope and record no-ops are counted too")
    return b_over, ratio_bc, ratio_db, per_stage_off


if __name__ == "__main__":
    sys.exit(main())
