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
- optionally offers admin endpoints through ``admin_routes()``: a mapping of
  sub-path to ``handler(query: dict[str, str]) -> (status, content_type, body)``.
  The daemon serves them at ``/admin/<component name>/<sub-path>`` and only with
  ``Authorization: Bearer <admin token>``.

The daemon builds each component with ``inferwatch_sidecar.components.<name>.component.build(
config_section, ctx)`` when the section is enabled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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
