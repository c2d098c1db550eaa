"""inferwatch: stage timings, request IDs and prediction records for model servers.

The public API is small; the implementation lives in private modules::

    import inferwatch

    inferwatch.configure(service="ranker", model="resnet50", model_version="v3")

    @inferwatch.stage("inference")
    def predict(x): ...

    with inferwatch.request():
        y = predict(x)
        inferwatch.record(prediction=y, confidence=0.93, features={"age": 31})

Importing this package loads the standard library only, and little of it:
the hot-path API is imported eagerly, while configuration (threads, sockets,
logging), the ASGI middleware and the logging filter load on first use.
Before :func:`configure` every function is a cheap no-op. See ``docs/sdk.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferwatch._core import (
    current_request_id,
    observe_batch,
    record,
    request,
    set_queue_depth,
    stage,
)
from inferwatch._env import DEFAULT_SOCKET
from inferwatch._version import __version__
from inferwatch.wire import WireError

if TYPE_CHECKING:
    from inferwatch._asgi import InferwatchMiddleware, instrument_fastapi
    from inferwatch._logging import RequestIdFilter
    from inferwatch._offline import record_offline, skew_sampled
    from inferwatch._runtime import configure, flush, is_configured, shutdown, stats

__all__ = [
    "DEFAULT_SOCKET",
    "InferwatchMiddleware",
    "RequestIdFilter",
    "WireError",
    "__version__",
    "configure",
    "current_request_id",
    "flush",
    "instrument_fastapi",
    "is_configured",
    "observe_batch",
    "record",
    "record_offline",
    "request",
    "set_queue_depth",
    "shutdown",
    "skew_sampled",
    "stage",
    "stats",
]

# Names loaded on first access (PEP 562), to keep ``import inferwatch`` cheap.
_LAZY = {
    "configure": "inferwatch._runtime",
    "flush": "inferwatch._runtime",
    "is_configured": "inferwatch._runtime",
    "shutdown": "inferwatch._runtime",
    "stats": "inferwatch._runtime",
    "InferwatchMiddleware": "inferwatch._asgi",
    "instrument_fastapi": "inferwatch._asgi",
    "RequestIdFilter": "inferwatch._logging",
    "record_offline": "inferwatch._offline",
    "skew_sampled": "inferwatch._offline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferwatch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
