"""The catalog's record type: one exported metric family, declared once."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import pairwise

_NAME = re.compile(r"^inferwatch_[a-z][a-z0-9_]*$")
_TYPES = ("counter", "gauge", "histogram", "info")
#: A component's name: ``core`` (the daemon's own entries) or a registered component's (components/registry.py
#: checks that each component's entries name it).
_COMPONENT = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One metric family, declared with keywords only.

    Attributes:
        name: the family name as exposed, with ``_total`` on counters.
        type: counter, gauge, histogram or info.
        unit: a base unit (seconds, bytes, ratio, ...) or "" when unitless.
        help: one sentence for HELP and the docs.
        labels: label names, in order. Every value is capped by the exporter.
        component: which component exports it: ``core`` or a registered component's name.
        buckets: histogram bucket upper bounds, in the unit: finite and strictly
            increasing, because aggregation finds an observation's bucket with ``bisect``.
    """

    name: str
    type: str
    unit: str = ""
    help: str
    labels: tuple[str, ...] = ()
    component: str
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
        if not _COMPONENT.match(self.component):
            raise ValueError(f"metric {self.name!r}: component must match {_COMPONENT.pattern}")
        if (self.type == "histogram") != (self.buckets is not None):
            raise ValueError(f"metric {self.name!r}: histograms (and only they) have buckets")
        if self.buckets is not None:
            self._check_buckets(self.buckets)
        if "le" in self.labels or "quantile" in self.labels:
            raise ValueError(f"metric {self.name!r}: 'le' and 'quantile' are reserved labels")

    def _check_buckets(self, buckets: tuple[float, ...]) -> None:
        if not buckets:
            raise ValueError(f"metric {self.name!r}: a histogram needs at least one bucket")
        for b in buckets:
            if not math.isfinite(b):
                raise ValueError(f"metric {self.name!r}: bucket {b!r} is not finite (+Inf is always added)")
        for lo, hi in pairwise(buckets):
            if not lo < hi:
                raise ValueError(f"metric {self.name!r}: buckets must be strictly increasing ({lo!r} then {hi!r})")

    @property
    def family(self) -> str:
        """The name prometheus_client families use (no ``_total``)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name
