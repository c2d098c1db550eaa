"""The one list of sidecar components.

Every place that enumerates components derives from :data:`REGISTRY`: the
daemon's build and start order (and the reverse stop order), the config
sections (``config/root.py`` adds one per component, so the config reference
documents them too), the metric catalog (:data:`CATALOG`: the core's entries
and each component's, in this order, which ``docs/metrics.md`` follows), the
catalog entries the daemon reserves for components (running or not) and the
conformance checks (``tests/components/test_conformance.py``) and the readers of each
section into the status summary's bad-now rows (:func:`verdict_readers`).

This module imports only the components' config models and catalog entries
(light: pydantic and the catalog), never their implementation, which the
daemon imports only when the section is enabled (numpy, pyarrow). The metric
package sits below the components, so it cannot import this list: the registry
hands it down (:class:`~inferwatch_sidecar.metrics.catalog.Catalog`).

To add a component: a config model (``components/<name>/config.py``, with
``enabled`` and every field documented under ``Attributes:``), its catalog
entries (``metrics/<name>.py``, each with ``component="<name>"``), a
``build(config, ctx)`` in ``components/<name>/component.py`` and one
:class:`ComponentSpec` below; for
its bad-now verdicts on the status page and in ``inferwatch top``, either list
them as ``verdicts`` rows in its status or give the spec a reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

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
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics import drift as drift_metrics
from inferwatch_sidecar.metrics import engines as engines_metrics
from inferwatch_sidecar.metrics import gpu as gpu_metrics
from inferwatch_sidecar.metrics import saturation as saturation_metrics
from inferwatch_sidecar.metrics import skew as skew_metrics
from inferwatch_sidecar.metrics import tail as tail_metrics
from inferwatch_sidecar.metrics.catalog import Catalog
from inferwatch_sidecar.metrics.entry import Metric

__all__ = ["CATALOG", "REGISTRY", "ComponentSpec", "component_metrics", "config_of", "names", "section", "spec",
           "verdict_readers"]

M = TypeVar("M", bound=BaseModel)

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
        if self.name == "core":
            raise ValueError("'core' names the daemon's own catalog entries, not a component")
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


#: The whole metric catalog: the daemon's own entries, then every component's, in start order. Building it
#: checks that each component's entries name it and that no name is defined twice.
CATALOG = Catalog((("core", core_metrics.METRICS), *((s.name, s.metrics) for s in REGISTRY)))


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


def section(cfg: BaseModel, name: str) -> BaseModel:
    """The section of the registered component ``name`` in the whole config ``cfg``."""
    out = getattr(cfg, spec(name).name)
    assert isinstance(out, BaseModel)
    return out


def config_of(cfg: BaseModel, model: type[M]) -> M:
    """The section of the whole config ``cfg`` whose model is ``model`` (typed: ``config_of(cfg, CanaryConfig)``)."""
    for s in REGISTRY:
        if s.config is model:
            out = getattr(cfg, s.name)
            assert isinstance(out, model)
            return out
    raise KeyError(f"no registered component is configured by {model.__name__}")
