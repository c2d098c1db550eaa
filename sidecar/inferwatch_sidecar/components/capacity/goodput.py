"""Goodput against per-model objectives: the share of requests that met every threshold.

A request is good when it succeeded and its end-to-end time, the time to first token of its first streamed
stage and that stream's mean inter-token gap are each within the model's thresholds (a threshold of a
quantity the request does not have, a TTFT for a request that streamed nothing, is not held against it).
A request that failed or was shed is bad; a cancelled one is neither (the client left).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from inferwatch.wire import OUTCOME_CANCELLED, OUTCOME_CLIENT_ERROR, OUTCOME_OK
from inferwatch_sidecar.components.capacity.config import Objective


def objective_for(objectives: dict[str, Objective], model: str) -> Objective | None:
    return objectives.get(model) or objectives.get("*")


def is_good(o: Objective, duration_ns: int, stages: Any) -> bool:
    if o.e2e_seconds is not None and duration_ns > o.e2e_seconds * 1e9:
        return False
    if o.ttft_seconds is None and o.itl_seconds is None:
        return True
    for st in stages or ():
        stream = st[2] if len(st) > 2 else None
        if stream is None:
            continue
        ttft_ns, items, gaps_us = stream[0], stream[1], stream[2]
        if o.ttft_seconds is not None and items and ttft_ns > o.ttft_seconds * 1e9:
            return False
        if o.itl_seconds is not None and gaps_us and sum(gaps_us) / len(gaps_us) > o.itl_seconds * 1e6:
            return False
        break
    return True


class Goodput:
    """Good and bad counts per key, and their sums over a sliding window of evaluations."""

    def __init__(self, objectives: list[Objective], window_s: float) -> None:
        self.objectives = {o.model: o for o in objectives}
        self.window_s = window_s
        self.totals: dict[Any, list[int]] = {}
        self.history: deque[tuple[float, dict[Any, tuple[int, int]]]] = deque()
        #: key -> (its totals, its objective, the end-to-end threshold in ns, whether that is the only threshold):
        #: one lookup a request (the capacity component's per-event bar). Keys are capped upstream; bounded here too.
        self._cache: dict[Any, tuple[list[int], Objective, float, bool]] = {}

    def _entry(self, key: Any, model: str) -> tuple[list[int], Objective, float, bool] | None:
        o = objective_for(self.objectives, model) if self.objectives else None
        if o is None:
            return None
        t = self.totals.get(key)
        if t is None:
            t = self.totals[key] = [0, 0]
        e = (t, o, o.e2e_seconds * 1e9 if o.e2e_seconds is not None else float("inf"),
             o.ttft_seconds is None and o.itl_seconds is None)
        if len(self._cache) < 4096:
            self._cache[key] = e
        return e

    def inline(self, key: Any, model: str) -> tuple[list[int] | None, Any]:
        """For the capacity component's inline path: ``key``'s totals (None without an objective) and the
        duration in ns at or under which a successful request is good with no other check.

        That is the end-to-end threshold rounded down to an int (an int duration within it is within the
        threshold; one above it is judged by :meth:`observe`, exactly), no limit without an objective, and
        -inf (every request judged) when the objective also holds TTFT or inter-token latency.
        """
        e = self._cache.get(key) or self._entry(key, model)
        if e is None:
            return None, 1 << 62
        t, _, e2e_ns, e2e_only = e
        if not e2e_only:
            return t, float("-inf")
        return t, (math.floor(e2e_ns) if e2e_ns != float("inf") else 1 << 62)

    def observe(self, key: Any, model: str, outcome: int, duration_ns: int, stages: Any) -> None:
        if outcome in (OUTCOME_CANCELLED, OUTCOME_CLIENT_ERROR):
            return
        e = self._cache.get(key) or self._entry(key, model)
        if e is None:
            return
        t, o, e2e_ns, e2e_only = e
        if outcome == OUTCOME_OK and duration_ns <= e2e_ns and (e2e_only or is_good(o, duration_ns, stages)):
            t[0] += 1
        else:
            t[1] += 1

    def ratios(self, now: float) -> dict[Any, float]:
        """Goodput per key over the window ending at ``now`` (keys without requests in it are left out)."""
        snap = {k: (v[0], v[1]) for k, v in self.totals.items()}
        self.history.append((now, snap))
        while len(self.history) > 1 and self.history[0][0] < now - self.window_s:
            self.history.popleft()
        old = self.history[0][1] if len(self.history) > 1 else {}
        out = {}
        for k, (g, b) in snap.items():
            g0, b0 = old.get(k, (0, 0)) if len(self.history) > 1 else (0, 0)
            n = (g - g0) + (b - b0)
            if n > 0:
                out[k] = (g - g0) / n
        return out
