"""Sampling cost: GPM and health sampling plus one engine scrape per second, as CPU share of one core.

One engines component scrapes a local HTTP endpoint serving a vLLM body (the recorded
``tests/fixtures/vllm_metrics.txt``, or with ``--series`` that body repeated under distinct
model names) and one saturation component samples GPM and health through NVML and
judges, ``--passes`` times, back to back. The CPU time of the scraping and sampling
thread (``time.thread_time``; the endpoint's server thread is the engine's cost, not
ours) per pass is the cost of one pass; at one pass a second that is the share of one core.
The bar is 2%. ``--nvml real`` uses nvidia-ml-py on a GPU (bench/gpu_real_check.py runs
it); the default is the fake NVML, whose Python bodies cost more than the driver's C calls.

Usage::

    python bench/saturation_cost.py                   # recorded vLLM body, fake NVML, 300 passes
    python bench/saturation_cost.py --series 5000
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO), str(REPO / "bench")]


def serve(body: bytes) -> tuple[Any, str]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"


def measure(passes: int, body: bytes, nvml: str) -> dict[str, float]:
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.components.engines.component import EnginesComponent
    from inferwatch_sidecar.components.engines.config import EnginesConfig
    from inferwatch_sidecar.components.gpu import fake_gpm
    from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice
    from inferwatch_sidecar.components.gpu.gpm import GpmSampler
    from inferwatch_sidecar.components.saturation.component import SaturationComponent
    from inferwatch_sidecar.components.saturation.config import SaturationConfig

    srv, url = serve(body)
    t = [0.0]
    ctx = ComponentContext(monotonic=lambda: t[0])
    if nvml == "real":
        import pynvml
        module: Any = pynvml
        mono = time.monotonic
    else:
        module = fake_gpm.FakeGpmNvml([FakeDevice()], clock=lambda: t[0], workloads={0: fake_gpm.steady(0.9, 0.2)})
        mono = ctx.monotonic
    eng = EnginesComponent(EnginesConfig(targets=[{"url": url, "service": "bench"}]), ctx)
    sat = SaturationComponent(SaturationConfig(), ctx, GpmSampler(module, monotonic=mono))
    sat.connect({"engines": eng})
    scrape, sample = [], []
    try:
        for _ in range(passes):
            c0 = time.thread_time()
            eng.tick()
            c1 = time.thread_time()
            sat.tick()
            c2 = time.thread_time()
            scrape.append(c1 - c0)
            sample.append(c2 - c1)
            t[0] += 1.0
            if nvml == "real":
                time.sleep(0.15)  # GPM needs samples more than 100 ms apart
    finally:
        srv.shutdown()
        srv.server_close()
        sat.stop(1.0)
    return {"scrape_ms": 1e3 * statistics.median(scrape), "sample_ms": 1e3 * statistics.median(sample)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--series", type=int, default=0, help="repeat the vLLM body to this many series (0: as recorded)")
    ap.add_argument("--nvml", choices=("fake", "real"), default="fake")
    args = ap.parse_args()
    if args.series:
        from engine_parse import body as make_body

        text, n = make_body(args.series)
        body = text.encode()
    else:
        body = (REPO / "tests/fixtures/vllm_metrics.txt").read_bytes()
        n = sum(1 for ln in body.decode().splitlines() if ln and not ln.startswith("#"))
    r = measure(args.passes, body, args.nvml)
    total = r["scrape_ms"] + r["sample_ms"]
    print(f"{args.passes} passes, engine body {n} series ({len(body)} bytes), NVML {args.nvml} (medians, CPU time)")
    print(f"  engine scrape (fetch, parse, extract)  {r['scrape_ms']:.3f} ms/pass")
    print(f"  GPM + health sampling and verdict      {r['sample_ms']:.3f} ms/pass")
    print(f"  at 1 pass/s: {total / 10:.3f}% of one core (bar 2%): {'met' if total / 1000 <= 0.02 else 'NOT met'}")


if __name__ == "__main__":
    main()
