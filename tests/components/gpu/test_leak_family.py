"""A seeded subset of the benchmark's random trace family (bench/leak_family.py), fast enough for every run.

The full family and the targets of issue 14 are in bench/leak_detection.py, whose judging (a detector per
process series and one for the memory no process accounts for) this reuses; here a few traces per case,
with margins for their number: leak-free hours stay quiet, fast leaks are found within 15 minutes of their
effective onset, and a leak that a restart ends is cleared within 10 minutes.
"""

from __future__ import annotations

import re
from types import ModuleType

import numpy as np
import pytest

from inferwatch_sidecar.components.gpu.config import DetectorConfig
from tests.helpers.imports import load_file
from tests.helpers.paths import BENCH


def _load(name: str) -> ModuleType:
    return load_file(BENCH / f"{name}.py")


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


oracle = _load("leak_oracle")


def _brute_distance2(f: np.ndarray, el: np.ndarray, k: int, taus: np.ndarray) -> float:
    """The nearest alternative's residual over samples 0..k-1, by explicit least squares on every candidate."""
    y = f[:k]
    best = float(((y - y.mean()) ** 2).sum())
    for u in range(1, k):
        best = min(best, float(((y[:u] - y[:u].mean()) ** 2).sum() + ((y[u:] - y[u:].mean()) ** 2).sum()))
    for shape in fam.WARM_SHAPES:
        for tau in taus:
            x = np.stack([np.ones(k), fam.warm_rise(shape, el[:k], float(tau))], axis=1)
            beta, *_ = np.linalg.lstsq(x, y, rcond=None)
            if beta[1] >= 0:  # a warm-up rises (a >= 0); else the flat fit above stands
                best = min(best, float(((y - x @ beta) ** 2).sum()))
    return best


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_oracle_distance_is_the_nearest_alternatives_least_squares_residual(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))
    el = np.arange(1, n + 1) * float(rng.uniform(20, 200))
    tau = float(rng.uniform(60, 1200))
    onset = float(el[int(rng.integers(3, n - 3))])
    f = (float(rng.uniform(500, 6000)) * fam.warm_rise(str(rng.choice(fam.WARM_SHAPES)), el, tau)
         + float(rng.uniform(0.1, 4)) * 1024 / 3600 * np.clip(el - onset, 0, None))
    taus = np.array([120.0, 600.0, tau])
    ks, d2 = oracle.distance2(f, el, taus)
    assert np.all(np.diff(d2) >= -1e-6)  # the distance only grows with the samples
    for i in rng.choice(len(ks), size=5, replace=False):
        assert d2[i] == pytest.approx(_brute_distance2(f - f[0], el, int(ks[i]), taus), rel=1e-6, abs=1e-6)


def test_the_oracle_cannot_separate_what_the_null_holds_and_separates_a_creep_by_its_bound() -> None:
    el = np.arange(1, 400) * 30.0
    # A warm-up of the family and a level shift are leak-free: no distance.
    warm = 3000 * fam.warm_rise("root", el, 700.0)
    assert oracle.distance2(warm, el, np.array([700.0]))[1].max() == pytest.approx(0.0, abs=1e-6)
    step = np.where(el >= 5000, 2048.0, 0.0)
    assert oracle.distance2(step, el)[1].max() == pytest.approx(0.0, abs=1e-6)
    # A creep on a flat floor: the distance crosses (4.75 + 1.645) x 20 MiB once, sooner for a faster leak.
    need = ((oracle.Z_ALPHA + oracle.Z_BETA) * 20) ** 2
    times = []
    for rate_mib_h in (256, 1024, 4096):
        creep = rate_mib_h / 3600 * np.clip(el - 3000, 0, None)
        ks, d2 = oracle.distance2(creep, el)
        times.append(float(el[ks[np.flatnonzero(d2 >= need)[0]] - 1]))
    assert times[0] > times[1] > times[2] > 3000
    # The floor interval and the deadline follow the documented rules.
    p = fam.draw_proc(np.random.default_rng(5))
    p.prealloc, p.saw_amp, p.saw_period = False, 1.0 * fam.GiB, 300.0
    assert oracle.floor_period(p, 5.0) == 300.0 and oracle.regime(300.0) == "B"
    p.saw_amp = 64 * fam.MiB
    assert oracle.floor_period(p, 5.0) == 5.0 and oracle.regime(5.0) == "A"
    assert oracle.target_delay(1.0) == 900.0 and oracle.target_delay(0.5) == pytest.approx(1800.0)


def test_the_oracle_at_a_trace_s_own_noise_needs_more_time_when_its_floor_is_noisier() -> None:
    """The oracle's time at the trace's own floor noise (the minimum of a floor interval's samples) against the
    issue's 20 MiB: later where that noise is larger, and its noise the order statistic of the drawn one."""
    from inferwatch_sidecar.components.gpu.trend import min_sd

    rng = np.random.default_rng(3)
    checked = 0
    while checked < 4:
        tr = fam.make_trace(rng, 1.0)
        p = tr.leak_proc
        assert p is not None
        period = oracle.floor_period(p, float(tr.desc["dt"]))
        own = oracle.own_noise(tr, period)
        sample = tr.desc["noise_mib"] * min_sd(period / tr.desc["dt"])
        if period > tr.desc["dt"] and p.saw_shape != "square":  # the first sample after a release: up to slope x dt
            phase = p.saw_amp / fam.MiB / p.saw_period * tr.desc["dt"] / 12**0.5
            assert own == pytest.approx((sample**2 + phase**2) ** 0.5)
        else:
            assert own == pytest.approx(sample)
        until = tr.onset + 4 * 3600
        t20 = oracle.oracle_time(tr, until)[0]
        if not np.isfinite(t20):
            continue
        t_own = oracle.oracle_time(tr, until, own)[0]
        t_double = oracle.oracle_time(tr, until, 40.0)[0]
        assert t_double >= t20
        assert (t_own >= t20) if own >= 20 else (t_own <= t20)
        checked += 1


def test_the_allocator_series_samples_every_10_s_and_carries_the_tensor_leak() -> None:
    rng = np.random.default_rng(7)
    measured = 0
    for _ in range(6):
        tr = fam.make_trace(rng, 2.0)
        a = tr.alloc[tr.leaker]
        ok = ~np.isnan(a)
        ts = tr.t[ok]
        assert np.all(np.diff(ts) >= fam.ALLOC_INTERVAL - 10.0 + 1e-9) and ok.sum() >= len(tr.t) * min(1.0, float(tr.desc["dt"])) / 10 * 0.5
        assert np.all(a[ok] % (2 * fam.MiB) == 0)
        # Its floor (the lowest sample of each 10 minutes) climbs at the leak's rate once the warm-up is over.
        end = tr.stop if tr.stop is not None else tr.t[-1]
        lo, hi = tr.effective_onset + 600, end - 60
        if hi - lo < 1800 or tr.desc["loads"]:
            continue  # too short to measure, or loads and unloads move the tensor floor as well
        first = a[ok & (tr.t >= lo) & (tr.t < lo + 600)].min()
        last = a[ok & (tr.t >= hi - 600) & (tr.t < hi)].min()
        assert (last - first) / (hi - lo - 600) == pytest.approx(tr.rate, rel=0.25), tr.desc
        measured += 1
    assert measured >= 2


def test_the_added_shapes_draw_what_they_document() -> None:
    rng = np.random.default_rng(5)
    # Jittered 5 s rows with 2-6% missing (and duplicated rows, as in the base family).
    tr = fam.make_trace(rng, 0.0, duration=6 * 3600.0, shape="jitter")
    gaps = np.diff(tr.t)
    assert tr.desc["dt"] == 5.0 and tr.desc["trace_shape"] == "jitter"
    assert np.all(gaps >= 0) and 2.0 < float(np.median(gaps[gaps > 0])) < 8.0
    assert len(np.unique(np.round(gaps[gaps > 0], 3))) > 100  # not on a grid
    assert 6 * 3600 / 5 * 0.85 < len(np.unique(tr.t)) < 6 * 3600 / 5 * 0.99
    # A model swap then a leak: the leaking process's curve starts again at the swap, the leak after it.
    tr = fam.make_trace(rng, 2.0, shape="swap")
    assert tr.leak_proc is not None and tr.onset is not None and tr.effective_onset is not None
    assert tr.leak_proc.start <= tr.onset <= tr.leak_proc.start + 600
    assert tr.effective_onset == max(tr.onset, fam.warmup_end(tr.leak_proc))
    # A second model loaded and unloaded every 1.5-3 h on a leak-free day: it comes and goes.
    tr = fam.make_trace(rng, 0.0, shape="second_model")
    assert tr.rate == 0 and tr.onset is None
    second = tr.procs[int(tr.desc["procs"]):]  # its rows: one per load (a new PID each), or one that stays
    held = np.nansum(second, axis=0) > 1.5 * fam.GiB  # a model of 2-12 GiB is loaded
    loads = int(np.sum(np.diff(held.astype(int)) == 1)) + int(held[0])
    assert 24 / 3 - 1 <= loads <= 24 / 1.5 + 1
    with pytest.raises(ValueError, match="unknown trace shape"):
        fam.make_trace(rng, 0.0, shape="nope")


def test_the_rate_shape_check_compares_both_estimates_on_every_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/leak_rate_shapes.py: the creep's rate on warm-ups in the null's prior and outside it."""
    shapes = _load("leak_rate_shapes")
    res = shapes.measure(20, 3)
    assert sorted(res) == sorted((s, r) for s in shapes.SHAPES for r in shapes.REGIMES)
    # In the prior, the rate net of the warm-up is the better one: the slope after the knot takes its tail.
    net, slope = np.abs(res["prior", "during"]["net"]), np.abs(res["prior", "during"]["slope"])
    assert (net > 0.2).sum() <= 3 < 15 <= (slope > 0.2).sum()
    # A ramp (mostly) over before the knot: the slope after it is about unbiased, and the net rate no worse.
    ramp = res["ramp", "after"]  # 9 of 20 off before the net rate was checked after the knot (the slope 3)
    assert (np.abs(ramp["net"]) > 0.2).sum() <= (np.abs(ramp["slope"]) > 0.2).sum() + 2
    assert shapes.main(["--n", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[2:-1]] == [[s, r] for s in shapes.SHAPES for r in shapes.REGIMES]
    assert out[-1].startswith("creep_rate worse than the slope after the knot")
    with pytest.raises(SystemExit):
        shapes.main(["--n", "0"])
    assert "--n must be at least 1" in capsys.readouterr().err


def test_the_benchmark_records_the_rate_and_its_standard_error_at_detection() -> None:
    """The rate target is judged at the sample that opened the episode; its standard error there bounds the
    share an unbiased estimate could have within 20%."""
    rng = np.random.default_rng(5)
    t = np.arange(0.0, 4 * 3600.0, 5.0)
    rate = 2 * fam.GiB / 3600
    y = 20 * fam.GiB + rate * np.maximum(0.0, t - 3600) + rng.normal(0, 20 * fam.MiB, len(t))
    det = bench.LeakDetector(DetectorConfig())
    rates = bench.feed_tracking_rates(det, t.tolist(), y.tolist())
    assert len(rates) == 1
    (at, (r_det, r_later, se)), = rates.items()
    assert at == det.episodes[0].detected_at and 3600 < at < 3600 + 15 * 60
    assert abs(r_det / rate - 1) < 0.3 and abs(r_later / rate - 1) < 0.2  # type: ignore[operator]
    assert se is not None and 0 < se < 0.2 * rate
