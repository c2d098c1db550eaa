"""Seeded traffic of two model versions for the canary judge's tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferwatch.wire import EV_RECORD, EV_REQUEST
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.judge import Judgement

#: Median and log-sd of the end-to-end latency; the 98th percentile of that lognormal.
MEDIAN_S, SIGMA = 0.02, 0.5
P98_S = float(np.exp(np.log(MEDIAN_S) + SIGMA * 2.053748910631823))


def traffic(rng: np.random.Generator, version: str, n: int, *, tail_factor: float = 1.0, error_rate: float = 0.01,
            model: str = "m") -> list[tuple[Any, ...]]:
    """``n`` requests (queue + inference stages) and their records (prediction, confidence) of one version.

    ``tail_factor`` multiplies every latency above the 98th percentile, a monotone change: the canary's P99 is
    then exactly ``tail_factor`` times the stable one's while everything below P98 is unchanged.
    """
    lat = rng.lognormal(np.log(MEDIAN_S), SIGMA, n)
    lat = np.where(lat > P98_S, lat * tail_factor, lat)
    queue = rng.lognormal(np.log(0.002), 0.8, n)
    err = rng.random(n) < error_rate
    conf = rng.beta(8, 2, n)
    pred = rng.choice(["cat", "dog", "bird"], n, p=[0.5, 0.3, 0.2])
    ctx = ("svc", model, version)
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        rid = f"{version}-{i}"
        out.append((EV_RECORD, ctx, 0, rid, str(pred[i]), float(conf[i]), None, None))
        out.append((EV_REQUEST, ctx, 0, int((lat[i] + queue[i]) * 1e9), int(err[i]), None, rid, None,
                    (("queue", int(queue[i] * 1e9), None), ("inference", int(lat[i] * 1e9), None))))
    return out


def judged(events: list[tuple[Any, ...]], cfg: CanaryConfig | None = None, now: float = 1000.0) -> list[Judgement]:
    """Run a fresh canary component over ``events`` and return its judgements.

    One judgement of one window: a fail is reported at once (``fail_after_s`` 0), so the verdict is the
    judge's own; tests/components/canary/test_error_rates.py holds the persistence over re-judgements.
    """
    cfg = (cfg or CanaryConfig()).model_copy(update={"fail_after_s": 0.0})
    c = CanaryComponent(cfg, ComponentContext(clock=lambda: now, monotonic=lambda: now))
    c.handle(0, 0, events)
    c.drain(now)
    return c.evaluate(now)
