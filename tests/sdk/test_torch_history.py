"""The torch probe's second stage: a bounded memory-history recording and the allocation sites that grew.

A fake ``torch`` module stands in for the real one: its ``cuda.memory._snapshot()`` returns the structure
torch documents (``segments`` with ``blocks``; ``device_traces`` of ``alloc`` / ``free_requested`` /
``free_completed`` actions with ``addr``, ``size`` and ``frames`` of ``filename``, ``line``, ``name``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inferwatch._torch import AllocatorProbe, HistoryCapture, TensorSuspect, growing_sites, site_events
from inferwatch.wire import EV_ALLOC, EV_ALLOC_SITE, MAX_STRING, Decoder, Encoder

MiB = 2**20


def frames(*sites: tuple[str, int, str]) -> list[dict[str, Any]]:
    return [{"filename": f, "line": ln, "name": n} for f, ln, n in sites]


TORCH = ("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1501, "_call_impl")
LEAK = ("/srv/app/cache.py", 42, "remember")
OK = ("/srv/app/model.py", 17, "forward")


class FakeMemory:
    """``torch.cuda.memory``'s history and snapshot calls, recorded."""

    def __init__(self, snapshot: dict[str, Any], fail_on: str | None = None) -> None:
        self.snapshot = snapshot
        self.calls: list[dict[str, Any]] = []
        self.fail_on = fail_on

    def _record_memory_history(self, enabled: str | None = "all", **kw: Any) -> None:
        if self.fail_on == "record" and enabled is not None:
            raise RuntimeError("record_context_cpp is not supported on this build")
        self.calls.append({"enabled": enabled, **kw})

    def _snapshot(self) -> dict[str, Any]:
        if self.fail_on == "snapshot":
            raise RuntimeError("snapshot failed")
        return self.snapshot


def fake_torch(mem: FakeMemory, initialised: bool = True) -> Any:
    cuda = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialised, memory=mem)
    return SimpleNamespace(cuda=cuda)


def snapshot_with_traces(rng: np.random.Generator) -> tuple[dict[str, Any], int, int]:
    """A leaking site (never freed) among sites whose allocations are freed; returns (snapshot, bytes, count)."""
    trace = []
    addr = 0x7F0000000000
    leak_bytes = leak_n = 0
    for _ in range(int(rng.integers(20, 60))):
        size = int(rng.integers(1, 64)) * 512 * 1024
        addr += size
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames(TORCH, OK)})
        trace.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0, "frames": []})
        trace.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0, "frames": []})
        if rng.random() < 0.5:
            s2 = int(rng.integers(1, 16)) * MiB
            addr += s2
            leak_bytes += s2
            leak_n += 1
            trace.append({"action": "alloc", "addr": addr, "size": s2, "stream": 0, "frames": frames(TORCH, LEAK, OK)})
    segments = [{"device": 0, "address": 0x7F0000000000, "total_size": 2**30, "allocated_size": leak_bytes,
                 "active_size": leak_bytes, "stream": 0, "segment_type": "large",
                 "blocks": [{"address": 0x7F0000000000, "size": 2**30, "requested_size": 0, "state": "inactive"}]}]
    return {"segments": segments, "device_traces": [trace]}, leak_bytes, leak_n


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_growing_sites_from_device_traces(seed: int) -> None:
    snap, leak_bytes, leak_n = snapshot_with_traces(np.random.default_rng(seed))
    sites = growing_sites(snap)
    assert leak_n > 0
    # The site is the first frame outside torch; freed allocations leave nothing behind.
    assert sites == [{"file": LEAK[0], "line": LEAK[1], "function": LEAK[2], "device": 0, "bytes": leak_bytes,
                      "count": leak_n}]


def test_growing_sites_from_blocks_when_there_are_no_traces() -> None:
    blocks = [
        {"address": 1, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated", "frames": frames(LEAK)},
        {"address": 2, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": frames(LEAK)},
        {"address": 3, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": frames(OK)},
        {"address": 4, "size": 64 * MiB, "requested_size": 0, "state": "inactive", "frames": frames(OK)},
        {"address": 5, "size": 32 * MiB, "state": "active_allocated"},  # allocated before the recording
    ]
    snap = {"segments": [{"device": 0, "address": 0, "total_size": 128 * MiB, "blocks": blocks}], "device_traces": [[]]}
    assert growing_sites(snap, top=1) == [{"file": LEAK[0], "line": 42, "function": "remember", "device": 0,
                                           "bytes": 12 * MiB, "count": 2}]
    assert [s["bytes"] for s in growing_sites(snap)] == [12 * MiB, 2 * MiB]
    assert growing_sites({}) == [] and growing_sites({"segments": [{"blocks": "junk"}], "device_traces": "x"}) == []
    assert growing_sites({"segments": [3, None, {"blocks": [5]}], "device_traces": [[7], None]}) == []
    assert growing_sites({"segments": 12, "device_traces": [[{"action": "alloc", "addr": 1, "size": 5}]]}) == []


def test_capture_is_bounded_in_time_and_entries_and_switches_history_off() -> None:
    snap, leak_bytes, _ = snapshot_with_traces(np.random.default_rng(4))
    mem = FakeMemory(snap)
    now = [1000.0]
    cap = HistoryCapture(seconds=30, max_entries=5000, cooldown_s=600, torch_module=fake_torch(mem),
                         clock=lambda: now[0])
    assert cap.start() and cap.state == "recording"
    assert mem.calls == [{"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 5000}]
    assert not cap.start()  # one recording at a time
    now[0] += 29
    assert cap.poll() is None and cap.state == "recording"
    now[0] += 2
    sites = cap.poll()
    assert sites is not None and sites[0]["bytes"] == leak_bytes and cap.captures == 1
    assert mem.calls[-1] == {"enabled": None} and cap.state == "idle"
    now[0] += 60
    assert not cap.start()  # cooling down
    now[0] += 600
    assert cap.start()


def test_capture_never_starts_without_cuda_and_fails_for_good_on_an_error() -> None:
    mem = FakeMemory({}, fail_on="record")
    assert not HistoryCapture(torch_module=fake_torch(mem, initialised=False)).start()
    cap = HistoryCapture(torch_module=fake_torch(mem))
    assert not cap.start() and cap.state == "failed" and "not supported" in cap.last_error
    assert not cap.start()
    # A snapshot that fails still switches the history off.
    mem2 = FakeMemory({}, fail_on="snapshot")
    now = [0.0]
    cap2 = HistoryCapture(seconds=1, torch_module=fake_torch(mem2), clock=lambda: now[0])
    assert cap2.start()
    now[0] = 2.0
    assert cap2.poll() is None and cap2.state == "failed" and mem2.calls[-1] == {"enabled": None}


def test_off_by_default_and_on_from_the_environment() -> None:
    assert HistoryCapture.from_env({}) is None
    assert HistoryCapture.from_env({"INFERWATCH_TORCH_HISTORY": "1"}) is not None
    assert AllocatorProbe(10.0, source=lambda: {}).history is None  # the test env does not set it


def test_the_suspect_check_needs_a_rising_floor_not_a_peak() -> None:
    rng = np.random.default_rng(5)
    flat, rising = TensorSuspect(900, 256 * MiB), TensorSuspect(900, 256 * MiB)
    fired_flat = fired_rising = False
    for k in range(200):
        t = 10.0 * k
        base = 8 * 2**30 + int(rng.integers(0, 64)) * MiB
        spike = 2**30 if k % 7 == 0 else 0  # transient peaks: the floor stays
        fired_flat |= flat.add(t, 0, base + spike)
        fired_rising |= rising.add(t, 0, base + int(t * MiB))  # 1 MiB/s of live tensors
    assert fired_rising and not fired_flat


def test_probe_runs_the_stage_when_its_samples_rise(caplog: pytest.LogCaptureFixture) -> None:
    snap, leak_bytes, _ = snapshot_with_traces(np.random.default_rng(6))
    mem = FakeMemory(snap)
    mono = [0.0]
    wall = [10**18]
    cap = HistoryCapture(seconds=20, torch_module=fake_torch(mem), clock=lambda: mono[0])
    alloc = [8 * 2**30]
    probe = AllocatorProbe(10.0, source=lambda: {0: {"allocated_bytes.all.current": alloc[0]}},
                           clock=lambda: wall[0], history=cap, suspect=TensorSuspect(300, 128 * MiB))
    sent = []
    with caplog.at_level(logging.WARNING, logger="inferwatch"):
        for _ in range(60):
            evs = probe.sample()
            assert evs[0][0] == EV_ALLOC and evs[0][3] == alloc[0]
            sent.append((wall[0], evs))
            wall[0] += 10 * 10**9
            mono[0] += 10
            alloc[0] += 16 * MiB
    assert cap.captures >= 1 and cap.sites[0]["file"] == LEAK[0] and cap.sites[0]["bytes"] == leak_bytes
    assert "live tensor bytes grew at: /srv/app/cache.py:42" in caplog.text
    # The sites travel once per capture, with the sample that ended the recording, stamped with its time.
    with_sites = [(t, [e for e in evs if e[0] == EV_ALLOC_SITE]) for t, evs in sent]
    with_sites = [(t, s) for t, s in with_sites if s]
    assert len(with_sites) == cap.captures
    t_cap, site_evs = with_sites[0]
    assert site_evs == [(EV_ALLOC_SITE, t_cap, 0, LEAK[0], LEAK[1], LEAK[2], leak_bytes, cap.sites[0]["count"])]


def test_site_events_fit_the_wire_and_keep_a_long_path_s_end() -> None:
    deep = "/srv/" + "very-long-package-name/" * 20 + "cache.py"
    sites = [{"file": deep, "line": 42, "function": "remember", "device": 3, "bytes": 3 * 2**40, "count": 7},
             {"file": "ü" * 200, "line": -1, "function": None, "device": 300, "bytes": "x", "count": 2**40}]
    evs = site_events(10**18, sites)
    assert evs[0][3].startswith("...") and evs[0][3].endswith("/cache.py") and len(evs[0][3].encode()) == MAX_STRING
    assert evs[1][2:] == (300 % 256, evs[1][3], 0, "?", 0, 2**32 - 1) and len(evs[1][3].encode()) <= MAX_STRING
    # What the probe makes, the encoder sends and the decoder gives back unchanged.
    dec = Decoder()
    got = [r for fr in Encoder(1, 2).encode(evs) for r in dec.decode(fr).records]
    assert got == evs
