"""Issue 28: the trace join and the OTLP decoder are bounded by bytes, not by counts alone.

Each test reproduces one attack from the issue at a scale a CI machine runs in
a second and asserts the bound in numbers (bytes held, spans counted, walks).
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from typing import Any

import pytest
from prometheus_client import generate_latest

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.ingest.otlp_traces import decode as decode_mod
from inferwatch_sidecar.ingest.otlp_traces import receiver as receiver_mod
from tests.helpers.sidecar import parse_metrics, sample
from tests.ingest.otlp_traces.spans import export, span, triton_trace

PB = "application/x-protobuf"


def make(traces: dict[str, Any] | None = None) -> Sidecar:
    return Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False},
                                                     "traces": traces or {}}))


def metrics(s: Sidecar) -> dict[Any, float]:
    return parse_metrics(generate_latest(s.registry).decode())


def fat_stage(trace: int, sid: int, parent: int, n_attrs: int = 64, n_events: int = 200) -> Any:
    """A generic-preset stage span (gen_ai.operation.name) whose request never comes, carrying junk."""
    attrs = {"gen_ai.operation.name": "chat"} | {f"junk.{i}": "v" * 255 for i in range(n_attrs)}
    return span(trace, sid, "stage", 1.0, 2.0, parent=parent, attrs=attrs,
                events=[(f"ev{i}", 1.5) for i in range(n_events)])


def test_waiting_stage_spans_keep_only_what_the_join_needs() -> None:
    s = make({"max_attributes_per_span": 128})
    body = export([fat_stage(1000 + i, 1, 99) for i in range(300)])
    assert len(body) > 300 * 64 * 255  # ~5 MB of attributes waiting for a request that never comes
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    assert s.traces.handle(body, PB, None)[0] == 200
    del body
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert s.traces.mapper.pending == 300
    # Whole spans held ~60 KB each (18 MB); the slim ones are a few hundred bytes plus the trace's indexes.
    assert held < 300 * 3000, held
    # The estimate the byte budget uses is within a small factor of what is really held.
    assert s.traces.mapper.nbytes > held / 4


def test_attribute_event_and_key_caps_are_applied_at_decode_and_counted() -> None:
    s = make({"max_attributes_per_span": 10, "max_events_per_span": 5, "max_attributes_per_event": 2})
    big_key = "k" * 100_000
    sp = span(1, 2, "x", 1.0, 2.0, kind=2, attrs={big_key: 1, **{f"a{i}": i for i in range(30)}},
              events=[("e", 1.5)] * 50)
    e = sp.events[0]
    for i in range(7):
        kv = e.attributes.add()
        kv.key = f"ea{i}"
        kv.value.int_value = i
    s.traces.handle(export([sp]), PB, None)
    m = metrics(s)
    assert sample(m, "inferwatch_otlp_cut_total", what="attribute") == 21 + 5  # 31 span attrs cut to 10; 7 to 2
    assert sample(m, "inferwatch_otlp_cut_total", what="event") == 45
    assert sample(m, "inferwatch_otlp_cut_total", what="key") == 1
    # The same caps on OTLP/JSON.
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "01" * 16, "spanId": "02" * 8, "name": "x", "kind": 2, "startTimeUnixNano": "1",
        "endTimeUnixNano": "2", "attributes": [{"key": big_key, "value": {"intValue": "1"}}]
        + [{"key": f"a{i}", "value": {"intValue": str(i)}} for i in range(30)],
        "events": [{"name": "e", "timeUnixNano": "1"}] * 50}]}]}]}
    s.traces.handle(json.dumps(doc).encode(), "application/json", None)
    m = metrics(s)
    assert sample(m, "inferwatch_otlp_cut_total", what="attribute") == 26 + 21
    assert sample(m, "inferwatch_otlp_cut_total", what="event") == 90
    decoded = decode_mod.decode(json.dumps(doc).encode(), "application/json", 10, decode_mod.Limits(10, 5, 2))
    assert big_key not in decoded.spans[0].attrs and len(decoded.spans[0].attrs) == 9


def test_join_buffer_is_bounded_by_bytes_and_per_trace() -> None:
    s = make({"max_pending_bytes": 1 << 16, "max_spans_per_trace": 50, "max_pending_spans": 100000})
    # Many traces of small waiting spans: the byte budget evicts the oldest traces.
    for b in range(20):
        s.traces.handle(export([fat_stage(10_000 + 100 * b + i, 1, 99, 4, 4) for i in range(100)]), PB, None)
        assert s.traces.mapper.nbytes <= 1 << 16
    m = metrics(s)
    assert sample(m, "inferwatch_otlp_spans_total", result="dropped", reason="evicted") > 1500
    assert sample(m, "inferwatch_otlp_pending_bytes") == s.traces.mapper.nbytes
    # One trace with 200 stage spans: 50 remembered, the rest dropped as trace_full.
    s = make({"max_spans_per_trace": 50})
    s.traces.handle(export([fat_stage(7, 100 + i, 99, 1, 1) for i in range(200)]), PB, None)
    assert s.traces.mapper.pending == 50
    assert sample(metrics(s), "inferwatch_otlp_spans_total", result="dropped", reason="trace_full") == 150


def test_join_does_not_rewalk_waiting_spans() -> None:
    """2,000 stage spans wait in one trace with parents in a cycle of 64 IDs; requests touching it stay cheap."""
    s = make({"max_spans_per_trace": 4096})
    cycle = [span(5, 1_000_000 + i, "link", 1.0, 2.0, parent=1_000_000 + (i + 1) % 64) for i in range(64)]
    stages = [span(5, 10 + i, "st", 1.0, 2.0, parent=1_000_000 + i % 64, attrs={"gen_ai.operation.name": "op"})
              for i in range(2000)]
    s.traces.handle(export(cycle + stages), PB, None)
    assert s.traces.mapper.pending == 2000

    sids = iter(range(5_000_000, 6_000_000))

    def cost(trace: int) -> float:
        bodies = [export([span(trace, next(sids), "req", 1.0, 2.0, parent=77, kind=2)]) for _ in range(40)]
        t0 = time.process_time()
        for b in bodies:
            s.traces.handle(b, PB, None)
        return time.process_time() - t0

    hot = min(cost(5) for _ in range(3))
    cold = min(cost(6) for _ in range(3))
    # Re-walking 2,000 spans x 64 parents per export made the hot trace ~100x the cold one.
    assert hot < 3 * cold + 0.01, (hot, cold)
    assert s.traces.mapper.pending == 2000
    # The join still works through the index: a request at a cycle node takes every stage below it.
    s.traces.handle(export([span(5, 1_000_000, "req", 1.0, 2.0, kind=2)]), PB, None)
    assert s.traces.mapper.pending == 0
    assert sample(metrics(s), "inferwatch_otlp_spans_total", result="accepted", reason="stage") == 2000


def test_nearest_request_takes_the_stage_across_batches() -> None:
    """Triton's three spans in any order and batching give the same stages (the incremental join's contract)."""
    import itertools
    for order in itertools.permutations(range(3)):
        for split in range(1, 4):
            s = make()
            spans = triton_trace(9, 1)
            seq = [spans[i] for i in order]
            s.traces.handle(export(seq[:split], scope="triton-server"), PB, None)
            if seq[split:]:
                s.traces.handle(export(seq[split:], scope="triton-server"), PB, None)
            m = metrics(s)
            stage = sample(m, "inferwatch_otlp_spans_total", result="accepted", reason="stage")
            late = sample(m, "inferwatch_otlp_spans_total", result="dropped", reason="late")
            # The compute span joins unless its model span came in an earlier batch (then it is late).
            model_first = order.index(1) < order.index(0) and order.index(0) >= split > order.index(1)
            assert (stage, late) == ((0, 1) if model_first else (1, 0)), (order, split)


def test_json_container_bomb_is_refused_before_parsing() -> None:
    s = make()
    bomb = b'{"resourceSpans":[' + b"{}," * 600_000 + b"{}]}"
    assert len(bomb) < s.cfg.traces.max_decompressed_bytes
    code, _, _ = s.traces.handle(bomb, "application/json", None)
    assert code == 413
    assert sample(metrics(s), "inferwatch_ingest_decode_errors_total", scope="otlp", reason="too_many_values") == 1


def test_large_bodies_are_decoded_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(environ={}).traces.max_decompressed_bytes == 4 << 20
    s = make()
    active = [0]
    peak = [0]
    real = receiver_mod.decode
    lock = threading.Lock()

    def slow_decode(*a: Any) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return real(*a)

    monkeypatch.setattr(receiver_mod, "decode", slow_decode)
    big = export([span(3, i + 1, "x" * 200, 1.0, 2.0, attrs={"a": "v" * 255}) for i in range(800)])
    assert len(big) > receiver_mod.LARGE_BODY
    small = export([span(4, 1, "x", 1.0, 2.0)])
    codes: list[int] = []
    threads = [threading.Thread(target=lambda b=b: codes.append(s.traces.handle(b, PB, None)[0]))
               for b in [big] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 4 and peak[0] == 1
    peak[0] = 0
    threads = [threading.Thread(target=lambda: codes.append(s.traces.handle(small, PB, None)[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] > 1  # small bodies are not serialised (the 50 ms sleeps overlap)


def test_a_span_ending_at_the_last_nanosecond_does_not_pin_its_exemplar() -> None:
    """A traced exemplar at 2**64-1 ns held its bucket against every newer untraced request, forever."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from inferwatch.wire import EV_REQUEST

    s = make()
    far = PbSpan(trace_id=(1).to_bytes(16, "big"), span_id=(2).to_bytes(8, "big"), name="req", kind=2,  # type: ignore[arg-type]
                 start_time_unix_nano=2**64 - 1 - 5 * 10**6, end_time_unix_nano=2**64 - 1)
    assert s.traces.handle(export([far], resource={"service.name": "svc"}), PB, None)[0] == 200
    now = time.time_ns()
    # A later untraced request of the same label set and bucket (5 ms).
    s.pipeline.events([(EV_REQUEST, ("svc", None, None), now, 5 * 10**6, 0, None, "fresh-request", None, [])], "http")
    text = om_latest(s.registry).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("inferwatch_request_duration_seconds_bucket")
             and 'service="svc"' in ln and "#" in ln]
    assert lines and all("fresh-request" in ln for ln in lines), lines
