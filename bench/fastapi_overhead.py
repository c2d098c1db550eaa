"""Throughput of a trivial FastAPI endpoint under uvicorn: plain, inferwatch, and the peers people pick.

Uvicorn servers run side by side on 127.0.0.1, several processes, each serving every
variant (dispatched by path, see ``build_server`` in ``bench/_fastapi_apps.py``):

  plain               a trivial JSON endpoint
  inferwatch          the same endpoint with inferwatch's ASGI middleware (request scope,
                      request ID echoed, ingress stage) and one stage inside the handler,
                      configured and sending to a real Unix datagram receiver
  instrumentator      prometheus-fastapi-instrumentator with its defaults (``instrument(app)``)
  starlette-exporter  starlette-exporter's ``PrometheusMiddleware`` with its defaults
  otel-api            OpenTelemetry's ``FastAPIInstrumentor.instrument_app`` with the API only
                      (no SDK: the global tracer and meter providers are the no-op proxies)
  otel-sdk            the same with an SDK ``TracerProvider`` and a ``BatchSpanProcessor``
                      whose exporter counts the spans and discards them (nothing leaves the process)

The Prometheus peers record into the default registry, which the server also serves
at /metrics, as their users would; ``VARIANTS`` says what each variant gives the user.

A closed-loop load generator (raw asyncio HTTP/1.1 keep-alive connections, a fixed
number in flight, so it stays cheap and never outruns the server) loads one variant
on one server process at a time. Each round loads every variant on every process,
rotating the order, so machine noise hits them alike; a round's ratio is a variant's
requests/s over plain's on the same process, and the result is the median over rounds.
The target for inferwatch is at least 95% of the uninstrumented throughput.

Why several processes, each serving every variant: two processes running the very
same code on the same core differ by several percent in speed, for the whole of their
lives (memory layout, hash seeds; a classic measurement bias), which is as large as
the effect measured here. Comparing variants inside one process cancels it, spreading
over several processes averages what is left, and the A/A line (plain on process 1
against plain on process 2, same code) prints the size of this noise floor.

``--instructions`` adds a deterministic measurement when valgrind is installed:
each variant's server runs under callgrind and the difference between two request
counts gives user-space CPU instructions per request (all threads: the SDK's encoding
and sending and the OTel SDK's export thread included; kernel time excluded). Unlike
requests/s it does not move with the machine's load, so on a shared machine it is the
figure to quote; ``--instructions-only`` skips the wall-clock rounds. The SDK's flush
interval is raised under valgrind so its batches stay as large as at full speed. It
also counts ``floor``: a toy middleware and stage written only to find the least any
pure Python implementation of the required behaviour can cost (see
``_fastapi_apps.build_floor_app``), against which the 5% budget of the 0.95 target is printed.

The receiver is a separate process that drains the Unix datagram socket, so the
SDK's sender succeeds (encodes and sends every event) as it does in production.
CPU sharing on a machine with two or more cores (``--no-pin`` turns it off): all
servers are pinned to CPU 0 (only one is loaded at a time), the load generator
and the receiver to CPU 1, so the server under test never fights them for its
core; background threads (the SDK's sender, the OTel export thread) share CPU 0
with their server, as they would in production.

The peers come from the ``bench`` extra: ``pip install -e ".[bench]"``.

Usage:
    python bench/fastapi_overhead.py                      # full run (3 servers, 12 rounds, ~5 min)
    python bench/fastapi_overhead.py --quick              # 2 servers, 5 rounds, ~1 min
    python bench/fastapi_overhead.py --instructions-only  # instructions per request under callgrind (15-25 min)
    python bench/fastapi_overhead.py --variants inferwatch,otel-sdk --quick   # plain and a subset
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fastapi_apps import VARIANTS, serve  # noqa: E402  (bench/ is a folder of scripts, not a package)
from _harness import CALLGRIND_PREFIX, collected, free_port  # noqa: E402

RECEIVER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
if len(sys.argv) > 2 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(sys.argv[2])})
print("ready", flush=True)
n = 0
while True:
    n += len(s.recv(70000))
"""


def pin(cpus: set[int] | None) -> None:
    """Pin this process to ``cpus`` where the OS allows it (Linux)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not start within {timeout} s")


def request_bytes(variant: str) -> bytes:
    return f"GET {VARIANTS[variant].path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


async def _connection(port: int, req: bytes, deadline: float, budget: list[int], lat: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while budget[0] > 0 and time.perf_counter() < deadline:
            budget[0] -= 1
            t0 = time.perf_counter_ns()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            i = head.lower().find(b"content-length:")
            if i < 0:
                raise RuntimeError(f"response without content-length: {head[:200]!r}")
            length = int(head[i + 15 : head.index(b"\r\n", i)])
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"bad response: {head[:100]!r}")
            lat.append(time.perf_counter_ns() - t0)
    finally:
        writer.close()


async def _load(port: int, req: bytes, seconds: float, max_requests: int, concurrency: int) -> tuple[float, list[int]]:
    lat: list[int] = []
    budget = [max_requests]
    t0 = time.perf_counter()
    await asyncio.gather(*(_connection(port, req, t0 + seconds, budget, lat) for _ in range(concurrency)))
    return len(lat) / (time.perf_counter() - t0), lat


def load(port: int, variant: str, seconds: float, max_requests: int, concurrency: int) -> tuple[float, list[int]]:
    """Closed-loop load on one variant's path: ``concurrency`` keep-alive connections, bounded by time and count."""
    req = request_bytes(variant)
    try:
        import uvloop

        return uvloop.run(_load(port, req, seconds, max_requests, concurrency))  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.run(_load(port, req, seconds, max_requests, concurrency))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc; NaN where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def start_server(port: int, env: dict[str, str], cpu: int | None, variants: tuple[str, ...],
                 wrap: list[str] | None = None, **popen: Any) -> subprocess.Popen[Any]:
    cmd = [*(wrap or []), sys.executable, os.path.abspath(__file__), "--serve", "--port", str(port),
           "--variants", ",".join(variants)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    return subprocess.Popen(cmd, env=env, **popen)


def stop(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def instructions_per_request(env: dict[str, str], variants: tuple[str, ...], small: int,
                             large: int) -> dict[str, float]:
    """User-space instructions per request of each variant in its own server process under callgrind.

    Each variant's process builds that variant's app only (plus the plain fallback), and
    gets two runs, ``small`` and ``large`` requests after the same warm-up; the
    difference divided by ``large - small`` leaves start-up and shutdown out.
    """
    out = {}
    for variant in variants:
        counts = []
        t0 = time.monotonic()
        for n in (small, large):
            port = free_port()
            srv = start_server(
                port, {**env, "INFERWATCH_FLUSH_INTERVAL_MS": "2500", "PYTHONHASHSEED": "0"}, None,
                tuple(dict.fromkeys(("plain", variant))),
                list(CALLGRIND_PREFIX),
                stderr=subprocess.PIPE, text=True,
            )
            try:
                wait_port(port, 300)
                load(port, variant, 600, 300, 4)  # warm-up: imports, caches, the first frames
                done = len(load(port, variant, 600, n, 4)[1])
                if done != n:
                    raise SystemExit(f"callgrind run of {variant}: {done} of {n} requests answered")
                srv.send_signal(signal.SIGINT)  # uvicorn exits cleanly; callgrind prints its total
                err = srv.communicate(timeout=300)[1]
            finally:
                stop([srv])
            total = collected(err)
            if total is None:
                raise SystemExit(f"callgrind printed no total for {variant}:\n{err[-2000:]}")
            counts.append(total)
        out[variant] = (counts[1] - counts[0]) / (large - small)
        print(f"  callgrind {variant}: {out[variant]:,.0f} instructions per request "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return out


def parse_variants(ap: argparse.ArgumentParser, text: str | None) -> tuple[str, ...]:
    """The variants named (plain always first, as the reference), in ``VARIANTS`` order."""
    if text is None:
        return tuple(VARIANTS)
    names = {v.strip() for v in text.split(",") if v.strip()}
    unknown = sorted(names - VARIANTS.keys())
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    return tuple(v for v in VARIANTS if v in names or v == "plain")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter run (about a minute)")
    ap.add_argument("--rounds", type=int, help="rounds (default 12, quick 5)")
    ap.add_argument("--seconds", type=float, help="load time per variant per server per round (default 1, quick 0.8)")
    ap.add_argument("--servers", type=int, help="server processes (default 3, quick 2)")
    ap.add_argument("--concurrency", type=int, default=8, help="connections in flight (default 8)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="request cap per load period")
    ap.add_argument("--variants", help=f"comma-separated subset of {', '.join(VARIANTS)} (plain is always in)")
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions per request under valgrind's callgrind (about 2 minutes a variant)")
    ap.add_argument("--instructions-only", action="store_true",
                    help="count instructions under callgrind and skip the wall-clock rounds")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers / load generator to separate CPUs")
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variants = parse_variants(ap, args.variants)
    if args.serve:
        pin(None if args.cpu is None else {args.cpu})
        serve(args.port, variants)
        return 0
    rounds = args.rounds or (5 if args.quick else 12)
    nserv = args.servers or (2 if args.quick else 3)
    seconds = args.seconds or (0.8 if args.quick else 1.0)
    if rounds < 1 or nserv < 1 or seconds <= 0:
        ap.error("--rounds, --servers and --seconds must be positive")
    count = args.instructions or args.instructions_only
    if count and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind on PATH (Debian: apt-get install valgrind)")
    wall = not args.instructions_only
    loaded = tuple(v for v in variants if VARIANTS[v].loaded)
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pinned = not args.no_pin and ncpu >= 2 and hasattr(os, "sched_setaffinity")
    server_cpu = load_cpu = None
    if pinned:
        cpus = sorted(os.sched_getaffinity(0))
        server_cpu, load_cpu = cpus[0], cpus[1]

    tmp = tempfile.mkdtemp(prefix="iwfb")
    sock_path = os.path.join(tmp, "ingest.sock")
    procs: list[subprocess.Popen[Any]] = []
    # (variant, server) -> per-round requests/s and server CPU us per request
    rps: dict[tuple[str, int], list[float]] = {(v, k): [] for v in loaded for k in range(nserv)}
    cpu_us: dict[tuple[str, int], list[float]] = {(v, k): [] for v in loaded for k in range(nserv)}
    lats: dict[str, list[int]] = {v: [] for v in loaded}
    ratios: dict[str, list[float]] = {v: [] for v in loaded}  # variant / plain, same server, same round
    instr: dict[str, float] = {}
    try:
        rx = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, sock_path, *([str(load_cpu)] if pinned else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(rx)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        env = {**os.environ, "INFERWATCH_SIDECAR": f"unix://{sock_path}"}
        if count:
            print(f"counting instructions under callgrind ({len(variants)} variants, about 2 minutes each)...",
                  file=sys.stderr)
            instr = instructions_per_request(env, variants, 500, 2500)
        if wall:
            run_rounds(args, env, loaded, nserv, rounds, seconds, pinned, server_cpu, load_cpu, procs,
                       rps, cpu_us, lats, ratios)
    finally:
        stop(procs[:-1])  # servers first: a server's final flush must find the receiver listening
        stop(procs[-1:])
        try:
            os.unlink(sock_path)
        except OSError:
            pass
        os.rmdir(tmp) if os.path.isdir(tmp) and not os.listdir(tmp) else None
    report(variants, loaded, nserv, rps, cpu_us, lats, ratios, instr, wall)
    return 0


def run_rounds(args: argparse.Namespace, env: dict[str, str], loaded: tuple[str, ...], nserv: int, rounds: int,
               seconds: float, pinned: bool, server_cpu: int | None, load_cpu: int | None,
               procs: list[subprocess.Popen[Any]], rps: dict[tuple[str, int], list[float]],
               cpu_us: dict[tuple[str, int], list[float]], lats: dict[str, list[int]],
               ratios: dict[str, list[float]]) -> None:
    """The wall-clock rounds: every loaded variant on every server, rotating the order each round."""
    servers: list[tuple[int, int]] = []  # (port, pid)
    for _ in range(nserv):
        port = free_port()
        p = start_server(port, env, server_cpu if pinned else None, loaded)
        procs.insert(0, p)  # servers stop before the receiver
        servers.append((port, p.pid))
    for port, _ in servers:
        wait_port(port)
    if pinned:
        pin({load_cpu} if load_cpu is not None else None)
    print(
        f"fastapi_overhead: {nserv} server processes serving {len(loaded)} variants, {rounds} rounds x "
        f"{seconds:.1f} s per variant per server, {args.concurrency} keep-alive connections, rotating "
        f"order; python {sys.version.split()[0]}; "
        + (
            f"servers on CPU {server_cpu}, load generator and receiver on CPU {load_cpu}"
            if pinned
            else f"not pinned ({os.cpu_count()} CPUs)"
        )
        + f"; load average {os.getloadavg()[0]:.1f}"
    )
    for port, _ in servers:  # warm-up
        for v in loaded:
            load(port, v, 0.5, 5000, args.concurrency)
    for r in range(rounds):
        k0 = r % len(loaded)
        order = loaded[k0:] + loaded[:k0]
        for k, (port, pid) in enumerate(servers):
            rate_of = {}
            for variant in order:
                time.sleep(0.15)  # background senders drain the last period's events before this one starts
                c0 = cpu_seconds(pid)
                rate, lat = load(port, variant, seconds, args.max_requests, args.concurrency)
                cpu_us[(variant, k)].append((cpu_seconds(pid) - c0) / max(len(lat), 1) * 1e6)
                rps[(variant, k)].append(rate)
                lats[variant].extend(lat)
                rate_of[variant] = rate
            for v in loaded:
                ratios[v].append(rate_of[v] / rate_of["plain"])
        print(
            f"  round {r + 1}/{rounds}: /plain per variant (median over servers) "
            + ", ".join(f"{v} {statistics.median(ratios[v][-nserv:]):.3f}" for v in loaded[1:]),
            file=sys.stderr,
        )


def report(variants: tuple[str, ...], loaded: tuple[str, ...], nserv: int,
           rps: dict[tuple[str, int], list[float]], cpu_us: dict[tuple[str, int], list[float]],
           lats: dict[str, list[int]], ratios: dict[str, list[float]], instr: dict[str, float],
           wall: bool) -> None:
    def med(d: dict[tuple[str, int], list[float]], v: str) -> float:
        return statistics.median(x for (vv, _), xs in d.items() if vv == v for x in xs)

    def cell(v: str, fmt: str, f: Any) -> str:
        return format(f(v), fmt) if v in loaded and wall else "-"

    def quartiles(v: str) -> str:
        xs = ratios[v]
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        return f"{statistics.median(xs):.3f} ({q[0]:.3f}-{q[2]:.3f})"

    print()
    print(f"{'variant':19s} {'instr/req':>10s} {'instr ratio':>11s} {'req/s':>7s} {'ratio (quartiles)':>21s} "
          f"{'p50 us':>7s} {'p99 us':>7s} {'CPU us/req':>10s}  gives the user")
    for v in variants if instr else loaded:
        print(
            f"{v:19s} "
            + (f"{instr[v]:10,.0f} {instr['plain'] / instr[v]:11.3f} " if instr else f"{'-':>10s} {'-':>11s} ")
            + f"{cell(v, '7.0f', lambda v: med(rps, v)):>7s} "
            + f"{cell(v, 's', quartiles):>21s} "
            + f"{cell(v, '7.0f', lambda v: pct(lats[v], 0.5)):>7s} {cell(v, '7.0f', lambda v: pct(lats[v], 0.99)):>7s} "
            + f"{cell(v, '10.1f', lambda v: med(cpu_us, v)):>10s}  {VARIANTS[v].gives}"
        )
    print("instr ratio: plain's instructions per request over the variant's (callgrind, user space, all threads), "
          "the instruction-bound throughput ratio; ratio: requests/s over plain's, median of same-server pairs")
    if wall:
        print("per server (median req/s):", "; ".join(
            f"{k + 1}: " + ", ".join(f"{v} {statistics.median(rps[(v, k)]):.0f}" for v in loaded)
            for k in range(nserv)))
        if nserv >= 2:
            aa = [a / b for a, b in zip(rps[("plain", 0)], rps[("plain", 1)], strict=True)]
            print(
                f"A/A across processes, plain on server 1 / plain on server 2 (the same code): median "
                f"{statistics.median(aa):.3f}, rounds {min(aa):.3f}-{max(aa):.3f} (why variants share a process)"
            )
    print()
    if "inferwatch" in loaded and wall:
        ratio = statistics.median(ratios["inferwatch"])
        print(f"throughput ratio inferwatch/plain: {ratio:.3f} (median of {len(ratios['inferwatch'])} same-server "
              f"pairs)   target >= 0.95")
        cpu_ratio = med(cpu_us, "plain") / med(cpu_us, "inferwatch")
        print(
            f"CPU-bound throughput ratio (plain/inferwatch server CPU per request): {cpu_ratio:.3f}; "
            f"the SDK costs {med(cpu_us, 'inferwatch') - med(cpu_us, 'plain'):.1f} us of server CPU per request"
        )
    if instr:
        for v in variants[1:]:
            extra = instr[v] - instr["plain"]
            print(f"  {v:19s} adds {extra:9,.0f} instructions per request ({extra / instr['plain'] * 100:5.1f}% "
                  f"of the plain request's)")
        if "instrumentator" in instr and "inferwatch" in instr:
            print(f"inferwatch's added instructions over instrumentator's: "
                  f"{(instr['inferwatch'] - instr['plain']) / (instr['instrumentator'] - instr['plain']):.2f}")
        if "floor" in instr:
            floor = instr["floor"] - instr["plain"]
            budget = instr["plain"] * (1 / 0.95 - 1)
            print(
                f"floor (build_floor_app: the bare behaviour in pure Python, no encoding or sending): adds "
                f"{floor:,.0f} instructions; the 0.95 target leaves {budget:,.0f} for the SDK's whole path, the "
                f"floor takes {floor / budget * 100:.0f}% of it"
            )
    if "inferwatch" in loaded and wall:
        print("target:", "met" if statistics.median(ratios["inferwatch"]) >= 0.95 else "NOT met")


if __name__ == "__main__":
    sys.exit(main())
