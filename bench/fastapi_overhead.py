"""Throughput of a trivial FastAPI endpoint under uvicorn, with and without inferwatch.

Uvicorn servers run side by side on 127.0.0.1, several processes of each variant:

  plain         a trivial JSON endpoint
  instrumented  the same endpoint with inferwatch's ASGI middleware (request scope,
                request ID echoed, ingress stage) and one stage inside the handler,
                configured and sending to a real Unix datagram receiver

A closed-loop load generator (raw asyncio HTTP/1.1 keep-alive connections, a fixed
number in flight, so it stays cheap and never outruns the server) loads one server
process at a time. Each round loads every process of both variants, alternating
the order, so machine noise hits both alike; a round's ratio is instrumented
requests/s over plain requests/s, and the result is the median over rounds. The
target is at least 95% of the uninstrumented throughput.

Why several processes per variant: two processes running the very same code on
the same core differ by several percent in speed, for the whole of their lives
(memory layout, hash seeds; a classic measurement bias), which is as large as the
effect measured here. Spreading each variant over several processes averages that
out, and the A/A line (plain process 1 against plain process 2, same code) prints
the size of this noise floor next to the result.

``--instructions`` adds a deterministic measurement when valgrind is installed:
each variant's server runs under callgrind and the difference between two request
counts gives user-space CPU instructions per request (all threads, the SDK's
encoding and sending included; kernel time excluded). Unlike requests/s it does not
move with the machine's load. The SDK's flush interval is raised under valgrind so
its batches stay as large as at full speed. It also counts a third variant,
``floor``: a toy middleware and stage written only to find the least any pure
Python implementation of the required behaviour can cost (see ``build_floor_app``),
against which the 5% budget of the 0.95 target is printed.

The receiver is a separate process that drains the Unix datagram socket, so the
SDK's sender succeeds (encodes and sends every event) as it does in production.
CPU sharing on a machine with two or more cores (``--no-pin`` turns it off): all
servers are pinned to CPU 0 (only one is loaded at a time), the load generator
and the receiver to CPU 1, so the server under test never fights them for its
core; the instrumented server's own sender thread shares CPU 0 with it, as it
would in production.

Usage:
    python bench/fastapi_overhead.py                   # full run (3 servers per variant, 12 rounds, ~90 s)
    python bench/fastapi_overhead.py --quick           # 2 servers per variant, 5 rounds, under ~30 s
    python bench/fastapi_overhead.py --instructions    # also instructions per request under callgrind (~5 min)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

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


#: The path each variant answers on; the same length, so the request bytes differ in content only.
PATHS = {"plain": "/plain", "instrumented": "/instr", "floor": "/floor"}


def build_app(variant: str) -> Any:
    """One variant's FastAPI app."""
    from fastapi import FastAPI

    app = FastAPI()
    if variant == "plain":

        @app.get(PATHS["plain"])
        async def predict_plain() -> dict[str, bool]:
            return {"ok": True}

    else:
        import inferwatch

        inferwatch.configure(service="bench", model="m", model_version="v1")  # INFERWATCH_SIDECAR from env
        inferwatch.instrument_fastapi(app)

        @app.get(PATHS["instrumented"])
        async def predict_instrumented() -> dict[str, bool]:
            with inferwatch.stage("inference"):
                pass
            return {"ok": True}

    return app


def build_floor_app() -> Any:
    """The least a pure-Python middleware and stage can do for what the SDK is asked to do.

    Not a product, a measuring stick for ``--instructions``. Per request it wraps
    ``send`` to echo an ``X-Request-ID`` header and read the status, takes an ID
    from a C-level counter, sets and resets a contextvar, reads the clock twice
    and appends one tuple to a bounded deque; its stage reads the clock twice
    and appends one tuple to the request. It leaves out everything else the SDK
    does: incoming ID headers, validation, the ingress stage, ``scope["state"]``,
    5xx and exception outcomes, never raising into the app, and above all
    encoding and sending the events (nothing ever reads the deque).
    """
    import collections
    import contextvars
    import itertools

    from fastapi import FastAPI

    current: contextvars.ContextVar[Any] = contextvars.ContextVar("floor_request", default=None)
    ids = map("0123456789ab-%x".__mod__, itertools.count(1))
    events: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=10_000)
    clock = time.perf_counter_ns

    class Request:
        __slots__ = ("asgi_send", "rid", "status", "stages")

        def send(self, message: Any) -> Any:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                message["headers"].append((b"x-request-id", self.rid.encode()))
            return self.asgi_send(message)

    class Middleware:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            t0 = clock()
            req = Request()
            req.asgi_send, req.rid, req.status, req.stages = send, next(ids), 0, []
            token = current.set(req)
            try:
                await self.app(scope, receive, req.send)
            finally:
                current.reset(token)
            events.append((t0, clock() - t0, req.rid, req.status, req.stages))

    class stage:
        __slots__ = ("name", "t0")

        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            self.t0 = clock()

        def __exit__(self, *exc: object) -> None:
            req = current.get()
            if req is not None:
                req.stages.append((self.name, clock() - self.t0))

    app = FastAPI()
    app.add_middleware(Middleware)

    @app.get(PATHS["floor"])
    async def predict_floor() -> dict[str, bool]:
        with stage("inference"):
            pass
        return {"ok": True}

    return app


def build_server() -> Any:
    """Both variants in one process, dispatched by path.

    Comparing two variants in the same process cancels the per-process speed
    bias (see the module docstring). The dispatcher returns the chosen app's
    coroutine, so it adds no await layer, and it costs both variants the same.
    """
    plain, instrumented, floor = build_app("plain"), build_app("instrumented"), build_floor_app()
    instr_path, floor_path = PATHS["instrumented"], PATHS["floor"]

    def app(scope: Any, receive: Any, send: Any) -> Any:
        path = scope.get("path")
        if path == floor_path:  # first, so plain and instrumented both pay two compares
            return floor(scope, receive, send)
        if path == instr_path:
            return instrumented(scope, receive, send)
        return plain(scope, receive, send)

    return app


def pin(cpus: set[int] | None) -> None:
    """Pin this process to ``cpus`` where the OS allows it (Linux)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def serve(port: int) -> None:
    import uvicorn

    # interface="asgi3": the dispatcher is a plain function returning a coroutine, which
    # uvicorn would otherwise take for an ASGI2 app.
    uvicorn.run(
        build_server(), host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off",
        interface="asgi3",
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    return f"GET {PATHS[variant]} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


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


VARIANTS = ("plain", "instrumented")


def start_server(port: int, env: dict[str, str], cpu: int | None, wrap: list[str] | None = None,
                 **popen: Any) -> subprocess.Popen[Any]:
    cmd = [*(wrap or []), sys.executable, os.path.abspath(__file__), "--serve", "--port", str(port)]
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


def instructions_per_request(env: dict[str, str], small: int, large: int) -> dict[str, float]:
    """User-space instructions per request of each variant in one server process under callgrind.

    Each variant (and the ``floor`` stick) gets its own process (the other apps sit idle in it)
    and two runs, ``small`` and ``large`` requests after the same warm-up; the
    difference divided by ``large - small`` leaves start-up and shutdown out.
    """
    out = {}
    for variant in (*VARIANTS, "floor"):
        counts = []
        for n in (small, large):
            port = free_port()
            srv = start_server(
                port, {**env, "INFERWATCH_FLUSH_INTERVAL_MS": "2500", "PYTHONHASHSEED": "0"}, None,
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"],
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
            found = re.findall(r"Collected : (\d+)", err)
            if not found:
                raise SystemExit(f"callgrind printed no total for {variant}:\n{err[-2000:]}")
            counts.append(int(found[-1]))
            print(f"  callgrind {variant}: {n} requests, {counts[-1]:,} instructions", file=sys.stderr)
        out[variant] = (counts[1] - counts[0]) / (large - small)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter run (under ~30 s)")
    ap.add_argument("--rounds", type=int, help="rounds (default 12, quick 5)")
    ap.add_argument("--seconds", type=float, help="load time per variant per server per round (default 1, quick 0.8)")
    ap.add_argument("--servers", type=int, help="server processes (default 3, quick 2)")
    ap.add_argument("--concurrency", type=int, default=8, help="connections in flight (default 8)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="request cap per load period")
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions per request under valgrind's callgrind (about 5 minutes)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers / load generator to separate CPUs")
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        pin(None if args.cpu is None else {args.cpu})
        serve(args.port)
        return 0
    rounds = args.rounds or (5 if args.quick else 12)
    nserv = args.servers or (2 if args.quick else 3)
    seconds = args.seconds or (0.8 if args.quick else 1.0)
    if rounds < 1 or nserv < 1 or seconds <= 0:
        ap.error("--rounds, --servers and --seconds must be positive")
    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind on PATH (Debian: apt-get install valgrind)")
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
    rps: dict[tuple[str, int], list[float]] = {(v, k): [] for v in VARIANTS for k in range(nserv)}
    cpu_us: dict[tuple[str, int], list[float]] = {(v, k): [] for v in VARIANTS for k in range(nserv)}
    lats: dict[str, list[int]] = {v: [] for v in VARIANTS}
    pair_ratios: list[float] = []  # instrumented / plain, same server, back to back
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
        servers: list[tuple[int, int]] = []  # (port, pid)
        for _ in range(nserv):
            port = free_port()
            p = start_server(port, env, server_cpu if pinned else None)
            procs.insert(0, p)  # servers stop before the receiver
            servers.append((port, p.pid))
        for port, _ in servers:
            wait_port(port)
        if pinned:
            pin({load_cpu} if load_cpu is not None else None)
        print(
            f"fastapi_overhead: {nserv} server processes serving both variants, {rounds} rounds x "
            f"{seconds:.1f} s per variant per server, {args.concurrency} keep-alive connections, alternating "
            f"order; python {sys.version.split()[0]}; "
            + (
                f"servers on CPU {server_cpu}, load generator and receiver on CPU {load_cpu}"
                if pinned
                else f"not pinned ({ncpu} CPUs)"
            )
            + f"; load average {os.getloadavg()[0]:.1f}"
        )
        for port, _ in servers:  # warm-up
            for v in VARIANTS:
                load(port, v, 0.5, 5000, args.concurrency)
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for k, (port, pid) in enumerate(servers):
                rate_of = {}
                for variant in order:
                    time.sleep(0.15)  # the sender drains the last period's events before this one starts
                    c0 = cpu_seconds(pid)
                    rate, lat = load(port, variant, seconds, args.max_requests, args.concurrency)
                    cpu_us[(variant, k)].append((cpu_seconds(pid) - c0) / max(len(lat), 1) * 1e6)
                    rps[(variant, k)].append(rate)
                    lats[variant].extend(lat)
                    rate_of[variant] = rate
                pair_ratios.append(rate_of["instrumented"] / rate_of["plain"])
            print(
                f"  round {r + 1}/{rounds}: instrumented/plain per server "
                + ", ".join(f"{x:.3f}" for x in pair_ratios[-nserv:]),
                file=sys.stderr,
            )
        stop(procs[:-1])  # the servers; the receiver stays for the callgrind runs
        if args.instructions:
            print("counting instructions under callgrind (about 5 minutes)...", file=sys.stderr)
            instr = instructions_per_request(env, 500, 2500)
    finally:
        stop(procs[:-1])  # servers first: a server's final flush must find the receiver listening
        stop(procs[-1:])
        try:
            os.unlink(sock_path)
        except OSError:
            pass
        os.rmdir(tmp) if os.path.isdir(tmp) and not os.listdir(tmp) else None

    def med(d: dict[tuple[str, int], list[float]], v: str) -> float:
        return statistics.median(x for (vv, _), xs in d.items() if vv == v for x in xs)

    print()
    print(
        f"{'variant':14s} {'req/s (median)':>15s} {'p50':>10s} {'p99':>10s} {'requests':>10s} {'server CPU/req':>15s}"
    )
    for v in VARIANTS:
        print(
            f"{v:14s} {med(rps, v):15.0f} {pct(lats[v], 0.5):8.0f}us {pct(lats[v], 0.99):8.0f}us "
            f"{len(lats[v]):10d} {med(cpu_us, v):13.1f}us"
        )
    print("per server (median req/s):", "; ".join(
        f"{k + 1}: plain {statistics.median(rps[('plain', k)]):.0f}, "
        f"instrumented {statistics.median(rps[('instrumented', k)]):.0f}" for k in range(nserv)))
    ratio = statistics.median(pair_ratios)
    q = statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) >= 2 else [ratio, ratio, ratio]
    print()
    print(f"throughput ratio instrumented/plain: {ratio:.3f} (median of {len(pair_ratios)} same-server pairs; "
          f"quartiles {q[0]:.3f}-{q[2]:.3f})   target >= 0.95")
    if nserv >= 2:
        aa = [a / b for a, b in zip(rps[("plain", 0)], rps[("plain", 1)], strict=True)]
        print(
            f"A/A across processes, plain on server 1 / plain on server 2 (the same code): median "
            f"{statistics.median(aa):.3f}, rounds {min(aa):.3f}-{max(aa):.3f} (why variants share a process)"
        )
    cpu_ratio = med(cpu_us, "plain") / med(cpu_us, "instrumented")
    print(
        f"CPU-bound throughput ratio (plain/instrumented server CPU per request): {cpu_ratio:.3f}; "
        f"the SDK costs {med(cpu_us, 'instrumented') - med(cpu_us, 'plain'):.1f} us of server CPU per request"
    )
    if instr:
        extra = instr["instrumented"] - instr["plain"]
        print(
            f"instructions per request (callgrind, user space, all threads): plain {instr['plain']:,.0f}, "
            f"instrumented {instr['instrumented']:,.0f}; the SDK adds {extra:,.0f} "
            f"({extra / instr['plain'] * 100:.1f}% of the plain request's), "
            f"an instruction-bound throughput ratio of {instr['plain'] / instr['instrumented']:.3f}"
        )
        floor = instr["floor"] - instr["plain"]
        budget = instr["plain"] * (1 / 0.95 - 1)
        print(
            f"floor (build_floor_app: the bare behaviour in pure Python, no encoding or sending): adds {floor:,.0f} "
            f"instructions, an instruction-bound ratio of {instr['plain'] / instr['floor']:.3f}; the 0.95 target "
            f"leaves {budget:,.0f} for the SDK's whole path, the floor takes {floor / budget * 100:.0f}% of it"
        )
    print("targets:", "met" if ratio >= 0.95 else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
