"""NVML sampling through the faked pynvml surface, including every fault path."""

from __future__ import annotations

import pynvml
import pytest

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.gpu.component import GpuComponent, build
from inferwatch_sidecar.components.gpu.config import GpuConfig
from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice, FakeNvml, FakeProcess, GiB, MiB, linear_leak
from inferwatch_sidecar.components.gpu.sampler import NvmlSampler, classify, container_hint


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(devices: list[FakeDevice] | None = None, **kw: object) -> tuple[GpuComponent, FakeNvml, Clock]:
    clock = Clock()
    devs = devices or [FakeDevice(processes=[FakeProcess(4242, linear_leak(20 * GiB, 0.0))])]
    fake = FakeNvml(devs, clock=lambda: clock.t - 1000.0, **kw)  # type: ignore[arg-type]
    ctx = ComponentContext(clock=clock, monotonic=clock)
    cfg = GpuConfig(backend="nvml", resolve_containers=False, reinit_s=5.0)
    sampler = NvmlSampler(lambda: fake, clock=clock, reinit_s=cfg.reinit_s, monotonic=clock)
    return build(cfg, ctx, sampler=sampler), fake, clock


def values(comp: GpuComponent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in comp.collect():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_fake_uses_the_real_pynvml_error_classes_and_codes() -> None:
    fake = FakeNvml([FakeDevice()], clock=lambda: 0.0)
    fake.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded) as e:
        fake.nvmlInit()
    assert e.value.value == 9 == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert fake.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert type(fake.nvmlMemory_v2) is int and fake.nvmlMemory_v2 == pynvml.nvmlMemory_v2


def test_healthy_sample_exports_device_and_process_memory() -> None:
    comp, fake, clock = make()
    comp.tick()
    v = values(comp)
    assert v[("inferwatch_gpu_memory_total_bytes", (("gpu", "0"),))] == 80 * GiB
    used = 512 * MiB + 20 * GiB
    assert v[("inferwatch_gpu_memory_used_bytes", (("gpu", "0"),))] == used
    assert v[("inferwatch_gpu_memory_free_bytes", (("gpu", "0"),))] == 80 * GiB - 256 * MiB - used
    assert v[("inferwatch_gpu_memory_reserved_bytes", (("gpu", "0"),))] == 256 * MiB
    assert v[("inferwatch_gpu_process_memory_used_bytes", (("container", ""), ("gpu", "0"), ("pid", "4242")))] == 20 * GiB
    assert v[("inferwatch_gpu_utilization_ratio", (("gpu", "0"),))] == pytest.approx(0.35)
    assert v[("inferwatch_gpu_power_watts", (("gpu", "0"),))] == 210.0
    assert v[("inferwatch_gpu_collector_up", ())] == 1.0
    st = comp.status()
    assert st["memory_info_version"] == "v2" and st["driver_version"] == "550.54.15" and st["state"] == "ok"


def test_old_driver_falls_back_to_v1_memory_info_and_says_so() -> None:
    comp, fake, _ = make(memory_v2=False)
    comp.tick()
    comp.tick()
    st = comp.status()
    assert st["memory_info_version"] == "v1"
    assert st["devices"][0]["reserved_bytes"] is None
    assert st["devices"][0]["free_bytes"] == 80 * GiB - (512 * MiB + 20 * GiB)
    assert "inferwatch_gpu_memory_reserved_bytes" not in {k[0] for k in values(comp)}


def test_library_missing_is_reported_not_raised() -> None:
    def load() -> object:
        raise ModuleNotFoundError("No module named 'pynvml'")

    clock = Clock()
    ctx = ComponentContext(clock=clock, monotonic=clock)
    comp = build(GpuConfig(backend="nvml"), ctx, sampler=NvmlSampler(load, clock=clock, monotonic=clock))
    comp.tick()
    v = values(comp)
    assert v[("inferwatch_gpu_collector_errors_total", (("error", "library_missing"), ("op", "init")))] == 1
    assert v[("inferwatch_gpu_collector_up", ())] == 0
    assert v[("inferwatch_gpu_collector_last_success_age_seconds", ())] == -1
    f = comp.status()["faults"][0]
    assert "pip install" in f["fix"] and comp.status()["state"] == "failing"


@pytest.mark.parametrize(("code", "reason", "hint"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library_not_found", "NVIDIA_VISIBLE_DEVICES"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "driver"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_mismatch", "reboot"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "/dev/nvidia"),
])
def test_init_faults_are_counted_explained_and_retried(code: int, reason: str, hint: str) -> None:
    comp, fake, clock = make()
    fake.fail("nvmlInit", code, times=1)
    comp.tick()
    st = comp.status()
    assert st["faults"][0]["error"] == reason and hint in st["faults"][0]["fix"]
    assert st["state"] == "failing"
    clock.t += 1
    comp.tick()  # before reinit_s: no new nvmlInit call
    assert fake.calls["nvmlInit"] == 1
    clock.t += 10
    comp.tick()  # retried and healthy now
    assert fake.calls["nvmlInit"] == 2
    v = values(comp)
    assert v[("inferwatch_gpu_collector_up", ())] == 1
    assert v[("inferwatch_gpu_collector_errors_total", (("error", reason), ("op", "init")))] == 2


def test_auto_backend_without_nvml_reports_absent() -> None:
    clock = Clock()
    ctx = ComponentContext(clock=clock, monotonic=clock)
    fake = FakeNvml([FakeDevice()], clock=clock)
    fake.fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    sampler = NvmlSampler(lambda: fake, clock=clock, monotonic=clock)
    sampler.init()
    comp = build(GpuConfig(backend="auto"), ctx, sampler=sampler)
    comp.absent_reason = sampler.init_fault
    comp.tick()
    st = comp.status()
    assert st["backend"] == "absent" and st["state"] == "absent"
    assert "libnvidia-ml.so.1" in st["message"] and "NVIDIA_VISIBLE_DEVICES" in st["message"]


def test_auto_backend_on_this_machine_never_crashes() -> None:
    clock = Clock()
    comp = build(GpuConfig(backend="auto"), ComponentContext(clock=clock, monotonic=clock))
    comp.tick()
    st = comp.status()
    # With a GPU this is the real NVML; without one (CI) the component is absent with a reason.
    assert st["backend"] in ("absent", "auto")
    if st["backend"] == "absent":
        assert st["message"]


def test_gpu_lost_on_one_device_keeps_the_others() -> None:
    devs = [FakeDevice(processes=[FakeProcess(1, linear_leak(GiB, 0))]), FakeDevice()]
    comp, fake, _ = make(devs)
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, device=0)
    comp.tick()
    v = values(comp)
    assert ("inferwatch_gpu_memory_used_bytes", (("gpu", "1"),)) in v
    assert ("inferwatch_gpu_memory_used_bytes", (("gpu", "0"),)) not in v
    assert v[("inferwatch_gpu_collector_errors_total", (("error", "gpu_is_lost"), ("op", "memory")))] == 1
    assert v[("inferwatch_gpu_collector_up", ())] == 1
    st = comp.status()
    assert st["state"] == "degraded"
    assert st["faults"][0]["gpu"] == "0" and "Xid 79" in st["faults"][0]["fix"]


def test_not_supported_queries_are_left_out_and_not_asked_again() -> None:
    comp, fake, _ = make()
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NOT_SUPPORTED)
    for _ in range(3):
        comp.tick()
    v = values(comp)
    assert not any(k[0] == "inferwatch_gpu_power_watts" for k in v)
    assert v[("inferwatch_gpu_collector_errors_total", (("error", "not_supported"), ("op", "power")))] == 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert ("inferwatch_gpu_memory_used_bytes", (("gpu", "0"),)) in v


def test_no_permission_for_processes_explains_host_pid_namespace() -> None:
    comp, fake, _ = make()
    fake.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
    comp.tick()
    st = comp.status()
    f = [x for x in st["faults"] if x["op"] == "processes"][0]
    assert f["error"] == "no_permission" and "host PID namespace" in f["fix"]
    assert st["devices"][0]["per_process_memory"] is False
    assert not any(k[0] == "inferwatch_gpu_process_memory_used_bytes" for k in values(comp))


@pytest.mark.parametrize("code", [None, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH])
def test_struct_or_version_mismatch_is_a_counted_fault(code: int | None) -> None:
    comp, fake, _ = make()
    fake.fail("nvmlDeviceGetComputeRunningProcesses", code)
    comp.tick()
    v = values(comp)
    assert v[("inferwatch_gpu_collector_errors_total", (("error", "version_mismatch"), ("op", "processes")))] == 1
    assert "upgrade nvidia-ml-py" in comp.status()["faults"][0]["fix"]


def test_driver_unloaded_mid_run_marks_down_and_ages_the_last_good_sample() -> None:
    comp, fake, clock = make()
    comp.tick()
    fake.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=3)
    for _ in range(3):
        clock.t += 7
        comp.tick()
    v = values(comp)
    assert v[("inferwatch_gpu_collector_up", ())] == 0
    assert v[("inferwatch_gpu_collector_last_success_age_seconds", ())] == 21
    assert comp.status()["last_good_sample_age_s"] == 21
    clock.t += 7
    comp.tick()
    assert values(comp)[("inferwatch_gpu_collector_up", ())] == 1


def test_unexpected_exception_in_a_pass_is_counted_and_the_thread_survives() -> None:
    comp, fake, clock = make()
    calls = {"n": 0}
    real = comp.sampler.sample

    def flaky() -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real()

    comp.sampler.sample = flaky  # type: ignore[method-assign]
    comp.cfg.interval_s = 0.01
    comp.start()
    try:
        import time
        deadline = time.monotonic() + 5
        while calls["n"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        comp.stop(2.0)
    assert calls["n"] >= 3
    assert comp.status()["faults"][0]["error"] == "unexpected"


def test_mig_devices_are_sampled_with_their_parent() -> None:
    mig = [FakeDevice(total=10 * GiB, processes=[FakeProcess(7, linear_leak(2 * GiB, 0))]),
           FakeDevice(total=10 * GiB)]
    comp, fake, _ = make([FakeDevice(mig=mig)])
    comp.tick()
    st = comp.status()
    names = {d["gpu"]: d for d in st["devices"]}
    assert set(names) == {"0", "0/mig0", "0/mig1"}
    assert names["0/mig0"]["parent"] == "0" and names["0/mig0"]["total_bytes"] == 10 * GiB
    assert names["0/mig0"]["processes"][0]["pid"] == 7


def test_classify_unknown_codes() -> None:
    assert classify(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)) == "unknown"
    assert classify(pynvml, RuntimeError("x")) == "unexpected"


def test_container_hint_from_cgroup(tmp_path: object) -> None:
    import pathlib
    root = pathlib.Path(str(tmp_path))
    (root / "11").mkdir()
    (root / "11" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_1111_2222_3333_444455556666.slice/"
        "cri-containerd-" + "ab" * 32 + ".scope\n")
    (root / "12").mkdir()
    (root / "12" / "cgroup").write_text("0::/system.slice/docker-" + "cd" * 32 + ".scope\n")
    assert container_hint(11, str(root)) == "pod:1a2b3c4d-1111-2222-3333-444455556666"
    assert container_hint(12, str(root)) == "cd" * 6
    assert container_hint(13, str(root)) is None
