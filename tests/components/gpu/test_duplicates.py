"""Duplicated model copies (one model loaded by every worker) and the device-wide time to OOM, live."""

from __future__ import annotations

import pynvml
import pytest

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.gpu.component import GpuComponent, build
from inferwatch_sidecar.components.gpu.config import DuplicatesConfig, GpuConfig
from inferwatch_sidecar.components.gpu.duplicates import BINS, FlatTracker, find_copies
from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice, FakeNvml, FakeProcess, GiB, MiB, linear_leak
from inferwatch_sidecar.components.gpu.sampler import NvmlSampler
from tests.components.gpu.test_sampler_faults import Clock, values

FLAT = {"flat_s": 60.0}


def run(procs: list[FakeProcess], seconds: int, **cfg: object) -> GpuComponent:
    """The component on a fake NVML, one tick per second for ``seconds``."""
    clock = Clock()
    fake = FakeNvml([FakeDevice(processes=procs)], clock=lambda: clock.t - 1000.0)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml", resolve_containers=False, **cfg), ctx,  # type: ignore[arg-type]
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))
    for _ in range(seconds):
        comp.tick()
        clock.t += 1
    return comp


def workers(sizes_gib: list[float], grow: int | None = None, noise_mib: float = 8.0) -> list[FakeProcess]:
    """gunicorn-style workers, pid 7001.., each holding ``sizes_gib`` with noise; worker ``grow`` leaks."""
    return [FakeProcess(7001 + k, linear_leak(s * GiB, 16 * MiB if k == grow else 0.0, 0.0, noise_mib * MiB,
                                              seed=k))
            for k, s in enumerate(sizes_gib)]


def copies_metric(comp: GpuComponent) -> tuple[float, float]:
    v = values(comp)
    return (v[("inferwatch_gpu_duplicate_model_copies", (("gpu", "0"),))],
            v[("inferwatch_gpu_duplicate_model_extra_bytes", (("gpu", "0"),))])


def test_four_workers_holding_one_model_each_are_reported() -> None:
    comp = run(workers([14.0, 14.1, 13.95, 14.05]), 90, duplicates=FLAT)
    st = comp.status()
    [dup] = st["duplicate_model_copies"]
    assert dup["gpu"] == "0" and dup["copies"] == 4 and dup["pids"] == [7001, 7002, 7003, 7004]
    used = {p["pid"]: p["used_bytes"] for p in st["devices"][0]["processes"]}
    assert dup["used_bytes"] == [used[p] for p in dup["pids"]]
    assert dup["copy_bytes"] == min(used.values())
    assert dup["extra_bytes"] == sum(used.values()) - min(used.values())
    assert dup["since"] == 1060.0  # first tick at 1000: flat for flat_s = 60 s from then on
    assert "Triton" in dup["fix"] and "--preload" in dup["fix"]
    assert st["devices"][0]["duplicate_model_copies"] == dup
    assert copies_metric(comp) == (4.0, dup["extra_bytes"])


def test_copies_leave_the_status_when_their_device_or_its_processes_cannot_be_read() -> None:
    clock = Clock()
    devs = [FakeDevice(processes=workers([14.0, 14.1, 13.95, 14.05])), FakeDevice(processes=workers([7.0, 7.0]))]
    fake = FakeNvml(devs, clock=lambda: clock.t - 1000.0)
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml", resolve_containers=False, duplicates=FLAT), ctx,
                 sampler=NvmlSampler(lambda: fake, clock=clock, monotonic=clock))

    def ticks(n: int) -> list[tuple[str, int]]:
        for _ in range(n):
            comp.tick()
            clock.t += 1
        return [(d["gpu"], d["copies"]) for d in comp.status()["duplicate_model_copies"]]

    assert ticks(90) == [("0", 4), ("1", 2)]
    fake.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION, times=1, device=0)
    assert ticks(1) == [("1", 2)]
    assert ticks(1) == [("0", 4), ("1", 2)]  # the trackers kept their history
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, times=1, device=1)
    assert ticks(1) == [("0", 4)]
    assert values(comp)[("inferwatch_gpu_duplicate_model_copies", (("gpu", "1"),))] == 0
    fake.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=1)
    assert ticks(1) == []


def test_copies_need_flat_s_of_history() -> None:
    comp = run(workers([14.0, 14.0, 14.0, 14.0]), 50, duplicates=FLAT)
    assert comp.status()["duplicate_model_copies"] == []
    assert copies_metric(comp) == (0.0, 0.0)


def test_different_sizes_are_not_copies() -> None:
    comp = run(workers([4.0, 8.0, 12.0, 16.0]), 90, duplicates=FLAT)
    assert comp.status()["duplicate_model_copies"] == [] and copies_metric(comp) == (0.0, 0.0)


def test_a_growing_worker_is_not_a_copy() -> None:
    # 16 MiB/s is 960 MiB per flat_s: over 5% of 14 GiB, so the worker is never flat.
    comp = run(workers([14.0, 14.0], grow=1), 90, duplicates=FLAT)
    assert comp.status()["duplicate_model_copies"] == []
    comp = run(workers([14.0, 14.0, 14.0, 14.0], grow=2), 90, duplicates=FLAT)
    [dup] = comp.status()["duplicate_model_copies"]
    assert dup["pids"] == [7001, 7002, 7004] and copies_metric(comp)[0] == 3.0


def test_small_processes_are_not_copies_and_thresholds_are_configurable() -> None:
    small = workers([0.5, 0.5, 0.5], noise_mib=1.0)
    comp = run(small, 90, duplicates=FLAT)
    assert comp.status()["duplicate_model_copies"] == []
    comp = run(small, 90, duplicates={**FLAT, "min_bytes": 256 * MiB, "min_copies": 3})
    assert comp.status()["duplicate_model_copies"][0]["copies"] == 3
    with pytest.raises(ValueError, match="min_copies"):
        GpuConfig(duplicates={"min_copies": 1})


def test_find_copies_takes_the_largest_similar_set() -> None:
    cfg = DuplicatesConfig()
    g = float(GiB)
    # Two sets: three of ~10 GiB and two of ~20 GiB; the larger set wins, the 10% bound is inclusive.
    found = find_copies({1: 10 * g, 2: 10.5 * g, 3: 11 * g, 4: 20 * g, 5: 20.1 * g, 6: 0.5 * g}, cfg)
    assert found is not None and found.pids == (1, 2, 3) and found.extra_bytes == 21.5 * g
    assert find_copies({1: 10 * g, 2: 11.2 * g}, cfg) is None  # 10.7% apart
    tie = find_copies({1: 10 * g, 2: 10 * g, 4: 20 * g, 5: 20 * g}, cfg)
    assert tie is not None and tie.pids == (4, 5)  # same count: the set holding more beyond one copy


def test_flat_tracker_memory_is_bounded_and_its_window_slides() -> None:
    cfg = DuplicatesConfig(flat_s=60.0)
    tr = FlatTracker(cfg.flat_s)
    for i in range(100_000):
        tr.update(i * 0.01, 10 * GiB + (3 * GiB if i < 100 else 0.0))  # a 3 GiB load in the first second
    assert len(tr._bins) <= BINS + 1
    assert tr.flat_level(999.99, cfg) == 10 * GiB  # the load left the window long ago


def test_device_time_to_oom_sums_every_leaking_process() -> None:
    fast = {"scales": [[320, 10]], "confirm_s": 20}
    procs = [FakeProcess(1, linear_leak(10 * GiB, 4 * MiB, 0.0)), FakeProcess(2, linear_leak(20 * GiB, 2 * MiB, 0.0)),
             FakeProcess(3, linear_leak(5 * GiB, 0.0))]
    comp = run(procs, 600, detector=fast)
    st = comp.status()
    dev = st["devices"][0]
    rates = {p["pid"]: p["rate_bytes_per_s"] for p in dev["processes"] if p["verdict"] == "leak"}
    assert set(rates) == {1, 2}
    expect = dev["free_bytes"] / (rates[1] + rates[2])
    assert expect == pytest.approx(dev["free_bytes"] / (6 * MiB), rel=0.02)
    for p in dev["processes"]:
        assert p["device_time_to_oom_s"] == pytest.approx(expect, rel=1e-12), p["pid"]
    assert dev["device_time_to_oom_s"] == pytest.approx(expect, rel=1e-12)
    own = {p["pid"]: p["time_to_oom_s"] for p in dev["processes"]}
    assert own[1] == pytest.approx(dev["free_bytes"] / rates[1]) and own[3] is None
    # The device-level metric, which the alert and the dashboard read, is the same (not one process's own).
    v = values(comp)
    assert v[("inferwatch_gpu_device_time_to_oom_seconds", (("gpu", "0"),))] == pytest.approx(expect, rel=1e-12)
    assert v[("inferwatch_gpu_leak_time_to_oom_seconds", (("gpu", "0"), ("pid", "1")))] == pytest.approx(own[1])
