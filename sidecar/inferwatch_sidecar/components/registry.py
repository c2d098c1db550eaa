"""The one list of sidecar components.

Every place that enumerates components derives from :data:`REGISTRY`: the
daemon's build and start order (and the reverse stop order), the config
sections the daemon reads, the catalog entries the daemon reserves for
components (running or not), the config reference's skip list (components
document their own sections), the readers of each section into the status
summary's bad-now rows (:func:`verdict_readers`) and the conformance checks
(``tests/components/test_conformance.py``).

This module imports only the components' config models, catalog entries and
status readers (light: pydantic, the catalog, plain functions over the status
document), never their implementation, which the daemon imports only when the
section is enabled (numpy, pyarrow).

To add a component: a config model (``components/<name>/config.py``, with
``enabled``), its catalog entries (``metrics/<name>.py``, joined in
``metrics/catalog.py``), a ``build(config, ctx)`` in ``components/<name>/component.py``,
the section in ``config.SidecarConfig`` and one :class:`ComponentSpec` below; for
its bad-now verdicts on the status page and in ``inferwatch top``, either list
them as ``verdicts`` rows in its status or give the spec a reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from inferwatch_sidecar.components.canary import verdicts as canary_verdicts
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.capacity.config import CapacityConfig
from inferwatch_sidecar.components.drift import verdicts as drift_verdicts
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.engines.config import EnginesConfig
from inferwatch_sidecar.components.gpu import verdicts as gpu_verdicts
from inferwatch_sidecar.components.gpu.config import GpuConfig
from inferwatch_sidecar.components.saturation.config import SaturationConfig
from inferwatch_sidecar.components.skew.config import SkewConfig
from inferwatch_sidecar.components.tail.config import TailConfig
from inferwatch_sidecar.metrics import canary as canary_metrics
from inferwatch_sidecar.metrics import capacity as capacity_metrics
from inferwatch_sidecar.metrics import drift as drift_metrics
from inferwatch_sidecar.metrics import engines as engines_metrics
from inferwatch_sidecar.metrics import gpu as gpu_metrics
from inferwatch_sidecar.metrics import saturation as saturation_metrics
from inferwatch_sidecar.metrics import skew as skew_metrics
from inferwatch_sidecar.metrics import tail as tail_metrics
from inferwatch_sidecar.metrics.entry import Metric

__all__ = ["REGISTRY", "ComponentSpec", "check_sections", "component_metrics", "names", "section", "spec",
           "verdict_readers"]

#: A status reader: the component's ``/v1/status`` section and the status's time -> bad-now rows
#: (``export/summary.py``'s ``Reader``).
VerdictReader = Callable[[Mapping[str, Any], float], Iterable[dict[str, Any]]]


@dataclass(frozen=True)
class ComponentSpec:
    """One component.

    Attributes:
        name: its config section, its key in ``/v1/status`` and the ``component`` of its catalog entries.
        module: the module whose ``build(config_section, ctx)`` builds it.
        config: the model of its config section.
        metrics: every catalog entry it may export (reserved even when it is off).
        verdicts: reads its ``/v1/status`` section into the status summary's bad-now rows (what is wrong,
            since when, which runbook); None: the rows it lists as ``verdicts`` in its status stand alone.
    """

    name: str
    module: str
    config: type[BaseModel]
    metrics: tuple[Metric, ...]
    verdicts: VerdictReader | None = None

    def __post_init__(self) -> None:
        foreign = [m.name for m in self.metrics if m.component != self.name]
        if foreign:
            raise ValueError(f"component {self.name!r}: catalog entries of another component: {foreign}")
        if "enabled" not in self.config.model_fields:
            raise ValueError(f"component {self.name!r}: its config section needs an 'enabled' field")


def _spec(name: str, config: type[BaseModel], metrics: tuple[Metric, ...],
          verdicts: VerdictReader | None = None) -> ComponentSpec:
    return ComponentSpec(name, f"inferwatch_sidecar.components.{name}.component", config, metrics, verdicts)


#: Every component, in start order (stopped in the reverse order).
REGISTRY: tuple[ComponentSpec, ...] = (
    _spec("gpu", GpuConfig, gpu_metrics.METRICS, gpu_verdicts.verdicts),
    _spec("drift", DriftConfig, drift_metrics.METRICS, drift_verdicts.verdicts),
    _spec("tail", TailConfig, tail_metrics.METRICS),
    _spec("canary", CanaryConfig, canary_metrics.METRICS, canary_verdicts.verdicts),
    _spec("skew", SkewConfig, skew_metrics.METRICS),
    _spec("engines", EnginesConfig, engines_metrics.METRICS),
    _spec("saturation", SaturationConfig, saturation_metrics.METRICS),
    _spec("capacity", CapacityConfig, capacity_metrics.METRICS),
)


def names() -> tuple[str, ...]:
    """Every component's name, in start order."""
    return tuple(s.name for s in REGISTRY)


def spec(name: str) -> ComponentSpec:
    """The component called ``name``; KeyError names the known ones."""
    for s in REGISTRY:
        if s.name == name:
            return s
    raise KeyError(f"no component {name!r}; known: {', '.join(names())}")


def verdict_readers() -> dict[str, VerdictReader]:
    """Component name -> the reader of its status section into bad-now rows, for those that declare one."""
    return {s.name: s.verdicts for s in REGISTRY if s.verdicts is not None}


def component_metrics() -> tuple[Metric, ...]:
    """The catalog entries of every component, in start order."""
    return tuple(m for s in REGISTRY for m in s.metrics)


def check_sections(root: type[BaseModel]) -> None:
    """Raise TypeError unless ``root`` (the whole config) has each component's section, of its config model."""
    for s in REGISTRY:
        f = root.model_fields.get(s.name)
        if f is None or f.annotation is not s.config:
            raise TypeError(f"{root.__name__} needs a field {s.name}: {s.config.__name__} (components/registry.py "
                            "lists it)")


def section(cfg: BaseModel, name: str) -> BaseModel:
    """The section of the registered component ``name`` in the whole config ``cfg``."""
    out = getattr(cfg, spec(name).name)
    assert isinstance(out, BaseModel)
    return out
