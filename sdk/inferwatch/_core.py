"""The hot path: request scopes, stage timers and event recording.

This module records predictions, batches and queue depths and owns the runtime switch
(:func:`_set_runtime`); request scopes and IDs live in ``_scope``, stage timers in ``_stages`` and
generator streams in ``_streams``. Every name they define is importable from here too.

Everything here runs on the serving code's own thread or event loop, so it
does the least possible work: a few clock reads, a contextvar lookup and one
append to a bounded deque. Encoding, validation and sending happen on the
sender thread (``Sender`` in ``_sender.py``).

Before ``configure()`` the module-level runtime ``_rt`` is None and every
function returns after one global lookup. Decorators applied at import time
check ``_rt`` on every call, so they start emitting as soon as the SDK is
configured (the OpenTelemetry proxy pattern).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferwatch import _scope, _stages
from inferwatch._scope import (
    _NO_STAGE,
    MAX_ERROR_TYPE,
    MAX_STAGES,
    _coerce_rid,
    _coerce_trace,
    _end_stage,
    _error_type,
    _inflight,
    _is_cancelled,
    _push,
    _req,
    _req_get,
    _req_reset,
    _req_set,
    _reseed_request_ids,
    _rid_source,
    _stage_event,
    _sweep_disconnects,
    current_request_id,
    new_request_id,
    request,
    valid_request_id,
)
from inferwatch._stages import (
    _CO_ASYNC_GENERATOR,
    _CO_COROUTINE,
    _CO_GENERATOR,
    _CO_ITERABLE_COROUTINE,
    _CO_VARARGS,
    _CO_VARKEYWORDS,
    _NAME_CHARS,
    _NULL_SPAN,
    F,
    _InvalidStage,
    _kind,
    _make_wrapper,
    _NullSpan,
    _signature_source,
    _span,
    _stage_name_error,
    _valid_names,
    check_stage_name,
    stage,
)
from inferwatch._streams import _StreamTimer, _timed_agen, _timed_gen
from inferwatch.wire import EV_BATCH, EV_QUEUE, EV_RECORD

if TYPE_CHECKING:
    from inferwatch._runtime import Runtime

__all__ = [
    "F", "MAX_ERROR_TYPE", "MAX_STAGES", "_CO_ASYNC_GENERATOR", "_CO_COROUTINE", "_CO_GENERATOR",
    "_CO_ITERABLE_COROUTINE", "_CO_VARARGS", "_CO_VARKEYWORDS", "_NAME_CHARS", "_NO_STAGE", "_NULL_SPAN",
    "_InvalidStage", "_NullSpan", "_StreamTimer", "_coerce_rid", "_coerce_trace", "_end_stage", "_error_type",
    "_inflight", "_is_cancelled", "_kind", "_make_wrapper", "_push", "_req", "_req_get", "_req_reset", "_req_set",
    "_reseed_request_ids", "_rid_source", "_signature_source", "_span", "_stage_event", "_stage_name_error",
    "_sweep_disconnects", "_timed_agen", "_timed_gen", "_valid_names", "check_stage_name", "current_request_id",
    "new_request_id", "observe_batch", "record", "request", "set_queue_depth", "stage", "valid_request_id",
]

#: The configured runtime, or None before ``configure()`` / after ``shutdown()``; set only by
#: :func:`_set_runtime`, which sets the copies in ``_scope`` and ``_stages`` too.
_rt: Runtime | None = None


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
    _scope._rt = rt
    _stages._rt = rt
