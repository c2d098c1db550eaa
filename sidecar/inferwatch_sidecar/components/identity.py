"""Version identity, owned once: the ``(service, model, version)`` key and the stable (baseline) version.

- :class:`VersionKeys` turns an event's raw context into its key through the
  daemon's shared label limiters (``service``, ``model``, ``model_version``),
  so every component counts a version once against the same budgets as the
  core metrics, and a context that is not a 3-tuple becomes the overflow key
  instead of an error.
- :func:`baseline` picks the version the others are compared with: the one
  configured in ``canary.baselines`` (handed to every component as
  ``ComponentContext.baselines``), else the busiest, a tie going to the
  version that sorts first (release names usually sort by age). The canary
  judge and the drift engine's canary comparison both call it, so they never
  compare against different baselines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch_sidecar.components.base import ComponentContext

__all__ = ["Key", "VersionKeys", "baseline"]

#: (service, model, version), as capped label values.
Key = tuple[str, str, str]


class VersionKeys:
    """The key of an event's context ``(service, model, version)``, through the shared label limiters."""

    __slots__ = ("_svc", "_model", "_ver")

    def __init__(self, ctx: ComponentContext) -> None:
        self._svc = ctx.limiter("service")
        self._model = ctx.limiter("model")
        self._ver = ctx.limiter("model_version")

    def of(self, raw: Any) -> Key:
        """The key of a decoded context tuple; anything else gets the limiters' key for missing values."""
        try:
            svc, model, ver = raw
        except (TypeError, ValueError):
            svc = model = ver = None
        return (self._svc.get(svc), self._model.get(model), self._ver.get(ver))

    def version(self, ver: Any) -> str:
        """A version as its capped label value (what :meth:`of` puts third)."""
        return str(self._ver.get(ver))


def baseline(model: str, traffic: Mapping[str, float], baselines: Mapping[str, str]) -> str | None:
    """The stable version of ``model`` among the versions in ``traffic`` (version -> events in the window).

    The version configured for ``model`` in ``baselines`` when it is in ``traffic`` (None when it is
    configured but absent: a configured baseline is never replaced by a guess); otherwise the busiest
    version, a tie going to the version that sorts first. None when ``traffic`` is empty.
    """
    want = baselines.get(model)
    if want is not None:
        return want if want in traffic else None
    if not traffic:
        return None
    return min(traffic, key=lambda v: (-traffic[v], v))
