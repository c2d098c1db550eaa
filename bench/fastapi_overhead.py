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

Usage:
    python bench/fastapi_overhead.py            # full run (about a minute)
    python bench/fastapi_overhead.py --quick    # under ~30 s
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
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
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


def serve(variant: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build_app(variant), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off")


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


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter run (under ~30 s)")
    ap.add_argument("--rounds", type=int, help="alternating rounds per variant (default 6, quick 3)")
    ap.add_argument("--seconds", type=float, help="load time per round (default 3, quick 1.5)")
    ap.add_argument("--concurrency", type=int, default=8, help="connections in flight (default 8)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="request cap per round")
    ap.add_argument("--serve", choices=["plain", "instrumented"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    rounds = args.rounds or (3 if args.quick else 6)
    seconds = args.seconds or (1.5 if args.quick else 3.0)

    tmp = tempfile.mkdtemp(prefix="iwfb")
    sock_path = os.path.join(tmp, "ingest.sock")
    procs: list[subprocess.Popen[Any]] = []
    try:
        rx = subprocess.Popen([sys.executable, "-c", RECEIVER, sock_path], stdout=subprocess.PIPE, text=True)
        procs.append(rx)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        env = {**os.environ, "INFERWATCH_SIDECAR": f"unix://{sock_path}"}
        ports = {}
        for variant in ("plain", "instrumented"):
            ports[variant] = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--serve", variant, "--port", str(ports[variant])],
                    env=env,
                )
            )
        for p in ports.values():
            wait_port(p)
        print(
            f"fastapi_overhead: {rounds} rounds x {seconds:.1f} s per variant, {args.concurrency} keep-alive "
            f"connections, alternating order; python {sys.version.split()[0]}"
        )
        for p in ports.values():  # warm-up
            load(p, 0.5, 5000, args.concurrency)
        rps: dict[str, list[float]] = {"plain": [], "instrumented": []}
        lats: dict[str, list[int]] = {"plain": [], "instrumented": []}
        for r in range(rounds):
            order = ("plain", "instrumented") if r % 2 == 0 else ("instrumented", "plain")
            for variant in order:
                rate, lat = load(ports[variant], seconds, args.max_requests, args.concurrency)
                rps[variant].append(rate)
                lats[variant].extend(lat)
            print(
                f"  round {r + 1}/{rounds}: plain {rps['plain'][-1]:8.0f} req/s, "
                f"instrumented {rps['instrumented'][-1]:8.0f} req/s",
                file=sys.stderr,
            )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
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
    print(f"{'variant':14s} {'req/s (median)':>15s} {'p50':>10s} {'p99':>10s} {'requests':>10s}")
    for v in ("plain", "instrumented"):
        print(
            f"{v:14s} {statistics.median(rps[v]):15.0f} {pct(lats[v], 0.5):8.0f}us {pct(lats[v], 0.99):8.0f}us "
            f"{len(lats[v]):10d}"
        )
    # Each round loads both servers back to back, so a round's ratio compares like with like;
    # the median over rounds resists the drift of a shared machine.
    per_round = [i / p for i, p in zip(rps["instrumented"], rps["plain"], strict=True)]
    ratio = statistics.median(per_round)
    print()
    print(f"throughput ratio instrumented/plain: {ratio:.3f} (median of per-round ratios)   target >= 0.95")
    print(f"per-round ratios: {', '.join(f'{x:.3f}' for x in per_round)}; "
          f"ratio of medians: {statistics.median(rps['instrumented']) / statistics.median(rps['plain']):.3f}")
    print("targets:", "met" if ratio >= 0.95 else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
