"""Throughput of a trivial FastAPI endpoint under uvicorn, with and without inferwatch.

Two uvicorn servers run side by side on 127.0.0.1:

  plain         a trivial JSON endpoint
  instrumented  the same endpoint with inferwatch's ASGI middleware (request scope,
                request ID echoed, ingress stage) and one stage inside the handler,
                configured and sending to a real Unix datagram receiver

A closed-loop load generator (raw asyncio HTTP/1.1 keep-alive connections, a fixed
number in flight, so it stays cheap and never outruns the server) loads one server
at a time, alternating between them round after round so that machine noise hits
both alike. It prints requests/s and p50/p99 latency of each, and the throughput
ratio; the target is at least 95% of the uninstrumented throughput.

The receiver is a separate process that drains the Unix datagram socket, so the
SDK's sender succeeds (encodes and sends every event) as it does in production.
CPU sharing on a machine with two or more cores (``--no-pin`` turns it off): both
servers are pinned to CPU 0 (only one is loaded at a time), the load generator
and the receiver to CPU 1, so the server under test never fights them for its
core; the instrumented server's own sender thread shares CPU 0 with it, as it
would in production.

Usage:
    python bench/fastapi_overhead.py            # full run (10 rounds x 3 s, about 75 s)
    python bench/fastapi_overhead.py --quick    # 4 rounds x 1.5 s, under ~30 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def build_app(variant: str) -> Any:
    """The app the server subprocess runs."""
    from fastapi import FastAPI

    app = FastAPI()
    if variant == "plain":

        @app.get("/predict")
        async def predict_plain() -> dict[str, bool]:
            return {"ok": True}

    else:
        import inferwatch

        inferwatch.configure(service="bench", model="m", model_version="v1")  # INFERWATCH_SIDECAR from env
        inferwatch.instrument_fastapi(app)

        @app.get("/predict")
        async def predict_instrumented() -> dict[str, bool]:
            with inferwatch.stage("inference"):
                pass
            return {"ok": True}

    return app


def pin(cpus: set[int] | None) -> None:
    """Pin this process to ``cpus`` where the OS allows it (Linux)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def serve(variant: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build_app(variant), host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


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


REQUEST = b"GET /predict HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def _connection(port: int, deadline: float, budget: list[int], lat: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while budget[0] > 0 and time.perf_counter() < deadline:
            budget[0] -= 1
            t0 = time.perf_counter_ns()
            writer.write(REQUEST)
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


async def _load(port: int, seconds: float, max_requests: int, concurrency: int) -> tuple[float, list[int]]:
    lat: list[int] = []
    budget = [max_requests]
    t0 = time.perf_counter()
    await asyncio.gather(*(_connection(port, t0 + seconds, budget, lat) for _ in range(concurrency)))
    return len(lat) / (time.perf_counter() - t0), lat


def load(port: int, seconds: float, max_requests: int, concurrency: int) -> tuple[float, list[int]]:
    """Closed-loop load: ``concurrency`` keep-alive connections, bounded by time and count."""
    try:
        import uvloop

        return uvloop.run(_load(port, seconds, max_requests, concurrency))  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.run(_load(port, seconds, max_requests, concurrency))


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter run (under ~30 s)")
    ap.add_argument("--rounds", type=int, help="alternating rounds per variant (default 10, quick 4)")
    ap.add_argument("--seconds", type=float, help="load time per round (default 3, quick 1.5)")
    ap.add_argument("--concurrency", type=int, default=8, help="connections in flight (default 8)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="request cap per round")
    ap.add_argument("--serve", choices=["plain", "instrumented"], help=argparse.SUPPRESS)
    ap.add_argument("--no-pin", action="store_true", help="do not pin server / load generator to separate CPUs")
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        pin(None if args.cpu is None else {args.cpu})
        serve(args.serve, args.port)
        return 0
    rounds = args.rounds or (4 if args.quick else 10)
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pinned = not args.no_pin and ncpu >= 2 and hasattr(os, "sched_setaffinity")
    if pinned:
        cpus = sorted(os.sched_getaffinity(0))
        server_cpu, load_cpu = cpus[0], cpus[1]
    seconds = args.seconds or (1.5 if args.quick else 3.0)

    tmp = tempfile.mkdtemp(prefix="iwfb")
    sock_path = os.path.join(tmp, "ingest.sock")
    procs: list[subprocess.Popen[Any]] = []
    try:
        rx = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, sock_path, *([str(load_cpu)] if pinned else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(rx)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        env = {**os.environ, "INFERWATCH_SIDECAR": f"unix://{sock_path}"}
        ports = {}
        pids = {}
        for variant in ("plain", "instrumented"):
            ports[variant] = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--serve",
                        variant,
                        "--port",
                        str(ports[variant]),
                        *(["--cpu", str(server_cpu)] if pinned else []),
                    ],
                    env=env,
                )
            )
            pids[variant] = procs[-1].pid
        for p in ports.values():
            wait_port(p)
        if pinned:
            pin({load_cpu})
        print(
            f"fastapi_overhead: {rounds} rounds x {seconds:.1f} s per variant, {args.concurrency} keep-alive "
            f"connections, alternating order; python {sys.version.split()[0]}; "
            + (
                f"servers on CPU {server_cpu}, load generator and receiver on CPU {load_cpu}"
                if pinned
                else f"not pinned ({ncpu} CPUs)"
            )
            + f"; load average {os.getloadavg()[0]:.1f}"
        )
        for p in ports.values():  # warm-up
            load(p, 0.5, 5000, args.concurrency)
        rps: dict[str, list[float]] = {"plain": [], "instrumented": []}
        lats: dict[str, list[int]] = {"plain": [], "instrumented": []}
        # Server CPU per request (all threads, the SDK's sender included): unlike req/s it
        # hardly moves when other processes compete for the cores.
        cpu_us: dict[str, list[float]] = {"plain": [], "instrumented": []}
        for r in range(rounds):
            order = ("plain", "instrumented") if r % 2 == 0 else ("instrumented", "plain")
            for variant in order:
                c0 = cpu_seconds(pids[variant])
                rate, lat = load(ports[variant], seconds, args.max_requests, args.concurrency)
                cpu_us[variant].append((cpu_seconds(pids[variant]) - c0) / max(len(lat), 1) * 1e6)
                rps[variant].append(rate)
                lats[variant].extend(lat)
            print(
                f"  round {r + 1}/{rounds}: plain {rps['plain'][-1]:8.0f} req/s, "
                f"instrumented {rps['instrumented'][-1]:8.0f} req/s",
                file=sys.stderr,
            )
    finally:
        # Servers first, the receiver last: a server's final flush must find it listening.
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            os.unlink(sock_path)
        except OSError:
            pass
        os.rmdir(tmp) if os.path.isdir(tmp) and not os.listdir(tmp) else None

    print()
    print(
        f"{'variant':14s} {'req/s (median)':>15s} {'p50':>10s} {'p99':>10s} {'requests':>10s} {'server CPU/req':>15s}"
    )
    for v in ("plain", "instrumented"):
        print(
            f"{v:14s} {statistics.median(rps[v]):15.0f} {pct(lats[v], 0.5):8.0f}us {pct(lats[v], 0.99):8.0f}us "
            f"{len(lats[v]):10d} {statistics.median(cpu_us[v]):13.1f}us"
        )
    # Each round loads both servers back to back, so a round's ratio compares like with like;
    # the median over rounds resists the drift of a shared machine.
    per_round = [i / p for i, p in zip(rps["instrumented"], rps["plain"], strict=True)]
    ratio = statistics.median(per_round)
    print()
    print(f"throughput ratio instrumented/plain: {ratio:.3f} (median of per-round ratios)   target >= 0.95")
    print(
        f"per-round ratios: {', '.join(f'{x:.3f}' for x in per_round)}; "
        f"ratio of medians: {statistics.median(rps['instrumented']) / statistics.median(rps['plain']):.3f}"
    )
    cpu_ratio = statistics.median(cpu_us["plain"]) / statistics.median(cpu_us["instrumented"])
    print(
        f"CPU-bound throughput ratio (plain/instrumented server CPU per request): {cpu_ratio:.3f}; "
        f"the SDK costs {statistics.median(cpu_us['instrumented']) - statistics.median(cpu_us['plain']):.1f} us "
        "of server CPU per request"
    )
    print("targets:", "met" if ratio >= 0.95 else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
