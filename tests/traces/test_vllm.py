"""A real vLLM tracing to a real sidecar: TTFT, queue, prefill, decode and tokens against vLLM's own histograms.

vLLM observes the same per-request values into its ``vllm:*`` histograms
that it puts on the request's ``llm_request`` span, so the sidecar's counts
must equal vLLM's and its sums agree to the nanosecond it rounds each value
to. The real test needs ``.venv-vllm`` (3.4 GB, built by ``scripts/test``);
the recorded-export test needs only the fixtures
``tests/traces/record_vllm_fixtures.py`` wrote from the same server.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from inferwatch_sidecar.components.engines.target import Target
from tests.helpers.sidecar import REPO, parse_metrics, sample, total, wait_until
from tests.loadtest.helpers import loadtest_json
from tests.traces import vllm_engine as engine

FIXTURES = Path(REPO) / "tests" / "fixtures"
LAB = {"service": "vllm", "model": engine.MODEL_NAME, "model_version": ""}
#: (ours, our labels beyond LAB, vLLM's histogram) for every duration both sides measure.
DURATIONS: tuple[tuple[str, dict[str, str], str], ...] = (
    ("inferwatch_request_duration_seconds", {}, "vllm:e2e_request_latency_seconds"),
    ("inferwatch_stage_duration_seconds", {"stage": "queue"}, "vllm:request_queue_time_seconds"),
    ("inferwatch_queue_wait_seconds", {}, "vllm:request_queue_time_seconds"),
    ("inferwatch_stage_duration_seconds", {"stage": "prefill"}, "vllm:request_prefill_time_seconds"),
    ("inferwatch_stage_duration_seconds", {"stage": "decode"}, "vllm:request_decode_time_seconds"),
    ("inferwatch_time_to_first_token_seconds", {"stage": "decode"}, "vllm:time_to_first_token_seconds"),
)


def assert_sidecar_matches_vllm(m: dict[Any, float], vm: dict[Any, float], n: int) -> None:
    """The sidecar's numbers from vLLM's spans against vLLM's own histograms for the same ``n`` requests."""

    def theirs(name: str) -> float:
        return total(vm, name, model_name=engine.MODEL_NAME)

    assert theirs("vllm:request_success_total") == n
    assert sample(m, "inferwatch_requests_total", **LAB, outcome="ok") == n
    assert total(m, "inferwatch_requests_total") == n
    for ours, extra, hist in DURATIONS:
        assert theirs(hist + "_count") == n, hist
        assert sample(m, ours + "_count", **LAB, **extra) == n, (ours, extra)
        # The sidecar keeps each value in whole nanoseconds: at most half of one off per request.
        diff = sample(m, ours + "_sum", **LAB, **extra) - theirs(hist + "_sum")
        assert abs(diff) <= n * 0.5e-9 + 1e-12, (ours, extra, diff)
    tokens = theirs("vllm:generation_tokens_total")
    assert tokens == theirs("vllm:request_generation_tokens_sum") > 0
    assert sample(m, "inferwatch_generated_tokens_total", **LAB, stage="decode") == tokens
    assert sample(m, "inferwatch_generation_length_tokens_sum", **LAB, stage="decode") == tokens
    assert sample(m, "inferwatch_generation_length_tokens_count", **LAB, stage="decode") == n
    assert theirs("vllm:request_generation_tokens_count") == n
    assert sample(m, "inferwatch_records_total", **LAB) == n  # the drift features, one record per request
    assert total(m, "inferwatch_otlp_spans_total", result="accepted", reason="request") == n
    assert total(m, "inferwatch_otlp_spans_total", result="accepted", reason="stage") == 0
    assert total(m, "inferwatch_otlp_spans_total", result="rejected") == 0
    assert total(m, "inferwatch_otlp_spans_total", result="dropped") == 0


def assert_neutral_matches_vllm(t: Target, vm: dict[Any, float]) -> None:
    """The engine-neutral reading against vLLM's own /metrics after the same requests (the server is idle now)."""
    (key,) = t.models
    st = t.models[key]
    assert key == ("tiny-llama", "")
    r = st.reading
    assert r.running == total(vm, "vllm:num_requests_running") == 0
    assert r.waiting == total(vm, "vllm:num_requests_waiting") == 0
    assert r.kv_usage == total(vm, "vllm:kv_cache_usage_perc")
    # Counted from the baseline scrape before the traffic, which vLLM's counters started at 0 for.
    assert st.preemptions_total == total(vm, "vllm:num_preemptions_total")
    queries = total(vm, "vllm:prefix_cache_queries_total")
    assert queries > 0 and st.prefix_hit_ratio == pytest.approx(total(vm, "vllm:prefix_cache_hits_total") / queries)
    assert st.last is not None and st.last.queue_share == pytest.approx(
        total(vm, "vllm:request_queue_time_seconds_sum") / total(vm, "vllm:e2e_request_latency_seconds_sum"))
    prefill, decode = (total(vm, f"vllm:request_{p}_time_seconds_sum") for p in ("prefill", "decode"))
    assert st.last.prefill_share == pytest.approx(prefill / (prefill + decode))
    assert t.cpu_cores is not None and t.cpu_cores > 0


def exemplar_trace_ids(sc: Any) -> set[str]:
    code, _, om = sc.get("/metrics", {"Accept": "application/openmetrics-text"})
    assert code == 200
    return {line.split('trace_id="')[1][:32] for line in om.decode().splitlines()
            if line.startswith("inferwatch_request_duration_seconds_bucket") and 'trace_id="' in line}


def _vllm_python() -> None:
    if engine.VLLM_PYTHON.is_file():
        return
    msg = f"{engine.VLLM_PYTHON} missing: scripts/test builds it from tests/traces/vllm-requirements.txt"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.mark.slow
def test_vllm_spans_match_vllms_own_histograms(sidecar_factory: Any, tmp_path: Path) -> None:
    _vllm_python()
    sc = sidecar_factory()
    log = tmp_path / "vllm.log"
    engine.make_model(tmp_path / "model", log)
    trace_ids = [f"{0x11A0000 + i:032x}" for i in range(len(engine.TRAFFIC))]
    with engine.serve(tmp_path / "model", sc.url + "/v1/traces", log, bsp_delay_ms=200) as port:
        # The engines component's scraper reads the same server: a baseline now, the traffic's deltas after.
        neutral = Target(f"http://127.0.0.1:{port}/metrics", "vllm", timeout_s=10)
        assert neutral.scrape() == "ok" and neutral.detected == "vllm"
        with ThreadPoolExecutor(4) as pool:  # concurrent, so requests share engine steps and wait in the queue
            usages = list(pool.map(lambda i: engine.stream_completion(port, *engine.TRAFFIC[i], trace_ids[i]),
                                   range(len(engine.TRAFFIC))))

        def counted() -> dict[Any, float] | None:
            # Spans are counted as the receiver takes them, requests once aggregation has them: wait for both.
            m = parse_metrics(sc.metrics())
            n = len(engine.TRAFFIC)
            done = (total(m, "inferwatch_otlp_spans_total", reason="request") >= n
                    and total(m, "inferwatch_requests_total", **LAB) >= n)
            return m if done else None

        m = wait_until(counted, timeout=30, what="vLLM's spans counted")
        assert neutral.scrape() == "ok", neutral.status()
        vm = parse_metrics(engine.scrape(port))
        exemplars = exemplar_trace_ids(sc)
        # inferwatch loadtest against the same vLLM (docs/capacity.md): streamed, exactly 6 tokens a request.
        doc, err = loadtest_json(f"http://127.0.0.1:{port}", "--api", "completions", "--model", engine.MODEL_NAME,
                                 "--stream", "--ignore-eos", "--output-tokens", "6", "--prompt-tokens", "12",
                                 "--concurrency", "1,2", "--requests", "4", "--duration", "20")
        vm2 = parse_metrics(engine.scrape(port))
    assert_neutral_matches_vllm(neutral, vm)
    n = len(engine.TRAFFIC)
    # ignore_eos: every request generates exactly max_tokens, streamed to the client.
    assert [u["completion_tokens"] for u in usages] == [t for _, t in engine.TRAFFIC]
    assert all(u["chunks"] >= 1 for u in usages)
    assert_sidecar_matches_vllm(m, vm, n)
    assert total(vm, "vllm:generation_tokens_total") == sum(t for _, t in engine.TRAFFIC)
    assert total(vm, "vllm:request_prompt_tokens_sum") == sum(u["prompt_tokens"] for u in usages)
    # vLLM honours the client's traceparent: the sidecar's exemplars are the trace IDs sent.
    assert exemplars and exemplars <= set(trace_ids)
    assert [s["concurrency"] for s in doc["steps"]] == [1, 2] and all(s["errors"] == 0 for s in doc["steps"])
    assert all(0 < s["ttft_p99_s"] <= s["latency_p99_s"] for s in doc["steps"]), doc
    # 4 requests a step and the preflight one, each of exactly 6 tokens, as vLLM counted them.
    assert total(vm2, "vllm:request_success_total") - total(vm, "vllm:request_success_total") == 9
    assert total(vm2, "vllm:generation_tokens_total") - total(vm, "vllm:generation_tokens_total") == 9 * 6
    assert "ttft p99" in err


def test_recorded_vllm_export_matches_recorded_metrics(sidecar_factory: Any) -> None:
    """One export vLLM sent, as OTLP/JSON, against vLLM's /metrics after the same requests."""
    body = (FIXTURES / "vllm_spans.json").read_bytes()
    spans = [s for rs in json.loads(body)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    requests = [s for s in spans if s["name"] == "llm_request"]
    assert len(requests) == len(engine.TRAFFIC)
    sc = sidecar_factory()
    code, answer = sc.post("/v1/traces", body)
    assert code == 200 and answer == {}, answer
    m = parse_metrics(sc.metrics())
    vm = parse_metrics((FIXTURES / "vllm_metrics.txt").read_text())
    assert_sidecar_matches_vllm(m, vm, len(requests))
    assert total(m, "inferwatch_otlp_spans_total", result="accepted", reason="unused") == len(spans) - len(requests)
    assert exemplar_trace_ids(sc) <= {s["traceId"] for s in requests}
