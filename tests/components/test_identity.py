"""One owner of version identity: the canary judge and the drift engine pick the same stable version.

``components/identity.py`` decides the baseline once (``canary.baselines``, else the busiest version, a tie
going to the version that sorts first); both components call it. Before, drift's canary comparison ignored
``canary.baselines`` and broke ties the other way, so the two could compare against different versions.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.components.base import ComponentContext, EstimatesAccuracy, Peers
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.drift.component import build as build_drift
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.identity import VersionKeys, baseline
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.daemon import Sidecar
from tests.components.drift.test_component import make_profile, traffic

NOW = 1_000_000.0


def test_baseline_follows_the_configured_version_else_the_busiest_with_ties_to_the_first() -> None:
    rng = random.Random(23)
    for _ in range(300):
        versions = rng.sample(["v1", "v2", "v10", "canary", "2024-01", "b"], rng.randint(1, 5))
        top = rng.randint(1, 50)
        traffic_ = {v: rng.choice([top, rng.randint(0, top)]) for v in versions}
        busiest = [v for v, n in traffic_.items() if n == max(traffic_.values())]
        assert baseline("m", traffic_, {}) == sorted(busiest)[0]
        want = rng.choice(versions)
        assert baseline("m", traffic_, {"m": want}) == want
        assert baseline("m", traffic_, {"other": want}) == sorted(busiest)[0]
        assert baseline("m", traffic_, {"m": "not-deployed"}) is None
    assert baseline("m", {}, {}) is None


def test_version_keys_cap_through_the_shared_limiters() -> None:
    ctx = ComponentContext(default_label_budget=2)
    keys = VersionKeys(ctx)
    assert keys.of(("svc", "m", "v1")) == ("svc", "m", "v1")
    assert keys.of(("svc", "m", "v2"))[2] == "v2"
    over = keys.of(("svc", "m", "v3"))[2]
    assert over != "v3" and over == ctx.limiter("model_version").get("v4")
    assert keys.of("not a tuple") == keys.of(None)


def _requests(version: str, n: int) -> list[tuple[Any, ...]]:
    return [(EV_REQUEST, ("svc", "m", version), 0, 20_000_000, 0, None, f"{version}-{i}", None,
             (("inference", 20_000_000, None),)) for i in range(n)]


def _both(tmp_path: Any, counts: dict[str, int], baselines: dict[str, str]) -> tuple[set[str], set[str]]:
    """The baseline each component compares the canaries with, after the same traffic."""
    ctx = ComponentContext(clock=lambda: NOW, monotonic=lambda: NOW, baselines=baselines)
    drift = build_drift(DriftConfig(reference=make_profile(tmp_path), window_events=50_000), ctx)
    canary = CanaryComponent(CanaryConfig(min_requests=100), ctx)
    for i, (ver, n) in enumerate(counts.items()):
        recs, _ = traffic(n, 40 + i, version=ver, start=10_000 * i)
        drift.handle(1, 1, recs)
        canary.handle(1, 1, _requests(ver, n) + recs)
    drift.drain(NOW)
    drift.evaluate()
    canary.drain(NOW)
    judged = {j.baseline_version for j in canary.evaluate(NOW)}
    compared = {m.canary["baseline_version"] for m in drift.monitors.values() if m.canary is not None}
    return judged, compared


@pytest.mark.parametrize(("counts", "baselines", "want"), [
    ({"v2": 600, "v1": 600, "v3": 300}, {}, "v1"),  # a tie: the version that sorts first, in both
    ({"v1": 900, "v2": 300}, {"m": "v2"}, "v2"),  # canary.baselines beats traffic, in both
    ({"v1": 300, "v2": 900}, {}, "v2"),  # the busiest
])
def test_canary_judge_and_drift_compare_against_the_same_baseline(tmp_path: Any, counts: dict[str, int],
                                                                  baselines: dict[str, str], want: str) -> None:
    judged, compared = _both(tmp_path, counts, baselines)
    assert judged == compared == {want}


def test_drift_hands_its_accuracy_estimate_to_canary_through_the_declared_hook(tmp_path: Any) -> None:
    cfg = SidecarConfig.model_validate({"gpu": {"enabled": False}, "tail": {"enabled": False},
                                        "drift": {"reference": make_profile(tmp_path)}, "canary": {"baselines": {}}})
    sc = Sidecar(cfg)
    sc._build_components()
    comps = {s.name: s.component for s in sc.slots if s.component is not None}
    drift, canary = comps["drift"], comps["canary"]
    assert isinstance(drift, EstimatesAccuracy) and not isinstance(canary, EstimatesAccuracy)
    assert Peers(comps).accuracy() is drift
    recs, (_a, _b, _c, _p, conf) = traffic(2000, 5, version="v1")
    drift.handle(1, 1, recs)
    drift.drain()
    drift.evaluate()
    est = drift.estimated_accuracy()
    assert est[("m", "v1")] == pytest.approx(float(np.mean(conf)), rel=1e-5)  # uncalibrated: E[confidence]
    assert canary._accuracy() == est
    exported = {(s.labels["model"], s.labels["model_version"]): s.value for fam in drift.collect()
                if fam.name == "inferwatch_drift_estimated_accuracy_ratio" for s in fam.samples}
    assert exported == est
