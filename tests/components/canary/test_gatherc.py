"""The canary's compiled pass over a batch (``_gatherc.c``) against its Python loop.

Both read the same random batches into fresh components; the per-ctx lists (reprs, so NaN and the order of
every list count), the drop counters and the stage limiter's state must be the same, whatever the events:
requests and records of every shape the staging may hold, streamed stages, predictions that need ``canon``,
bad outcomes and durations, unhashable contexts, short tuples, a limiter that overflows or raises.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any

import numpy as np
import pytest

from inferwatch.wire import EV_HTTP, EV_RECORD, EV_REQUEST
from inferwatch_sidecar.aggregate.context import ComponentContext
from inferwatch_sidecar.components.canary import component as canary_component
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.window import N_OUTCOMES

GATHER = canary_component._compiled_gather


def test_the_compiled_pass_was_built_where_ci_runs() -> None:
    if os.environ.get("CI") == "true":
        assert GATHER is not None, "inferwatch_sidecar.components.canary._gatherc was not built: pip install -e . " \
                                   "needs a C compiler"


pytestmark = pytest.mark.skipif(GATHER is None and os.environ.get("CI") != "true",
                                reason="the compiled pass was not built (no C compiler)")

CTXS: list[Any] = [("svc", "m", "v1"), ("svc", "m", "v2"), ("svc", "n", None)]
NAMES = [f"stage{i}" for i in range(9)] + ["queue", "inference"]


def _stage(rng: random.Random) -> Any:
    roll = rng.random()
    name: Any = rng.choice(NAMES)
    if roll < 0.03:
        return (name, 5)  # too short
    if roll < 0.05:
        return [name, 5, None]  # a list, not a tuple
    if roll < 0.07:
        name = rng.choice([None, 7, b"x"])
    dur: Any = rng.choice([rng.randrange(0, 10**9), rng.randrange(0, 10**9), rng.random() * 1e6, math.nan,
                           math.inf, True, "5", 2**1100, np.int64(4)]) if rng.random() < 0.2 else rng.randrange(10**8)
    stream: Any = None
    if rng.random() < 0.25:  # a streamed stage: (ttft ns, items, gaps us[, undelivered]), and odd ones
        gaps: Any = tuple(rng.randrange(10**5) for _ in range(rng.randrange(4)))
        stream = (rng.randrange(10**7), rng.randrange(0, 3), gaps)
        if rng.random() < 0.2:
            stream = (*stream, rng.randrange(5))
        if rng.random() < 0.15:
            stream = rng.choice([(1.5e6, 1, gaps), (math.nan, 1, gaps), (5, 1, list(gaps)), (5, 1.0, gaps),
                                 (5, True, gaps), (5, 1, (1.5, 2)), (5, 1, (2**1100,)), (5, 1), [5, 1, gaps],
                                 (5, 1, gaps, 0, 0), ("5", 1, gaps), None])
    return (name, dur, stream)


def _ctx(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.03:
        return ["svc", "m", "v1"]  # unhashable
    if roll < 0.1:
        return tuple(rng.choice(CTXS))  # equal to a shared one, another object
    return rng.choice(CTXS)


def _request(rng: random.Random) -> Any:
    outcome: Any = rng.choice([0, 0, 0, 1, 2, 3, 4]) if rng.random() < 0.9 else rng.choice(
        [N_OUTCOMES, -1, True, 1.0, "0", None, 2**70])
    dur: Any = rng.randrange(10**9) if rng.random() < 0.9 else rng.choice([1.5e6, math.nan, math.inf, 2**1100, None])
    stages: Any = tuple(_stage(rng) for _ in range(rng.randrange(5)))
    if rng.random() < 0.2:
        stages = list(stages)
    ev = (EV_REQUEST, _ctx(rng), 1, dur, outcome, None, f"r{rng.randrange(99)}", None, stages)
    return ev[:rng.randrange(2, 9)] if rng.random() < 0.02 else ev


def _record(rng: random.Random) -> Any:
    pred: Any = rng.choice(["cat", "dog", None]) if rng.random() < 0.85 else rng.choice(
        [1, 1.0, 2.5, True, np.int64(3), math.nan, ("tuple",)])
    conf: Any = rng.random() if rng.random() < 0.8 else rng.choice([None, math.nan, math.inf, -math.inf, 1, "x"])
    ev = (EV_RECORD, _ctx(rng), 1, "r", pred, conf, None, None)
    return ev[:rng.randrange(2, 6)] if rng.random() < 0.02 else ev


def _odd(rng: random.Random) -> Any:
    return rng.choice([
        (EV_HTTP, CTXS[0], 1, "/x", 200, 0, 0, 0, False, None),  # any type is read for its [4] and [5]
        (2**70, CTXS[0], 1, 2, "p", 0.5),
        (2.0, CTXS[0], 1, 5, 0, None, None, None, ()),  # a type code equal to EV_REQUEST, not an int
        [EV_REQUEST, CTXS[0]],
        (EV_REQUEST,),
        None,
    ])


def _batch(rng: random.Random, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        roll = rng.random()
        out.append(_request(rng) if roll < 0.5 else _record(rng) if roll < 0.95 else _odd(rng))
    return out


def _component(stage_budget: int) -> CanaryComponent:
    return CanaryComponent(CanaryConfig(), ComponentContext(default_label_budget=stage_budget))


def _state(c: CanaryComponent, got: Any) -> str:
    lim = c._lim_stage
    return repr((got, dict(c.dropped), lim._seen, lim.overflowed))


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_pass_reads_random_batches_as_the_python_loop_does(seed: int) -> None:
    rng = random.Random(seed)
    budget = rng.choice([1, 3, 50])
    a, b = _component(budget), _component(budget)
    for _ in range(3):  # the limiter's state carries over from batch to batch
        batch = _batch(rng, rng.randrange(0, 300))
        want = a._gather_python(batch, None)
        got = b._gather_compiled(batch)
        assert _state(b, got) == _state(a, want)


def test_plain_traffic_never_reaches_the_fallback() -> None:
    """Requests with plain and streamed stages (an LLM server's) and records are all read in C."""
    rng = random.Random(3)
    batch = []
    for i in range(500):
        ctx = CTXS[i % 2]
        stream = (rng.randrange(10**7), i % 3, tuple(rng.randrange(10**5) for _ in range(i % 4)))
        batch.append((EV_REQUEST, ctx, 1, rng.randrange(10**9), i % N_OUTCOMES, None, f"r{i}", None,
                      (("queue", rng.randrange(10**6), None), ("inference", rng.randrange(10**8), None),
                       ("decode", rng.randrange(10**8), stream if i % 5 else (*stream, 1)))))
        batch.append((EV_RECORD, ctx, 1, f"r{i}", "cat", rng.random(), None, None))
    c = _component(50)
    called: list[Any] = []
    c._gather_into = lambda events, *rest: called.extend(events)  # type: ignore[method-assign]
    reqs, streams, recs = c._gather_compiled(batch)
    assert called == []
    assert sum(len(v[0]) for v in reqs.values()) == 500 and sum(len(v[1]) for v in recs.values()) == 500
    assert sum(len(v[1]) for v in streams.values()) == sum(i % 4 for i in range(500))
    want = _component(50)._gather_python(batch, None)
    assert repr((reqs, streams, recs)) == repr(want)
    # The fallback is what reads the rest: an odd event reaches it, alone and in its turn.
    odd = (EV_REQUEST, CTXS[0], 1, 5, 0, None, None, None, (["queue", 1, None],))  # a stage as a list
    c._gather_compiled([batch[0], odd, batch[1]])
    assert called == [odd]


class _Limiter:
    """A stage limiter that raises for one name: the event is counted once and what came before it stays."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def get(self, name: Any) -> str:
        self.calls.append(name)
        if name == "boom":
            raise RuntimeError("limiter")
        return name


def test_a_limiter_that_raises_drops_the_event_as_the_python_loop_does() -> None:
    ctx = CTXS[0]
    batch = [(EV_REQUEST, ctx, 1, 10, 0, None, None, None, (("a", 1, None), ("boom", 2, None), ("c", 3, None))),
             (EV_REQUEST, ctx, 1, 20, 0, None, None, None, (("a", 4, None), ("c", 5, None)))]
    results = []
    for run in ("_gather_python", "_gather_compiled"):
        c = _component(50)
        c._lim_stage = _Limiter()  # type: ignore[assignment]
        got = getattr(c, run)(batch, None) if run == "_gather_python" else c._gather_compiled(batch)
        results.append((repr(got), dict(c.dropped), c._lim_stage.calls))  # type: ignore[attr-defined]
    assert results[0] == results[1]
    assert results[1][1]["error"] == 1 and results[1][2] == ["a", "boom", "c"]


def test_the_component_uses_the_compiled_pass_only_without_an_slo() -> None:
    c = _component(50)
    assert c.compiled_gather is GATHER
    seen: list[str] = []
    c._gather_python = lambda batch, slo: seen.append("python") or ({}, {}, {})  # type: ignore[method-assign]
    c._gather_compiled = lambda batch: seen.append("compiled") or ({}, {}, {})  # type: ignore[method-assign]
    c._gather([], None)
    c._gather([], object())
    c.compiled_gather = None
    c._gather([], None)
    assert seen == ["compiled", "python", "python"]
