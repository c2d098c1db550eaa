"""Issues 25 and 26 in the demo: the ``saturation`` fault runs the model server into a KV-cache-bound phase,
then a host-CPU-bound one, and the saturation verdict names each; the live knee is found while the requests in
flight pile up, and they rise past it (the summary says both).

The server's engine facts are its own requests' (:mod:`inferwatch_sidecar.demo.engine_sim`): a KV cache of
384 tokens per worker that requests wait for, then preprocessing that burns 40 ms of real CPU per request;
the sidecar scrapes them as a vLLM endpoint and judges them with the production rules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferwatch_sidecar.demo import engine_sim, promtext
from inferwatch_sidecar.demo import model as mdl


@pytest.mark.slow
def test_saturation_fault_is_named_kv_cache_bound_then_host_cpu_bound_and_requests_rise_past_the_knee(
        tmp_path: Path) -> None:
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario

    # Bounded: 90 s at most (20 s of baseline, whose load steps up half-way so that the live knee has two levels
    # to go by, two 15 s phases, time to spare on a loaded machine); it stops once both phases were named and the
    # requests in flight rose past the live knee.
    with Scenario(ScenarioConfig(duration_s=90, inject_at_s=20, faults=("saturation",),
                                 workdir=str(tmp_path / "demo"))) as sc:
        sc.start(timeout=90)
        sc.run(until=lambda s: sc.all_detected() and sc.capacity.rose() is not None)
        lines = sc.summary_lines()
    st = sc.faults["saturation"]
    out = "\n".join(lines)
    assert st.detected_at is not None and st.injected_at is not None, out
    kv, cpu = st.series["kv_cache_at"][0], st.series["host_cpu_at"][0]
    # The KV-cache phase is named during its 15 s, the host-CPU one after the switch.
    assert st.injected_at < kv < st.injected_at + 15 < cpu, out
    m = re.search(r"kv_cache-bound at \d+\.\ds \((.*)\); then host_cpu-bound at \d+\.\ds \((.*)\)", st.detail)
    assert m is not None, st.detail
    # The verdict's own sentences: the KV cache preempting, then the cores used against the one allowed.
    assert "KV" in m.group(1) or "kv" in m.group(1), m.group(1)
    assert re.search(r"\d\.\d\d of 0\.5 cores", m.group(2)), m.group(2)
    assert "PASS: 1 of 1 injected faults detected" in out, out
    # The live knee: found once the traffic went beyond it (the faulted server's throughput flat while requests in
    # flight piled up: its baseline levels below the knee, its fault levels beyond), and the requests in flight
    # rose past it, from where they were before the fault.
    rose = sc.capacity.rose()
    assert rose is not None, out
    (t0, f0), (t1, f1, k1, h1) = rose
    assert t0 < st.injected_at <= t1 and f1 > f0 and f1 > k1 and h1 < 0, rose
    assert re.search(r"requests in flight rose from at most \d+\.\d\d before the fault \(\d+s\) to \d+\.\d\d at \d+s, "
                     r"past the knee of \d+\.\d\d \(headroom -\d+%\)", out), out


def _scrape(t: float, flight: float, knee: float | None = None, head: float | None = None) -> promtext.Scrape:
    lab = f'{{model="{mdl.NAME}",model_version="{mdl.STABLE}"}}'
    text = f"inferwatch_capacity_in_flight{lab} {flight}\n"
    if knee is not None:
        text += f"inferwatch_capacity_knee_concurrency{lab} {knee}\ninferwatch_capacity_headroom_ratio{lab} {head}\n"
    return promtext.Scrape(text, t)


def test_capacity_trace_says_how_far_requests_rose_past_a_knee_found_during_the_fault() -> None:
    from inferwatch_sidecar.demo.judge import CapacityTrace

    tr = CapacityTrace(inject_at=20.0)
    for t, f in ((2.0, 0.1), (8.0, 0.25), (15.0, 0.55), (19.0, 0.5)):
        tr.observe(t, _scrape(t, f))
    assert tr.rose() is None and tr.points == [] and len(tr.flights) == 4
    tr.observe(22.0, _scrape(22.0, 2.4))  # piling up, no knee yet
    assert tr.rose() is None
    # The knee shows once the fault's levels are beyond it; the first point is already past it, so the headroom
    # never "fell" among the known points, but the requests in flight rose past the knee from before the fault.
    for t, f, head in ((28.0, 24.0, -50.0), (35.0, 13.0, -26.0), (48.0, 32.0, -67.0), (50.0, 9.0, -18.0)):
        tr.observe(t, _scrape(t, f, 0.47, head))
    assert tr.fell() is not None  # -67 < -50
    assert tr.rose() == ((15.0, 0.55), (48.0, 32.0, 0.47, -67.0))
    text = "\n".join(tr.lines())
    assert "requests in flight rose from at most 0.55 before the fault (15s) to 32.00 at 48s, past the knee of " \
           "0.47 (headroom -6700%)" in text, text
    # A knee known only with requests in flight below it says nothing of the kind.
    calm = CapacityTrace(inject_at=20.0)
    calm.observe(10.0, _scrape(10.0, 1.0))
    calm.observe(30.0, _scrape(30.0, 0.5, 2.0, 0.75))
    assert calm.rose() is None
    assert CapacityTrace().rose() is None  # no injection time: nothing to compare with


def test_engine_exposition_sums_the_workers_and_reads_as_vllm(tmp_path: Path) -> None:
    """Two workers' files plus this one's state: one vLLM endpoint, which the sidecar's parser recognises."""
    import json
    import os

    from inferwatch_sidecar.components.engines import kinds, promtext

    d = tmp_path / "engine"
    d.mkdir()
    other = {"running": 2, "waiting": 3, "kv_used": 300, "kv_total": 384, "preemptions": 5, "queue_s": 1.5,
             "e2e_s": 4.0, "requests": 10, "cpu_s": 2.0}
    (d / "1.json").write_text(json.dumps(other))
    (d / f"{os.getpid()}.json").write_text(json.dumps({"running": 99}))  # stale: this worker's own state wins
    own = {"running": 1, "waiting": 0, "kv_used": 84, "kv_total": 384, "preemptions": 1, "queue_s": 0.5,
           "e2e_s": 2.0, "requests": 5, "cpu_s": 1.0}
    text = engine_sim.exposition(str(tmp_path), mdl.NAME, own)
    parsed = promtext.parse(text, kinds.wanted)
    assert parsed.bad_lines == 0
    assert kinds.detect(n for n, _, _ in parsed.series) == "vllm"
    r = kinds.extract("vllm", parsed.series)
    m = r.models[next(iter(r.models))]
    assert (m.running, m.waiting, m.preemptions) == (3, 3, 6)
    assert m.kv_usage == pytest.approx(384 / 768) and m.queue_s == 2.0 and m.e2e_s == 6.0
    assert r.cpu_seconds == 3.0


def test_kv_cache_makes_a_request_wait_for_blocks_and_counts_a_preemption() -> None:
    import asyncio

    async def scenario() -> tuple[int, int, int]:
        eng = engine_sim.EngineSim(None)
        a = await eng.acquire_kv(100, 250)  # 196 of 250 tokens
        waiter = asyncio.ensure_future(eng.acquire_kv(20, 250))  # 116 more do not fit: it waits
        await asyncio.sleep(0.01)
        waiting = eng.waiting
        await eng.release_kv(a)
        b = await asyncio.wait_for(waiter, 1.0)
        return waiting, eng.preemptions, b

    waiting, preemptions, held = asyncio.run(scenario())
    assert (waiting, preemptions, held) == (1, 1, 20 + engine_sim.GENERATED_TOKENS)
