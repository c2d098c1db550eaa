"""``inferwatch loadtest``'s latency beside the server's own, at low load (issue 26's bar: within 5%).

A real sidecar, the demo's FastAPI model server (one uvicorn worker, SDK-instrumented: ingress, preprocess,
queue, inference, postprocess) and one closed-loop step of the load generator at a low concurrency. The
client's mean latency is set beside the server-side mean of ``inferwatch_request_duration_seconds`` over the
same requests (the sidecar's counters before and after, once every request was counted), and beside the sum of
the stage means. ``--delay-ms`` adds that much to every inference batch (the demo's latency fault with share 1)
for a server whose requests take a model's time rather than a few milliseconds; the gap (HTTP parsing and
writing outside the middleware, loopback) is about constant, so its share shrinks as requests grow.

At concurrency 1 two more figures tell the load generator's own overhead from what the server's timings
cannot see: a raw blocking-socket client (``sendall``, ``recv`` until the answer is whole: the least any
client adds) sends the same request bytes to the same server for as long, its server-side mean taken apart;
and the same raw client against an ASGI app that answers at once under the same uvicorn gives the floor of a
request outside any application (uvicorn's HTTP parsing and writing, loopback, the two processes' wake-ups).

Usage::

    PYTHONPATH=sdk:sidecar:. python bench/loadtest_agreement.py [--concurrency 1] [--duration 10] [--delay-ms 0 20]
"""

from __future__ import annotations

import argparse
import asyncio
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
from _harness import REPO, free_port  # noqa: E402  (bench/ is a folder of scripts)


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _wait(pred: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def measure(tmp: Path, sidecar_url: str, sock: str, concurrency: int, duration: float, delay_ms: float) -> dict[str, Any]:
    from inferwatch_sidecar.demo import faults as fl
    from inferwatch_sidecar.demo import model as mdl
    from inferwatch_sidecar.loadtest.client import build_request
    from inferwatch_sidecar.loadtest.payloads import Prepared
    from inferwatch_sidecar.loadtest.runner import Objectives, Target
    from inferwatch_sidecar.loadtest.sidecar_view import scrape, stage_means
    from inferwatch_sidecar.loadtest.sweep import Plan, run

    state = tmp / f"state-{delay_ms:g}"
    state.mkdir()
    if delay_ms > 0:
        fl.write(str(state / "faults.json"), fl.Faults(latency_stage="inference", latency_share=1.0,
                                                       latency_delay_s=delay_ms / 1000))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    env.update({"INFERWATCH_SIDECAR": "unix://" + sock, "INFERWATCH_SERVICE": "bench", "INFERWATCH_MODEL": mdl.NAME,
                "INFERWATCH_MODEL_VERSION": f"d{delay_ms:g}", "INFERWATCH_DEMO_STATE_DIR": str(state),
                "INFERWATCH_DEMO_ERROR_SHARE": "0", "INFERWATCH_DEMO_SHED_SHARE": "0"})
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "inferwatch_sidecar.demo.server:app", "--host",
                            "127.0.0.1", "--port", str(port), "--log-level", "warning"], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _up(f"http://127.0.0.1:{port}/healthz"), 60, "the demo server")
        raw = build_request("POST", f"127.0.0.1:{port}", "/predict", demo_body(), {"Content-Type": "application/json"})
        t = Target("127.0.0.1", port, "json", False, [Prepared(raw, 0)], 30.0)
        version = f"d{delay_ms:g}"
        seen = {"n": 0}

        def counted(extra: int) -> Any:
            def check() -> Any:
                m = scrape(sidecar_url)
                n = sum(v for (name, lab), v in m.items() if name == "inferwatch_requests_total"
                        and dict(lab).get("model_version") == version)
                return m if n >= seen["n"] + extra else None
            return check

        before = scrape(sidecar_url)
        out = asyncio.run(run(t, Plan("concurrency", [float(concurrency)], duration, 10**6, 600.0, Objectives())))
        (step,) = out.steps
        mid = _wait(counted(step.requests + 1), 30, "every request counted by the sidecar")  # + the preflight
        seen["n"] += step.requests + 1
        raw_lat = raw_client(port, raw, duration) if concurrency == 1 else []
        after = _wait(counted(len(raw_lat)), 30, "every raw-socket request counted") if raw_lat else mid
    finally:
        app.terminate()
        app.wait(30)
    means = stage_means(before, mid)
    client = statistics.fmean(step.latencies)
    server = means["request"]
    stages = sum(v for k, v in means.items() if k not in ("request", "queue_wait"))
    row = {"delay_ms": delay_ms, "requests": step.requests, "client_mean_s": client,
           "client_p50_s": statistics.median(step.latencies), "server_request_mean_s": server,
           "stage_sum_s": stages, "client_over_server": client / server, "gap_s": client - server,
           "generator_cpu_share": step.cpu_share}
    if raw_lat:
        raw_server = stage_means(mid, after)["request"]
        raw_mean = statistics.fmean(raw_lat)
        row.update(raw_requests=len(raw_lat), raw_mean_s=raw_mean, raw_server_mean_s=raw_server,
                   raw_over_server=raw_mean / raw_server, raw_gap_s=raw_mean - raw_server)
    return row


NULL_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})
"""


def demo_body() -> bytes:
    """The body of every request: one row of the demo model's features."""
    import numpy as np

    from inferwatch_sidecar.demo import model as mdl

    return json.dumps({"features": mdl.sample(1, np.random.default_rng(0)).row(0)}).encode()


def null_floor(tmp: Path, duration: float) -> float:
    """The raw-socket client's mean latency against an ASGI app that answers at once, under the same uvicorn
    (one worker, the same options): what a request costs before and after any application code runs."""
    (tmp / "nullapp.py").write_text(NULL_APP)
    port = free_port()
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "nullapp:app", "--app-dir", str(tmp), "--host",
                            "127.0.0.1", "--port", str(port), "--log-level", "warning"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _up(f"http://127.0.0.1:{port}/"), 60, "the null ASGI app")
        from inferwatch_sidecar.loadtest.client import build_request

        raw = build_request("POST", f"127.0.0.1:{port}", "/predict", demo_body(), {"Content-Type": "application/json"})
        return statistics.fmean(raw_client(port, raw, duration))
    finally:
        app.terminate()
        app.wait(30)


def raw_client(port: int, raw: bytes, duration: float) -> list[float]:
    """The least a client can add: one blocking socket, ``sendall`` and ``recv`` until the answer is whole,
    timed from before the write to after the last byte (the same request bytes as the load generator's)."""
    import socket

    lat = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            s.sendall(raw)
            buf = b""
            need = -1
            while need < 0 or len(buf) < need:
                chunk = s.recv(65536)
                if not chunk:
                    raise SystemExit("the server closed the raw-socket client's connection")
                buf += chunk
                if need < 0:
                    i = buf.find(b"\r\n\r\n")
                    if i >= 0:
                        head = buf[:i].lower()
                        j = head.index(b"content-length:") + 15
                        k = head.find(b"\r\n", j)
                        need = i + 4 + int(head[j:k if k >= 0 else None])
            lat.append(time.perf_counter() - t0)
            if not buf.split(b"\r\n", 1)[0].split()[1].startswith(b"2"):
                raise SystemExit(f"the raw-socket client got {buf[:200]!r}")
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    a = ap.parse_args()
    from tests.helpers.sidecar import SidecarProc

    with tempfile.TemporaryDirectory(prefix="iw-agree-") as d:
        tmp = Path(d)
        sc = SidecarProc(tmp, []).start()
        try:
            rows = [measure(tmp, sc.url, sc.sock, a.concurrency, a.duration, ms) for ms in a.delay_ms]
        finally:
            sc.stop()
        floor = null_floor(tmp, a.duration) if a.concurrency == 1 else None
    print(f"loadtest vs the server's own timings, concurrency {a.concurrency}, {a.duration:g} s a step")
    print(f"{'delay':>7} {'requests':>8} {'client mean':>12} {'server mean':>12} {'stage sum':>10} "
          f"{'client/server':>13} {'gap':>9}")
    for r in rows:
        print(f"{r['delay_ms']:>5g}ms {r['requests']:>8} {r['client_mean_s'] * 1e3:>10.3f}ms "
              f"{r['server_request_mean_s'] * 1e3:>10.3f}ms {r['stage_sum_s'] * 1e3:>8.3f}ms "
              f"{r['client_over_server']:>13.4f} {r['gap_s'] * 1e6:>7.0f}us  loadtest")
        if "raw_mean_s" in r:
            print(f"{'':7} {r['raw_requests']:>8} {r['raw_mean_s'] * 1e3:>10.3f}ms "
                  f"{r['raw_server_mean_s'] * 1e3:>10.3f}ms {'':>10} "
                  f"{r['raw_over_server']:>13.4f} {r['raw_gap_s'] * 1e6:>7.0f}us  raw socket")
    if floor is not None:
        print(f"the raw-socket client against an ASGI app that answers at once under the same uvicorn: "
              f"{floor * 1e6:.0f}us a request (none of it inside any application's timings)")
    if a.json:
        print(json.dumps({"rows": rows, "null_app_raw_mean_s": floor}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
