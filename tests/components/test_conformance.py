"""Every registered component meets the component contract, checked the same way for each (after river's ``checks/``).

The components come from the registry (``components/registry.py``), so a new one is checked the moment it is
registered. Each is built by its own ``build()`` from its default section (enabled), fed a seeded family of
well-formed traffic mixed with garbage, and driven by hand through its passes. The checks:

- ``handle`` never raises on garbage, and neither does a pass of the worker over it (a bad record is counted
  and dropped, never the batch or the thread);
- ``collect`` returns only families of the component's own catalog entries, of the entry's type, with the
  entry's label names, and some samples after traffic;
- ``status`` is strict JSON (no NaN) before and after traffic;
- ``stop`` is idempotent, started or not, and ``collect``/``status`` still answer after it.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from inferwatch.wire import EV_ALLOC, EV_RECORD, EV_REQUEST, EV_STAGE, Schema
from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.base import Component, ComponentContext
from inferwatch_sidecar.components.periodic import PeriodicComponent, StagedComponent
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.config import SidecarConfig
from inferwatch_sidecar.daemon import COMPONENT_METRICS
from inferwatch_sidecar.metrics.entry import Metric

NAMES = registry.names()
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _section(name: str) -> Any:
    """The component's default section, enabled, with the fake GPU backend (no NVML on a test machine)."""
    spec = registry.spec(name)
    extra: dict[str, Any] = {"enabled": True}
    if name == "gpu":
        extra.update(backend="fake", interval_s=0.05,
                     fake={"processes": [{"pid": 4242, "base_gib": 2, "leak_mib_per_s": 5, "leak_start_s": 0}]})
    if name == "engines":  # a target that refuses: the component counts and exports the failure
        extra.update(targets=[{"url": "http://127.0.0.1:9/metrics", "kind": "vllm"}], timeout_s=1.0)
    return spec.config.model_validate(extra)


def _build(name: str, clock: Clock) -> Component:
    pytest.importorskip("pyarrow") if name == "skew" else None
    mod = importlib.import_module(registry.spec(name).module)
    comp = mod.build(_section(name), ComponentContext(clock=clock, monotonic=clock))
    assert isinstance(comp, Component)
    return comp


_SCHEMA = Schema(7, ("x", "y"), ("color",), struct.Struct("<2d"), struct.Struct("<1H"))


def _traffic(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """Well-formed decoded events of two versions: requests with stages, records with features, allocator samples."""
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        ver = "v1" if rng.random() < 0.7 else "v2"
        ctx = ("svc", "m", ver)
        rid = f"{ver}-{i}"
        lat = rng.lognormvariate(math.log(0.02), 0.5)
        feats = (_SCHEMA, (rng.gauss(0, 1), rng.gauss(5, 2)), (rng.choice(["red", "blue", "green"]),))
        out.append((EV_RECORD, ctx, int(T0 * 1e9) + i, rid, rng.choice(["cat", "dog"]), rng.random(), None, feats))
        stream = (int(0.005e9), 12, (1000, 2000, 1500)) if i % 3 == 0 else None
        out.append((EV_REQUEST, ctx, int(T0 * 1e9) + i, int(lat * 1e9), int(rng.random() < 0.02), None, rid, None,
                    (("queue", int(lat * 0.1e9), None), ("inference", int(lat * 0.9e9), stream))))
        if i % 10 == 0:
            out.append((EV_ALLOC, int(T0 * 1e9) + i * 1000, 0, 1 << 30, 2 << 30, 1 << 30, 1 << 20, 0, 0, 0))
    return out


_JUNK: tuple[Any, ...] = (None, -1, 0, 2**70, float("nan"), float("inf"), "", "x" * 300, b"\xff", (), (1, 2),
                          ("a", "b", "c", "d"), {"k": 1}, [None], object())


def _garbage(rng: random.Random, good: list[tuple[Any, ...]], n: int) -> Iterator[Any]:
    """Events with fields replaced by junk, cut short or lengthened, and things that are not events at all."""
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            yield rng.choice(_JUNK)
            continue
        ev = list(rng.choice(good))
        if kind < 0.3:
            ev = ev[: rng.randrange(len(ev))]
        elif kind < 0.4:
            ev += [rng.choice(_JUNK)]
        else:
            for _ in range(rng.randint(1, 3)):
                ev[rng.randrange(1, len(ev))] = rng.choice(_JUNK)
            if rng.random() < 0.2:
                ev[0] = rng.choice([EV_STAGE, EV_REQUEST, EV_RECORD, EV_ALLOC, 99, None])
        yield tuple(ev)


def _one_pass(comp: Component, clock: Clock) -> None:
    """What the worker does, by hand: drain and evaluate (closing any time window), or one sampling pass."""
    assert isinstance(comp, PeriodicComponent)
    if isinstance(comp, StagedComponent):
        comp.drain(clock())
        clock.t += 7200  # past every window (tail's tumbling window, canary's sub-windows)
        comp.drain(clock())
        comp.evaluate(clock())
    else:
        comp.tick()


def _check_families(name: str, fams: list[Any]) -> int:
    """Every family is one of the component's catalog entries, with its type and labels; returns the samples."""
    own: dict[str, Metric] = {m.family: m for m in registry.spec(name).metrics}
    n = 0
    for fam in fams:
        m = own.get(fam.name)
        assert m is not None, f"{name} exported {fam.name!r}, which is not one of its catalog entries"
        assert fam.type == m.type, (fam.name, fam.type, m.type)
        for s in fam.samples:
            keys = set(s.labels) - {"le"}
            assert keys == set(m.labels), f"{fam.name}: labels {sorted(keys)}, the catalog says {m.labels}"
            n += 1
    return n


def _strict_json(doc: Any) -> None:
    json.dumps(doc, allow_nan=False)


def test_the_registry_is_the_one_list_of_components() -> None:
    assert len(set(NAMES)) == len(NAMES)
    catalog = {m.component for m in CATALOG.all_metrics()} - {"core"}
    assert catalog == set(NAMES), "every component with catalog entries is registered, and only those"
    assert {m.name for m in COMPONENT_METRICS} == {m.name for m in CATALOG.all_metrics() if m.component in NAMES}
    for name in NAMES:
        assert SidecarConfig.model_fields[name].annotation is registry.spec(name).config


@pytest.mark.parametrize("name", NAMES)
def test_component_contract(name: str) -> None:
    clock = Clock()
    comp = _build(name, clock)
    assert comp.name == name
    assert isinstance(comp, PeriodicComponent), "every component uses the shared skeleton (components/periodic.py)"
    _strict_json(comp.status())

    rng = random.Random(f"conformance-{name}")
    good = _traffic(rng, 400)
    for start in range(0, len(good), 50):
        comp.handle(1234, 1, good[start:start + 50])
    junk = list(_garbage(rng, good, 600))
    for start in range(0, len(junk), 25):
        comp.handle(1234, 2, junk[start:start + 25])  # type: ignore[arg-type]
    comp.handle(1234, 3, [])
    _one_pass(comp, clock)
    comp.handle(1234, 1, good[:100])
    _one_pass(comp, clock)

    assert _check_families(name, list(comp.collect())) > 0, f"{name} exported no sample after traffic"
    _strict_json(comp.status())


@pytest.mark.parametrize("name", NAMES)
def test_stop_is_idempotent(name: str) -> None:
    clock = Clock()
    never_started = _build(name, clock)
    never_started.stop(1.0)
    never_started.stop(1.0)

    comp = _build(name, clock)
    comp.start()
    comp.start()  # a started component is left alone
    comp.handle(1, 1, _traffic(random.Random(1), 20))
    comp.stop(5.0)
    comp.stop(5.0)
    assert isinstance(comp, PeriodicComponent) and comp._worker is None
    _check_families(name, list(comp.collect()))
    _strict_json(comp.status())


def test_the_daemon_subscribes_every_enabled_component_to_its_record_types() -> None:
    from inferwatch_sidecar.daemon import Sidecar

    sc = Sidecar(SidecarConfig.model_validate({"gpu": {"backend": "fake"}}))
    sc._build_components()
    enabled = [s.name for s in sc.slots if s.component is not None]
    assert enabled == [n for n in NAMES if n != "skew"]  # skew is off by default
    subscribed = {name: types for name, types, _h in sc.pipeline.dispatch}
    for s in sc.slots:
        if s.component is not None:
            assert subscribed.get(s.name, frozenset()) == s.component.record_types
            assert sc.pipeline.component_errors[(s.name, "handle")] == 0
    before = sc.pipeline.dispatch
    sc.pipeline.subscribe("probe", frozenset({EV_RECORD}), lambda *_: None)
    takers = [s.name for s in sc.slots if s.component is not None and s.component.record_types]
    assert sc.pipeline.dispatch is not before and len(before) == len(takers)  # copy on write
