"""A seeded subset of the benchmark's random trace family (bench/leak_family.py), fast enough for every run.

The full family and the targets of issue 14 are in bench/leak_detection.py, whose judging (a detector per
process series and one for the memory no process accounts for) this reuses; here a few traces per case,
with margins for their number: leak-free hours stay quiet, fast leaks are found within 15 minutes of their
effective onset, and a leak that a restart ends is cleared within 10 minutes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from inferwatch_sidecar.components.gpu.config import DetectorConfig

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fam = _load("leak_family")
bench = _load("leak_detection")


def test_the_family_draws_what_it_documents() -> None:
    rng = np.random.default_rng(1)
    tr = fam.make_trace(rng, 1.0)
    assert tr.onset is not None and tr.effective_onset >= tr.onset and tr.rate == pytest.approx(fam.GiB / 3600)
    assert np.all(np.diff(tr.t) >= 0)
    assert np.all(tr.used % (2 * fam.MiB) == 0) and tr.used.max() <= fam.TOTAL
    # One row per PID; the device is their sum plus the driver's 600 MiB.
    assert tr.procs.shape[1] == len(tr.t) and tr.leaker is not None
    assert np.allclose(tr.used - np.nansum(tr.procs, axis=0), 600 * fam.MiB)


@pytest.mark.parametrize("shape", fam.WARM_SHAPES)
def test_every_warm_up_shape_plateaus_and_its_end_leaves_64_mib_to_come(shape: str) -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = fam.draw_proc(rng)
        p.warm_shape, p.start = shape, float(rng.uniform(0, 3600))
        end = fam.warmup_end(p)
        reached = fam.warm_rise(shape, np.array([end - p.start, 200 * p.warm_tau]), p.warm_tau)
        assert p.warm_amp * (1 - reached[0]) == pytest.approx(fam.WARMUP_LEFT, rel=1e-6)
        assert reached[1] == pytest.approx(1.0, abs=1e-9)  # it plateaus
        rise = fam.warm_rise(shape, np.linspace(0, end - p.start, 200), p.warm_tau)
        assert rise[0] == 0.0 and np.all(np.diff(rise) >= 0)
    with pytest.raises(ValueError, match="unknown warm-up shape 'log'"):
        fam.warm_rise("log", np.zeros(1), 60.0)


@pytest.mark.xfail(strict=True, reason="issue 14: the targets are not met on the random family yet "
                                       "(docs/benchmarks.md, GPU section)")
def test_leak_free_hours_stay_quiet_and_fast_leaks_are_found_within_15_minutes() -> None:
    rng = np.random.default_rng(2024)
    cfg = DetectorConfig()
    quiet = [bench.run_detector(fam.make_trace(rng, 0.0, duration=6 * 3600), cfg) for _ in range(4)]
    assert [len(d.all_episodes()) for d in quiet] == [0, 0, 0, 0]
    late = []
    for rate in (1.0, 2.0, 4.0):
        for _ in range(3):
            tr = fam.make_trace(rng, rate)
            o = bench.judge_leak(tr, bench.run_detector(tr, cfg), None)
            assert o.pre == 0
            if o.delay is None or o.delay > 15 * 60:
                late.append((rate, tr.desc))
            elif tr.stop is not None:
                assert o.cleared_after_stop is not None and o.cleared_after_stop <= 600
    assert late == []  # 9 traces: the 95% target allows none to be late at this size


def test_the_benchmark_runs_detector_variants_from_set_options() -> None:
    assert bench._setting("max_quarter_share=0.75") == ("max_quarter_share", 0.75)
    assert bench._setting("scales=[[900,10],[3600,30]]") == ("scales", [[900, 10], [3600, 30]])
    cfg = DetectorConfig(**dict(bench._setting(kv) for kv in ("min_blocks=4", "scales=[[900,10],[3600,30]]")))
    assert cfg.min_blocks == 4 and [tuple(s) for s in cfg.scales] == [(900, 10), (3600, 30)]
    with pytest.raises(ValueError, match="unknown detector setting 'bogus'; one of clear_s"):
        bench._setting("bogus=1")
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        bench._setting("min_blocks")


def test_the_warm_up_shape_check_judges_every_shape_and_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    shapes = _load("leak_warmup_shapes")
    rng = np.random.default_rng(4)
    for shape in shapes.SHAPES:
        t, y = shapes.series(rng, shape, 0.5)
        assert len(t) == len(y) and t[-1] < 1800 and np.all(y % (2 * fam.MiB) == 0)
        # Leak-free: after its load the series ends within the warm-up's amplitude plus sawtooth and noise.
        assert y[-1] - y[t >= 20][0] < 7 * fam.GiB
    assert shapes.main(["--n", "1", "--hours", "0.25"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# 1 leak-free series of 0.25 h per warm-up shape (seed 11)")
    assert [line.split()[0] for line in out[2:]] == list(shapes.SHAPES)
    # Every row counts episodes among the one series: 0 or 1 series alarmed.
    assert all(line.split()[2] in ("0", "1") and line.split()[4] == "1" for line in out[2:])
    assert shapes.main(["--quick"]) == 0
    assert capsys.readouterr().out.startswith("# 5 leak-free series of 1 h per warm-up shape")
    with pytest.raises(SystemExit):
        shapes.main(["--n", "0"])
    assert "--n must be at least 1" in capsys.readouterr().err


def test_an_s_shaped_warm_up_and_an_early_leak_stay_within_noise_of_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/leak_identifiability.py: the conflict between issue 14's zero false alarms and its early leaks."""
    ident = _load("leak_identifiability")
    gib, mib = fam.GiB, fam.MiB
    # A 3 GiB S-shaped warm-up of tau 20 min against the leak it resembles most up to that leak's deadline.
    c, r, mx, rms, energy = ident.closest_leak(3 * gib, 1200.0)
    assert 3 * 60 <= c <= 6 * 60 and 2.5 * gib <= r * 3600 <= 3.5 * gib, (c, r)
    assert mx < 64 * mib and rms < 20 * mib, (mx, rms)
    # The fit is what it says: the distances are the warm-up's to a + r max(0, x - c) over [0, c + 15 min].
    x = np.arange(0.0, c + 900.0, 10.0)
    f = 3 * gib * fam.warm_rise("s_curve", x, 1200.0)
    h = np.maximum(0.0, x - c)
    a = float(np.mean(f - r * h))
    assert float(np.abs(f - a - r * h).max()) == pytest.approx(mx, rel=1e-6)
    assert energy == pytest.approx(float(((f - a - r * h) ** 2).sum() * 10.0), rel=1e-6)
    # An oracle needs (z 4.75 + z 1.645)^2 sigma^2 of squared distance: one floor observation every 20 s or so.
    assert 10 < ident.oracle_period(energy) < 40
    # A fast warm-up is far from any straight rise: easy to tell apart.
    assert ident.closest_leak(3 * gib, 300.0)[3] > 60 * mib
    with pytest.raises(ValueError, match="never rises at 1 GiB/h"):
        ident.closest_leak(0.1 * gib, 1200.0)
    assert ident.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.strip().endswith(" s") and "GiB/h" in ln]
    assert len(rows) == 12, out
    counts = [int(n) for n in re.findall(r"(?:first 40 min|found) (\d+) of 6", out)]
    assert len(counts) == 2 and all(0 <= n <= 6 for n in counts), out
