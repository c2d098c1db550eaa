"""The real sidecar process answers Prometheus' protobuf Accept, and a real Prometheus with native histograms ingests it.

Every family the daemon registers (aggregator, pipeline, HTTP, OTLP traces, process) goes
through the protobuf encoder: one bad family would fail the whole scrape, so Prometheus'
``up`` and the decoded families are checked, then the native series against the exact
quantiles of the durations sent.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest

from inferwatch_sidecar.metrics.protobuf import CONTENT_TYPE
from tests.helpers.sidecar import SidecarProc
from tests.metrics.promproto import native_buckets, parse_delimited
from tests.metrics.test_native import PROM_242_ACCEPT
from tests.scale.promproc import Prom

pytestmark = pytest.mark.prometheus
STAGE = "inferwatch_stage_duration_seconds"
WIDTH = 2 ** (1 / 8) - 1


def test_sidecar_serves_native_histograms_to_a_real_prometheus(prometheus_bin: str, tmp_path: Path) -> None:
    rnd = random.Random(5)
    durs = [rnd.lognormvariate(math.log(3e-3), 0.8) for _ in range(400)]
    sc = SidecarProc(tmp_path).start()
    try:
        events = [{"type": "request", "duration_s": d * 1.5, "request_id": f"r{k}",
                   "stages": {"infer": d, "tokenize": d / 50}} for k, d in enumerate(durs)]
        body = json.dumps({"service": "svc", "model": "m", "model_version": "v1", "events": events}).encode()
        assert sc.post("/v1/events", body)[0] == 200
        code, headers, pb = sc.get("/metrics", {"Accept": PROM_242_ACCEPT})
        assert code == 200 and headers["Content-Type"] == CONTENT_TYPE
        fams = {f.name: f for f in parse_delimited(pb)}
        assert len(fams) == len(parse_delimited(pb))
        for name in ("inferwatch_requests_total", "inferwatch_ingest_events_total", "inferwatch_sidecar_info",
                     "inferwatch_sidecar_process_cpu_seconds_total", "inferwatch_http_refused_total"):
            assert name in fams, sorted(fams)
        infer = next(m.histogram for m in fams[STAGE].metric if any(lp.value == "infer" for lp in m.label))
        assert infer.sample_count == len(durs) and infer.schema == 3 and sum(native_buckets(infer).values()) == 400
        assert any(lp.name == "request_id" for ex in infer.exemplars for lp in ex.label)
        # Text is still text.
        code, headers, text = sc.get("/metrics", {"Accept": "text/plain"})
        assert headers["Content-Type"].startswith("text/plain") and b'_bucket{le="0.005"' in text
        scrape = [{"job_name": "inferwatch", "static_configs": [{"targets": [f"127.0.0.1:{sc.port}"]}]}]
        with Prom(prometheus_bin, scrape, native=True) as prom:
            deadline = time.monotonic() + 30
            while not prom.query(f'histogram_count({STAGE}{{stage="infer"}})'):
                assert time.monotonic() < deadline, prom.log()
                time.sleep(0.5)
            assert [float(x["value"][1]) for x in prom.query("up")] == [1.0]
            assert float(prom.query(f'histogram_count({STAGE}{{stage="infer"}})')[0]["value"][1]) == 400
            for q in (0.5, 0.99):
                got = float(prom.query(f'histogram_quantile({q}, {STAGE}{{stage="infer"}})')[0]["value"][1])
                xs = np.sort(np.asarray(durs))
                k = math.ceil(q * len(xs) - 1e-9)
                assert xs[k - 1] * (1 - WIDTH) <= got <= xs[min(k, len(xs) - 1)] * (1 + WIDTH), (q, got)
            assert prom.query(f"{STAGE}_bucket") == []
            reqs = prom.query('inferwatch_requests_total{outcome="ok"}')
            assert [float(x["value"][1]) for x in reqs] == [400.0]
            assert float(prom.query('histogram_count(inferwatch_request_duration_seconds)')[0]["value"][1]) == 400
    finally:
        sc.stop()
