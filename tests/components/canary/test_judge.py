"""The canary judge: its rank test against scipy, its verdicts on seeded canaries, and its score."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.window import LATENCY_EDGES, latency_bins, quantile
from inferwatch_sidecar.stats import hypothesis as stats
from tests.components.canary.helpers import judged, traffic


@pytest.mark.parametrize("shift", [0.0, 0.3, -0.2])
def test_binned_mann_whitney_equals_scipy_on_tied_data(shift: float) -> None:
    rng = np.random.default_rng(4)
    ref = np.round(rng.normal(0, 1, 700), 1)  # heavy ties: one decimal
    cur = np.round(rng.normal(shift, 1, 300), 1)
    values = np.unique(np.concatenate([ref, cur]))
    rc = np.array([np.sum(ref == v) for v in values], dtype=float)
    cc = np.array([np.sum(cur == v) for v in values], dtype=float)
    auc, _z, p = stats.mann_whitney_binned(rc, cc)
    want = sps.mannwhitneyu(cur, ref, alternative="greater", method="asymptotic", use_continuity=True)
    assert auc * len(ref) * len(cur) == pytest.approx(want.statistic, rel=1e-12)
    assert p == pytest.approx(want.pvalue, rel=1e-9, abs=1e-15)


def test_latency_quantile_interpolates_inside_one_bin() -> None:
    v = np.full(1000, 0.02)
    v[990:] = 0.5
    h = np.bincount(latency_bins(v), minlength=LATENCY_EDGES.size + 1)
    e = LATENCY_EDGES
    # 0.02 s falls in the bin (e[86], e[87]] with 990 of the 1000 values, 0.5 s in (e[113], e[114]]
    assert e[86] < 0.02 <= e[87] and e[113] < 0.5 <= e[114]
    assert quantile(h, 0.5) == pytest.approx(e[86] * (e[87] / e[86]) ** (500 / 990), rel=1e-12)
    assert quantile(h, 0.99) == pytest.approx(e[87], rel=1e-12)
    assert quantile(h, 0.995) == pytest.approx(e[113] * (e[114] / e[113]) ** 0.5, rel=1e-12)
    assert quantile(np.zeros(LATENCY_EDGES.size + 1), 0.5) is None


def test_a_canary_with_3x_p99_fails_on_its_p99() -> None:
    rng = np.random.default_rng(11)
    (j,) = judged(traffic(rng, "v1", 9500) + traffic(rng, "v2", 2000, tail_factor=3.0))
    assert (j.baseline_version, j.canary_version, j.baseline_requests, j.canary_requests) == ("v1", "v2", 9500, 2000)
    assert j.verdict == "fail"
    assert [m.label for m in j.failed] == ["latency_p99", "stage_p99[inference]"]
    p99 = next(m for m in j.metrics if m.name == "latency_p99")
    assert p99.critical and p99.effect_name == "ratio"
    assert round(p99.effect, 3) == 2.804  # 3x in truth; one bin is 12%
    assert round(p99.p_adjusted, 7) == 6.636e-04  # Fisher's exact, Holm across the 11 tests of the judgement
    # the body of the distribution did not move: the rank test passes
    assert next(m for m in j.metrics if m.name == "latency").result == "pass"
    # a critical metric failed: the verdict is fail although the score alone (77.5) would be marginal
    assert round(j.score, 2) == 77.5
    assert j.reasons()[0] == ("latency_p99: ratio 2.804 beyond tolerance 1.2 (stable 0.06849, canary 0.192, "
                              "adjusted p=0.00066)")


def test_an_identical_canary_passes_in_at_least_99_of_100_seeded_runs() -> None:
    verdicts = []
    for seed in range(100):
        rng = np.random.default_rng(1000 + seed)
        (j,) = judged(traffic(rng, "v1", 4000) + traffic(rng, "v2", 1000))
        verdicts.append(j.verdict)
    assert verdicts.count("pass") >= 99
    assert verdicts.count("pass") == 100


def test_more_errors_fail_and_a_changed_prediction_mix_costs_score() -> None:
    rng = np.random.default_rng(5)
    (j,) = judged(traffic(rng, "v1", 5000) + traffic(rng, "v2", 2000, error_rate=0.05))
    assert j.verdict == "fail"
    err = next(m for m in j.metrics if m.name == "error_rate")
    assert (err.result, round(err.baseline, 4), round(err.canary, 4)) == ("fail", 0.0082, 0.049)
    assert err.tolerance == pytest.approx(0.0041)  # max(0.002, 50% of 0.82%)
    # a different prediction mix and lower confidence: non-critical, so only the score drops
    events = traffic(rng, "v1", 5000)
    canary = [(e[0], e[1], e[2], e[3], "cat", 0.6, *e[6:]) if e[0] == 5 and i % 4 == 0 else e
              for i, e in enumerate(traffic(rng, "v2", 2000))]
    (j,) = judged(events + canary)
    failed = [m.label for m in j.failed]
    assert failed == ["prediction_mix", "confidence"]
    assert [round(m.effect, 3) for m in j.failed] == [0.294, 0.105]
    assert (j.verdict, round(j.score, 2)) == ("marginal", 80.0)


def test_the_configured_baseline_wins_over_the_busiest_version() -> None:
    rng = np.random.default_rng(6)
    events = traffic(rng, "v1", 3000) + traffic(rng, "v2", 1000)
    (j,) = judged(events, CanaryConfig(baselines={"m": "v2"}))
    assert (j.baseline_version, j.canary_version) == ("v2", "v1")
    # too few requests: no judgement
    assert judged(traffic(rng, "v1", 3000) + traffic(rng, "v2", 400)) == []


def test_one_stage_can_be_critical() -> None:
    rng = np.random.default_rng(11)
    events = traffic(rng, "v1", 9500) + traffic(rng, "v2", 2000, tail_factor=3.0)
    # The same canary as above: only the inference stage's P99 critical, it fails on it alone ...
    (j,) = judged(events, CanaryConfig(critical=["stage_p99[inference]"]))
    assert [(m.label, m.critical) for m in j.failed] == [("latency_p99", False), ("stage_p99[inference]", True)]
    assert (j.verdict, round(j.score, 2)) == ("fail", 77.5)
    # ... while the queue stage's, which did not move, leaves the verdict to the score.
    (j,) = judged(events, CanaryConfig(critical=["stage_p99[queue]", "stage_latency[inference]"]))
    assert not any(m.critical for m in j.failed)
    assert [m.label for m in j.metrics if m.critical] == ["stage_latency[inference]", "stage_p99[queue]"]
    assert j.verdict == "marginal"


def test_config_rejects_unknown_critical_metrics_and_inverted_scores() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        CanaryConfig(critical=["latency_p50"])
    for bad in ("latency[inference]", "stage_latency[]", "stage_p50[inference]"):
        with pytest.raises(ValueError, match=r"unknown metric.*stage_latency\[STAGE\]"):
            CanaryConfig(critical=[bad])
    with pytest.raises(ValueError, match="marginal_score"):
        CanaryConfig(pass_score=70, marginal_score=80)
