"""The one metric catalog: the single source for every exported metric.

The Prometheus exporter registers from it, ``docs/metrics.md`` is generated
from it (``python -m inferwatch_sidecar.catalog --markdown``), and the
dashboards and alert rules are checked against it.

Each component owns its own list (``core_metrics.py``, ``gpu/metrics.py``,
``drift/metrics.py``); this module only defines the record type and joins
the lists, so components never edit each other's files.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_NAME = re.compile(r"^inferwatch_[a-z][a-z0-9_]*$")
_TYPES = ("counter", "gauge", "histogram", "info")


@dataclass(frozen=True)
class Metric:
    """One metric family.

    Attributes:
        name: the family name as exposed, with ``_total`` on counters.
        type: counter, gauge, histogram or info.
        unit: a base unit (seconds, bytes, ratio, ...) or "" when unitless.
        help: one sentence for HELP and the docs.
        labels: label names, in order. Every value is capped by the exporter.
        component: which component exports it (core, gpu, drift).
        buckets: histogram bucket upper bounds, in the unit.
    """

    name: str
    type: str
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    component: str = "core"
    buckets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric {self.name!r}: name must match {_NAME.pattern}")
        if self.type not in _TYPES:
            raise ValueError(f"metric {self.name!r}: type must be one of {_TYPES}")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters end in _total")
        if self.type != "counter" and self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: only counters end in _total")
        if self.unit and self.type != "info" and not self.name.removesuffix("_total").endswith("_" + self.unit):
            raise ValueError(f"metric {self.name!r}: name must end in its unit {self.unit!r}")
        if (self.type == "histogram") != (self.buckets is not None):
            raise ValueError(f"metric {self.name!r}: histograms (and only they) have buckets")
        if "le" in self.labels or "quantile" in self.labels:
            raise ValueError(f"metric {self.name!r}: 'le' and 'quantile' are reserved labels")

    @property
    def family(self) -> str:
        """The name prometheus_client families use (no ``_total``)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


def all_metrics() -> tuple[Metric, ...]:
    """Every metric of every component, in a stable order."""
    from inferwatch_sidecar import core_metrics
    from inferwatch_sidecar.drift import metrics as drift_metrics
    from inferwatch_sidecar.gpu import metrics as gpu_metrics

    out = (*core_metrics.METRICS, *gpu_metrics.METRICS, *drift_metrics.METRICS)
    seen: set[str] = set()
    for m in out:
        if m.name in seen:
            raise ValueError(f"metric {m.name!r} is defined twice")
        seen.add(m.name)
    return out


def by_name() -> dict[str, Metric]:
    """The catalog keyed by metric name."""
    return {m.name: m for m in all_metrics()}


def series_names(m: Metric) -> tuple[str, ...]:
    """Names of the sample series a family exposes (for checking queries)."""
    if m.type == "histogram":
        return (f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count")
    if m.type == "info":
        return (f"{m.name}_info",)
    return (m.name,)


def markdown() -> str:
    """Render docs/metrics.md."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `inferwatch_sidecar/catalog.py` by",
        "`python -m inferwatch_sidecar.catalog --markdown > docs/metrics.md`. Do not edit by hand:",
        "a test fails when this file and the catalog differ.",
        "",
    ]
    for comp in ("core", "gpu", "drift"):
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
        print("usage: python -m inferwatch_sidecar.catalog --markdown", file=sys.stderr)
        sys.exit(2)
