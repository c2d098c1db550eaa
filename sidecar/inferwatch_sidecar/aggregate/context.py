"""The context the daemon shares with the aggregator and every component.

It lives with the label limiters, below both its users, so that ``aggregate`` does not import
``components`` (``components/base.py`` re-exports it as the component contract's context).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from inferwatch_sidecar.aggregate.labels import LabelLimiter

__all__ = ["ComponentContext"]


@dataclass
class ComponentContext:
    """What the daemon hands the aggregator and every component: clocks, the shared label limiters, settings.

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
    #: ``labels.max_family_series``: samples of one family a scrape can hold. A snapshot built for the
    #: exposition keeps one more per family (so the cut still shows) and counts the rest (metrics/samples.py).
    max_family_series: int | None = None

    def limiter(self, label: str) -> LabelLimiter:
        lim = self.limiters.get(label)
        if lim is None:
            lim = self.limiters[label] = LabelLimiter(label, self.default_label_budget)
        return lim
