"""Put the current request ID on every log record."""

from __future__ import annotations

import logging

from inferwatch._core import current_request_id


class RequestIdFilter(logging.Filter):
    """A logging filter that sets ``record.request_id`` and lets every record through.

    Attach it to a *handler* (filters on a logger do not see records that
    propagate from child loggers), then use ``%(request_id)s`` in the format::

        handler.addFilter(inferwatch.RequestIdFilter())
        handler.setFormatter(logging.Formatter("%(request_id)s %(message)s"))

    Args:
        default: the value outside a request scope (or before ``configure()``).
    """

    def __init__(self, default: str = "-") -> None:
        super().__init__()
        self.default = default

    def filter(self, record: logging.LogRecord) -> bool:
        rid = current_request_id()
        record.request_id = self.default if rid is None else rid
        return True
