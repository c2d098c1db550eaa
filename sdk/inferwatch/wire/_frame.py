"""One frame being built: its records and its string table (the encoder's working state).

See ``encoder.py``: every path takes its string refs through :meth:`_FrameBuilder.ref`, and an event that
fails or does not fit takes them back out with :meth:`_FrameBuilder.rollback`.
"""

from __future__ import annotations

from typing import Any

from inferwatch.wire._codegen_common import TooLarge as _TooLarge
from inferwatch.wire.spec import HEADER, NONE_REF, clip

_U8_BYTES = [bytes([i]) for i in range(256)]
#: "No context seen yet" (not None: a None context must reach the general path's error).
_NO_CTX = object()


class _FrameBuilder:
    """Accumulates records and a string table for one frame."""

    __slots__ = (
        "strings", "table", "table_len", "records", "n_records", "size", "ctxs", "announced", "pre",
        "ctx_obj", "ctx_refs", "template",
    )

    def __init__(self) -> None:
        self.n_records = 0
        #: The context object of the last event on a fast path and its three string refs:
        #: consecutive events usually share the very same tuple, so an ``is`` test skips hashing it.
        self.ctx_obj: Any = _NO_CTX  # not None: a None context must reach the general path's error
        self.ctx_refs: tuple[int, int, int] = (NONE_REF, NONE_REF, NONE_REF)
        #: The last REQUEST a fast encoder packed whole (plain stages): a run of look-alikes may follow.
        self.template: Any = None
        #: Context tuple -> its three string refs, so a frame looks each context up once.
        self.ctxs: dict[Any, tuple[int, int, int]] = {}
        #: Schema IDs announced in this frame.
        self.announced: set[int] = set()
        #: SCHEMA records to put before the record being encoded.
        self.pre: list[bytes] = []
        self.strings: dict[str, int] = {}
        self.table: list[bytes] = []
        self.table_len = 0
        self.records: list[bytes] = []
        self.size = HEADER.size

    def rollback(self, mark: int) -> None:
        """Drop the strings added after the table had ``mark`` entries.

        An event that fails or does not fit must not leave its strings behind:
        they would make the flushed frame larger than ``max_frame``.
        """
        if len(self.table) <= mark:
            return
        del self.table[mark:]
        self.table_len = sum(len(b) for b in self.table)
        self.strings = {k: r for k, r in self.strings.items() if r < mark}
        # The context caches may point at dropped refs; they are only caches.
        self.ctx_obj = _NO_CTX
        self.ctxs = {}

    def ref(self, s: str | None) -> int:
        """The string ref of ``s`` in this frame, adding it to the table if need be."""
        if s is None:
            return NONE_REF
        r = self.strings.get(s)
        if r is None:
            r = len(self.table)
            if r >= NONE_REF:
                raise _TooLarge("string table full")
            b = clip(s)
            self.table.append(_U8_BYTES[len(b)] + b)
            self.table_len += 1 + len(b)
            self.strings[s] = r
        return r

    def ctx(self, ctx: Any) -> tuple[int, int, int]:
        """The three string refs of a ``(service, model, model_version)`` context."""
        refs = self.ctxs.get(ctx)
        if refs is None:
            svc, model, ver = ctx
            refs = self.ctxs[ctx] = (self.ref(svc), self.ref(model), self.ref(ver))
        return refs
