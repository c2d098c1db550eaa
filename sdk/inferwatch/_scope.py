"""Request scopes and request IDs: the contextvar that holds the open request, and its REQUEST event.

Part of the hot path (see ``_core``); the stage wrappers (``_stages``) and streams (``_streams``) attach
their timings to the request open here, or send them on their own through :func:`_stage_event`.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import sys
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from inferwatch.wire import (
    EV_REQUEST,
    EV_STAGE,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
)

if TYPE_CHECKING:
    from inferwatch._runtime import Runtime

#: The configured runtime, or None before ``configure()`` / after ``shutdown()``. Each hot-path module
#: holds its own copy so that reading it stays one global lookup; ``_core._set_runtime`` sets them all.
_rt: Runtime | None = None

#: Most stages one request event carries; more are sent as separate STAGE events.
MAX_STAGES = 255
#: Longest error type sent (exception class names are bounded by this).
MAX_ERROR_TYPE = 64


# -- request IDs ------------------------------------------------------------------------

def _rid_source() -> Iterator[str]:
    # A random per-process prefix and a hex counter, formatted in C: next() on this
    # map is one call with no Python frame (an f-string costs about five times more).
    return map((os.urandom(6).hex() + "-%x").__mod__, itertools.count(1))


#: Endless process-unique request IDs; ``next(_rid_iter)`` is thread-safe under the GIL.
_rid_iter = _rid_source()


def new_request_id() -> str:
    """A process-unique request ID: a random per-process prefix and a counter.

    No syscall and no randomness per call, unlike uuid4.
    """
    return next(_rid_iter)


def _reseed_request_ids() -> None:
    global _rid_iter
    _rid_iter = _rid_source()


if hasattr(os, "register_at_fork"):
    # A forked child must not repeat its parent's request IDs.
    os.register_at_fork(after_in_child=_reseed_request_ids)


# -- request state ------------------------------------------------------------------------

#: Larger than any clock reading: "no stage has started yet".
_NO_STAGE = 1 << 126

_req: contextvars.ContextVar[request | None] = contextvars.ContextVar("inferwatch_request", default=None)
_req_get = _req.get
_req_set = _req.set
_req_reset = _req.reset


def current_request_id() -> str | None:
    """The request ID of the innermost open request scope, or None."""
    st = _req_get()
    return None if st is None else st.rid


def _push(rt: Runtime, ev: tuple[Any, ...]) -> None:
    # deque.append is atomic under the GIL; the length check keeps memory bounded.
    # A race can overshoot the cap by a few events, which is harmless.
    buf = rt.buf
    n = len(buf)
    if n < rt.cap:
        buf.append(ev)
        if n == rt.high_water:
            rt.wake.set()
    else:
        rt.buffer_full += 1


def _end_stage(rt: Runtime, name: str, t0: int, t1: int, stream: tuple[int, int, list[int]] | None) -> None:
    """Attach a finished stage to the open request, or emit it on its own."""
    try:
        st = _req_get()
        if st is not None and st.open:
            st.stages.append((name, t1 - t0, stream))
            if t0 < st.first:
                st.first = t0
        else:
            _stage_event(rt, name, t0, t1, stream, st)
    except Exception:  # never raise into serving code
        rt.internal_errors += 1


def _stage_event(
    rt: Runtime, name: str, t0: int, t1: int, stream: tuple[int, int, list[int]] | None, st: request | None
) -> None:
    """A stage outside any open request scope (or after its request ended) becomes a STAGE event."""
    try:
        if st is None:
            _push(rt, (EV_STAGE, rt.ctx, t1 + rt.offset, None, (name, t1 - t0, stream)))
        else:
            _push(rt, (EV_STAGE, st.ctx, t1 + rt.offset, st.rid, (name, t1 - t0, stream)))
    except Exception:
        rt.internal_errors += 1


#: HTTP requests in flight whose server tells whether their client has gone (uvicorn's request
#: cycle has ``disconnected``). The sender thread looks at them on every wake-up (50 ms by default)
#: and stamps the moment a client left, so a plain handler whose client hung up ends cancelled with
#: the client's wait: one set insertion per request rather than a watcher task.
_inflight: set[Any] = set()


if hasattr(os, "register_at_fork"):
    # A forked child serves none of its parent's requests.
    os.register_at_fork(after_in_child=_inflight.clear)


def _sweep_disconnects(rt: Runtime) -> None:
    """Mark the in-flight requests whose client has disconnected (the sender thread calls it)."""
    try:
        now = rt.clock()
        for req in tuple(_inflight):
            if not req.gone and not req._resp_done and req._cycle.disconnected is True:
                req.gone = now
    except Exception:
        rt.internal_errors += 1


def _is_cancelled(et: type[BaseException]) -> bool:
    # asyncio is not imported by the SDK (it costs tens of ms); if it is not
    # loaded, the exception cannot be its CancelledError.
    aio = sys.modules.get("asyncio")
    return aio is not None and issubclass(et, aio.CancelledError)


def _error_type(et: type[BaseException]) -> str:
    return et.__name__[:MAX_ERROR_TYPE] or "Exception"


class request:
    """The scope of one request, as a sync or async context manager.

    It sets the request ID in a contextvar, collects the stages that run
    inside it, and on exit sends one REQUEST event with the end-to-end time,
    the outcome and the stages. An exception marks the request as an error
    (``error_type`` is the exception's class name, at most 64 characters) and
    still propagates; ``asyncio.CancelledError`` marks it cancelled, and so
    does a client that disconnected (the ASGI middleware notices it).

    Args:
        request_id: the ID to use; one is generated cheaply when omitted. An
            ID that is not 1-128 printable ASCII characters without spaces is
            replaced by a generated one.
        model: the model name for this request (default: the configured one).
        model_version: the model version (default: the configured one).
        trace_id: a W3C trace ID (32 hex characters or 16 bytes) to send
            with the request, so the sidecar can attach exemplars.
        **attrs: extra attributes, added to this request's OpenTelemetry
            stage spans. They are not sent to the sidecar, because they
            would be unbounded labels.

    Example::

        with inferwatch.request() as req:
            log.info("handling %s", req.request_id)
    """

    # The request object is also the state the contextvar holds while it is open:
    # one allocation per request.
    __slots__ = (
        "rid", "trace", "ctx", "t0", "stages", "first", "open", "status_error", "gone", "attrs",
        "_model", "_version", "_token", "_rt",
    )

    def __init__(
        self,
        request_id: str | None = None,
        model: str | None = None,
        model_version: str | None = None,
        *,
        trace_id: str | bytes | None = None,
        **attrs: Any,
    ) -> None:
        self.rid: Any = request_id
        self._model = model
        self._version = model_version
        self.trace: Any = trace_id
        self.attrs: dict[str, Any] | None = attrs
        self._rt: Runtime | None = None

    @property
    def request_id(self) -> str | None:
        """The request ID while the scope is open (None when the SDK is off)."""
        return self.rid if self._rt is not None else None

    def __enter__(self) -> request:
        rt = _rt
        if rt is None:
            return self
        try:
            self.t0 = rt.clock()
            rid = self.rid
            if rid is None or rid == "":
                self.rid = next(_rid_iter)
            elif type(rid) is not str or not valid_request_id(rid):
                self.rid = _coerce_rid(rid)
            if self._model is None and self._version is None:
                self.ctx = rt.ctx
            else:
                c = rt.ctx
                self.ctx = (c[0], c[1] if self._model is None else str(self._model),
                            c[2] if self._version is None else str(self._version))
            if self.trace is not None:
                self.trace = _coerce_trace(self.trace)
            self.stages: list[tuple[Any, ...]] = []
            #: Start of the earliest stage that ended inside this request (the end of ingress).
            self.first = _NO_STAGE
            #: True while stages may still attach to this request.
            self.open = True
            #: Error type set by the ASGI middleware for a 5xx response without an exception.
            self.status_error: str | None = None
            #: When the client disconnected (clock ns; 0 while it is there), set by the ASGI middleware.
            self.gone = 0
            self._token = _req_set(self)
            self._rt = rt
        except Exception:
            rt.internal_errors += 1
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        rt = self._rt
        if rt is None or not self.open:
            return
        try:
            t1 = rt.clock()
            if self.gone:
                self._close(rt, t1, OUTCOME_CANCELLED, None)
            elif et is None:
                if self.status_error is None:
                    self._close(rt, t1, OUTCOME_OK, None)
                else:
                    self._close(rt, t1, OUTCOME_ERROR, self.status_error)
            elif _is_cancelled(et):
                self._close(rt, t1, OUTCOME_CANCELLED, None)
            else:
                self._close(rt, t1, OUTCOME_ERROR, _error_type(et))
        except Exception:
            rt.internal_errors += 1

    def _close(self, rt: Runtime, t1: int, outcome: int, err: str | None) -> None:
        """Leave the scope at ``t1`` and send its REQUEST event (``__exit__`` and the ASGI middleware)."""
        try:
            _req_reset(self._token)
        except ValueError:
            # Exited in another context than it was entered (unusual async use):
            # clear our state from this context instead.
            if _req_get() is self:
                _req_set(None)
        self.open = False
        stages = self.stages
        if len(stages) > MAX_STAGES:
            # One REQUEST record carries at most 255 stages; the rest go out on their own.
            self.stages = stages[:MAX_STAGES]
            for name, dur, stream in stages[MAX_STAGES:]:
                _push(rt, (EV_STAGE, self.ctx, t1 + rt.offset, self.rid, (name, dur, stream)))
            stages = self.stages
        buf = rt.buf
        n = len(buf)
        if n < rt.cap:
            buf.append((EV_REQUEST, self.ctx, t1 + rt.offset, t1 - self.t0, outcome, err, self.rid, self.trace, stages))
            if n == rt.high_water:
                rt.wake.set()
        else:
            rt.buffer_full += 1

    async def __aenter__(self) -> request:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, ev, tb)


def valid_request_id(s: str) -> bool:
    """True for 1-128 printable ASCII characters without spaces (safe in headers and logs)."""
    return 0 < len(s) <= 128 and s.isascii() and s.isprintable() and " " not in s


def _coerce_rid(rid: object) -> str:
    """Bound a caller-supplied request ID: printable ASCII, at most 128 characters."""
    try:
        s = str(rid)
    except Exception:
        return new_request_id()
    if valid_request_id(s):
        return s
    return new_request_id()


def _coerce_trace(trace: object) -> bytes | None:
    try:
        b = bytes(trace) if isinstance(trace, (bytes, bytearray)) else bytes.fromhex(str(trace))
    except Exception:
        return None
    if len(b) != 16 or not any(b):
        return None
    return b
