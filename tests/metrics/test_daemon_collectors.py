"""The daemon's registry: every collector describes the catalog entries it exports."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import COMPONENT_METRICS, CORE_METRICS, Sidecar
from inferwatch_sidecar.metrics import core, drift, gpu
from inferwatch_sidecar.metrics.core import PROCESS_METRICS
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.families import CatalogCollector


def sidecar(tmp_path: Path) -> Sidecar:
    tree = {"ingest": {"socket": str(tmp_path / "s.sock")}, "http": {"port": 0},
            "gpu": {"enabled": False}, "drift": {"enabled": False}}
    return Sidecar(load_config(environ={}, overrides=tree), environ={})


def test_the_daemons_collectors_describe_the_whole_catalog_once() -> None:
    described = [*CORE_METRICS, *COMPONENT_METRICS, *PROCESS_METRICS]
    assert len(set(described)) == len(described)
    assert set(described) == set(CATALOG.all_metrics())


@pytest.mark.parametrize(
    "m", [core.REQUESTS_TOTAL, core.INGEST_LAG_SECONDS, core.COMPONENT_UP, core.SIDECAR,
          core.SIDECAR_PROCESS_OPEN_FDS, gpu.GPU_MEMORY_USED_BYTES, drift.DRIFT_LABELS_TOTAL],
    ids=lambda m: m.name,
)
def test_the_daemons_registry_refuses_a_second_exporter_of_a_catalog_name(tmp_path: Path, m: Metric) -> None:
    sc = sidecar(tmp_path)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        sc.registry.register(CatalogCollector(list, [m]))


def test_what_the_core_collectors_export_is_what_they_describe(tmp_path: Path) -> None:
    sc = sidecar(tmp_path)
    ctx = ("svc", "m", "v1")
    with sc.aggregator.lock:
        sc.aggregator.process([(EV_REQUEST, ctx, 1, 5_000_000, 0, None, "r1", None, [("queue", 1_000_000, None)])],
                              [0] * 16)
    by_family = {(m.name if m.type == "info" else m.family): m for m in CATALOG.all_metrics()}
    exported = {by_family[f.name] for f in sc.collect()}
    assert exported <= {*CORE_METRICS, *PROCESS_METRICS}
    assert set(CORE_METRICS) <= exported
