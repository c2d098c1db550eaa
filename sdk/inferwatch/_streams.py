"""Streams: timing a generator stage's first item, the gaps between items, and a cancelled stream's tail.

Part of the hot path (see ``_core``): a decorated generator re-yields through :func:`_timed_gen` or
:func:`_timed_agen`, and its stage ends in :meth:`_StreamTimer.finish`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferwatch._scope import _is_cancelled, _req_get, _stage_event

if TYPE_CHECKING:
    from inferwatch._runtime import Runtime


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
