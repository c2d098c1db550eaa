"""Catalog entries: keyword-only declarations, validated buckets, one module-level name per entry."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from inferwatch_sidecar.metrics import canary, capacity, core, drift, engines, gpu, saturation, skew, tail
from inferwatch_sidecar.metrics.catalog import all_metrics
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


def test_an_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="component"):
        Metric(name="inferwatch_x", type="gauge", help="Help.", component="disk")


@pytest.mark.parametrize("module", [core, gpu, drift, tail, canary, skew], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_entry_is_a_module_level_name_and_in_the_modules_tuple(module: ModuleType) -> None:
    component = module.__name__.rsplit(".", 1)[-1]
    declared = {name: v for name, v in vars(module).items() if isinstance(v, Metric)}
    assert list(declared.values()) == list(module.METRICS), "METRICS lists every declared entry, in order"
    for name, m in declared.items():
        assert name == m.name.removeprefix("inferwatch_").upper()
        assert m.component == component


def test_the_catalog_is_the_components_in_order() -> None:
    assert all_metrics() == (*core.METRICS, *gpu.METRICS, *drift.METRICS, *tail.METRICS, *canary.METRICS,
                             *skew.METRICS, *engines.METRICS, *saturation.METRICS, *capacity.METRICS)
