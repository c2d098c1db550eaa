"""Every detector meets one contract (STYLE.md point 9), checked the same way for each of them.

After river's ``checks/``: the same checks run over every implementation of
:class:`~inferwatch_sidecar.components.detector.Detector`, each fed its own
seeded stream: read-only results, bounded memory on a long stream, identical
results on identical streams, and a JSON state round trip that continues
exactly like the original.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from inferwatch_sidecar.components.detector import Detector
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.multivariate import fit as fit_joint
from inferwatch_sidecar.components.drift.multivariate_window import JointWindow
from inferwatch_sidecar.components.drift.rolling import RollingColumn
from inferwatch_sidecar.components.drift.window import ColumnWindow
from inferwatch_sidecar.components.gpu.config import DetectorConfig
from inferwatch_sidecar.components.gpu.detector import LeakDetector
from tests.components.gpu.traces import creep


@dataclass(frozen=True)
class Case:
    """One implementation and how to feed it.

    Attributes:
        name: the test id.
        make: a fresh detector.
        stream: ``(seed, start, n)`` -> steps ``start`` to ``start + n`` of the seeded stream.
        feed: apply steps to a detector.
        n: steps in a "long" stream, enough to fill every window the detector keeps.
    """

    name: str
    make: Callable[[], Detector]
    stream: Callable[[int, int, int], list[Any]]
    feed: Callable[[Any, list[Any]], None]
    n: int


# -- the leak detector: one memory sample per step ---------------------------------------------------------------------

LEAK_CFG = DetectorConfig(scales=[(160, 10), (320, 20)], warmup_s=0, confirm_s=30, clear_s=60)


def _leak_stream(seed: int, start: int, n: int) -> list[Any]:
    y = creep(start + n, 4.0, 300, seed=seed)  # quiet, then a creep: both verdicts and a rate occur
    return [(float(t), float(y[t])) for t in range(start, start + n)]


def _leak_feed(det: LeakDetector, steps: list[Any]) -> None:
    for t, v in steps:
        det.update(t, v)


# -- the per-column drift window: one batch of values per step, a new sub-window every 5 steps ------------------------

_REF_RNG = np.random.default_rng(0)
NUMERIC_REF = prof.numeric_column("x", _REF_RNG.normal(size=2000))
CATEGORICAL_REF = prof.categorical_column("c", list(_REF_RNG.choice(["a", "b", "c", "d"], size=2000)), top_k=3)


def _batch_rng(seed: int, step: int) -> np.random.Generator:
    return np.random.default_rng([seed, step])


def _numeric_stream(seed: int, start: int, n: int) -> list[Any]:
    out = []
    for i in range(start, start + n):
        v = _batch_rng(seed, i).normal(0.3, 1.2, 50)
        v[::7] = np.nan
        out.append((i, v if i % 3 else [float(x) for x in v]))  # arrays and raw values both reach update()
    return out


def _categorical_stream(seed: int, start: int, n: int) -> list[Any]:
    out = []
    for i in range(start, start + n):
        rng = _batch_rng(seed, i)
        vals: list[Any] = [str(x) for x in rng.choice(["a", "b", "c", "d", "e"], size=40)]
        vals += [f"new{i}", None, 3]  # a fresh unseen category every step, a missing value, a number
        out.append((i, vals))
    return out


def _window_feed(win: ColumnWindow, steps: list[Any]) -> None:
    for i, values in steps:
        if i % 5 == 0:
            win.rotate()
        win.update(values)
        if i % 4 == 0:
            win.add_missing(2)


# -- the joint (multivariate) window: one batch of records of one schema per step, a new sub-window every 5 steps --

_JA = _REF_RNG.normal(size=1000)
JOINT_MODEL = fit_joint({"a": _JA, "b": _JA + 0.5 * _REF_RNG.normal(size=1000)},
                        {"c": list(_REF_RNG.choice(["u", "v", "w"], size=1000))}, ["a", "b", "c"], 1000)


def _joint_stream(seed: int, start: int, n: int) -> list[Any]:
    out = []
    for i in range(start, start + n):
        rng = _batch_rng(seed, i)
        a = rng.normal(size=30)
        nums = np.stack([a, a + rng.normal(size=30)], axis=1)
        cats = [(str(x),) for x in rng.choice(["u", "v", "w", "new"], size=30)]
        out.append((i, nums, cats))
    return out


def _joint_feed(win: JointWindow, steps: list[Any]) -> None:
    for i, nums, cats in steps:
        if i % 5 == 0:
            win.rotate()
        win.update(("a", "b"), nums, ("c",), cats)


# -- the rolling history of a column: one finished sub-window per step, a new history slot every 3 steps ------------


def _rolling_stream(seed: int, start: int, n: int) -> list[Any]:
    out = []
    for i in range(start, start + n):
        v = _batch_rng(seed, i).normal(0.2, 1.1, 40)
        counts, sums, _ = NUMERIC_REF.bin(v)
        out.append((20.0 * i, counts, sums, i % 3))
    return out


def _rolling_feed(h: RollingColumn, steps: list[Any]) -> None:
    for start, counts, sums, missing in steps:
        h.update(start, counts, sums, missing)


CASES = [
    Case("leak_detector", lambda: LeakDetector(LEAK_CFG), _leak_stream, _leak_feed, 4400),
    Case("column_window_numeric", lambda: ColumnWindow(NUMERIC_REF, 6), _numeric_stream, _window_feed, 200),
    Case("column_window_categorical", lambda: ColumnWindow(CATEGORICAL_REF, 6), _categorical_stream, _window_feed,
         200),
    Case("joint_window", lambda: JointWindow(JOINT_MODEL, 6), _joint_stream, _joint_feed, 200),
    Case("rolling_history", lambda: RollingColumn(NUMERIC_REF, 8, 60.0), _rolling_stream, _rolling_feed, 200),
]


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


def _plain(v: Any) -> Any:
    """Results as plain data, for comparison."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def results(det: Detector) -> str:
    return json.dumps({name: _plain(getattr(det, name)) for name in type(det).RESULTS}, sort_keys=True)


def state(det: Detector) -> str:
    """The state as strict JSON (no NaN or infinity), keys sorted."""
    return json.dumps(det.to_state(), sort_keys=True, allow_nan=False)


def _mutate(v: Any) -> None:
    """Try every way of changing a result in place; a read-only result refuses or is a copy."""
    if isinstance(v, np.ndarray):
        try:
            v[...] = 7
        except ValueError:
            pass
    elif isinstance(v, (dict, list)):
        v.clear()
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        for f in dataclasses.fields(v):
            _mutate(getattr(v, f.name))


def test_every_detector_meets_the_protocol(case: Case) -> None:
    det = case.make()
    assert isinstance(det, Detector)
    assert type(det).RESULTS
    for name in type(det).RESULTS:
        assert isinstance(getattr(type(det), name), property), name


def test_results_are_read_only(case: Case) -> None:
    det = case.make()
    case.feed(det, case.stream(1, 0, case.n))
    before = results(det)
    for name in type(det).RESULTS:
        value = getattr(det, name)
        with pytest.raises(AttributeError):
            setattr(det, name, value)
        _mutate(value)
    assert results(det) == before


def test_memory_is_bounded_on_a_long_stream(case: Case) -> None:
    det = case.make()
    case.feed(det, case.stream(2, 0, case.n))
    size = len(state(det))
    # 10x more updates: the first 7x untraced (tracemalloc slows a detector's pass several times over),
    # the last 3x under tracemalloc, whose growth must stay flat.
    case.feed(det, case.stream(2, case.n, 7 * case.n))
    more = case.stream(2, 8 * case.n, 3 * case.n)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        case.feed(det, more)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # After 10x more updates the state is as large as before, give or take the digits of its counters.
    assert len(state(det)) <= 1.1 * size + 100
    assert grown < 64 * 1024, f"{grown} bytes kept after {3 * case.n} traced updates"


def test_a_seeded_stream_gives_identical_results(case: Case) -> None:
    a, b, other = case.make(), case.make(), case.make()
    case.feed(a, case.stream(3, 0, case.n))
    case.feed(b, case.stream(3, 0, case.n))
    case.feed(other, case.stream(4, 0, case.n))
    assert results(a) == results(b)
    assert state(a) == state(b)
    assert state(other) != state(a)  # the stream matters: the comparison above is not vacuous


def test_state_round_trip_continues_exactly_like_the_original(case: Case) -> None:
    original = case.make()
    case.feed(original, case.stream(5, 0, case.n))
    saved = state(original)
    resumed = type(original).from_state(json.loads(saved))
    assert state(resumed) == saved and results(resumed) == results(original)
    rest = case.stream(5, case.n, case.n)
    case.feed(original, rest)
    case.feed(resumed, rest)
    assert results(resumed) == results(original)
    assert state(resumed) == state(original)


def test_from_state_refuses_a_state_it_cannot_use(case: Case) -> None:
    with pytest.raises(ValueError):
        type(case.make()).from_state({})
