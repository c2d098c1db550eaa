"""Engine scraping: recognition, the neutral set, interval rates, and every failure counted, over real HTTP."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.engines import kinds, promtext
from inferwatch_sidecar.components.engines.component import EnginesComponent
from inferwatch_sidecar.components.engines.config import EnginesConfig
from inferwatch_sidecar.components.engines.target import Target
from tests.helpers.net import free_port
from tests.helpers.paths import FIXTURES

VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {run}
vllm:num_requests_running{{engine="1",model_name="m"}} {run}
vllm:num_requests_waiting{{engine="0",model_name="m"}} {wait}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.1
vllm:num_preemptions_total{{engine="0",model_name="m"}} {pre}
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {queue}
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {e2e}
process_cpu_seconds_total {cpu}
"""


class Engine(http.server.BaseHTTPRequestHandler):
    body: bytes = b""
    status = 200
    delay = 0.0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.delay:
            time.sleep(self.delay)
        try:
            self.send_response(self.status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up (timeout, too large): what the test checks

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[tuple[type[Engine], str]]:
    handler = type("H", (Engine,), {})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    th.start()
    yield handler, f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()
    srv.server_close()


def vllm_body(**kw: float) -> bytes:
    base = dict(run=3, wait=5, kv=0.5, pre=0, hits=0, queries=0, queue=0.0, e2e=0.0, cpu=0.0)
    base.update(kw)
    return VLLM.format(**base).encode()


def test_recognises_each_engine_from_its_names() -> None:
    assert kinds.detect(["vllm:num_requests_running", "process_cpu_seconds_total"]) == "vllm"
    assert kinds.detect(["sglang:num_queue_reqs"]) == "sglang"
    assert kinds.detect(["nv_inference_count", "nv_trt_llm_request_metrics"]) == "tensorrt_llm"
    assert kinds.detect(["nv_inference_count"]) == "triton"
    assert kinds.detect(["http_requests_total"]) is None


def test_vllm_interval_rates_and_reset_safe_preemptions(engine: tuple[type[Engine], str]) -> None:
    h, url = engine
    clock = [100.0]
    t = Target(url, "v", monotonic=lambda: clock[0])
    h.body = vllm_body(pre=7, hits=10, queries=100, queue=1.0, e2e=10.0, cpu=5.0)
    assert t.scrape() == "ok" and t.detected == "vllm"
    st = t.models[("m", "")]
    # Two data-parallel engines: counts add, the fullest KV cache is the one that preempts.
    assert st.reading.running == 6 and st.reading.waiting == 5 and st.reading.kv_usage == 0.5
    assert st.preemptions_total == 0  # the engine's history before the sidecar watched is not counted
    clock[0] += 2.0
    h.body = vllm_body(pre=10, hits=40, queries=150, queue=4.0, e2e=14.0, cpu=6.5)
    assert t.scrape() == "ok"
    assert st.preemptions_total == 3
    assert st.prefix_hit_ratio == pytest.approx(30 / 50)
    assert st.last is not None and st.last.queue_share == pytest.approx(3.0 / 4.0)
    assert t.cpu_cores == pytest.approx(1.5 / 2.0)
    clock[0] += 1.0
    h.body = vllm_body(pre=2, hits=41, queries=160)  # the engine restarted: its counters start again
    assert t.scrape() == "ok"
    assert st.preemptions_total == 5


@pytest.mark.parametrize(("setup", "reason"), [
    (lambda h: setattr(h, "status", 500), "http_error"),
    (lambda h: setattr(h, "body", b"<html>not metrics</html>"), "garbage"),
    (lambda h: setattr(h, "body", b"http_requests_total 3\n"), "unrecognised"),
    (lambda h: setattr(h, "body", b"vllm:num_requests_running 1\n" * 2000), "too_large"),
    (lambda h: setattr(h, "delay", 1.0), "timeout"),
])
def test_a_bad_engine_is_counted_by_reason(engine: tuple[type[Engine], str], setup: Any, reason: str) -> None:
    h, url = engine
    h.body = vllm_body()
    setup(h)
    t = Target(url, "v", timeout_s=0.3, max_body_bytes=16 << 10)
    assert t.scrape() == reason
    assert t.results[reason] == 1 and not t.up
    st = t.status()
    assert st["error"]["reason"] == reason and st["error"]["fix"]


def test_refused_and_recovery() -> None:
    t = Target(f"http://127.0.0.1:{free_port()}/metrics", "gone", timeout_s=0.5)
    assert t.scrape() == "refused"
    assert t.status()["up"] is False


def test_component_exports_the_neutral_set_under_the_configured_labels(engine: tuple[type[Engine], str]) -> None:
    h, url = engine
    h.body = (FIXTURES / "vllm_metrics.txt").read_bytes()
    cfg = EnginesConfig(targets=[{"url": url, "service": "chat", "model_version": "v7"},
                                 {"url": "http://127.0.0.1:9/metrics", "name": "down"}])
    comp = EnginesComponent(cfg, ComponentContext())
    comp.tick()
    comp.tick()
    fams = {f.name: f for f in comp.collect()}
    theirs = {(s.name, s.labels.get("model_name")): s.value
              for f in text_string_to_metric_families(h.body.decode()) for s in f.samples}
    lab = {"service": "chat", "model": "tiny-llama", "model_version": "v7"}
    for ours, their in (("inferwatch_engine_requests_running", "vllm:num_requests_running"),
                        ("inferwatch_engine_requests_waiting", "vllm:num_requests_waiting"),
                        ("inferwatch_engine_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc")):
        (s,) = fams[ours].samples
        assert s.labels == lab and s.value == theirs[(their, "tiny-llama")]
    (p,) = fams["inferwatch_engine_preemptions"].samples
    assert p.value == 0
    up = {s.labels["target"]: s.value for s in fams["inferwatch_engine_up"].samples}
    assert up == {url.split("/")[2]: 1.0, "down": 0.0}
    scr = {(s.labels["target"], s.labels["result"]): s.value for s in fams["inferwatch_engine_scrapes"].samples}
    assert scr[("down", "refused")] == 2 and scr[(url.split("/")[2], "ok")] == 2
    status = comp.status()
    assert status["down"] == ["http://127.0.0.1:9/metrics"]


def test_engine_model_labels_are_bounded(engine: tuple[type[Engine], str]) -> None:
    h, url = engine
    h.body = "".join(f'vllm:num_requests_running{{model_name="m{i}"}} 1\n' for i in range(50)).encode()
    t = Target(url, "v", max_models=4)
    t.scrape()
    t.scrape()
    assert len(t.models) == 4 and t.models_dropped == 2 * 46


def test_triton_fixture_reads_pending_and_queue_time() -> None:
    text = (FIXTURES / "triton_metrics.txt").read_text()
    p = promtext.parse(text, kinds.wanted)
    r = kinds.extract("triton", p.series)
    mr = r.models[("double", "1")]
    assert mr.waiting == 0 and mr.queue_s is not None and mr.e2e_s is not None and 0 < mr.queue_s < mr.e2e_s
    assert r.host_cpu_ratio is not None and 0 <= r.host_cpu_ratio <= 1


def test_tensorrt_llm_and_sglang_names() -> None:
    trt = ('nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 12\n'
           'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3\n'
           'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 96\n'
           'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 128\n'
           'nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0\n')
    p = promtext.parse(trt, kinds.wanted)
    kind = kinds.detect(n for n, _, _ in p.series)
    mr = kinds.extract(str(kind), p.series).models[("tensorrt_llm", "1")]
    assert kind == "tensorrt_llm" and mr.running == 12 and mr.waiting == 3 and mr.kv_usage == 0.75
    sg = ('sglang:num_running_reqs{model_name="q"} 9\nsglang:num_queue_reqs{model_name="q"} 4\n'
          'sglang:token_usage{model_name="q"} 0.93\nsglang:cache_hit_rate{model_name="q"} 0.4\n')
    p = promtext.parse(sg, kinds.wanted)
    mr = kinds.extract("sglang", p.series).models[("q", "")]
    assert (mr.running, mr.waiting, mr.kv_usage, mr.prefix_hit_rate) == (9, 4, 0.93, 0.4)


def test_config_errors_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="http"):
        EnginesConfig(targets=[{"url": "ftp://x/metrics"}])
    with pytest.raises(ValueError, match="unique"):
        EnginesConfig(targets=[{"url": "http://a:1/metrics"}, {"url": "http://a:1/other"}])
