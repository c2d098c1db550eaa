"""Stage timers: the ``stage`` decorator and context manager, and the wrappers it generates.

Part of the hot path (see ``_core``). The generated wrappers run with this module's globals: they read
:data:`_rt`, ``_req_get`` and ``_stage_event`` as one global lookup each.
"""

from __future__ import annotations

import functools
import keyword
import types
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from inferwatch._scope import _end_stage, _req_get, _stage_event
from inferwatch._streams import _timed_agen, _timed_gen

if TYPE_CHECKING:
    from inferwatch._runtime import Runtime

F = TypeVar("F", bound=Callable[..., Any])

#: The configured runtime, or None before ``configure()`` / after ``shutdown()``. Each hot-path module
#: holds its own copy so that reading it stays one global lookup; ``_core._set_runtime`` sets them all.
_rt: Runtime | None = None

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
