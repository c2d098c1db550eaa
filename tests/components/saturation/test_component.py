"""The engines and saturation components together, in process, and in a real sidecar with --engine-metrics."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.engines.component import EnginesComponent
from inferwatch_sidecar.components.engines.config import EnginesConfig
from inferwatch_sidecar.components.gpu import fake_gpm as fg
from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice
from inferwatch_sidecar.components.gpu.gpm import GpmSampler
from inferwatch_sidecar.components.saturation.component import SaturationComponent
from inferwatch_sidecar.components.saturation.config import SaturationConfig
from tests.helpers.sidecar import parse_metrics, total, wait_until

BODY = """vllm:num_requests_running{{model_name="m"}} 8
vllm:num_requests_waiting{{model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
vllm:num_preemptions_total{{model_name="m"}} {pre}
vllm:request_prefill_time_seconds_sum{{model_name="m"}} {prefill}
vllm:request_decode_time_seconds_sum{{model_name="m"}} {decode}
process_cpu_seconds_total {cpu}
"""


class Engine(http.server.BaseHTTPRequestHandler):
    state: dict[str, float] = {}

    def do_GET(self) -> None:  # noqa: N802
        s = self.state
        body = BODY.format(**s).encode()
        s["prefill"] += 0.05
        s["decode"] += 0.95
        s["cpu"] += s["cpu_rate"]
        s["pre"] += s["pre_rate"]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[tuple[dict[str, float], str]]:
    state = {"waiting": 0.0, "kv": 0.4, "pre": 0.0, "prefill": 0.0, "decode": 0.0, "cpu": 0.0, "cpu_rate": 0.1,
             "pre_rate": 0.0}
    handler = type("H", (Engine,), {"state": state})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield state, f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()
    srv.server_close()


def test_decode_bandwidth_then_kv_cache_then_host_cpu(engine: tuple[dict[str, float], str]) -> None:
    state, url = engine
    t = [0.0]
    ctx = ComponentContext(monotonic=lambda: t[0])
    phase = {"w": fg.Phase(0.99, 0.03)}
    nv = fg.FakeGpmNvml([FakeDevice()], clock=lambda: t[0], workloads={0: lambda s: phase["w"]})
    eng = EnginesComponent(EnginesConfig(targets=[{"url": url, "service": "chat", "model_version": "1"}]), ctx)
    for tg in eng.targets:
        tg.monotonic = ctx.monotonic
    sat = SaturationComponent(SaturationConfig(), ctx, GpmSampler(nv, monotonic=ctx.monotonic))
    sat.connect({"engines": eng})

    def run(seconds: int) -> None:
        for _ in range(seconds):
            eng.tick()
            sat.tick()
            t[0] += 1.0

    run(40)
    st = sat.status()
    (m,) = st["models"]
    assert m["bound"] == "memory_bandwidth" and m["model"] == "m" and m["service"] == "chat"
    assert m["sentence"].startswith("decode is memory-bandwidth-bound (DRAM ")
    assert "GPU utilization 99% is not headroom" in m["sentence"]
    assert st["verdicts"][0]["verdict"] == "memory_bandwidth-bound"
    # The engine's KV cache fills and it starts preempting; decode eases off.
    phase["w"] = fg.Phase(0.5, 0.3)
    state.update(kv=0.99, pre_rate=1.0)
    run(40)
    assert sat.status()["models"][0]["bound"] == "kv_cache"
    # Tokenization pegs the serving process's one core; the GPU starves.
    phase["w"] = fg.Phase(0.2, 0.3)
    state.update(kv=0.3, pre_rate=0.0, cpu_rate=0.99)
    run(60)
    m = sat.status()["models"][0]
    assert m["bound"] == "host_cpu", m
    assert "CPU-bound (0.99 of 1 cores)" in m["sentence"]
    fams = {f.name: f for f in sat.collect()}
    bound = {s.labels["resource"]: s.value for s in fams["inferwatch_saturation_bound"].samples}
    assert bound["host_cpu"] == 1 and sum(bound.values()) == 1
    ratios = {s.labels["resource"]: s.value for s in fams["inferwatch_saturation_ratio"].samples}
    assert set(ratios) == {"compute", "memory_bandwidth", "kv_cache", "queue", "host_cpu"}
    assert all(0 <= v <= 1 for v in ratios.values())
    assert {s.labels["fidelity"] for s in fams["inferwatch_gpu_sm_utilization_ratio"].samples} == {"gpm"}


def test_sidecar_with_engine_metrics_flag_says_it_on_status(sidecar_factory: Any,
                                                           engine: tuple[dict[str, float], str]) -> None:
    state, url = engine
    state.update(kv=0.995, pre_rate=2.0)
    sc = sidecar_factory(
        "--engine-metrics", url, "--set", "engines.interval_s=0.2", "--set", "saturation.gpm.backend=fake",
        "--set", "saturation.gpm.interval_s=0.2", "--set", "saturation.enter_hold_s=1",
        "--set", "saturation.smoothing_s=0.5", "--no-drift")

    def bound() -> dict[str, Any] | None:
        comps = sc.status()["components"]
        models = comps.get("saturation", {}).get("models") or []
        return models[0] if models and models[0]["bound"] == "kv_cache" else None

    m = wait_until(bound, timeout=30, what="the KV-cache verdict")
    assert m["sentence"].startswith("the KV cache is full (")
    st = sc.status()
    assert any(v["verdict"] == "kv_cache-bound" for v in st["summary"]["verdicts"])
    mm = parse_metrics(sc.metrics())
    assert total(mm, "inferwatch_engine_kv_cache_usage_ratio", model="m") == pytest.approx(0.995)
    assert total(mm, "inferwatch_saturation_bound", model="m", resource="kv_cache") == 1
    assert total(mm, "inferwatch_engine_preemptions_total", model="m") > 0


def test_cli_rejects_a_bad_engine_url(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--engine-metrics", "localhost:8000",
                        "--print-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--engine-metrics" in r.stderr and "http" in r.stderr
