"""How the canary judge keeps its false fails down: Holm across a judgement's tests, exact tests for rates,
and a fail reported only once it has held over re-judgements of new requests (``canary.fail_after_s``).

The measured rates (1,000 seeded identical runs per family, regressions' power, whole rollouts) come from
``bench/canary_judge.py`` and are in docs/canary.md, "Error rates".
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from scipy.stats import fisher_exact, hypergeom
from statsmodels.stats.multitest import multipletests

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.judge import VerdictHold, exact_greater, holm
from tests.components.canary.helpers import traffic
from tests.helpers.paths import REPO


def test_holm_equals_statsmodels_on_random_p_values() -> None:
    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 13, 40):
        p = np.concatenate([rng.uniform(0, 1, m - m // 3), rng.uniform(0, 1e-3, m // 3)])
        p[rng.integers(0, m)] = p[0]  # a tie
        want = multipletests(p, method="holm")[1]
        assert holm(p) == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("kb", "nb", "kc", "nc"), [(3, 4000, 6, 1000), (0, 1000, 2, 500), (40, 2000, 21, 1000),
                                                    (10, 500, 0, 500), (900, 1000, 480, 500)])
def test_the_rates_exact_test_is_fishers_one_sided(kb: int, nb: int, kc: int, nc: int) -> None:
    want = fisher_exact([[kc, nc - kc], [kb, nb - kb]], alternative="greater").pvalue
    assert exact_greater(kb, nb, kc, nc) == pytest.approx(want, rel=1e-9)


def _grid() -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(5)
    out = [(kb, nb, kc, nc) for nb in (0, 1, 2, 50, 4000, 100_000) for nc in (0, 1, 3, 500, 200_000)
           for kb in sorted({0, 1, nb // 100, nb // 2, max(nb - 1, 0), nb})
           for kc in sorted({0, 1, nc // 100, nc // 2, max(nc - 1, 0), nc})]
    for _ in range(500):
        nb, nc = (int(rng.integers(1, 10 ** int(rng.integers(1, 7)))) for _ in range(2))
        out.append((int(rng.integers(0, nb + 1)), nb, int(rng.integers(0, nc + 1)), nc))
    return out


def test_the_exact_test_is_scipys_hypergeom_sf_to_the_bit_without_importing_scipy_stats() -> None:
    """Boost's function, called without scipy.stats (46 MiB of modules), gives scipy.stats's value exactly,
    at the support's edges (certain, impossible) and for arguments outside the distribution (nan) too."""
    code = ("import sys\nimport numpy as np\nfrom tests.components.canary.helpers import judged, traffic\n"
            "rng = np.random.default_rng(4)\n"
            "(j,) = judged(traffic(rng, 'v1', 3000) + traffic(rng, 'v2', 1000, error_rate=0.05))\n"
            "print(j.verdict, sorted({m.name for m in j.metrics if m.p_value is not None}))\n"
            "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO / "sidecar"),
                                                                           str(REPO)])}).stdout.splitlines()
    assert out[0].startswith("fail ") and "'error_rate'" in out[0] and "'latency_p99'" in out[0]  # judged in full
    assert out[1] == "[]"  # and scipy.stats never imported
    grid = _grid()
    got = np.array([exact_greater(*g) for g in grid])
    want = np.array([hypergeom.sf(kc - 1, nb + nc, kb + kc, nc) for kb, nb, kc, nc in grid])
    assert np.array_equal(got, want, equal_nan=True)
    assert {0.0, 1.0} <= set(got.tolist()) and np.isnan(got).any() and ((got > 0) & (got < 1)).sum() > 300


def test_the_exact_test_falls_back_to_scipy_stats_without_the_private_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import scipy.stats  # noqa: F401  (loaded before the stub: it keeps the real module)

    monkeypatch.setitem(sys.modules, "scipy.special._ufuncs", types.ModuleType("scipy.special._ufuncs"))
    grid = _grid()[::7]
    got = np.array([exact_greater(*g) for g in grid])
    want = np.array([hypergeom.sf(kc - 1, nb + nc, kb + kc, nc) for kb, nb, kc, nc in grid])
    assert np.array_equal(got, want, equal_nan=True)


def test_fishers_test_is_calibrated_where_the_z_test_is_not() -> None:
    """Rare errors (0.4% of 4000 stable requests, 500 canary ones): under equal rates the one-sided z-test says
    p <= 0.001 far more often than 0.1% of the time; the exact test never more often."""
    from inferwatch_sidecar.stats.hypothesis import two_proportion_z

    rng = np.random.default_rng(11)
    kb, kc = rng.binomial(4000, 0.004, 20000), rng.binomial(500, 0.004, 20000)
    z_p = []
    for b, c in zip(kb, kc, strict=True):
        z, p2 = two_proportion_z(b, 4000, c, 500)
        z_p.append(p2 / 2 if z > 0 else 1 - p2 / 2)
    exact = np.array([exact_greater(int(b), 4000, int(c), 500) for b, c in zip(kb, kc, strict=True)])
    assert np.mean(np.array(z_p) <= 1e-3) > 3e-3
    assert np.mean(exact <= 1e-3) <= 1e-3


def _judgement(hold: VerdictHold, judged: str, now: float) -> Any:
    from inferwatch_sidecar.components.canary.judge import Judgement

    j = Judgement("svc", "m", "v2", "v1", 1000, 4000, 40.0 if judged == "fail" else 100.0, judged)
    hold.apply([j], now)
    return j


def test_a_fail_is_reported_only_once_it_has_held_for_fail_after_s() -> None:
    hold = VerdictHold(60.0)
    seq = [(0.0, "pass"), (10.0, "fail"), (40.0, "fail"), (70.0, "fail"), (80.0, "fail"), (90.0, "pass"),
           (100.0, "fail"), (110.0, "marginal"), (120.0, "fail"), (175.0, "fail"), (180.0, "fail")]
    got = [_judgement(hold, v, t).verdict for t, v in seq]
    assert got == ["pass", "marginal", "marginal", "fail", "fail", "pass", "marginal", "marginal", "marginal",
                   "marginal", "fail"]
    # Since when: the reported verdict's start, and the unbroken fail's.
    j = _judgement(hold, "fail", 190.0)
    assert (j.verdict, j.verdict_since_unix, j.failing_since_unix, j.judged_verdict) == ("fail", 180.0, 120.0, "fail")
    # The warning of a pending fail says since when and what it waits for.
    hold = VerdictHold(60.0)
    j = _judgement(hold, "fail", 1_700_000_000.0)
    assert j.verdict == "marginal" and j.warnings == [
        "failing since 2023-11-14 22:13:20 UTC: reported fail once it has failed for 60 s without a break "
        "(canary.fail_after_s), marginal until then"]
    # 0: at once; a pair no longer judged is forgotten.
    assert _judgement(VerdictHold(0.0), "fail", 5.0).verdict == "fail"
    hold.apply([], 1_700_000_100.0)
    assert _judgement(hold, "fail", 1_700_000_110.0).failing_since_unix == 1_700_000_110.0


def test_the_component_holds_a_real_fail_back_then_reports_it_and_its_metrics_follow() -> None:
    """A canary with 5x the errors, judged every 10 s: marginal (pending) for the first 60 s, then fail; the
    exported verdict follows the reported one, and the status carries the since-when of both."""
    now = [1000.0]
    c = CanaryComponent(CanaryConfig(), ComponentContext(clock=lambda: now[0], monotonic=lambda: now[0]))
    rng = np.random.default_rng(4)
    c.handle(0, 0, traffic(rng, "v1", 5000) + traffic(rng, "v2", 1500, error_rate=0.05))
    seen = []
    for t in range(1000, 1081, 10):
        now[0] = float(t)
        c.drain(now[0])
        (j,) = c.evaluate(now[0])
        seen.append(j.verdict)
        assert j.judged_verdict == "fail"
    assert seen == ["marginal"] * 6 + ["fail"] * 3
    (st,) = c.status()["judgements"]
    assert (st["verdict"], st["judged_verdict"], st["failing_since_unix"], st["verdict_since_unix"]) == (
        "fail", "fail", 1000.0, 1060.0)
    samples = {(m.name, tuple(s.labels.items())): s.value for m in c.collect() for s in m.samples}
    fail = [v for (name, labels), v in samples.items() if name == "inferwatch_canary_verdict" and
            ("verdict", "fail") in labels]
    assert fail == [1.0]


def test_the_p99_test_is_calibrated_on_identical_latencies_where_the_stable_threshold_was_not() -> None:
    """4,000 identical pairs (3,000 stable and 800 canary requests, random log-normal medians and spreads): the
    share above the P99 of both versions together (Fisher) says p <= alpha at most alpha of the time; the share
    above the stable version's own P99 (the judge before) said it more than twice as often at alpha = 1%."""
    from inferwatch_sidecar.components.canary.judge import _p99
    from inferwatch_sidecar.components.canary.window import N_LATENCY, latency_bins
    from inferwatch_sidecar.stats.hypothesis import two_proportion_z

    cfg = CanaryConfig()
    rng = np.random.default_rng(1)
    new, old = [], []
    for _ in range(4000):
        sigma, median = rng.uniform(0.3, 1.0), rng.uniform(0.005, 0.2)
        b = np.bincount(latency_bins(rng.lognormal(np.log(median), sigma, 3000)), minlength=N_LATENCY)
        c = np.bincount(latency_bins(rng.lognormal(np.log(median), sigma, 800)), minlength=N_LATENCY)
        new.append(_p99("latency_p99", None, b, c, cfg).p_value)
        j = int(np.searchsorted(np.cumsum(b), 0.99 * 3000, side="left"))
        z, p2 = two_proportion_z(b[j + 1:].sum(), 3000, c[j + 1:].sum(), 800)
        old.append(p2 / 2 if z > 0 else 1 - p2 / 2)
    pn, po = np.array(new), np.array(old)
    for alpha in (0.05, 0.01, 0.001):
        assert np.mean(pn <= alpha) <= alpha, alpha
    assert (np.mean(pn <= 0.01), np.mean(po <= 0.01)) == (0.007, 0.01675)
