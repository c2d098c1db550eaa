"""A WSGI app instrumented with the real SDK, configured at import: under ``gunicorn --preload`` in the master.

Each request holds its sync worker for ``HOLD_S``, so N concurrent requests reach N distinct workers;
the response is the worker's pid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import inferwatch

HOLD_S = 0.3

inferwatch.configure()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    with inferwatch.request(), inferwatch.stage("inference"):
        time.sleep(HOLD_S)
    inferwatch.flush()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]
