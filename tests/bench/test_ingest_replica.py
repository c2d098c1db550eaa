"""bench/ingest.py's callgrind replica runs the collector and the drain cadence it says it runs.

The replica's per-event instructions include the collector's work on staged events, which depends on
both (issue 23's GC pass): "served" must be what ``Sidecar.run`` sets, and a mode must not leak into
the next child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import BENCH, REPO

PROBE = """
import gc, json, sys
sys.path.insert(0, {bench!r})
import _ingest_callgrind as r
from inferwatch_sidecar.config import SidecarConfig
r.replica_gc(SidecarConfig(), {mode!r})
print(json.dumps({{"enabled": gc.isenabled(), "thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count() > 0}}))
"""


def _probe(mode: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO / "sidecar")])}
    out = subprocess.run([sys.executable, "-c", PROBE.format(bench=str(BENCH), mode=mode)], capture_output=True,
                         text=True, env=env, cwd=REPO, check=True, timeout=60).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize(("mode", "want"), [
    ("served", {"enabled": True, "thresholds": [], "frozen": True}),  # the config default, below
    ("default", {"enabled": True, "thresholds": [700, 10, 10], "frozen": False}),
    ("off", {"enabled": False, "thresholds": [700, 10, 10], "frozen": False}),
    ("20000,5,50", {"enabled": True, "thresholds": [20_000, 5, 50], "frozen": True}),
])
def test_the_replica_runs_the_collector_its_mode_names(mode: str, want: dict[str, object]) -> None:
    from inferwatch_sidecar.config import SidecarConfig

    if mode == "served":
        want = {**want, "thresholds": list(SidecarConfig().gc_thresholds)}
    assert _probe(mode) == want


def test_the_replica_drains_at_the_cadence_it_is_given() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO / "sidecar")]),
           "IW_BENCH_DRAIN_FRAMES": "7", "IW_BENCH_GC": "off"}
    r = subprocess.run([sys.executable, str(BENCH / "ingest.py"), "--replica-child", "1", "tail", "300"],
                       capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["components"] == ["tail"]
    # 6,000 warm-up requests are 120 frames of 100 events (17 passes every 7 frames, then one at the end),
    # the 300 measured ones 6 frames (the pass at the end).
    assert out["drain_passes"] == 120 // 7 + 1 + 1
