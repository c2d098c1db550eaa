"""The one metric catalog: the single source for every exported metric.

The Prometheus exporter registers from it, ``docs/metrics.md`` is generated
from it (``python -m inferwatch_sidecar.metrics.catalog --markdown``), and the
dashboards and alert rules are checked against it.

Each component owns its own list (``core.py``, ``gpu.py``, ``drift.py``, ``tail.py``, ``canary.py`` in
this package); this module joins the lists, so components never edit each
other's files.
"""

from __future__ import annotations

import sys

from inferwatch_sidecar.metrics import canary as canary_metrics
from inferwatch_sidecar.metrics import capacity as capacity_metrics
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics import drift as drift_metrics
from inferwatch_sidecar.metrics import engines as engines_metrics
from inferwatch_sidecar.metrics import gpu as gpu_metrics
from inferwatch_sidecar.metrics import saturation as saturation_metrics
from inferwatch_sidecar.metrics import skew as skew_metrics
from inferwatch_sidecar.metrics import tail as tail_metrics
from inferwatch_sidecar.metrics.entry import COMPONENTS, Metric

__all__ = ["Metric", "all_metrics", "by_name", "markdown", "series_names", "units"]


def all_metrics() -> tuple[Metric, ...]:
    """Every metric of every component, in a stable order."""
    out = (*core_metrics.METRICS, *gpu_metrics.METRICS, *drift_metrics.METRICS, *tail_metrics.METRICS,
           *canary_metrics.METRICS, *skew_metrics.METRICS, *engines_metrics.METRICS, *saturation_metrics.METRICS,
           *capacity_metrics.METRICS)
    seen: set[str] = set()
    for m in out:
        if m.name in seen:
            raise ValueError(f"metric {m.name!r} is defined twice")
        seen.add(m.name)
    return out


def by_name() -> dict[str, Metric]:
    """The catalog keyed by metric name."""
    return {m.name: m for m in all_metrics()}


def units() -> dict[str, str]:
    """Units by prometheus_client family name (no ``_total``), for families built without one.

    prometheus_client's ``ProcessCollector`` builds its own families, so an exporter that needs
    every family's unit (OTLP) looks them up here.
    """
    return {m.family: m.unit for m in all_metrics() if m.unit}


def series_names(m: Metric) -> tuple[str, ...]:
    """Names of the sample series a family exposes (for checking queries)."""
    if m.type == "histogram":
        # The bare name is the native histogram (protobuf exposition, docs/scale.md).
        return (f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count", m.name)
    if m.type == "info":
        return (f"{m.name}_info",)
    return (m.name,)


def markdown() -> str:
    """Render docs/metrics.md."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `inferwatch_sidecar/metrics/catalog.py` by",
        "`python -m inferwatch_sidecar.metrics.catalog --markdown > docs/metrics.md`. Do not edit by hand:",
        "a test fails when this file and the catalog differ.",
        "",
    ]
    for comp in COMPONENTS:
        ms = [m for m in all_metrics() if m.component == comp]
        if not ms:
            continue
        lines += [f"## {comp}", "", "| name | type | unit | labels | help |", "| --- | --- | --- | --- | --- |"]
        for m in ms:
            labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
            lines.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {labels} | {m.help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    else:
        print("usage: python -m inferwatch_sidecar.metrics.catalog --markdown", file=sys.stderr)
        sys.exit(2)
