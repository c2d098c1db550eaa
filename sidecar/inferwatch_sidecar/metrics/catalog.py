"""The one metric catalog: the single source for every exported metric.

The Prometheus exporter registers from it, ``docs/metrics.md`` is generated from it
(``python scripts/gen_docs.py``), and the dashboards and alert rules are checked against it.

Each component owns its own list of entries (``core.py`` for the daemon's own, and ``gpu.py``,
``drift.py``, ... in this package, one per component), so components never edit each other's files. Which
components there are, and in which order, is the component registry's to say
(:data:`inferwatch_sidecar.components.registry.CATALOG` is the whole catalog): this package sits below the
components, so the registry hands the lists down to a :class:`Catalog` rather than this module naming them.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferwatch_sidecar.metrics import core
from inferwatch_sidecar.metrics.entry import Metric

__all__ = ["Catalog", "Metric", "core_units", "series_names"]


class Catalog:
    """Every exported family: the core's entries, then each component's, in the order given.

    Args:
        groups: ``(component, entries)`` pairs; each entry's ``component`` must be its group's name.

    Raises:
        ValueError: an entry in another component's group, a component given twice, or a name defined twice.
    """

    def __init__(self, groups: Sequence[tuple[str, Sequence[Metric]]]) -> None:
        seen: set[str] = set()
        names = [g for g, _ in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"a component is given twice: {names}")
        for group, entries in groups:
            foreign = [m.name for m in entries if m.component != group]
            if foreign:
                raise ValueError(f"component {group!r}: catalog entries of another component: {foreign}")
            for m in entries:
                if m.name in seen:
                    raise ValueError(f"metric {m.name!r} is defined twice")
                seen.add(m.name)
        #: The components that own entries, in the order the docs list them.
        self.components: tuple[str, ...] = tuple(names)
        self._all = tuple(m for _, entries in groups for m in entries)

    def all_metrics(self) -> tuple[Metric, ...]:
        """Every metric of every component, in a stable order."""
        return self._all

    def by_name(self) -> dict[str, Metric]:
        """The catalog keyed by metric name."""
        return {m.name: m for m in self._all}

    def units(self) -> dict[str, str]:
        """Units by prometheus_client family name (no ``_total``), for families built without one.

        prometheus_client's ``ProcessCollector`` builds its own families, so an exporter that needs
        every family's unit (OTLP) looks them up here.
        """
        return _units(self._all)

    def markdown(self) -> str:
        """Render docs/metrics.md."""
        lines = [
            "# Metrics reference",
            "",
            "Generated from the metric catalog (`inferwatch_sidecar/metrics/`, joined in the components' order by",
            "`inferwatch_sidecar/components/registry.py`) by `python scripts/gen_docs.py`. Do not edit by hand:",
            "a test fails when this file and the catalog differ.",
            "",
        ]
        for comp in self.components:
            ms = [m for m in self._all if m.component == comp]
            if not ms:
                continue
            lines += [f"## {comp}", "", "| name | type | unit | labels | help |", "| --- | --- | --- | --- | --- |"]
            for m in ms:
                labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
                lines.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {labels} | {m.help} |")
            lines.append("")
        return "\n".join(lines)


def _units(entries: Sequence[Metric]) -> dict[str, str]:
    return {m.family: m.unit for m in entries if m.unit}


def core_units() -> dict[str, str]:
    """:meth:`Catalog.units` of the daemon's own entries (those of ``ProcessCollector`` among them)."""
    return _units(core.METRICS)


def series_names(m: Metric) -> tuple[str, ...]:
    """Names of the sample series a family exposes (for checking queries)."""
    if m.type == "histogram":
        # The bare name is the native histogram (protobuf exposition, docs/scale.md).
        return (f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count", m.name)
    if m.type == "info":
        return (f"{m.name}_info",)
    return (m.name,)
