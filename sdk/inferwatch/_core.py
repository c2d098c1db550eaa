"""The hot path: request scopes, stage timers and event recording.

Everything here runs on the serving code's own thread or event loop, so it
does the least possible work: a few clock reads, a contextvar lookup and one
append to a bounded deque. Encoding, validation and sending happen on the
sender thread (``Sender`` in ``_runtime.py``).

Before ``configure()`` the module-level runtime ``_rt`` is None and every
function returns after one global lookup. Decorators applied at import time
check ``_rt`` on every call, so they start emitting as soon as the SDK is
configured (the OpenTelemetry proxy pattern).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import keyword
import os
import sys
import types
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from inferwatch.wire import (
    EV_BATCH,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
)

if TYPE_CHECKING:
    from inferwatch._runtime import Runtime

F = TypeVar("F", bound=Callable[..., Any])

#: The configured runtime, or None before ``configure()`` / after ``shutdown()``.
_rt: Runtime | None = None

#: Most stages one request event carries; more are sent as separate STAGE events.
MAX_STAGES = 255
#: Longest error type sent (exception class names are bounded by this).
MAX_ERROR_TYPE = 64

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
_valid_names: set[str] = set()


def check_stage_name(name: object) -> str:
    """Validate a stage name; raise at definition time, never while recording.

    Raises:
        TypeError: the name is not a string.
        ValueError: the name is not 1-64 characters of ``[A-Za-z0-9_.:-]``
            starting with a letter or underscore.
    """
    err = _stage_name_error(name)
    if err is not None:
        raise err
    return cast(str, name)


def _stage_name_error(name: object) -> TypeError | ValueError | None:
    """The error a bad stage name raises at definition time, or None (and the name is cached as valid)."""
    if type(name) is not str:
        return TypeError(f"stage name must be a str, not {type(name).__name__}")
    if name in _valid_names:
        return None
    if not (0 < len(name) <= 64 and (name[0].isalpha() or name[0] == "_") and _NAME_CHARS.issuperset(name)):
        return ValueError(
            f"invalid stage name {name!r}: use 1-64 characters of letters, digits, '_', '.', ':' or '-',"
            " starting with a letter or '_' (stage names become metric label values)"
        )
    if len(_valid_names) < 10000:
        _valid_names.add(name)
    return None


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


# -- stages ------------------------------------------------------------------------------

_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08
_CO_GENERATOR = 0x20
_CO_COROUTINE = 0x80
_CO_ITERABLE_COROUTINE = 0x100
_CO_ASYNC_GENERATOR = 0x200

# The end of a stage, inlined in every wrapper: attach to the open request, or
# emit a STAGE event through the (rarer, slower) helper. Never raises.
_END = """
        __iw_t1 = __iw_clock()
        try:
            __iw_st = _req_get()
            if __iw_st is not None and __iw_st.open:
                __iw_st.stages.append((__iw_name, __iw_t1 - __iw_t0, None))
                if __iw_t0 < __iw_st.first:
                    __iw_st.first = __iw_t0
            else:
                _stage_event(__iw_rt, __iw_name, __iw_t0, __iw_t1, None, __iw_st)
        except Exception:
            __iw_rt.internal_errors += 1
"""

_SYNC_BODY = """
    __iw_rt = _rt
    if __iw_rt is None:
        return __iw_fn({call})
    if __iw_rt.tracer is not None:
        with __iw_span(__iw_rt, __iw_name):
            __iw_t0 = __iw_rt.clock()
            try:
                return __iw_fn({call})
            finally:
                __iw_end(__iw_rt, __iw_name, __iw_t0, __iw_rt.clock(), None)
    __iw_clock = __iw_rt.clock
    __iw_t0 = __iw_clock()
    try:
        return __iw_fn({call})
    finally:""" + _END

_ASYNC_BODY = """
    __iw_rt = _rt
    if __iw_rt is None:
        return await __iw_fn({call})
    if __iw_rt.tracer is not None:
        with __iw_span(__iw_rt, __iw_name):
            __iw_t0 = __iw_rt.clock()
            try:
                return await __iw_fn({call})
            finally:
                __iw_end(__iw_rt, __iw_name, __iw_t0, __iw_rt.clock(), None)
    __iw_clock = __iw_rt.clock
    __iw_t0 = __iw_clock()
    try:
        return await __iw_fn({call})
    finally:""" + _END

_GEN_BODY = """
    __iw_rt = _rt
    if __iw_rt is None:
        return (yield from __iw_fn({call}))
    return (yield from __iw_gen(__iw_rt, __iw_name, __iw_fn({call})))
"""

_AGEN_BODY = """
    __iw_rt = _rt
    if __iw_rt is None:
        __iw_it = __iw_fn({call})
    else:
        __iw_it = __iw_agen(__iw_rt, __iw_name, __iw_fn({call}))
    try:
        async for __iw_item in __iw_it:
            yield __iw_item
    finally:
        # Close the inner generator now (a consumer that stops early closes us),
        # rather than whenever the event loop finalises it.
        await __iw_it.aclose()
"""


def _signature_source(fn: Callable[..., Any]) -> tuple[str, str] | None:
    """Parameter list and call expression that mirror ``fn``'s own signature.

    A wrapper with the exact signature avoids building ``*args``/``**kwargs``
    on every call, which is most of a generic wrapper's cost. Returns None
    when the signature cannot be mirrored (the caller then uses a generic
    wrapper).
    """
    if not isinstance(fn, types.FunctionType):  # bound methods, partials, classes, builtins
        return None
    code = fn.__code__
    flags = code.co_flags
    n_pos = code.co_argcount
    n_posonly = code.co_posonlyargcount
    n_kwonly = code.co_kwonlyargcount
    names = code.co_varnames
    pos = list(names[:n_pos])
    i = n_pos
    kwonly = list(names[i : i + n_kwonly])
    i += n_kwonly
    varargs = varkw = None
    if flags & _CO_VARARGS:
        varargs = names[i]
        i += 1
    if flags & _CO_VARKEYWORDS:
        varkw = names[i]
    all_names = [*pos, *kwonly, *([varargs] if varargs else []), *([varkw] if varkw else [])]
    for n in all_names:
        if n.startswith("__iw") or n == "_rt" or keyword.iskeyword(n) or not n.isidentifier():
            return None
    params: list[str] = []
    call: list[str] = []
    for j, n in enumerate(pos):
        params.append(n)
        if j == n_posonly - 1:
            params.append("/")
        call.append(n)
    if varargs:
        params.append("*" + varargs)
        call.append("*" + varargs)
    elif kwonly:
        params.append("*")
    for n in kwonly:
        params.append(n)
        call.append(f"{n}={n}")
    if varkw:
        params.append("**" + varkw)
        call.append("**" + varkw)
    return ", ".join(params), ", ".join(call)


def _make_wrapper(fn: Callable[..., Any], name: str, kind: str) -> Callable[..., Any]:
    # Why generated code (exec) and not a closure over ``*args, **kwargs``: measured with
    # callgrind on a one-argument sync function, the wrapper's cost over a bare call is
    # 591 instructions per call before configure() against 1,415 for the closure, and
    # 3,390 against 4,213 inside a configured request. The first is the "(e') <= 100 ns per
    # stage" target of bench/sdk_overhead.py. This generator is unrelated to the wire
    # format's (inferwatch/wire/_codegen.py): it mirrors a signature, not a field table.
    sig = _signature_source(fn)
    params, call = sig if sig is not None else ("*__iw_args, **__iw_kwargs", "*__iw_args, **__iw_kwargs")
    body = {"sync": _SYNC_BODY, "async": _ASYNC_BODY, "gen": _GEN_BODY, "agen": _AGEN_BODY}[kind]
    prefix = "async def" if kind in ("async", "agen") else "def"
    src = (
        "def __iw_factory(__iw_fn, __iw_name, __iw_end, __iw_span, __iw_gen, __iw_agen):\n"
        f"    {prefix} __iw_wrapper({params}):\n"
        + "\n".join(" " * 4 + line for line in body.format(call=call).strip("\n").split("\n"))
        + "\n    return __iw_wrapper\n"
    )
    ns: dict[str, Any] = {}
    # The generated code only names the wrapped function's own parameters and our helpers.
    exec(compile(src, f"<inferwatch stage {name}>", "exec"), globals(), ns)
    wrapper: Callable[..., Any] = ns["__iw_factory"](fn, name, _end_stage, _span, _timed_gen, _timed_agen)
    if sig is not None:
        wrapper.__defaults__ = fn.__defaults__
        wrapper.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(wrapper, fn)
    return wrapper


def _kind(fn: Callable[..., Any]) -> str:
    target = getattr(fn, "__func__", fn)
    while isinstance(target, functools.partial):
        target = target.func
    code = getattr(target, "__code__", None)
    flags = 0 if code is None else code.co_flags
    if flags & _CO_ASYNC_GENERATOR:
        return "agen"
    if flags & _CO_COROUTINE:
        return "async"
    if flags & _CO_GENERATOR:
        return "gen"
    if getattr(target, "_is_coroutine_marker", None) is not None:  # inspect.markcoroutinefunction
        return "async"
    return "sync"


class _StreamTimer:
    __slots__ = ("t0", "first", "last", "items", "gaps", "clock")

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.t0 = clock()
        self.first = -1
        self.last = 0
        self.items = 0
        self.gaps: list[int] = []

    def item(self) -> None:
        now = self.clock()
        if self.items == 0:
            self.first = now
        elif len(self.gaps) < 1024:
            self.gaps.append((now - self.last) // 1000)
        self.last = now
        self.items += 1

    def finish(self, rt: Runtime, name: str, cancelled: bool) -> None:
        """End the stage: a completed stream, or a cancelled one (closed early, or its client left).

        Runs in the context of the request the stream belongs to, which tells
        whether (and when) its client disconnected.
        """
        t1 = self.clock()
        t0 = self.t0
        ttft = (self.first - t0) if self.items else t1 - t0
        try:  # _end_stage, inlined: the request is looked up once for both
            st = _req_get()
            gone = 0 if st is None else st.gone
            stream: tuple[Any, ...]
            if not cancelled and not gone:
                stream = (ttft, self.items, self.gaps)
            else:
                stream = (ttft, self.items, self.gaps, self.after(gone) if gone else 0)
                if st is not None and st.open and not gone:
                    st.gone = t1  # a request whose stream was cut short ends cancelled
            if st is not None and st.open:
                st.stages.append((name, t1 - t0, stream))
                if t0 < st.first:
                    st.first = t0
            else:
                _stage_event(rt, name, t0, t1, stream, st)  # type: ignore[arg-type]
        except Exception:  # never raise into serving code
            rt.internal_errors += 1

    def after(self, gone: int) -> int:
        """How many items were produced after ``gone`` (clock ns): generated, never delivered.

        The item times are rebuilt from the first item's time and the gaps, so
        no clock is kept per item. Past the 1,024 recorded gaps the times are
        unknown; the items there are split in proportion to the time after ``gone``.
        """
        n = self.items
        if n == 0 or self.last <= gone:
            return 0
        t = self.first
        if t > gone:
            return n
        k = 1
        for g in self.gaps:
            t += g * 1000
            if t > gone:
                return n - k
            k += 1
        rest = n - k
        return round(rest * (self.last - gone) / (self.last - t)) if self.last > t else 0


def _timed_gen(rt: Runtime, name: str, gen: Any) -> Any:
    """Re-yield ``gen``'s items, timing the first item and the gaps between items.

    A generator closed before it is exhausted (``close()``, or dropped
    unfinished) ends its stage as a cancelled stream; an exception from
    ``gen`` itself does not (the request records the error).
    """
    # The request this generator belongs to is the one open when iteration starts;
    # run the bookkeeping in that context even if iteration ends elsewhere.
    timer = _StreamTimer(rt.clock)
    ctx = contextvars.copy_context()
    cancelled = False
    try:
        nxt = gen.__next__
        while True:
            try:
                item = nxt()
            except StopIteration as stop:
                return stop.value
            timer.item()
            yield item
    except BaseException as e:
        cancelled = isinstance(e, GeneratorExit) or _is_cancelled(type(e))
        raise
    finally:
        try:
            gen.close()
        finally:
            ctx.run(timer.finish, rt, name, cancelled)


async def _timed_agen(rt: Runtime, name: str, agen: Any) -> Any:
    """Async twin of :func:`_timed_gen` (``aclose()`` and ``CancelledError`` cancel the stream)."""
    timer = _StreamTimer(rt.clock)
    ctx = contextvars.copy_context()
    cancelled = False
    try:
        nxt = agen.__anext__
        while True:
            try:
                item = await nxt()
            except StopAsyncIteration:
                return
            timer.item()
            yield item
    except BaseException as e:
        cancelled = isinstance(e, GeneratorExit) or _is_cancelled(type(e))
        raise
    finally:
        try:
            await agen.aclose()
        finally:
            ctx.run(timer.finish, rt, name, cancelled)


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


def _span(rt: Runtime, name: str) -> Any:
    """An OpenTelemetry span context manager for a stage, or a no-op."""
    tracer = rt.tracer
    if tracer is None:
        return _NULL_SPAN
    try:
        st = _req_get()
        attrs: dict[str, Any] = {"inferwatch.stage": name}
        if st is not None:
            attrs["inferwatch.request_id"] = st.rid
            for k, v in (st.attrs or {}).items():
                if isinstance(v, (str, bool, int, float)):
                    attrs[f"inferwatch.{k}"] = v
        return tracer.start_as_current_span(name, attributes=attrs)
    except Exception:
        rt.internal_errors += 1
        return _NULL_SPAN


class stage:
    """Time one stage of a request: a decorator and a context manager.

    As a decorator it works on sync and async functions and on sync and
    async generators; each call gets fresh timing state. For generators it
    also records the time to the first item, the gaps between items and the
    item count (TTFT and inter-token latency for a token stream). A
    generator closed before it is exhausted (``close()``/``aclose()``, a
    ``CancelledError``, a client disconnect) is a cancelled stream: its
    request ends ``cancelled``, its length is not counted as a generation,
    and the items it produced after the client left are counted as
    undelivered.

    Inside a ``request()`` scope the stage is attached to that request;
    outside one it is sent on its own. Before ``configure()`` it does nothing.

    Args:
        name: 1-64 characters of letters, digits, ``_ . : -``. A bad name
            raises ``ValueError`` (``TypeError`` for a non-string) when the
            decorator is applied, at definition time. A ``with`` block, which
            may build its name at request time, never raises: it runs
            untimed and the SDK counts a ``bad_name`` drop.

    Example::

        @inferwatch.stage("inference")
        def predict(x): ...

        with inferwatch.stage("postprocess"):
            ...

    A ``stage`` object used as a context manager times one block at a time:
    write ``with stage("x"):`` at the point of use (cheap), rather than
    entering one shared object from concurrent tasks.
    """

    __slots__ = ("name", "_t0", "_rt", "_span")

    def __init__(self, name: str) -> None:
        self.name = name if type(name) is str and name in _valid_names else self._check_name(name)
        self._t0: int | None = None

    def _check_name(self, name: object) -> Any:
        # Whether this is a decorator (strict) or a with-block (lenient) shows only later, so a bad
        # name turns this object into an _InvalidStage, which knows both answers: the methods of a
        # valid stage stay free of any check.
        if _stage_name_error(name) is not None:
            self.__class__ = _InvalidStage
        return name

    def __call__(self, fn: F) -> F:
        if isinstance(fn, (staticmethod, classmethod)):
            # Written above @staticmethod / @classmethod: time the function inside and keep
            # the descriptor, so the class still binds it (or not) as it would without us.
            inner = fn.__func__
            return type(fn)(_make_wrapper(inner, self.name, _kind(inner)))
        if not callable(fn):
            raise TypeError(f"stage({self.name!r}) decorates a callable, not {type(fn).__name__}")
        return _make_wrapper(fn, self.name, _kind(fn))  # type: ignore[return-value]

    def __enter__(self) -> stage:
        rt = _rt
        if rt is None:
            return self
        self._rt = rt
        if rt.tracer is not None:
            self._span = _span(rt, self.name)
            try:
                self._span.__enter__()
            except Exception:
                self._span = _NULL_SPAN
        else:
            self._span = None
        self._t0 = rt.clock()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        t0 = self._t0
        if t0 is None:
            return
        self._t0 = None
        rt = self._rt
        t1 = rt.clock()
        try:  # _end_stage, inlined: this is the most common way to time a block
            st = _req_get()
            if st is not None and st.open:
                st.stages.append((self.name, t1 - t0, None))
                if t0 < st.first:
                    st.first = t0
            else:
                _stage_event(rt, self.name, t0, t1, None, st)
        except Exception:
            rt.internal_errors += 1
        span = self._span
        if span is not None:
            try:
                span.__exit__(et, ev, tb)
            except Exception:
                rt.internal_errors += 1

    async def __aenter__(self) -> stage:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, ev, tb)


class _InvalidStage(stage):
    """A ``stage`` with a bad name: as a decorator it raises, as a context manager it is counted and times nothing."""

    __slots__ = ()

    def __call__(self, fn: F) -> F:
        err = _stage_name_error(self.name)
        assert err is not None
        raise err

    def __enter__(self) -> stage:
        rt = _rt
        if rt is not None:
            try:
                rt.bad_names += 1
                rt.sender.log.warn(
                    "stage_name", "inferwatch: a stage was not timed (counted as a bad_name drop): %s",
                    _stage_name_error(self.name),
                )
            except Exception:
                rt.internal_errors += 1
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


# -- recording ---------------------------------------------------------------------------


def record(
    prediction: Any = None,
    confidence: Any = None,
    features: Any = None,
    label: Any = None,
    **extra: Any,
) -> None:
    """Record a prediction for the current request (or outside any request).

    Nothing is validated here: the event keeps a reference to ``features``
    and the sender thread classifies the values later. Do not mutate the
    mapping after passing it (pass a copy if you must). Values that are not
    numbers or strings (NaN and None count as missing; infinity, containers
    and objects are dropped and counted as ``invalid_value``) never raise.

    Args:
        prediction: the model's output: a number or a class name.
        confidence: the model's confidence in it, a number.
        features: a mapping of feature name to number or string.
        label: the ground truth, when the caller knows it.
        **extra: more features, merged into ``features``.
    """
    rt = _rt
    if rt is None:
        return
    try:
        if extra:
            features = {**features, **extra} if isinstance(features, dict) else extra
        st = _req_get()
        if st is None:
            ev = (EV_RECORD, rt.ctx, rt.clock() + rt.offset, None, prediction, confidence, label, features)
        else:
            # A record inside a request carries the request's start time: one clock read less.
            ev = (EV_RECORD, st.ctx, st.t0 + rt.offset, st.rid, prediction, confidence, label, features)
        buf = rt.buf
        n = len(buf)
        if n < rt.cap:
            buf.append(ev)
            if n == rt.high_water:
                rt.wake.set()
        else:
            rt.buffer_full += 1
    except Exception:
        rt.internal_errors += 1


def observe_batch(size: int) -> None:
    """Record the size of one dynamic batch that was run."""
    rt = _rt
    if rt is None:
        return
    st = _req_get()
    _push(rt, (EV_BATCH, rt.ctx if st is None else st.ctx, size))


def set_queue_depth(n: int) -> None:
    """Report the current depth of the serving queue (a gauge: the latest value wins)."""
    rt = _rt
    if rt is None:
        return
    _push(rt, (EV_QUEUE, rt.ctx, n))


def _set_runtime(rt: Runtime | None) -> None:
    global _rt
    _rt = rt
