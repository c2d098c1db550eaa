"""The catalog's record type: one exported metric family, declared once."""

from __future__ import annotations

import re
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
