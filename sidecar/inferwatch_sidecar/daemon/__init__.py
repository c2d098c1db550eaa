"""The sidecar daemon: :class:`Sidecar`, its lifecycle (:mod:`.lifecycle`), wiring (:mod:`.wiring`) and
status (:mod:`.status`)."""

from __future__ import annotations

from inferwatch_sidecar.daemon.lifecycle import HANDLED_SIGNALS, Sidecar
from inferwatch_sidecar.daemon.wiring import COMPONENT_METRICS, COMPONENTS, CORE_METRICS, ComponentSlot, StartupError

__all__ = ["COMPONENTS", "COMPONENT_METRICS", "CORE_METRICS", "HANDLED_SIGNALS", "ComponentSlot", "Sidecar",
           "StartupError"]
