"""The plug-in contract for sidecar components (GPU monitor, drift engine).

The daemon owns ingest, HTTP and export. A component:

- is built by a ``build(config_section, ctx)`` function in its package from its
  own validated config section;
- is started and stopped by the daemon (``start`` / ``stop``);
- receives the decoded records it asked for (``record_types``) through
  ``handle``, on the ingest thread. ``handle`` must be cheap and must never
  block or raise: it is called for every frame;
- exposes metrics from the catalog at scrape time (``collect``), as
  prometheus_client metric families. The OTLP exporter converts the same
  families, so there is one source for both;
- reports a JSON-able ``status()`` for ``/v1/status``;
- optionally implements one of the declared hooks below; the daemon checks
  for them with ``isinstance`` against these protocols, never ``getattr``:

  - :class:`ServesAdmin`: ``admin_routes()``, a mapping of sub-path to
    ``handler(query: dict[str, str]) -> (status, content_type, body)``. The
    daemon serves them at ``/admin/<component name>/<sub-path>`` and only with
    ``Authorization: Bearer <admin token>``;
  - :class:`Connects`: ``connect(peers)``, called once every component is
    built, with :class:`Peers`, through which a component finds the others'
    typed hooks;
  - :class:`EstimatesAccuracy`: ``estimated_accuracy()``, the drift
    component's accuracy estimate per (model, version), which the canary judge
    reads through :meth:`Peers.accuracy` instead of parsing exported samples;
  - :class:`TakesOffline`: ``post_offline(body)``, the skew component's
    ``POST /v1/skew``.

The one list of components is :mod:`inferwatch_sidecar.components.registry`;
the daemon builds each enabled one with its module's ``build(config_section,
ctx)``. Most components subclass :class:`~inferwatch_sidecar.components.periodic.PeriodicComponent`
(or its staged form), which implements this contract once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from inferwatch_sidecar.aggregate.labels import LabelLimiter

#: Signature of an admin route handler: query parameters in, (HTTP status, content type, body) out.
#: For POST requests the daemon passes the request body as the ``"body"`` entry.
AdminHandler = Callable[[dict[str, str]], tuple[int, str, bytes]]


@dataclass
class ComponentContext:
    """What the daemon hands every component.

    Attributes:
        clock: wall-clock seconds (injectable for tests).
        monotonic: monotonic seconds (injectable for tests).
        limiters: the shared per-label cardinality limiters, by label name.
            ``limiter(name)`` creates one with the default budget on first use.
        logger: the component's logger.
        default_label_budget: budget for labels without an explicit one.
    """

    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    limiters: dict[str, LabelLimiter] = field(default_factory=dict)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("inferwatch.sidecar"))
    default_label_budget: int = 100
    #: The stable version per model (``canary.baselines``), which every component's baseline honours
    #: (:func:`inferwatch_sidecar.components.identity.baseline`).
    baselines: Mapping[str, str] = field(default_factory=dict)

    def limiter(self, label: str) -> LabelLimiter:
        lim = self.limiters.get(label)
        if lim is None:
            lim = self.limiters[label] = LabelLimiter(label, self.default_label_budget)
        return lim



@runtime_checkable
class Component(Protocol):
    """What the daemon expects of a plug-in component."""

    #: Config section name and key in /v1/status.
    name: str
    #: Wire record types (``inferwatch.wire.EV_*``) this component wants.
    record_types: frozenset[int]

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None: ...

    def collect(self) -> Iterable[Any]: ...

    def status(self) -> dict[str, Any]: ...


# -- optional hooks ---------------------------------------------------------------------------------------------------

@runtime_checkable
class ServesAdmin(Protocol):
    """A component with admin endpoints (served under ``/admin/<name>/``, token required)."""

    def admin_routes(self) -> Mapping[str, AdminHandler]: ...


@runtime_checkable
class EstimatesAccuracy(Protocol):
    """A component that estimates each model version's accuracy (the drift component)."""

    def estimated_accuracy(self) -> Mapping[tuple[str, str], float]:
        """The latest estimate per (model, version), from the last evaluation; cheap, never raises."""
        ...


@runtime_checkable
class TakesOffline(Protocol):
    """A component that takes offline values posted to ``/v1/skew`` (the skew component)."""

    def post_offline(self, body: bytes) -> tuple[int, dict[str, Any]]: ...


H = TypeVar("H")


class Peers:
    """The daemon's built components, as handed to :meth:`Connects.connect`.

    A component asks for a declared hook, not for a name: ``peers.accuracy()`` (or ``peers.first(cls)``).
    """

    def __init__(self, components: Mapping[str, Any]) -> None:
        self._components = dict(components)

    def first(self, hook: type[H]) -> H | None:
        """The first component (in start order) that implements the runtime-checkable protocol ``hook``."""
        for comp in self._components.values():
            if isinstance(comp, hook):
                return comp
        return None

    def accuracy(self) -> EstimatesAccuracy | None:
        """The component that estimates accuracy per model version (the drift component), or None."""
        for comp in self._components.values():
            if isinstance(comp, EstimatesAccuracy):
                return comp
        return None

    def names(self) -> list[str]:
        return list(self._components)


@runtime_checkable
class Connects(Protocol):
    """A component that reads another component's results; called once all are built."""

    def connect(self, peers: Peers) -> None: ...
