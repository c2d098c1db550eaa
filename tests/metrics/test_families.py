"""Families built from catalog entries, and collectors that describe them to a registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.metrics import core, families
from inferwatch_sidecar.metrics.entry import Metric


@pytest.mark.parametrize("m", CATALOG.all_metrics(), ids=lambda m: m.name)
def test_a_family_takes_name_help_type_and_unit_from_its_entry(m: Metric) -> None:
    fam = families.family(m)
    assert fam.name == (m.name if m.type == "info" else m.family)
    assert fam.documentation == m.help
    assert fam.type == m.type
    assert fam.unit == (m.unit if m.type != "info" else "")


def test_samples_carry_the_entrys_label_names_in_order() -> None:
    fam = families.counter(core.REQUESTS_TOTAL)
    fam.add_metric(["svc", "m", "v1", "ok"], 3)
    (s,) = fam.samples
    assert s.name == "inferwatch_requests_total"
    assert list(s.labels) == list(core.REQUESTS_TOTAL.labels)


def test_a_builder_refuses_an_entry_of_another_type() -> None:
    with pytest.raises(ValueError, match="is a counter, not a gauge"):
        families.gauge(core.REQUESTS_TOTAL)
    with pytest.raises(ValueError, match="not a histogram"):
        families.bucket_les(core.QUEUE_DEPTH)


def test_bucket_les_follow_the_entrys_buckets_with_inf_last() -> None:
    les = families.bucket_les(core.BATCH_SIZE)
    assert les == [repr(float(b)) for b in core.BATCH_BUCKETS] + ["+Inf"]


def test_info_families_take_the_entrys_labels_as_their_value() -> None:
    fam = families.info(core.SIDECAR)
    fam.add_metric([], {"version": "1.0", "python": "3.11.0"})
    (s,) = fam.samples
    assert s.name == "inferwatch_sidecar_info" and s.labels == {"version": "1.0", "python": "3.11.0"}


def test_registering_two_collectors_that_export_the_same_name_raises() -> None:
    reg = CollectorRegistry()
    reg.register(families.CatalogCollector(list, [core.REQUESTS_TOTAL, core.QUEUE_DEPTH]))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        reg.register(families.CatalogCollector(list, [core.QUEUE_DEPTH]))


def test_a_gauge_named_like_a_counters_family_is_a_duplicate_too() -> None:
    reg = CollectorRegistry()
    reg.register(families.CatalogCollector(list, [core.REQUESTS_TOTAL]))
    clash = Metric(name="inferwatch_requests", type="gauge", help="Clashes with inferwatch_requests_total.",
                   component="core")
    with pytest.raises(ValueError, match="inferwatch_requests"):
        reg.register(families.CatalogCollector(list, [clash]))


def test_a_catalog_collector_exports_what_its_function_returns() -> None:
    def collect() -> list[object]:
        g = families.gauge(core.PRODUCERS)
        g.add_metric([], 2)
        return [g]

    reg = CollectorRegistry()
    reg.register(families.CatalogCollector(collect, [core.PRODUCERS]))
    assert reg.get_sample_value("inferwatch_producers") == 2
    assert b"# HELP inferwatch_producers " + core.PRODUCERS.help.encode() in generate_latest(reg)
