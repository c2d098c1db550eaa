"""Optional integrations: OpenTelemetry stage spans and the PyTorch allocator probe."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest

import inferwatch
from inferwatch._torch import AllocatorProbe, expandable_segments_from_env
from inferwatch.wire import EV_ALLOC
from tests.sdk.conftest import Receiver, buffered

# -- OpenTelemetry --------------------------------------------------------------------------


@pytest.fixture
def otel() -> Any:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_stage_spans_are_children_of_the_current_span_and_carry_the_request_id(receiver: Receiver, otel: Any) -> None:
    provider, exporter = otel
    assert inferwatch.configure(sidecar=receiver.path, otel_spans=True, otel_tracer_provider=provider)

    @inferwatch.stage("inference")
    def infer() -> int:
        return 1

    @inferwatch.stage("ainference")
    async def ainfer() -> int:
        return 2

    server = provider.get_tracer("server")
    with server.start_as_current_span("GET /predict") as parent, inferwatch.request("rid-otel", tenant="a"):
        infer()
        asyncio.run(ainfer())
        with inferwatch.stage("post"):
            pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"GET /predict", "inference", "ainference", "post"}
    for name in ("inference", "ainference", "post"):
        s = spans[name]
        assert s.parent is not None and s.parent.span_id == parent.get_span_context().span_id
        assert s.context.trace_id == parent.get_span_context().trace_id
        assert s.attributes["inferwatch.request_id"] == "rid-otel"
        assert s.attributes["inferwatch.stage"] == name
        assert s.attributes["inferwatch.tenant"] == "a"
    # The stages are recorded for the sidecar as well.
    (req,) = buffered()
    assert [s[0] for s in req[8]] == ["inference", "ainference", "post"]


def test_no_spans_by_default(receiver: Receiver, otel: Any) -> None:
    provider, exporter = otel
    assert inferwatch.configure(sidecar=receiver.path, otel_tracer_provider=provider)
    with inferwatch.stage("x"):
        pass
    assert exporter.get_finished_spans() == ()


def test_spans_requested_without_opentelemetry_warn_and_continue(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes the import fail
    with caplog.at_level(logging.WARNING, logger="inferwatch"):
        assert inferwatch.configure(sidecar=receiver.path, otel_spans=True)
    assert 'pip install "inferwatch[otel]"' in caplog.text
    with inferwatch.stage("x"):
        pass
    assert len(buffered()) == 1


# -- PyTorch allocator probe ------------------------------------------------------------------

STATS = {
    "allocated_bytes.all.current": 1 << 30,
    "reserved_bytes.all.current": 2 << 30,
    "active_bytes.all.current": (1 << 30) + 512,
    "inactive_split_bytes.all.current": 4096,
    "num_alloc_retries": 3,
    "num_ooms": 1,
}


def test_probe_sends_alloc_samples_per_device(receiver: Receiver) -> None:
    calls = []

    def source() -> dict[int, dict[str, Any]]:
        calls.append(1)
        return {0: STATS, 1: {**STATS, "num_ooms": 0, "expandable_segments": True}}

    assert inferwatch.configure(
        sidecar=receiver.path, flush_interval_ms=10_000, torch_probe=True, torch_stats_source=source
    )
    assert inferwatch.flush()
    recs = [r for r in receiver.records() if r[0] == EV_ALLOC]
    assert len(calls) == 1
    assert [r[2] for r in recs] == [0, 1]
    assert recs[0][3:] == (1 << 30, 2 << 30, (1 << 30) + 512, 4096, 3, 1, False)
    assert recs[1][3:] == (1 << 30, 2 << 30, (1 << 30) + 512, 4096, 3, 0, True)
    # Not due again until the interval has passed.
    assert inferwatch.flush()
    assert len(calls) == 1


def test_probe_is_off_by_default(receiver: Receiver) -> None:
    assert inferwatch.configure(sidecar=receiver.path, flush_interval_ms=10_000)
    assert inferwatch.flush()
    assert [r for r in receiver.records() if r[0] == EV_ALLOC] == []


def test_probe_failures_never_raise() -> None:
    def broken() -> dict[int, Any]:
        raise RuntimeError("CUDA error: device-side assert")

    p = AllocatorProbe(1.0, broken)
    assert p.due(0.0) and not p.due(0.5) and p.due(1.0)
    assert p.sample() == [] and p.errors == 1 and "device-side assert" in p.last_error
    weird = AllocatorProbe(1.0, lambda: {0: {"num_ooms": "lots", "allocated_bytes.all.current": -5}})
    (ev,) = weird.sample()
    assert ev[3] == 0 and ev[8] == 0


def test_expandable_segments_from_the_allocator_config() -> None:
    assert expandable_segments_from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert expandable_segments_from_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:true"})
    assert not expandable_segments_from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert not expandable_segments_from_env({})


def test_default_source_does_not_import_torch() -> None:
    from inferwatch._torch import torch_stats

    had = "torch" in sys.modules
    if not had:
        assert torch_stats() == {}
        assert "torch" not in sys.modules
