"""The knee: the concurrency beyond which throughput stops growing while latency climbs.

Operational analysis bounds a closed system's throughput by ``X(N) <= min(N / L0, Xmax)``: with ``N``
requests in flight and ``L0`` the latency of one request alone, throughput grows along ``N / L0`` until the
server's bottleneck saturates at ``Xmax``; from there more concurrency only adds queueing (latency grows as
``N / Xmax``). The knee is where the two asymptotes meet, ``N* = Xmax * L0`` (Kleinrock's balance point).
For a server with ``k`` slots and service time ``S`` it is exactly ``k``.

:func:`fit` fits the two asymptotes to measured levels (concurrency, throughput, its standard error) by
weighted least squares, choosing the split between the rising levels and the plateau that fits best, and
gives the knee with a parametric-bootstrap interval. It says the knee is *reached* only when the data show
it: at least one level well beyond it whose throughput stays on the plateau while its latency climbed.
``inferwatch loadtest`` feeds it the steps of a sweep; the live capacity table feeds it throughput by the
number of requests in flight at arrival (Little's law: ``X(n) = n / L(n)``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

#: The smallest relative standard error a level's throughput is given (so one level never weighs infinitely).
MIN_REL_SE = 0.01
#: A level counts as beyond the knee when its concurrency is at least this many times the knee.
BEYOND = 1.2
#: ... and its latency at least this many times the lowest latency seen.
LATENCY_CLIMB = 1.15
#: Bootstrap resamples for the interval.
RESAMPLES = 200


@dataclass(frozen=True)
class Level:
    """One measured concurrency level.

    Attributes:
        concurrency: requests in flight (a load test's workers, or the live table's mean in-flight count).
        throughput: completed requests per second at that level.
        throughput_se: standard error of ``throughput`` (0 when unknown).
        latency: mean end-to-end latency in seconds at that level.
    """

    concurrency: float
    throughput: float
    throughput_se: float
    latency: float


@dataclass(frozen=True)
class Knee:
    """A fitted knee.

    Attributes:
        concurrency: the knee, ``Xmax * L0``.
        throughput_rps: the plateau ``Xmax``.
        low, high: the 5th and 95th percentiles of the knee over bootstrap resamples.
        reached: True when a level beyond the knee shows the plateau (throughput flat, latency up).
        levels: how many levels went into the fit.
    """

    concurrency: float
    throughput_rps: float
    low: float
    high: float
    reached: bool
    levels: int


def _two_segments(cs: Sequence[float], xs: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float]:
    """The best ``min(a*c, xmax)`` fit: (a, xmax, weighted SSE). Levels sorted by concurrency."""
    m = len(cs)
    best = (0.0, 0.0, math.inf)
    # prefix sums for the rising slope through the origin, suffix sums for the plateau mean
    scx = [0.0] * (m + 1)
    scc = [0.0] * (m + 1)
    for i in range(m):
        scx[i + 1] = scx[i] + ws[i] * cs[i] * xs[i]
        scc[i + 1] = scc[i] + ws[i] * cs[i] * cs[i]
    sw = [0.0] * (m + 1)
    swx = [0.0] * (m + 1)
    for i in range(m - 1, -1, -1):
        sw[i] = sw[i + 1] + ws[i]
        swx[i] = swx[i + 1] + ws[i] * xs[i]
    for k in range(1, m):
        a = scx[k] / scc[k] if scc[k] > 0 else 0.0
        xmax = swx[k] / sw[k] if sw[k] > 0 else 0.0
        if a <= 0 or xmax <= 0:
            continue
        sse = 0.0
        for i in range(m):
            d = xs[i] - min(a * cs[i], xmax)
            sse += ws[i] * d * d
        if sse < best[2]:
            best = (a, xmax, sse)
    return best


def _weights(levels: Sequence[Level]) -> list[float]:
    out = []
    for lv in levels:
        se = max(lv.throughput_se, MIN_REL_SE * abs(lv.throughput), 1e-12)
        out.append(1.0 / (se * se))
    return out


def fit(levels: Sequence[Level], seed: int = 0, resamples: int = RESAMPLES) -> Knee | None:
    """The knee of ``levels``, or None when they cannot place one (fewer than 3 usable levels).

    A returned knee with ``reached`` False is the best guess from levels that never showed the plateau
    (every level is still on the rising line, or the latency never climbed): a lower bound, not the knee.
    """
    lv = sorted((x for x in levels if x.concurrency > 0 and x.throughput > 0 and x.latency > 0
                 and math.isfinite(x.throughput) and math.isfinite(x.latency)), key=lambda x: x.concurrency)
    if len(lv) < 3:
        return None
    cs = [x.concurrency for x in lv]
    xs = [x.throughput for x in lv]
    ws = _weights(lv)
    a, xmax, sse = _two_segments(cs, xs, ws)
    if not math.isfinite(sse):
        return None
    knee = xmax / a
    lat0 = min(x.latency for x in lv)
    tol = [2.0 / math.sqrt(w) for w in ws]
    # Beyond the knee: on the plateau within its noise (or 10%), and latency clearly up.
    beyond = [x for x, t in zip(lv, tol, strict=True)
              if x.concurrency >= BEYOND * knee and x.throughput <= xmax + max(t, 0.1 * xmax)
              and x.latency >= LATENCY_CLIMB * lat0]
    reached = bool(beyond) and any(c < knee for c in cs)
    rng = random.Random(seed)
    ks: list[float] = []
    ses = [1.0 / math.sqrt(w) for w in ws]
    for _ in range(resamples):
        xr = [max(x + rng.gauss(0.0, s), 1e-12) for x, s in zip(xs, ses, strict=True)]
        ar, xm, e = _two_segments(cs, xr, ws)
        if math.isfinite(e) and ar > 0:
            ks.append(xm / ar)
    ks.sort()
    low = ks[int(0.05 * (len(ks) - 1))] if ks else knee
    high = ks[int(math.ceil(0.95 * (len(ks) - 1)))] if ks else knee
    return Knee(concurrency=knee, throughput_rps=xmax, low=low, high=high, reached=reached, levels=len(lv))
