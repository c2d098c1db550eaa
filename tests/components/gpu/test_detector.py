"""The leak detector: quiet on normal memory behaviour, fires on creep, detector contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferwatch_sidecar.components.gpu.config import DetectorConfig
from inferwatch_sidecar.components.gpu.detector import LeakDetector, _ar1_inflation, _hinge, _norm_ppf, sen_mann_kendall
from inferwatch_sidecar.components.gpu.trend import TrendResult, agreed_rate
from tests.components.gpu.traces import GiB, MiB, creep, noise, quantised

N = 3 * 3600


def run(y: np.ndarray, cfg: DetectorConfig | None = None) -> tuple[LeakDetector, int | None]:
    det = LeakDetector(cfg)
    first = None
    for t, v in enumerate(y):
        det.update(float(t), float(v))
        if first is None and det.verdict == "leak":
            first = t
    return det, first


def _quiet(name: str, seed: int, n: int = 2 * 3600 + 600) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    base = 20 * GiB + noise(rng, n)
    if name == "warmup":  # grows 12 GiB with a 4-minute time constant, then plateaus
        return quantised(base + 12 * GiB * (1 - np.exp(-t / 240)))
    if name == "step":  # a second model loads after an hour
        return quantised(base + 15 * GiB * (t >= 3600))
    if name == "sawtooth":  # allocator cache fills over 90 s then is emptied
        return quantised(base + 3 * GiB * ((t % 90) / 90))
    if name == "prealloc":  # vLLM-style 90% preallocation at start-up
        return quantised(72 * GiB + noise(rng, n))
    if name == "staircase":  # three batch-shape steps twenty minutes apart
        return quantised(base + GiB * ((t > 3000).astype(int) + (t > 4200) + (t > 5400)))
    if name == "idle_busy":  # traffic arrives: the cache grows by 3 GiB in 30 s, emptied when idle
        return quantised(base + 3 * GiB * np.clip(((t - 2400) % 3000) / 30, 0, 1) * (((t - 2400) % 3000) < 1800)
                         * (t > 2400))
    return quantised(base)


@pytest.mark.parametrize("scenario", ["noise", "warmup", "step", "sawtooth", "prealloc", "staircase", "idle_busy"])
@pytest.mark.parametrize("seed", [1, 2])
def test_detector_stays_quiet_on_normal_memory_behaviour(scenario: str, seed: int) -> None:
    det, first = run(_quiet(scenario, seed))
    assert first is None, f"{scenario} fired at t={first}"
    assert det.verdict == "no_leak"


@pytest.mark.parametrize("rate_gib_h", [0.5, 1.0, 4.0])
def test_detector_fires_on_creep_with_a_sane_rate(rate_gib_h: float) -> None:
    onset = 3600
    det, first = run(creep(N, rate_gib_h, onset, seed=3))
    assert det.verdict == "leak"
    assert first is not None and onset < first
    if rate_gib_h >= 1.0:
        assert first - onset <= 15 * 60  # the product target: 1 GiB/h within 15 minutes
    true = rate_gib_h * GiB / 3600
    assert det.rate == pytest.approx(true, rel=0.1)
    lo, hi = det.ci
    assert lo <= det.rate <= hi
    assert lo <= true * 1.02 and hi >= true * 0.98
    # Time to OOM with 40 GiB of headroom.
    assert det.time_to_oom(40 * GiB) == pytest.approx(40 * GiB / det.rate)
    assert det.detected_at == first


def test_creep_under_sawtooth_is_still_detected() -> None:
    rng = np.random.default_rng(5)
    t = np.arange(N)
    y = quantised(20 * GiB + noise(rng, N) + 2 * GiB * ((t % 60) / 60) + 2 * GiB / 3600 * np.maximum(0, t - 3600))
    det, first = run(y)
    assert det.verdict == "leak" and first is not None and first - 3600 < 20 * 60


def _aliased_sawtooth(onset: int, n: int, seed: int = 2) -> np.ndarray:
    """A 2.6 GiB allocator sawtooth with a 37.3 s period sampled at 1 s: about 70 MiB per sample,
    so the sampled trough slides by up to 70 MiB as the sampling phase drifts (aliasing)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return quantised(30 * GiB + 2.6 * GiB * ((t % 37.3) / 37.3) + noise(rng, n)
                     + GiB / 3600 * np.maximum(0, t - onset))


def test_1gib_per_hour_under_an_aliased_fast_sawtooth_is_detected_within_15_minutes() -> None:
    # Regression (bench/leak_detection.py --only 1:4, seed 7, multi-model background: 77.8 min).
    # The floor of a 1 GiB/h creep (17 MiB/min) under such a sawtooth rises in jumps of about
    # one sampling step; the staircase test saw half of the 12-minute rise in one jump and
    # rejected the creep until the 1 h scale caught it. Without the jitter allowance this trace
    # is not detected in the 20 minutes after onset.
    onset = 3900
    y = _aliased_sawtooth(onset, onset + 20 * 60)
    det, first = run(y)
    assert first is not None and onset < first <= onset + 15 * 60
    assert det.rate == pytest.approx(GiB / 3600, rel=0.25)


def test_aliased_sawtooth_alone_does_not_fire() -> None:
    y = _aliased_sawtooth(10**9, 2 * 3600 + 1200)  # onset never reached
    det, first = run(y)
    assert first is None and det.verdict == "no_leak"


def test_warmup_tail_under_an_aliased_sawtooth_does_not_fire() -> None:
    # A warm-up with a 5-minute time constant still rises ~25 MiB per 12 min at warmup_s
    # (1800 s); with a 2.6 GiB, 64.7 s sawtooth (~40 MiB per sample) on top, every test but the
    # strict staircase test passes. The jitter allowance is therefore only given to series older
    # than 2 x warmup_s; granting it at once fires on this trace at t = 2080 s.
    rng = np.random.default_rng(2)
    n = 3000
    t = np.arange(n)
    y = quantised(16 * GiB + 10 * GiB * (1 - np.exp(-t / 300)) + 2.6 * GiB * ((t % 64.7) / 64.7)
                  + noise(rng, n, 12))
    det, first = run(y)
    assert first is None and det.verdict == "no_leak"


def test_verdict_clears_after_the_leak_stops() -> None:
    y = creep(N, 2.0, 1800)
    y[5400:] = y[5400]
    det, first = run(y)
    assert first is not None
    assert det.verdict == "no_leak" and det.detected_at is None


def test_insufficient_data_before_the_window_fills() -> None:
    # The GLR (the default) judges a young series once the shortest window holds min_blocks floor blocks
    # (5 bins of 10 s); the trend test waits 1.5 windows (22.5 minutes).
    det, _ = run(creep(45, 4.0, 0))
    assert det.verdict == "insufficient_data"
    assert det.rate is None
    det, _ = run(creep(600, 4.0, 0), DetectorConfig(method="trend"))
    assert det.verdict == "insufficient_data"
    assert det.rate is None


def test_a_fast_leak_from_the_series_start_is_judged_before_a_window_fills() -> None:
    # No blind period: 4 GiB/h from the first sample is no warm-up whose slope decays at least as fast as
    # exp(-t / 20 min); the GLR separates it within the first window (900 s).
    det, first = run(creep(900, 4.0, 0))
    assert det.verdict == "leak" and first is not None and first < 900
    assert det.rate == pytest.approx(4 * GiB / 3600, rel=0.2)


def test_theil_sen_and_mann_kendall_match_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    t = np.arange(60, dtype=float) * 10
    y = 3.0 * t + rng.normal(0, 200, 60)
    slope, lower, upper, z = sen_mann_kendall(t, y, 0.95)
    ref = scipy_stats.theilslopes(y, t, alpha=0.95)
    assert slope == pytest.approx(ref.slope)
    # Sen's interval: scipy uses the same ranks (no ties here).
    assert lower == pytest.approx(ref.low_slope, rel=0.02)
    assert upper == pytest.approx(ref.high_slope, rel=0.02)
    tau = scipy_stats.kendalltau(t, y)
    # Mann-Kendall z from S with continuity correction vs scipy's tau z (no ties): S = tau * n(n-1)/2.
    n = 60
    s = tau.statistic * n * (n - 1) / 2
    z_ref = (s - 1) / np.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    assert z == pytest.approx(z_ref, rel=1e-6)
    assert _norm_ppf(0.975) == pytest.approx(scipy_stats.norm.ppf(0.975), abs=1e-8)
    assert _norm_ppf(0.001) == pytest.approx(scipy_stats.norm.ppf(0.001), abs=1e-7)


# -- the detector contract (STYLE.md 9) ----------------------------------------------------
def test_contract_bounded_memory_on_a_long_stream() -> None:
    det = LeakDetector()
    cap = sum(int(round(2.2 * w / b)) + 2 for w, b in det.cfg.scales)  # two windows and a block per scale
    y = creep(40000, 0.0, 0, seed=2)  # longer than two of the longest windows (2 x 4 h)
    for t, v in enumerate(y):
        det.update(float(t), float(v))
    assert det.memory_bins() == cap
    assert len(json.dumps(det.to_state())) < 120_000


SHORT = DetectorConfig(scales=[(720, 10)], warmup_s=0)


def test_contract_deterministic_on_a_seeded_stream() -> None:
    a, fa = run(creep(4000, 1.0, 1500, seed=9), SHORT)
    b, fb = run(creep(4000, 1.0, 1500, seed=9), SHORT)
    assert fa is not None
    assert (a.verdict, a.rate, a.ci, a.detected_at, fa) == (b.verdict, b.rate, b.ci, b.detected_at, fb)


def test_contract_snapshot_restore_round_trip() -> None:
    y = creep(4000, 1.0, 1500, seed=4)
    whole, first_fired = run(y, SHORT)
    assert first_fired is not None and first_fired > 1600
    first = LeakDetector(SHORT)
    for t in range(1600):
        first.update(float(t), float(y[t]))
    state = json.loads(json.dumps(first.to_state()))  # must survive JSON
    second = LeakDetector.from_state(state)
    for t in range(1600, len(y)):
        second.update(float(t), float(y[t]))
    assert (second.verdict, second.rate, second.ci, second.detected_at, second.episodes) == (
        whole.verdict, whole.rate, whole.ci, whole.detected_at, whole.episodes)


def test_from_state_rejects_a_state_with_other_scales_than_its_config() -> None:
    det = LeakDetector(DetectorConfig(scales=[(720, 10)]))
    with pytest.raises(ValueError, match="different detector scales"):
        LeakDetector.from_state({**det.to_state(), "config": DetectorConfig().model_dump(mode="json")})


def test_nan_and_out_of_order_samples_are_ignored() -> None:
    det = LeakDetector()
    det.update(10.0, 5 * MiB)
    det.update(9.0, 7 * MiB)
    det.update(11.0, float("nan"))
    assert det.samples == 1 and det.last == 5 * MiB


def test_config_rejects_scales_with_too_few_bins() -> None:
    with pytest.raises(ValueError, match="bins per window"):
        DetectorConfig(scales=[(100, 10)])


def test_serial_correlation_widens_the_error_for_curved_floors_not_for_a_leak_and_its_onset() -> None:
    """The AR(1) widening used while a series has no slope history: ~1 for a ramp (or flat-then-ramp) in
    independent noise, large for a warm-up's curve; drawn at random per case."""
    rng = np.random.default_rng(7)
    ramps, hinges, warmups = [], [], []
    for _ in range(60):
        n = int(rng.integers(8, 60))
        t = np.sort(rng.uniform(0, 900, n))
        sd = rng.uniform(2, 60) * MiB
        rate = rng.uniform(0.25, 4) * GiB / 3600
        ramps.append(_ar1_inflation(t, rate * t + rng.normal(0, sd, n), 900 * 0.75))
        knot = rng.uniform(0, 0.6) * 900
        hinges.append(_ar1_inflation(t, rate * np.maximum(0, t - knot) + rng.normal(0, sd, n), 900 * 0.75))
        tau, amp = rng.uniform(120, 1200), rng.uniform(1, 6) * GiB
        curve = amp * (1 - np.exp(-(t + rng.uniform(0, 600)) / tau))
        warmups.append(_ar1_inflation(t, curve + rng.normal(0, 0.02 * amp / 3, n), 900 * 0.75))
    # Independent residuals: rho near 0 (at most sqrt(1.9 / 0.1) = 4.4 by the 0.9 cap).
    assert np.median(ramps) < 1.25 and np.median(hinges) < 1.25
    assert np.quantile(ramps, 0.9) < 1.8 and np.quantile(hinges, 0.9) < 1.8
    assert np.median(warmups) > 2.5 and np.quantile(warmups, 0.1) > 1.5
    # Short or exactly fitted series are not widened.
    assert _ar1_inflation(np.arange(4.0), np.arange(4.0), 3.0) == 1.0
    assert _ar1_inflation(np.arange(10.0), 2 * np.arange(10.0), 7.0) == 1.0


def test_hinge_finds_the_onset_and_rate_of_a_flat_then_rising_floor() -> None:
    t = np.arange(0.0, 1800.0, 30.0)
    g = 5 * GiB + 2 * MiB * np.maximum(0.0, t - 600.0)
    c, r, lo, hi = _hinge(t, g, 1 * MiB, 1.96, 1350.0)
    assert c == 600.0 and r == pytest.approx(2 * MiB) and lo < r < hi


def _passing(window: float, rate: float, half: float) -> TrendResult:
    return TrendResult(window, window / 60, 60, rate, rate - half, rate + half, 9.0, 0, 0.0, None, True, 0.0,
                       rate, rate - half, rate + half, 0.0, 0.0)


def test_an_episode_reports_the_narrowest_rate_among_the_passing_windows_that_agree() -> None:
    """A longer window's interval is narrower, but a fill or a warm-up it does not model biases it: where its
    interval misses a shorter window's, the shorter one's rate stands."""
    short, mid, long_ = _passing(900, 1.00, 0.10), _passing(1800, 1.05, 0.05), _passing(3600, 2.00, 0.01)
    assert agreed_rate([short, mid, long_]) is mid
    assert agreed_rate([short, mid, _passing(3600, 1.06, 0.01)]).window_s == 3600  # agreeing: the narrowest
    assert agreed_rate([short, long_]) is short
    # A shorter passing scale without a rate is passed over; none with one is an error.
    no_rate = TrendResult(900, 15, 60, 1.0, 0.9, 1.1, 9.0, 0, 0.0, None, True, None, None, None, None, 0.0, None)
    assert agreed_rate([no_rate, long_]) is long_
    with pytest.raises(ValueError, match="needs a passing scale with a rate"):
        agreed_rate([no_rate])


def _stalled_sawtooth(seed: int, leak_gib_h: float, stall_at: float = 6000.0, stall_s: float = 2400.0,
                      n: int = 9000, period: float = 500.0) -> np.ndarray:
    """A random sawtooth (exponential gaps, a 1 GiB cache filled over the mean gap, then held at its top) that
    does not release for ``stall_s`` from ``stall_at``, when a leak of ``leak_gib_h`` starts."""
    rng = np.random.default_rng(seed)
    t = np.arange(float(n))
    rel = np.cumsum(rng.exponential(period, 200))
    rel = np.r_[rel[rel < stall_at], stall_at, stall_at + stall_s + np.cumsum(rng.exponential(period, 50))]
    last = np.r_[0.0, rel][np.searchsorted(rel, t, side="right")]
    cache = GiB * np.minimum(1.0, (t - last) / period)
    return quantised(20 * GiB + cache + leak_gib_h * GiB / 3600 * np.maximum(0.0, t - stall_at) + noise(rng, n, 20))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_fast_leak_while_a_random_sawtooth_stalls_at_its_top_is_found_before_the_next_release(seed: int) -> None:
    """The floor shows only at releases; a cache held at its top for 40 minutes shows none. Memory above the
    trough by more than the tallest tooth bounds the floor from below (``trend._ceiling_floors``): a 4 GiB/h
    leak is found within 30 minutes of its onset, at its rate, and the same stall without it raises nothing."""
    det, first = run(_stalled_sawtooth(seed, 4.0))
    assert first is not None and 6000 < first <= 6000 + 30 * 60
    assert det.episodes[0].rate == pytest.approx(4 * GiB / 3600, rel=0.2)
    quiet, _ = run(_stalled_sawtooth(seed, 0.0))
    assert quiet.episodes == ()
