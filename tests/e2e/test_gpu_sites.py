"""The torch probe's second stage end to end: the SDK's real sender and probe (a fake ``torch`` whose memory
snapshot has a leaking line) -> Unix socket -> a served sidecar -> ``/v1/status`` shows the site on the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.helpers.sidecar import REPO, wait_until

#: A producer: the real SDK with its allocator probe on, a rising allocated floor, and a history capture
#: over a fake torch whose snapshot holds two live allocations from /srv/app/cache.py:42 and a freed one.
PRODUCER = textwrap.dedent("""\
    import sys, time
    from types import SimpleNamespace
    import inferwatch
    from inferwatch import _core
    from inferwatch._torch import HistoryCapture

    MiB = 2**20
    leak = [{"filename": "/srv/app/cache.py", "line": 42, "name": "remember"}]
    tmp = [{"filename": "/srv/app/model.py", "line": 17, "name": "forward"}]
    trace = [{"action": "alloc", "addr": 1, "size": 96 * MiB, "frames": leak},
             {"action": "alloc", "addr": 2, "size": 8 * MiB, "frames": tmp},
             {"action": "free_completed", "addr": 2, "size": 8 * MiB, "frames": []},
             {"action": "alloc", "addr": 3, "size": 32 * MiB, "frames": leak}]

    class Memory:
        def _record_memory_history(self, enabled=None, **kw): pass
        def _snapshot(self): return {"segments": [], "device_traces": [trace]}

    torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                                 memory=Memory()))
    allocated = [8 << 30]

    def stats():
        allocated[0] += 64 * MiB
        return {0: {"allocated_bytes.all.current": allocated[0], "reserved_bytes.all.current": allocated[0] + (1 << 30)}}

    assert inferwatch.configure(service="svc", sidecar="unix://" + sys.argv[1], torch_probe=True,
                                torch_probe_interval_s=0.05, torch_stats_source=stats, flush_interval_ms=20)
    probe = _core._rt.sender.probe
    probe.history = HistoryCapture(seconds=0.1, torch_module=torch)
    probe.suspect = SimpleNamespace(add=lambda t, dev, a: True)  # the floor rises: start the recording
    end = time.monotonic() + 3.0
    while time.monotonic() < end and probe.history.captures == 0:
        time.sleep(0.05)
    time.sleep(0.3)
    assert inferwatch.flush() and probe.history.captures == 1, probe.history.last_error
    inferwatch.shutdown()
    """)


def test_sites_travel_from_the_probe_to_the_sidecar_status(tmp_path: Path, sidecar_factory: Any) -> None:
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("gpu:\n  backend: fake\n  interval_s: 0.05\n  fake: {processes: [{pid: 4242, base_gib: 4}]}\n")
    sc = sidecar_factory("--config", str(cfg), "--set", "gpu.enabled=true")
    prod = subprocess.run([sys.executable, "-c", PRODUCER, sc.sock], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert prod.returncode == 0, prod.stderr[-2000:]

    def shown() -> dict[str, Any] | None:
        for a in sc.status()["components"]["gpu"]["allocator"]:
            if a["sites"]:
                return a
        return None

    entry = wait_until(shown, what="the allocator entry with its sites")
    assert entry["device"] == 0 and entry["allocated_bytes"] > 8 << 30
    assert entry["sites"]["sites"] == [{"file": "/srv/app/cache.py", "line": 42, "function": "remember",
                                        "bytes": 128 * 2**20, "count": 2}]
    ingest = sc.status()["ingest"]
    assert ingest["decode_errors"] == {} and sc.status()["components"]["gpu"]["allocator_records_dropped"] == {}
