"""Catalog entries: keyword-only declarations, validated buckets, one module-level name per entry."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.metrics import canary, capacity, core, drift, engines, gpu, saturation, skew, tail
from inferwatch_sidecar.metrics.catalog import Catalog
from inferwatch_sidecar.metrics.entry import Metric


def test_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Metric("inferwatch_x", "gauge", "", "Help.", component="core")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ((), "at least one bucket"),
        ((0.1, 0.1), "strictly increasing"),
        ((1.0, 0.5), "strictly increasing"),
        ((0.1, math.inf), "not finite"),
        ((math.nan,), "not finite"),
    ],
)
def test_histogram_buckets_must_be_finite_strictly_increasing_and_not_empty(
    buckets: tuple[float, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Metric(name="inferwatch_x_seconds", type="histogram", unit="seconds", help="Help.", component="core",
               buckets=buckets)


def test_only_histograms_have_buckets() -> None:
    with pytest.raises(ValueError, match="only they"):
        Metric(name="inferwatch_x", type="gauge", help="Help.", component="core", buckets=(1.0,))
    with pytest.raises(ValueError, match="only they"):
        Metric(name="inferwatch_x", type="histogram", help="Help.", component="core")


def test_a_component_name_that_is_not_an_identifier_is_refused() -> None:
    # Which components exist is the registry's to say: its catalog refuses an entry filed under another
    # component (test_the_catalog_refuses_a_foreign_entry_...); the entry itself checks the name's shape.
    with pytest.raises(ValueError, match="component must match"):
        Metric(name="inferwatch_x", type="gauge", help="Help.", component="Disk")


@pytest.mark.parametrize("module", [core, gpu, drift, tail, canary, skew], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_entry_is_a_module_level_name_and_in_the_modules_tuple(module: ModuleType) -> None:
    component = module.__name__.rsplit(".", 1)[-1]
    declared = {name: v for name, v in vars(module).items() if isinstance(v, Metric)}
    assert list(declared.values()) == list(module.METRICS), "METRICS lists every declared entry, in order"
    for name, m in declared.items():
        assert name == m.name.removeprefix("inferwatch_").upper()
        assert m.component == component


def test_the_catalog_is_the_core_then_the_registered_components_in_order() -> None:
    assert CATALOG.components == ("core", *registry.names())
    assert CATALOG.all_metrics() == (*core.METRICS, *(m for s in registry.REGISTRY for m in s.metrics))
    # Every metric module of this package is one component's list, and every one is in the catalog.
    assert {m.component for m in CATALOG.all_metrics()} == set(CATALOG.components)
    for module in (canary, capacity, drift, engines, gpu, saturation, skew, tail):
        assert registry.spec(module.__name__.rsplit(".", 1)[1]).metrics == module.METRICS


def _entry(name: str, component: str) -> Metric:
    return Metric(name=name, type="gauge", help="x", component=component)


def test_the_catalog_refuses_a_foreign_entry_a_twice_defined_name_or_component() -> None:
    a, b = _entry("inferwatch_a", "one"), _entry("inferwatch_b", "two")
    assert Catalog([("one", [a]), ("two", [b])]).by_name() == {"inferwatch_a": a, "inferwatch_b": b}
    with pytest.raises(ValueError, match="component 'one': catalog entries of another component: \\['inferwatch_b'\\]"):
        Catalog([("one", [a, b])])
    with pytest.raises(ValueError, match="metric 'inferwatch_a' is defined twice"):
        Catalog([("one", [a]), ("two", [b, _entry("inferwatch_a", "two")])])
    with pytest.raises(ValueError, match="a component is given twice"):
        Catalog([("one", [a]), ("one", [])])
    with pytest.raises(ValueError, match="component must match"):
        _entry("inferwatch_c", "Not A Name")
