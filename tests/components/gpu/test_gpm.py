"""GPM sampling through the fake NVML: physically consistent phases, interval averages, coarse fallback, health."""

from __future__ import annotations

import random

import pynvml
import pytest

from inferwatch_sidecar.components.gpu import fake_gpm as fg
from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice
from inferwatch_sidecar.components.gpu.gpm import GpmSampler


def run(workload: fg.Workload, passes: int = 3, gpm: bool = True, step: float = 1.0,
        devices: list[FakeDevice] | None = None) -> tuple[list, GpmSampler, fg.FakeGpmNvml]:
    t = [0.0]
    nv = fg.FakeGpmNvml(devices or [FakeDevice()], clock=lambda: t[0], workloads={0: workload}, gpm=gpm)
    s = GpmSampler(nv, monotonic=lambda: t[0])
    acts = []
    for _ in range(passes):
        a, _h = s.sample()
        acts.extend(a)
        t[0] += step
    return acts, s, nv


def test_decode_is_bandwidth_heavy_and_prefill_compute_heavy_on_random_loads() -> None:
    rng = random.Random(7)
    for _ in range(20):
        busy = rng.uniform(0.6, 1.0)
        dec, _, _ = run(fg.steady(busy, rng.uniform(0.0, 0.15)))
        pre, _, _ = run(fg.steady(busy, rng.uniform(0.85, 1.0)))
        d, p = dec[-1], pre[-1]
        assert d.fidelity == p.fidelity == "gpm"
        assert d.dram_bw_util > p.dram_bw_util and d.sm_occupancy < p.sm_occupancy
        assert d.tensor_active < p.tensor_active
        # nvidia-smi's number is the same for both: it only says a kernel ran.
        assert d.kernel_active == pytest.approx(p.kernel_active, abs=0.011)
        assert d.kernel_active == pytest.approx(busy, abs=0.011)


def test_values_are_interval_averages() -> None:
    # Busy decode for the first half of each second, idle the second half.
    acts, _, _ = run(lambda t: fg.Phase(1.0 if (t % 1.0) < 0.5 else 0.0, 0.0), passes=3)
    full = fg.counters(fg.Phase(1.0, 0.0))
    assert acts[-1].dram_bw_util == pytest.approx(full["dram"] / 2, rel=1e-6)
    assert acts[-1].t1 - acts[-1].t0 == pytest.approx(1.0)


def test_first_pass_and_too_close_samples_give_no_interval() -> None:
    acts, s, nv = run(fg.steady(0.5, 0.5), passes=1)
    assert acts == [] and nv.calls["nvmlGpmSampleGet"] == 1
    acts, s, nv = run(fg.steady(0.5, 0.5), passes=4, step=0.05)
    # 0.05 s apart: only one sample pair in 0.15 s is more than 0.12 s apart.
    assert len(acts) == 1


def test_pre_hopper_falls_back_to_coarse_utilization() -> None:
    acts, s, _ = run(fg.steady(0.97, 0.05), passes=2, gpm=False)
    a = acts[-1]
    assert a.fidelity == "coarse" and a.sm_occupancy is None and a.tensor_active is None
    assert a.sm_util == pytest.approx(0.97, abs=0.011)


def test_mig_instances_sample_through_the_parent() -> None:
    dev = FakeDevice(mig=[FakeDevice(total=10 << 30), FakeDevice(total=10 << 30)])
    acts, s, nv = run(fg.steady(0.9, 0.9), passes=2, devices=[dev])
    gpus = sorted(a.gpu for a in acts)
    assert gpus == ["0", "0/mig0", "0/mig1"]
    assert nv.calls["nvmlGpmMigSampleGet"] == 4


def test_health_throttle_clocks_ecc_and_bounded_xids() -> None:
    t = [0.0]
    nv = fg.FakeGpmNvml([FakeDevice(), FakeDevice()], clock=lambda: t[0])
    nv.throttle[1] = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    nv.ecc[1] = (5, 1)
    for code in (79, 48, 99999):
        nv.xid(1, code)
    s = GpmSampler(nv, monotonic=lambda: t[0])
    _, hs = s.sample()
    h1 = {h.gpu: h for h in hs}["1"]
    assert h1.throttle["hw_thermal"] and h1.throttle["sw_power_cap"] and not h1.throttle["hw_slowdown"]
    assert h1.sm_clock_hz is not None and h1.sm_clock_hz < {h.gpu: h for h in hs}["0"].sm_clock_hz
    assert (h1.ecc_corrected, h1.ecc_uncorrected) == (5, 1)
    assert s.xids == {("1", "79"): 1, ("1", "48"): 1, ("1", "other"): 1}


def test_nvml_faults_are_counted_not_raised() -> None:
    t = [0.0]
    nv = fg.FakeGpmNvml([FakeDevice()], clock=lambda: t[0], workloads={0: fg.steady(0.5, 0.5)})
    s = GpmSampler(nv, monotonic=lambda: t[0])
    s.sample()
    nv.fail("nvmlGpmSampleGet", pynvml.NVML_ERROR_GPU_IS_LOST, times=1)
    t[0] += 1
    acts, _ = s.sample()
    assert not [a for a in acts if a.fidelity == "gpm"]
    assert s.faults[("gpm_sample", "gpu_is_lost")] == 1
    for _ in range(2):
        t[0] += 1
        acts, _ = s.sample()
    assert acts and acts[-1].fidelity == "gpm"  # recovers on the next pair
    nv2 = fg.FakeGpmNvml([FakeDevice()], clock=lambda: 0.0)
    nv2.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    s2 = GpmSampler(nv2)
    assert s2.sample() == ([], []) and s2.faults[("init", "driver_not_loaded")] == 1
