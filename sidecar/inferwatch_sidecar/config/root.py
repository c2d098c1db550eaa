"""The whole configuration: the daemon's own sections, then one section per registered component.

The component sections are not written here: :data:`SidecarConfig` is :class:`CoreConfig` plus one field
per :data:`~inferwatch_sidecar.components.registry.REGISTRY` entry, named after the component and typed
by its config model, in the registry's order. Adding a component to the registry adds its section, its
``INFERWATCH_<NAME>__...`` variables and its part of docs/config.md.

Code reaches a component's section through the registry (:func:`~inferwatch_sidecar.components.registry.section`,
or :func:`~inferwatch_sidecar.components.registry.config_of` for its typed model): the type checker knows
:data:`SidecarConfig` as :class:`CoreConfig`, which it is a subclass of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, NonNegativeInt, create_model

from inferwatch_sidecar.components import registry
from inferwatch_sidecar.config.sections import (
    AggregateConfig,
    HttpConfig,
    IngestConfig,
    LabelsConfig,
    Section,
    TracesConfig,
)

__all__ = ["CoreConfig", "SidecarConfig"]


class CoreConfig(Section):
    """The whole sidecar configuration (the YAML file's root)."""

    ingest: IngestConfig = Field(default_factory=IngestConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    labels: LabelsConfig = Field(default_factory=LabelsConfig)
    aggregate: AggregateConfig = Field(default_factory=AggregateConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)
    resource: dict[str, str] = Field(
        default_factory=dict,
        description="Extra OpenTelemetry resource attributes for the OTLP push (service.name, ...).",
    )
    shutdown_timeout_s: float = Field(10.0, gt=0, le=300, description="Longest a graceful shutdown may take.")
    heap_trim_free_bytes: int = Field(
        4 << 20, ge=0,
        description="Free bytes the C heap may hold before the sidecar gives them back to the system (glibc's "
        "malloc_trim), so RSS comes down after a burst of large objects; 0 never trims.",
    )
    heap_trim_interval_s: float = Field(2.0, gt=0, le=3600, description="Shortest time between two heap trims.")
    malloc_arena_max: int = Field(
        2, ge=0, le=1024,
        description="Most malloc arenas glibc may make for the sidecar's threads (mallopt M_ARENA_MAX, set at "
        "start; glibc's default is 8 per core, each holding its own free memory). 0, or MALLOC_ARENA_MAX in the "
        "environment, leaves glibc's choice.",
    )
    gc_thresholds: tuple[NonNegativeInt, NonNegativeInt, NonNegativeInt] = Field(
        (10_000, 50, 20),
        description="Python's cyclic garbage collector thresholds (gc.set_threshold) for the sidecar process; "
        "the objects made at start-up are frozen out of its scans. A full collection walks every live container "
        "and holds the interpreter meanwhile: with CPython's (700, 10, 10) an attacked sidecar spent a fifth of "
        "its time in them, up to 0.67 s each, and every scrape waited. Cycles are rare here (reference counts "
        "free nearly everything), so full collections are made rare (one per 1,000 young ones); the youngest "
        "generation stays small, since a collection's pause grows with it ((50000, 20, 100) gave 0.4 s pauses of "
        "the middle one). The middle one is collected every 50 young collections, not 10: staged events (up to a "
        "second in the components' stages) are mostly freed before it walks them again (live ingest: the "
        "collector's share 9-10% of the CPU at 40k events/s against 11-15% with (10000, 10, 100)).",
    )


def _with_components(core: type[CoreConfig]) -> type[CoreConfig]:
    """``core`` with a section per registered component, in the registry's order."""
    taken = sorted(set(registry.names()) & set(core.model_fields))
    if taken:
        raise TypeError(f"components {taken} are named like sections of the daemon's own config")
    sections: dict[str, Any] = {s.name: (s.config, Field(default_factory=s.config)) for s in registry.REGISTRY}
    return create_model("SidecarConfig", __base__=core, __module__=__name__, __doc__=core.__doc__, **sections)


if TYPE_CHECKING:
    SidecarConfig = CoreConfig
else:
    SidecarConfig = _with_components(CoreConfig)
