"""A seeded subset of the benchmark's random trace family (bench/leak_family.py), fast enough for every run.

The full family and the targets of issue 14 are in bench/leak_detection.py; here a few traces per case,
with margins for their number: leak-free hours stay quiet, fast leaks are found within 15 minutes of their
effective onset, and a leak that a restart ends is cleared within 10 minutes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from inferwatch_sidecar.components.gpu.detector import LeakDetector

FAMILY = Path(__file__).resolve().parents[2] / "bench" / "leak_family.py"


def _family() -> ModuleType:
    spec = importlib.util.spec_from_file_location("leak_family", FAMILY)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["leak_family"] = mod
    spec.loader.exec_module(mod)
    return mod


fam = _family()


def _run(tr: object) -> LeakDetector:
    det = LeakDetector()
    for t, v in zip(tr.t.tolist(), tr.used.tolist(), strict=True):  # type: ignore[attr-defined]
        det.update(t, v)
    return det


def test_the_family_draws_what_it_documents() -> None:
    rng = np.random.default_rng(1)
    tr = fam.make_trace(rng, 1.0)
    assert tr.onset is not None and tr.effective_onset >= tr.onset and tr.rate == pytest.approx(fam.GiB / 3600)
    assert np.all(np.diff(tr.t) >= 0)
    assert np.all(tr.used % (2 * fam.MiB) == 0) and tr.used.max() <= fam.TOTAL


@pytest.mark.xfail(strict=True, reason="issue 14: the targets are not met on the random family yet "
                                       "(docs/benchmarks.md, GPU section)")
def test_leak_free_hours_stay_quiet_and_fast_leaks_are_found_within_15_minutes() -> None:
    rng = np.random.default_rng(2024)
    quiet = [_run(fam.make_trace(rng, 0.0, duration=6 * 3600)) for _ in range(4)]
    assert [len(d.episodes) for d in quiet] == [0, 0, 0, 0]
    late = []
    for rate in (1.0, 2.0, 4.0):
        for _ in range(3):
            tr = fam.make_trace(rng, rate)
            det = _run(tr)
            hits = [e for e in det.episodes if e.detected_at >= tr.onset]
            assert not [e for e in det.episodes if e.detected_at < tr.onset]
            end = tr.stop if tr.stop is not None else np.inf
            if not hits or hits[0].detected_at >= end or hits[0].detected_at - tr.effective_onset > 15 * 60:
                late.append((rate, tr.desc))
            elif tr.stop is not None:
                assert hits[0].cleared_at is not None and hits[0].cleared_at - tr.stop <= 600
    assert late == []  # 9 traces: the 95% target allows none to be late at this size
