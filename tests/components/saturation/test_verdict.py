"""The saturation verdict on random traces per resource, its hysteresis, and its sentence."""

from __future__ import annotations

import random
import zlib

import pytest

from inferwatch_sidecar.components.saturation import rules, traces


@pytest.mark.parametrize("resource", [*rules.RESOURCES, "none"])
def test_right_resource_named_within_30_s_on_random_traces(resource: str) -> None:
    rng = random.Random(zlib.crc32(resource.encode()))
    for _ in range(4):
        tr = traces.draw(rng, resource, 240.0)
        o = traces.judge_trace(tr)
        assert not o.named_wrong, (tr, o)
        assert o.named == resource, (tr, o)
        if resource != "none":
            assert o.delay_s is not None and o.delay_s <= 30.0, (tr, o)


@pytest.mark.parametrize("resource", ["memory_bandwidth", "kv_cache", "none"])
def test_steady_load_does_not_flap(resource: str) -> None:
    rng = random.Random(99)
    tr = traces.draw(rng, resource, 3 * 3600.0, steady=True)
    o = traces.judge_trace(tr)
    assert o.flaps == 0 and o.named == resource, o


def test_hysteresis_holds_between_exit_and_enter() -> None:
    j = rules.Judge()
    t = 0.0
    for _ in range(40):
        j.update(rules.Inputs(t=t, kv_usage=0.99))
        t += 1
    assert j.bound == "kv_cache"
    # Between exit (0.75) and enter (0.9) of the ceiling the bound one stays bound.
    for _ in range(300):
        j.update(rules.Inputs(t=t, kv_usage=0.80))
        t += 1
    assert j.bound == "kv_cache" and j.changes == 1
    for _ in range(60):
        j.update(rules.Inputs(t=t, kv_usage=0.3))
        t += 1
    assert j.bound == "none" and j.changes == 2


def test_hardware_outranks_the_queue_it_causes() -> None:
    j = rules.Judge()
    for t in range(60):
        j.update(rules.Inputs(t=float(t), kv_usage=0.99, preemptions=1.0, queue_share=0.9, waiting=40, running=8))
    assert j.bound == "kv_cache"
    j = rules.Judge()
    for t in range(60):
        j.update(rules.Inputs(t=float(t), kv_usage=0.3, queue_share=0.9, waiting=40, running=8))
    assert j.bound == "queue"


def test_ratios_follow_the_documented_rules() -> None:
    r = rules.ratios(rules.Inputs(t=0, fidelity="gpm", sm_util=0.6, sm_occupancy=0.2, tensor_active=0.1,
                                  dram_bw_util=0.85, kernel_active=0.97, kv_usage=0.475, queue_share=0.25,
                                  cpu_cores=1.5, cpu_budget=2.0))
    assert r["memory_bandwidth"] == pytest.approx(1.0)
    assert r["compute"] == pytest.approx(max(0.1 / 0.7, 0.6 * 0.2 / 0.4))
    assert r["kv_cache"] == pytest.approx(0.5) and r["queue"] == pytest.approx(0.5)
    assert r["host_cpu"] == pytest.approx(0.75)
    assert rules.ratios(rules.Inputs(t=0, kv_usage=0.1, preemptions=2))["kv_cache"] == 1.0
    assert rules.ratios(rules.Inputs(t=0))["compute"] is None


def test_sentence_says_utilization_is_not_headroom() -> None:
    j = rules.Judge()
    for t in range(40):
        j.update(rules.Inputs(t=float(t), fidelity="gpm", sm_util=0.55, sm_occupancy=0.21, tensor_active=0.1,
                              dram_bw_util=0.87, kernel_active=0.97, prefill_share=0.05, kv_usage=0.4))
    assert j.bound == "memory_bandwidth"
    assert j.sentence() == ("decode is memory-bandwidth-bound (DRAM 87%, SM occupancy 21%); "
                            "GPU utilization 97% is not headroom")
    j = rules.Judge()
    for t in range(40):
        j.update(rules.Inputs(t=float(t), fidelity="gpm", sm_util=0.3, sm_occupancy=0.1, tensor_active=0.05,
                              dram_bw_util=0.3, kernel_active=0.95, kv_usage=0.4))
    assert j.bound == "none" and j.sentence().startswith("headroom") and "not headroom" in j.sentence()


def test_an_input_that_goes_away_does_not_hold_the_verdict() -> None:
    j = rules.Judge()
    t = 0.0
    for _ in range(40):
        j.update(rules.Inputs(t=t, kv_usage=0.99))
        t += 1
    assert j.bound == "kv_cache"
    for _ in range(40):  # the engine went down: no engine inputs at all
        j.update(rules.Inputs(t=t))
        t += 1
    assert j.bound == "none" and "kv_cache" not in j.smooth
