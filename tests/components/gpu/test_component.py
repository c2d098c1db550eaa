"""The gpu component: allocator ingest and classification, dead PIDs, fake backend from config."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from inferwatch.wire import EV_ALLOC, EV_ALLOC_SITE
from inferwatch_sidecar.components.base import Component, ComponentContext
from inferwatch_sidecar.components.gpu.component import GpuComponent, build
from inferwatch_sidecar.components.gpu.config import GpuConfig
from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice, FakeNvml, FakeProcess, GiB, MiB
from inferwatch_sidecar.components.gpu.sampler import NvmlSampler
from tests.components.gpu.test_sampler_faults import Clock, values

FAST = {"scales": [[320, 10]], "warmup_s": 0, "confirm_s": 20}


def rec(t: float, allocated: int, reserved: int, split: int = 0, retries: int = 0, ooms: int = 0,
        device: int = 0) -> tuple[int, ...]:
    return (EV_ALLOC, int(t * 1e9), device, allocated, reserved, allocated, split, retries, ooms, 0)


def scenario(kind: str, extra: Callable[[int, float], list[tuple[Any, ...]]] | None = None
             ) -> tuple[GpuComponent, Clock]:
    """A process leaking 4 MiB/s seen by NVML, with allocator stats matching ``kind``; ``extra(i, t)``: more
    records the process sends with its i-th sample."""
    clock = Clock()
    rate = 4 * MiB

    def nvml_used(t: float) -> float:
        return 10 * GiB + rate * t

    fake = FakeNvml([FakeDevice(processes=[FakeProcess(50, nvml_used)])], clock=lambda: clock.t - 1000.0)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    cfg = GpuConfig(backend="nvml", detector=FAST, resolve_containers=False)
    comp = build(cfg, ctx, sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    for _ in range(600):
        el = clock.t - 1000.0
        if kind == "tensor":
            a, r, s = 6 * GiB + rate * el, 8 * GiB + rate * el, 0
        elif kind == "cache_fragmentation":
            a, r, s = 6 * GiB, 8 * GiB + rate * el, int(0.5 * rate * el)
        else:  # native: allocator flat, NVML grows
            a, r, s = 6 * GiB, 8 * GiB, 0
        comp.handle(50, 1, [rec(clock.t, int(a), int(r), s, retries=int(el // 10) if kind != "native" else 0),
                            *(extra(_, clock.t) if extra else ())])
        comp.tick()
        clock.t += 1
    return comp, clock


def test_component_satisfies_the_contract() -> None:
    comp, _ = scenario("native")
    assert isinstance(comp, Component)
    assert comp.name == "gpu" and comp.record_types == frozenset({EV_ALLOC, EV_ALLOC_SITE})


@pytest.mark.parametrize("kind", ["tensor", "cache_fragmentation", "native"])
def test_leak_is_classified_from_allocator_stats(kind: str) -> None:
    comp, _ = scenario(kind)
    st = comp.status()
    proc = st["devices"][0]["processes"][0]
    assert proc["verdict"] == "leak" and proc["kind"] == kind
    # The cause as gpu analyze names it (the scenario's cache growth retries allocations: fragmentation).
    assert proc["cause"] == {"tensor": "tensor", "cache_fragmentation": "fragmentation",
                             "native": "outside_allocator"}[kind]
    assert [x["cause"] for x in st["leaks"] if x["pid"] == 50] == [proc["cause"]]
    assert proc["rate_bytes_per_s"] == pytest.approx(4 * MiB, rel=0.02)
    v = values(comp)
    assert v[("inferwatch_gpu_leak_kind", (("gpu", "0"), ("kind", kind), ("pid", "50")))] == 1.0
    assert sum(val for (n, lab), val in v.items() if n == "inferwatch_gpu_leak_kind") == 1.0
    free = st["devices"][0]["free_bytes"]
    assert proc["time_to_oom_s"] == pytest.approx(free / proc["rate_bytes_per_s"])
    assert v[("inferwatch_gpu_leak_time_to_oom_seconds", (("gpu", "0"), ("pid", "50")))] == pytest.approx(
        proc["time_to_oom_s"])
    # Allocator series and non-allocator memory = NVML per-process used - reserved.
    reserved = v[("inferwatch_gpu_allocator_reserved_bytes", (("gpu", "0"), ("pid", "50")))]
    assert v[("inferwatch_gpu_process_non_allocator_memory_bytes", (("gpu", "0"), ("pid", "50")))] == (
        proc["used_bytes"] - reserved)


def test_fragmentation_warning_from_retries_and_inactive_split() -> None:
    comp, _ = scenario("cache_fragmentation")
    v = values(comp)
    lab = (("gpu", "0"), ("pid", "50"))
    assert v[("inferwatch_gpu_fragmentation_warning", lab)] == 1.0
    assert v[("inferwatch_gpu_allocator_alloc_retries_total", lab)] == 59
    assert comp.status()["allocator"][0]["fragmentation_reason"].startswith("alloc retries")
    comp2, _ = scenario("native")
    assert values(comp2)[("inferwatch_gpu_fragmentation_warning", lab)] == 0.0


def test_malformed_allocator_records_are_counted_and_dropped() -> None:
    comp, _ = scenario("native")
    comp.handle(1, 1, [(EV_ALLOC, 1, 0, -5, 0, 0, 0, 0, 0, 0), (EV_ALLOC, 1), (EV_ALLOC,) + ("x",) * 9])
    v = values(comp)
    assert v[("inferwatch_gpu_allocator_records_dropped_total", (("reason", "bad_value"),))] == 2
    assert v[("inferwatch_gpu_allocator_records_dropped_total", (("reason", "bad_layout"),))] == 1


def test_dead_pid_series_are_removed() -> None:
    clock = Clock()
    dev = FakeDevice(processes=[FakeProcess(10, lambda t: GiB), FakeProcess(11, lambda t: 2 * GiB)])
    fake = FakeNvml([dev], clock=lambda: clock.t)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml", pid_ttl_s=5, resolve_containers=False), ctx,
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    ctx.limiter("pid").get("999")  # another component's PID label: never released by gpu
    comp.handle(11, 1, [rec(clock.t, GiB, GiB)])
    comp.tick()
    pids = {lab for (n, lab) in values(comp) if n == "inferwatch_gpu_process_memory_used_bytes"}
    assert len(pids) == 2
    dev.processes = dev.processes[:1]  # pid 11 exits
    for _ in range(7):
        clock.t += 1
        comp.tick()
    v = values(comp)
    assert not any(dict(lab).get("pid") == "11" for (_n, lab) in v)
    assert any(dict(lab).get("pid") == "10" for (_n, lab) in v)
    assert "11" not in comp._pid_lim._seen and set(comp._pid_lim._seen) == {"10", "999"}
    assert [p["pid"] for p in comp.status()["devices"][0]["processes"]] == [10]


def test_allocator_only_process_is_judged_on_reserved_bytes() -> None:
    """Without the host PID namespace NVML lists no processes: the allocator series still detects."""
    clock = Clock()
    fake = FakeNvml([FakeDevice()], clock=lambda: clock.t)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml", detector=FAST, resolve_containers=False), ctx,
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    for i in range(600):
        comp.handle(77, 1, [rec(clock.t, 2 * GiB + i * 2 * MiB, 3 * GiB + i * 2 * MiB)])
        comp.tick()
        clock.t += 1
    leaks = comp.status()["leaks"]
    proc = [x for x in leaks if x["pid"] == 77][0]
    assert proc["kind"] == "tensor" and proc["rate_bytes_per_s"] == pytest.approx(2 * MiB, rel=0.02)


def test_pid_label_is_capped_by_the_limiter() -> None:
    clock = Clock()
    dev = FakeDevice(processes=[FakeProcess(100 + i, lambda t: GiB) for i in range(5)])
    fake = FakeNvml([dev], clock=lambda: clock.t)
    ctx = ComponentContext(clock=clock, monotonic=clock, default_label_budget=3)
    comp = build(GpuConfig(backend="nvml", resolve_containers=False), ctx,
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    comp.tick()
    used = {dict(lab)["pid"]: v for (n, lab), v in values(comp).items()
            if n == "inferwatch_gpu_process_memory_used_bytes"}
    assert set(used) == {"100", "101", "102", "__overflow__"}
    assert used["__overflow__"] == 2 * GiB  # two PIDs folded into one series, bytes summed
    assert comp._pid_lim.overflowed >= 2


def test_fake_backend_from_config_injects_a_leak_on_the_sampler_thread() -> None:
    """What the demo and the end-to-end test do: config only, real thread, real clock."""
    cfg = GpuConfig.model_validate({
        "backend": "fake", "interval_s": 0.01, "resolve_containers": False,
        "detector": {"scales": [[0.64, 0.04]], "warmup_s": 0, "confirm_s": 0.05,
                     "min_rate_bytes_per_s": 0, "tau_max_s": 0.1},
        "fake": {"devices": 1, "total_gib": 80, "pid": 4242, "leak_mib_per_s": 4096, "leak_start_s": 0},
    })
    comp = build(cfg, ComponentContext())
    comp.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not comp.status()["leaks"]:
            time.sleep(0.05)
    finally:
        comp.stop(2.0)
    leaks = comp.status()["leaks"]
    assert any(x["pid"] == 4242 for x in leaks), comp.status()
    assert comp.status()["backend"] == "fake"


def test_replay_config_with_a_missing_file_fails_start_up(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        build(GpuConfig(backend="replay", replay={"files": [f"{tmp_path}/nope.csv"]}), ComponentContext())
    with pytest.raises(ValueError, match="replay.files is empty"):
        GpuConfig(backend="replay")
    with pytest.raises(ValueError):
        GpuConfig(backend="cuda")
    with pytest.raises(ValueError):
        GpuConfig(intervl_s=1)  # type: ignore[call-arg]


def test_status_keeps_the_episode_of_a_process_that_exited() -> None:
    """A leak that ends because its process goes away stays in /v1/status's bounded episode history."""
    clock = Clock()
    dev = FakeDevice(processes=[FakeProcess(60, lambda t: 10 * GiB + 4 * MiB * max(0.0, t - 200.0))])
    fake = FakeNvml([dev], clock=lambda: clock.t - 1000.0)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml", detector=FAST, pid_ttl_s=5, resolve_containers=False), ctx,
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    for _ in range(600):
        comp.tick()
        clock.t += 1
    st = comp.status()
    (ep,) = [e for e in st["episodes"] if e["pid"] == 60]
    assert ep["cleared_at"] is None and ep["end"] is None and ep["detected_at"] > ep["onset_estimate"]
    assert ep["rate_bytes_per_s"] == pytest.approx(4 * MiB, rel=0.05)
    proc = st["devices"][0]["processes"][0]
    assert proc["onset_estimate"] == ep["onset_estimate"] and len(proc["episodes"]) == 1
    v = values(comp)
    assert v[("inferwatch_gpu_leak_onset_timestamp_seconds", (("gpu", "0"), ("pid", "60")))] == ep["onset_estimate"]
    dev.processes = []  # the process exits
    last_seen = clock.t - 1
    for _ in range(8):
        comp.tick()
        clock.t += 1
    st = comp.status()
    assert st["devices"][0]["processes"] == []
    (gone,) = [e for e in st["episodes"] if e["pid"] == 60]
    assert gone["end"] == "process_exited" and gone["cleared_at"] == last_seen
    assert gone["detected_at"] == ep["detected_at"]


def test_device_detector_judges_the_memory_no_process_accounts_for() -> None:
    """A leak in a listed process is that process's; the device's own series (used minus the
    processes', here the driver's flat 512 MiB) stays quiet instead of reporting it twice."""
    comp, _ = scenario("native")
    st = comp.status()
    dev = st["devices"][0]
    assert dev["processes"][0]["verdict"] == "leak"
    assert dev["leak"]["verdict"] == "no_leak"
    assert [x["pid"] for x in st["leaks"]] == [50]
    det = comp.dev_det["0"]
    assert det.last == pytest.approx(512 * MiB)


def test_a_warm_up_prior_far_longer_than_every_window_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    # Windows of seconds under the default 20-minute prior: a leak from the series' start is a "warm-up" for
    # minutes (the demo and the status-page test set tau_max_s of their windows' scale); the log says so.
    fake = FakeNvml([FakeDevice(processes=[])], clock=time.time)
    ctx = ComponentContext()
    with caplog.at_level("WARNING"):
        build(GpuConfig(backend="nvml", detector={"scales": [[2, 0.1]]}, resolve_containers=False), ctx,
              sampler=NvmlSampler(lambda: fake))
    (msg,) = [r.getMessage() for r in caplog.records if "tau_max_s" in r.getMessage()]
    assert "1200 s, 600x the longest window (2 s)" in msg, msg
    caplog.clear()
    with caplog.at_level("WARNING"):
        for det in ({"scales": [[2, 0.1]], "tau_max_s": 2.0}, {"scales": [[2, 0.1]], "method": "trend"}, {}):
            build(GpuConfig(backend="nvml", detector=det, resolve_containers=False), ctx,
                  sampler=NvmlSampler(lambda: fake))
    assert not [r for r in caplog.records if "tau_max_s" in r.getMessage()]
