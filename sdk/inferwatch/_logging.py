"""Put the current request ID (and trace ID) on every log record."""

from __future__ import annotations

import logging

from inferwatch import _core
from inferwatch._env import LOG_REQUEST_ID_CHOICES, env_choice


class RequestIdFilter(logging.Filter):
    """A logging filter that sets ``record.request_id`` and ``record.trace_id`` and lets every record through.

    Attach it to a *handler* (filters on a logger do not see records that
    propagate from child loggers), then use ``%(request_id)s`` (and
    ``%(trace_id)s``) in the format::

        handler.addFilter(inferwatch.RequestIdFilter())
        handler.setFormatter(logging.Formatter("%(request_id)s %(message)s"))

    ``record.request_id`` is the request ID (the client's ``X-Request-ID``
    when it sent one), or with ``show="trace_id"`` the request's W3C trace ID
    where it has one, so logs can be joined to traces; ``record.trace_id`` is
    always the trace ID, 32 hex digits, or ``default``.

    Args:
        default: the value outside a request scope (or before ``configure()``), and
            the trace ID of an untraced request.
        show: ``request_id`` or ``trace_id``; None reads ``INFERWATCH_LOG_REQUEST_ID``
            (default ``request_id``).

    Raises:
        ValueError: ``show`` or the variable is not one of ``request_id``, ``trace_id``.
    """

    def __init__(self, default: str = "-", show: str | None = None) -> None:
        super().__init__()
        self.default = default
        if show is None:
            show = env_choice("INFERWATCH_LOG_REQUEST_ID", "request_id", LOG_REQUEST_ID_CHOICES)
        elif show not in LOG_REQUEST_ID_CHOICES:
            raise ValueError(f"show={show!r}: expected one of {', '.join(LOG_REQUEST_ID_CHOICES)}")
        self.show = show

    def filter(self, record: logging.LogRecord) -> bool:
        st = _core._req_get()
        if st is None:
            record.request_id = record.trace_id = self.default
            return True
        trace = st.trace
        tid = trace.hex() if isinstance(trace, bytes) else None
        record.trace_id = self.default if tid is None else tid
        record.request_id = tid if tid is not None and self.show == "trace_id" else st.rid
        return True
