"""The inferwatch wire format, version 1: encoder and reference decoder.

This module is the executable form of ``docs/wire-format.md``; the two must
agree. It uses the standard library only, so the SDK can import it, and it is
written for speed because the sidecar decodes with the same code.

Design in one paragraph: a *frame* is one datagram. It starts with a fixed
32-byte header, then a per-frame string table, then length-prefixed records.
Strings (service, model, stage, error type, categorical values, feature names)
are sent once per frame and referenced by a ``u16`` index. Feature names are
not sent with each event: a SCHEMA record announces the names and kinds once
under a producer-unique ``schema_id`` and RECORD events carry only values.
The encoder re-announces every schema it uses at least every
``schema_repeat_s`` seconds, so a restarted sidecar recovers on its own.
Every record carries its own length, so a decoder skips record types it does
not know and one bad record never costs the rest of the frame.

Event tuples (what the SDK's hot path appends, and what the decoder returns)
are plain tuples for speed; their layouts are documented beside the ``EV_*``
constants below.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_FRAME",
    "WireError",
    "Frame",
    "Schema",
    "Encoder",
    "Decoder",
    "DROP_REASONS",
]

MAGIC = b"IW"
VERSION = 1
#: Largest frame the encoder writes. Fits a UDP datagram on loopback and the
#: default Linux Unix-datagram limit.
MAX_FRAME = 65000
MAX_STRING = 255
MAX_REQUEST_ID = 128
MAX_FEATURES = 256
MAX_GAPS = 1024
NONE_REF = 0xFFFF

# Record / event types. The same codes are used on the wire and as the first
# element of the event tuples.
#
#   EV_HELLO   (EV_HELLO, sdk_version, language, hostname, start_unix_ns)
#   EV_REQUEST (EV_REQUEST, ctx, end_unix_ns, duration_ns, outcome, error_type,
#               request_id, trace_id, stages)
#   EV_STAGE   (EV_STAGE, ctx, end_unix_ns, request_id, stage)
#   EV_RECORD  (EV_RECORD, ctx, unix_ns, request_id, prediction, confidence,
#               label, features)
#   EV_BATCH   (EV_BATCH, ctx, size)
#   EV_QUEUE   (EV_QUEUE, ctx, depth)
#   EV_DROPS   (EV_DROPS, {reason: cumulative_count})
#   EV_ALLOC   (EV_ALLOC, unix_ns, device, allocated, reserved, active,
#               inactive_split, num_alloc_retries, num_ooms, expandable_segments)
#
# ``ctx`` is a ``(service, model, model_version)`` tuple of str or None.
# A stage is ``(name, duration_ns, stream)`` with ``stream`` None or
# ``(ttft_ns, items, gaps_us)``: time to the first item, items yielded, and
# the gaps between consecutive items in microseconds (at most MAX_GAPS sent).
# ``outcome`` is OUTCOME_OK / OUTCOME_ERROR / OUTCOME_CANCELLED.
#
# On encode, EV_RECORD's ``features`` is a mapping name -> value. On decode it
# is replaced by ``(schema, numeric_values, categorical_values)`` where the
# tuples line up with ``schema.numeric`` and ``schema.categorical``; a
# missing numeric value is NaN and a missing categorical value is None.
EV_HELLO = 1
EV_REQUEST = 2
EV_STAGE = 3
EV_SCHEMA = 4  # wire only
EV_RECORD = 5
EV_BATCH = 6
EV_QUEUE = 7
EV_DROPS = 8
EV_ALLOC = 9

OUTCOME_OK = 0
OUTCOME_ERROR = 1
OUTCOME_CANCELLED = 2
OUTCOMES = ("ok", "error", "cancelled")

KIND_NUMERIC = 0
KIND_CATEGORICAL = 1

TAG_NONE = 0
TAG_FLOAT = 1
TAG_STRING = 2

#: Drop reasons the SDK reports in DROPS records, by wire code.
DROP_REASONS = {
    1: "buffer_full",
    2: "socket_absent",
    3: "send_failed",
    4: "invalid_value",
    5: "too_many_features",
    6: "event_too_large",
    7: "encode_error",
    8: "bad_name",
}
DROP_CODES = {v: k for k, v in DROP_REASONS.items()}

_HEADER = struct.Struct("<2sBBIQIqHH")  # 32 bytes
_REC = struct.Struct("<BH")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_F64 = struct.Struct("<d")
_HELLO = struct.Struct("<HHHq")
_REQUEST = struct.Struct("<HHHqQBHB")
_STAGE_HDR = struct.Struct("<HHHq")
_STAGE = struct.Struct("<HQB")
_STREAM = struct.Struct("<QIH")
_SCHEMA = struct.Struct("<IH")
_SCHEMA_FIELD = struct.Struct("<HB")
_RECORD = struct.Struct("<HHHqI")
_CTX_U32 = struct.Struct("<HHHI")
_DROP = struct.Struct("<BQ")
_ALLOC = struct.Struct("<qBQQQQQQB")
_CTX = struct.Struct("<HHH")
_REQUEST_TAIL = struct.Struct("<qQBHB")
_RECORD_TAIL = struct.Struct("<qI")
# Decoder fast paths: the record header (type, length) is skipped and a RECORD's context
# (as its 6 raw bytes), time, schema ID and request-ID length are read in one call...
_RECORD_FAST = struct.Struct("<3x6sqIB")
# ...and likewise a REQUEST's context, end, duration, outcome, error type, stage count
# and request-ID length.
_REQUEST_FAST = struct.Struct("<3x6sqQBHBB")
# A RECORD's confidence and the label's value tag.
_F64_U8 = struct.Struct("<dB")
_EMPTY = struct.Struct("<")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_U8_BYTES = [bytes([i]) for i in range(256)]
_NAN_F64 = struct.pack("<d", math.nan)

_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


class WireError(ValueError):
    """A frame or record that does not follow the wire format.

    Attributes:
        reason: a short, bounded reason code suitable as a metric label.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Schema(NamedTuple):
    """A decoded feature schema: names split by kind, in wire order."""

    schema_id: int
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    num_struct: struct.Struct
    cat_struct: struct.Struct


class Frame(NamedTuple):
    """One decoded datagram."""

    pid: int
    producer_id: int
    seq: int
    sent_unix_ns: int
    records: list[tuple[Any, ...]]
    #: Reason codes of records that were dropped while the rest survived.
    errors: list[str]


def _clip(s: str, limit: int = MAX_STRING) -> bytes:
    b = s.encode("utf-8", "replace")
    if len(b) <= limit:
        return b
    # Cut on a character boundary so the result is still valid UTF-8.
    return b[:limit].decode("utf-8", "ignore").encode("utf-8")


def classify(value: Any) -> tuple[int, Any] | None:
    """Classify one feature value for the wire.

    Returns:
        ``(KIND_NUMERIC, float)`` for a finite number or bool (NaN and None
        become a missing numeric value), ``(KIND_CATEGORICAL, str)`` for a
        string, or None for anything else (inf, containers, objects), which
        the caller counts as ``invalid_value`` and drops. Other number types
        (numpy scalars, ``Decimal``, ``Fraction``: anything without a
        ``shape`` that ``float()`` converts) are numeric too, so a value
        classifies the same whichever path the encoder takes.
    """
    t = type(value)
    if t is float:
        if value != value:
            return (KIND_NUMERIC, math.nan)
        if value in (math.inf, -math.inf):
            return None
        return (KIND_NUMERIC, value)
    if t is int or t is bool:
        # Any int a float holds (the encoder's fast path packs ints the same way);
        # past about 1.8e308 float() overflows and the value is dropped.
        try:
            return (KIND_NUMERIC, float(value))
        except OverflowError:
            return None
    if t is str:
        return (KIND_CATEGORICAL, value)
    if value is None:
        return (KIND_NUMERIC, math.nan)
    # numpy scalars and other number-likes, without importing numpy.
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        try:
            return classify(item())
        except Exception:
            return None
    if isinstance(value, str):
        return (KIND_CATEGORICAL, str(value))
    if isinstance(value, (int, float)) or (
        # Decimal, Fraction and other number types; arrays and tensors (a shape) are not scalars.
        hasattr(t, "__float__") and item is None and getattr(value, "shape", None) is None
    ):
        try:
            return classify(float(value))  # subclasses of int and float too (an IntEnum, say)
        except Exception:  # too large for a float, or a __float__ that raises
            return None
    return None


class _TooLarge(Exception):
    """An event does not fit a frame (string table or record length limit)."""


_NO_CTX = object()


class _FrameBuilder:
    """Accumulates records and a string table for one frame."""

    __slots__ = (
        "strings", "table", "table_len", "records", "n_records", "size", "ctxs", "announced", "pre",
        "ctx_obj", "ctx_refs",
    )

    def __init__(self) -> None:
        self.n_records = 0
        #: The context object of the last REQUEST on the fast path and its three string refs:
        #: consecutive events usually share the very same tuple, so an ``is`` test skips hashing it.
        self.ctx_obj: Any = _NO_CTX  # not None: a None context must reach the general path's error
        self.ctx_refs: tuple[int, int, int] = (NONE_REF, NONE_REF, NONE_REF)
        #: Context tuple -> its packed three string refs, so a frame packs each context once.
        self.ctxs: dict[Any, bytes] = {}
        #: Schema IDs announced in this frame.
        self.announced: set[int] = set()
        #: SCHEMA records to put before the record being encoded.
        self.pre: list[bytes] = []
        self.strings: dict[str, int] = {}
        self.table: list[bytes] = []
        self.table_len = 0
        self.records: list[bytes] = []
        self.size = _HEADER.size

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
        if s is None:
            return NONE_REF
        r = self.strings.get(s)
        if r is None:
            r = len(self.table)
            if r >= NONE_REF:
                raise _TooLarge("string table full")
            b = _clip(s)
            self.table.append(_U8.pack(len(b)) + b)
            self.table_len += 1 + len(b)
            self.strings[s] = r
        return r


class Encoder:
    """Turns SDK events into wire frames. Not thread-safe: one per sender.

    Args:
        pid: the producer's process ID.
        producer_id: a random 64-bit ID for this producer (new after fork).
        clock: wall-clock nanoseconds, injectable for tests.
        schema_repeat_s: re-announce a schema at least this often.
        max_frame: largest frame to emit, in bytes.
    """

    #: Encode plain REQUEST events on the fast path. Tests turn it off on an
    #: instance to check that both paths write the same bytes.
    _fast_request = True

    def __init__(
        self,
        pid: int,
        producer_id: int,
        clock: Any = None,
        schema_repeat_s: float = 2.0,
        max_frame: int = MAX_FRAME,
        max_schemas: int = 1024,
    ) -> None:
        import time

        self.pid = pid & _U32_MAX
        self.producer_id = producer_id & _U64_MAX
        self._clock = clock or time.time_ns
        self._repeat_ns = int(schema_repeat_s * 1e9)
        self.max_frame = max_frame
        self._max_schemas = max_schemas
        self._seq = 0
        #: Whether the last REQUEST on the fast path had a streamed stage.
        self._streamy = False
        #: The last REQUEST packed whole by the fast path: a run of look-alikes may follow.
        self._plain: Any = None
        self._next_schema = 1
        # key -> [schema_id, numeric_names, categorical_names, last_announced_ns, numeric Struct]
        self._schemas: OrderedDict[tuple[tuple[str, int], ...], list[Any]] = OrderedDict()
        # Fast path: names of an all-numeric feature dict -> its schema entry.
        self._fast: dict[tuple[Any, ...], list[Any]] = {}
        #: Events the encoder itself dropped, by reason name (cumulative).
        self.drops: dict[str, int] = {}

    def _drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n

    # -- public -------------------------------------------------------------------

    def encode(self, events: list[tuple[Any, ...]], extra: list[tuple[Any, ...]] | None = None) -> list[bytes]:
        """Encode events into as many frames as needed.

        ``extra`` events (HELLO, DROPS) are put at the front of the first
        frame. Events that cannot be encoded are counted in ``self.drops``
        and skipped; this method does not raise for bad event content.
        """
        return [f for f, _ in self.encode_counted(events, extra)]

    def encode_counted(
        self, events: list[tuple[Any, ...]], extra: list[tuple[Any, ...]] | None = None
    ) -> list[tuple[bytes, int]]:
        """Like :meth:`encode`, but each frame comes with how many of ``events`` it carries.

        The sender needs the counts to report exactly how many events a lost
        frame cost. ``extra`` events are not counted.
        """
        frames: list[tuple[bytes, int]] = []
        fb = _FrameBuilder()
        now = self._clock()
        max_frame = self.max_frame
        n_extra = len(extra) if extra else 0
        counted = 0
        pending: list[Any] = []  # schema entries announced by the event being encoded
        evs = (extra + events) if extra else events
        total = len(evs)
        i = 0
        while i < total:
            ev = evs[i]
            i += 1
            if pending:
                pending.clear()
            mark = len(fb.table)
            try:
                rec: bytes | None = self._encode_event(fb, ev, now, pending)
            except _TooLarge:
                rec = None  # string table full or record too big: retry on a fresh frame
            except Exception:
                self._drop("encode_error")
                fb.rollback(mark)
                continue
            if rec is None or fb.size + fb.table_len + len(rec) > max_frame:
                # Does not fit in the current frame: flush it and retry on a fresh one.
                fb.rollback(mark)
                if fb.records:
                    frames.append((self._finish(fb, now), counted))
                    counted = 0
                fb = _FrameBuilder()
                pending.clear()
                try:
                    rec = self._encode_event(fb, ev, now, pending)
                except _TooLarge:
                    rec = None
                except Exception:
                    self._drop("encode_error")
                    fb = _FrameBuilder()
                    continue
                if rec is None or fb.size + fb.table_len + len(rec) > max_frame:
                    self._drop("event_too_large")
                    fb = _FrameBuilder()
                    continue
            fb.records.append(rec)
            fb.size += len(rec)
            if pending:
                fb.n_records += 1 + len(fb.pre)  # SCHEMA records travel in the same bytes
                for entry in pending:
                    # Only now is the schema really in a frame.
                    entry[3] = now
                    fb.announced.add(entry[0])
            else:
                fb.n_records += 1
            if i > n_extra:
                counted += 1
            if self._plain is ev and i < total:
                # A plain REQUEST on the fast path: the requests after it usually have the
                # same shape (context, stage names, no error), so they are packed in a run.
                j = self._run(fb, ev, evs, i, max_frame)
                if j > i:
                    counted += j - i  # a run never contains extra events (HELLO, DROPS)
                    i = j
        if fb.records:
            frames.append((self._finish(fb, now), counted))
        return frames

    def _run(self, fb: _FrameBuilder, tmpl: tuple[Any, ...], evs: list[tuple[Any, ...]], i: int, max_frame: int) -> int:
        """Pack the REQUESTs from ``evs[i]`` on that are shaped like ``tmpl`` into ``fb``; return the next index.

        Shaped like the template means: the same context object, the same stage
        names, no error type, plain stages, a ``str`` request ID and no trace or a
        16-byte one. Their strings are all in the frame's table already, so each
        is one ``Struct.pack`` with the template's refs and adds no string: the
        bytes are exactly what :meth:`_encode_event` would write. The run stops at
        the first event that differs or fails to pack, or when the frame is full;
        the general loop takes it from there.
        """
        stages = tmpl[8]
        n = len(stages)
        runner = _RUNS.get(n)
        if runner is None:
            runner = _make_run(n)
        strings = fb.strings
        try:
            names = [name for name, _, _ in stages]
            refs = [NONE_REF if name is None else strings[name] for name in names]
            j, used = runner(
                evs, i, len(evs), tmpl[1], *fb.ctx_refs, fb.records, max_frame - fb.size - fb.table_len,
                *names, *refs,
            )
        except Exception:  # an odd template (it packed, so this is only a guard): no run
            return i
        fb.size += used
        fb.n_records += j - i
        return int(j)

    def forget_announcements(self) -> None:
        """Re-announce every schema in the next frame.

        The sender calls this when a send fails, because the receiver may have
        restarted and lost its schema cache.
        """
        for entry in self._schemas.values():
            entry[3] = None

    # -- internals ------------------------------------------------------------------

    def _finish(self, fb: _FrameBuilder, now: int) -> bytes:
        self._seq = (self._seq + 1) & _U32_MAX
        head = _HEADER.pack(
            MAGIC, VERSION, 0, self.pid, self.producer_id, self._seq, now, len(fb.table), fb.n_records
        )
        return b"".join([head, *fb.table, *fb.records])

    @staticmethod
    def _record(rtype: int, payload: bytes) -> bytes:
        if len(payload) > 0xFFFF:
            raise _TooLarge("record too large")
        return _REC.pack(rtype, len(payload)) + payload

    @staticmethod
    def _rid(rid: Any) -> bytes:
        if not rid:
            return b"\x00"
        if type(rid) is str:
            b = rid.encode("utf-8", "replace")
            if len(b) <= MAX_REQUEST_ID:
                return _U8_BYTES[len(b)] + b
        b = _clip(str(rid), MAX_REQUEST_ID)
        return _U8_BYTES[len(b)] + b

    @staticmethod
    def _ctx(fb: _FrameBuilder, ctx: Any) -> bytes:
        b = fb.ctxs.get(ctx)
        if b is None:
            svc, model, ver = ctx
            b = _CTX.pack(fb.ref(svc), fb.ref(model), fb.ref(ver))
            fb.ctxs[ctx] = b
        return b

    def _stages(self, fb: _FrameBuilder, stages: Any) -> list[bytes]:
        strings = fb.strings
        out = []
        for st in stages:
            name, dur, stream = st
            r = strings.get(name)
            if r is None:
                r = fb.ref(name)
            if stream is None:
                try:
                    out.append(_STAGE.pack(r, dur, 0))
                except struct.error:
                    out.append(_STAGE.pack(r, _u64(dur), 0))
                continue
            ttft, items, gaps = stream
            gaps = gaps[:MAX_GAPS]
            n = len(gaps)
            gs = _struct_for("I", n)
            try:
                g = gs.pack(*gaps)
            except struct.error:
                g = gs.pack(*[min(max(int(x), 0), _U32_MAX) for x in gaps])
            out.append(_STAGE.pack(r, _u64(dur), 1))
            out.append(_STREAM.pack(_u64(ttft), min(max(int(items), 0), _U32_MAX), n))
            out.append(g)
        return out

    def _value(self, fb: _FrameBuilder, v: Any) -> bytes:
        if v is None:
            return b"\x00"
        t = type(v)
        if t is str:
            return b"\x02" + _U16.pack(fb.ref(v))
        if t is float and v - v == 0.0:
            return b"\x01" + _F64.pack(v)
        c = classify(v)
        if c is None:
            self._drop("invalid_value")
            return b"\x00"
        kind, val = c
        if kind == KIND_NUMERIC:
            if val != val:
                return b"\x00"
            return b"\x01" + _F64.pack(val)
        return b"\x02" + _U16.pack(fb.ref(val))

    def _conf(self, conf: Any) -> bytes:
        if conf is None:
            return _NAN_F64
        if type(conf) is float and conf - conf == 0.0:
            return _F64.pack(conf)
        c = classify(conf)
        if c is None or c[0] != KIND_NUMERIC:
            self._drop("invalid_value")
            return _NAN_F64
        return _F64.pack(c[1])

    def _features(self, fb: _FrameBuilder, features: Any, now: int, pending: list[Any]) -> tuple[int, bytes]:
        """Schema ID and packed values; appends the SCHEMA record to fb when it must be announced."""
        # Fast path: every value a finite number, and a key list seen before.
        if type(features) is dict:
            keys = tuple(features)
            entry = self._fast.get(keys)
            if entry is not None:
                vals = tuple(features.values())
                try:
                    total = sum(vals)
                    ok = total - total == 0.0  # False for NaN or inf anywhere
                except Exception:  # a str, or a number type whose arithmetic raises (a signaling NaN)
                    ok = False
                if ok:
                    try:
                        packed = entry[4].pack(*vals)
                    except Exception:  # out of range, or a __float__ that raises: the slow path counts it
                        packed = None
                    if packed is not None:
                        self._announce(fb, entry, now, pending)
                        return entry[0], packed
        got = self._schema_for(features)
        if got is None:
            return 0, b""
        entry, nums, cats = got
        self._announce(fb, entry, now, pending)
        return entry[0], entry[4].pack(*nums) + struct.pack(f"<{len(cats)}H", *[fb.ref(c) for c in cats])

    def _announce(self, fb: _FrameBuilder, entry: list[Any], now: int, pending: list[Any]) -> None:
        sid = entry[0]
        if sid in fb.announced or entry in pending:
            return
        last = entry[3]
        if last is None or now - last >= self._repeat_ns:
            fb.pre.append(self._schema_record(fb, entry))
            pending.append(entry)

    def _schema_for(self, features: Any) -> tuple[list[Any], list[float], list[str | None]] | None:
        try:
            items = list(features.items() if isinstance(features, dict) else dict(features).items())
        except Exception:  # not a mapping, or one that fails to iterate
            self._drop("invalid_value")
            return None
        if len(items) > MAX_FEATURES:
            self._drop("too_many_features", len(items) - MAX_FEATURES)
            items = items[:MAX_FEATURES]
        key: list[tuple[str, int]] = []
        nums: list[float] = []
        cats: list[str | None] = []
        num_names: list[str] = []
        cat_names: list[str] = []
        clean = True
        for name, value in items:
            if type(name) is not str or not name or len(name) > 64:
                self._drop("bad_name")
                clean = False
                continue
            c = classify(value)
            if c is None:
                self._drop("invalid_value")
                clean = False
                continue
            kind, val = c
            key.append((name, kind))
            if kind == KIND_NUMERIC:
                nums.append(val)
                num_names.append(name)
            else:
                cats.append(val)
                cat_names.append(name)
        k = tuple(key)
        entry = self._schemas.get(k)
        if entry is None:
            entry = [self._next_schema, num_names, cat_names, None, struct.Struct(f"<{len(num_names)}d")]
            self._next_schema = (self._next_schema % _U32_MAX) + 1
            self._schemas[k] = entry
            if len(self._schemas) > self._max_schemas:
                _, old = self._schemas.popitem(last=False)
                self._fast.pop(tuple(old[1]), None)
        else:
            self._schemas.move_to_end(k)
        if clean and not cat_names and type(features) is dict and len(items) == len(features):
            if len(self._fast) >= self._max_schemas:
                self._fast.clear()
            self._fast[tuple(num_names)] = entry
        return entry, nums, cats

    def _encode_event(self, fb: _FrameBuilder, ev: tuple[Any, ...], now: int, pending: list[Any]) -> bytes | None:
        """The bytes of one event (its SCHEMA records first), or None for an unknown type.

        Raises on malformed content; the caller counts it as ``encode_error``.
        """
        t = ev[0]
        if fb.pre:
            fb.pre = []
        if t == EV_REQUEST:
            if self._fast_request:
                # Fast path for the common REQUEST: a handful of plain (not streamed) stages
                # and in-range ints. The whole record is packed by one precompiled Struct per
                # (stage count, trace length, request-ID length). Byte identity with the
                # general path below rests on the string table: this path adds strings in the
                # general path's order (error type, context, stage names) and only where the
                # general path is sure to add them too, i.e. never before a value on which the
                # general path would raise. Refs are idempotent, so when anything here does not
                # fit (a stream, an out-of-range value, an odd type) the general path redoes
                # the event and writes the same bytes it always did, or raises the same error.
                try:
                    _, ctx, end_ns, dur, outcome, err, rid, trace, stages = ev
                    n = len(stages)
                    if (
                        n <= _FAST_MAX_STAGES
                        and type(end_ns) is int
                        and type(dur) is int
                        and type(outcome) is int
                        and -0x8000000000000000 <= end_ns <= 0x7FFFFFFFFFFFFFFF
                        and 0 <= outcome <= 0xFF
                    ):
                        if not trace:
                            trace_b = b""
                        elif type(trace) is bytes:
                            trace_b = trace[:16]
                        else:
                            trace_b = bytes(trace)[:16]
                        eref = NONE_REF if err is None else fb.strings.get(err)
                        if eref is None:
                            eref = fb.ref(err)
                        if ctx is fb.ctx_obj:
                            c0, c1, c2 = fb.ctx_refs
                        else:
                            refs = fb.ctx_refs = _CTX.unpack(self._ctx(fb, ctx))
                            fb.ctx_obj = ctx
                            c0, c1, c2 = refs
                        if not rid:
                            rid_b = b""
                        elif type(rid) is str:
                            rid_b = rid.encode("utf-8", "replace")
                            if len(rid_b) > MAX_REQUEST_ID:
                                rid_b = _clip(rid, MAX_REQUEST_ID)
                        else:
                            rid_b = self._rid(rid)[1:]
                        lr = len(rid_b)
                        lt = len(trace_b)
                        if not self._streamy:
                            got = _FAST_REQUEST.get(n << 16 | lt << 8 | lr)
                            if got is None:
                                got = _fast_request(n, lr, lt)
                            rec = got[0](
                                got[1], fb.strings, fb, stages,
                                c0, c1, c2, end_ns, dur, outcome, eref, lr, rid_b, lt, trace_b,
                            )
                            if rec is not None:
                                self._plain = ev
                                return rec
                        # A streamed stage (an LLM response): the general stage packer does the
                        # stages, in its own order of refs, and one Struct the rest. A service
                        # that streams usually streams every response, so the next request
                        # skips the plain-stage attempt while the last one had a stream (only
                        # the speed depends on this guess, never the bytes).
                        parts = self._stages(fb, stages)
                        self._streamy = len(parts) != n  # a streamed stage packs as three parts
                        plen = _FAST_HEAD_SIZE + lr + lt
                        for b in parts:
                            plen += len(b)
                        if plen <= 0xFFFF:
                            hp = _FAST_REQUEST.get(lt << 8 | lr)
                            if hp is None:
                                hp = _fast_request(0, lr, lt)
                            return b"".join(
                                (
                                    hp[1](
                                        EV_REQUEST, plen, c0, c1, c2, end_ns, dur, outcome, eref, n, lr, rid_b, lt,
                                        trace_b,
                                    ),
                                    *parts,
                                )
                            )
                except Exception:
                    pass  # the general path below gives the reference result or error
            _, ctx, end_ns, dur, outcome, err, rid, trace, stages = ev
            if len(stages) > 255:
                stages = stages[:255]
            if trace:
                trace_b = bytes(trace)[:16]
                trace_b = _U8_BYTES[len(trace_b)] + trace_b
            else:
                trace_b = b"\x00"
            try:
                head = _REQUEST_TAIL.pack(end_ns, dur, outcome, fb.ref(err) if err is not None else NONE_REF, len(stages))
            except struct.error:
                head = _REQUEST_TAIL.pack(int(end_ns), _u64(dur), int(outcome), fb.ref(err), len(stages))
            body = b"".join((self._ctx(fb, ctx), head, self._rid(rid), trace_b, *self._stages(fb, stages)))
            return self._record(EV_REQUEST, body)
        if t == EV_RECORD:
            _, ctx, unix_ns, rid, pred, conf, label, features = ev
            if features:
                sid, packed = self._features(fb, features, now, pending)
            else:
                sid, packed = 0, b""
            body = b"".join(
                (
                    self._ctx(fb, ctx),
                    _RECORD_TAIL.pack(int(unix_ns), sid),
                    self._rid(rid),
                    self._value(fb, pred),
                    self._conf(conf),
                    self._value(fb, label),
                    packed,
                )
            )
            rec = self._record(EV_RECORD, body)
            if fb.pre:
                return b"".join((*fb.pre, rec))
            return rec
        if t == EV_STAGE:
            _, ctx, end_ns, rid, st = ev
            body = b"".join((self._ctx(fb, ctx), _I64.pack(int(end_ns)), self._rid(rid), *self._stages(fb, (st,))))
            return self._record(EV_STAGE, body)
        if t in (EV_BATCH, EV_QUEUE):
            _, ctx, n = ev
            n = min(max(int(n), 0), _U32_MAX)
            return self._record(t, self._ctx(fb, ctx) + _U32.pack(n))
        if t == EV_DROPS:
            counts = [(DROP_CODES[k], v) for k, v in ev[1].items() if k in DROP_CODES and v > 0][:255]
            body = _U8.pack(len(counts)) + b"".join(_DROP.pack(c, min(v, _U64_MAX)) for c, v in counts)
            return self._record(EV_DROPS, body)
        if t == EV_HELLO:
            _, ver, lang, host, start = ev
            return self._record(EV_HELLO, _HELLO.pack(fb.ref(ver), fb.ref(lang), fb.ref(host), int(start)))
        if t == EV_ALLOC:
            _, unix_ns, dev, a, r, act, ins, retries, ooms, exp = ev
            vals = [_u64(x) for x in (a, r, act, ins, retries, ooms)]
            return self._record(EV_ALLOC, _ALLOC.pack(int(unix_ns), int(dev) & 0xFF, *vals, 1 if exp else 0))
        raise ValueError(f"unknown event type {t!r}")

    def _schema_record(self, fb: _FrameBuilder, entry: list[Any]) -> bytes:
        sid, num_names, cat_names = entry[0], entry[1], entry[2]
        fields = [(n, KIND_NUMERIC) for n in num_names] + [(n, KIND_CATEGORICAL) for n in cat_names]
        body = _SCHEMA.pack(sid, len(fields)) + b"".join(_SCHEMA_FIELD.pack(fb.ref(n), k) for n, k in fields)
        return self._record(EV_SCHEMA, body)


def _u64(x: Any) -> int:
    return min(max(int(x), 0), _U64_MAX)


#: Stage counts the REQUEST encoder's fast path handles; more go the general way.
_FAST_MAX_STAGES = 32
_FastRequest = tuple[Callable[..., "bytes | None"], Callable[..., bytes]]
#: A REQUEST payload's size before the request ID, trace and stages (ctx, tail, two length bytes).
_FAST_HEAD_SIZE = _CTX.size + _REQUEST_TAIL.size + 2
#: ``n_stages << 16 | trace_len << 8 | rid_len`` -> (builder, Struct.pack), bounded below.
_FAST_REQUEST: dict[int, _FastRequest] = {}


def _fast_request(n: int, lr: int, lt: int) -> _FastRequest:
    """The packer of a whole REQUEST record: ``n`` plain stages, ``lr``-byte request ID, ``lt``-byte trace.

    The builder takes ``(pack, fb.strings, fb, stages, ctx refs..., end_ns,
    dur, outcome, error ref, lr, rid, lt, trace)`` and returns the record, or
    None when a stage is streamed (or a new stage name comes with a non-int
    duration). It is generated per stage count (as the decoder's
    ``_plain_stages`` is) because unrolled code beats a loop that flattens the
    stage fields; out-of-range values make ``pack`` raise ``struct.error``,
    which sends the event to the general path.
    """
    fmt = f"<BHHHHqQBHBB{lr}sB{lt}s" + "HQB" * n
    packer = struct.Struct(fmt)
    payload = packer.size - 3
    names = [f"n{i}, d{i}, s{i}" for i in range(n)]
    lines = ["def build(pack, strings, fb, st, c0, c1, c2, e, d, o, er, lr, r, lt, t):"]
    if n:
        lines.append("    " + "".join(f"({x}), " for x in names) + "= st")
        lines.append("    if " + " or ".join(f"s{i} is not None" for i in range(n)) + ":")
        lines.append("        return None")
        # Names are nearly always in the table already; otherwise ref() adds them in stage order.
        lines.append("    try:")
        lines.extend(f"        r{i} = strings[n{i}]" for i in range(n))
        lines.append("    except KeyError:")
        # Adding a name is safe only where the general path cannot raise before it adds them
        # all, which an int duration guarantees (it clamps out-of-range ints).
        lines.append("        if " + " or ".join(f"type(d{i}) is not int" for i in range(n)) + ":")
        lines.append("            return None")
        lines.extend(f"        r{i} = fb.ref(n{i})" for i in range(n))
    args = "".join(f", r{i}, d{i}, 0" for i in range(n))
    lines.append(f"    return pack({EV_REQUEST}, {payload}, c0, c1, c2, e, d, o, er, {n}, lr, r, lt, t{args})")
    ns: dict[str, Any] = {}
    exec("\n".join(lines), ns)  # only ints go into the source
    got: _FastRequest = (ns["build"], packer.pack)
    if len(_FAST_REQUEST) >= 4096:
        _FAST_REQUEST.clear()
    _FAST_REQUEST[n << 16 | lt << 8 | lr] = got
    return got


#: Stage count -> the generated run packer (see :meth:`Encoder._run`).
_RUNS: dict[int, Callable[..., tuple[int, int]]] = {}


def _run_shape(n: int, lr: int, lt: int, c0: int, c1: int, c2: int, refs: tuple[int, ...]) -> tuple[Any, ...]:
    """The packer of one run's REQUESTs with an ``lr``-byte ID and ``lt``-byte trace, and its constant parts.

    Within a run everything but the times, the outcome, the ID and the trace is
    the same for every record, so those fields are packed once here into the few
    byte strings that sit between the variable fields, and each record is one
    ``pack`` of the variables and these constants (``s`` fields, copied as they
    are). The bytes equal the ones :func:`_fast_request`'s packer writes.
    """
    st = struct.Struct(f"<9sqQB4s{lr}s1s{lt}s" + ("2sQ" + "3sQ" * (n - 1) + "1s" if n else ""))
    consts: list[bytes] = [
        _REC.pack(EV_REQUEST, st.size - 3) + _CTX.pack(c0, c1, c2),
        struct.pack("<HBB", NONE_REF, n, lr),
        _U8.pack(lt),
    ]
    if n:
        consts.append(struct.pack("<H", refs[0]))
        consts.extend(struct.pack("<BH", 0, r) for r in refs[1:])
        consts.append(b"\x00")
    return (st.pack, *consts)


def _make_run(n: int) -> Callable[..., tuple[int, int]]:
    """The run packer for REQUESTs with ``n`` plain stages, generated like :func:`_fast_request`.

    It takes ``(evs, i, end, ctx, c0, c1, c2, records, room, N0, N1, ..., R0, R1, ...)``:
    the events, where to start and stop, the template's context object and its
    refs, the frame's record list, the bytes left in the frame, and each stage's
    name and ref. It appends records and returns ``(next index, bytes appended)``.
    Request IDs over the wire limit, other trace lengths, errors and streamed or
    renamed stages stop the run; the general path takes them.
    """
    names = "".join(f", N{k}" for k in range(n))
    refs = "".join(f", R{k}" for k in range(n))
    consts = "P, M, L" + "".join(f", S{k}" for k in range(n + 1 if n else 0))
    lines = [f"def run(evs, i, end, ctx0, c0, c1, c2, records, room{names}{refs}):"]
    lines.append("    used = 0")
    lines.append("    append = records.append")
    lines.append("    shapes = {}")
    lines.append("    key = -1")
    lines.append("    while i < end:")
    lines.append("        try:")
    lines.append("            t, ctx, e, d, o, er, rid, tr, st = evs[i]")
    lines.append(f"            if t != {EV_REQUEST} or ctx is not ctx0 or er is not None or type(rid) is not str:")
    lines.append("                break")
    if n:
        lines.append("            " + "".join(f"(a{k}, d{k}, s{k}), " for k in range(n)) + "= st")
        conds = [f"s{k} is not None" for k in range(n)] + [f"a{k} != N{k}" for k in range(n)]
        lines.append("            if " + " or ".join(conds) + ":")
        lines.append("                break")
    else:
        lines.append("            if st:")
        lines.append("                break")
    lines.append("            r = rid.encode()")
    lines.append("            k = len(r)")
    lines.append(f"            if k > {MAX_REQUEST_ID}:")
    lines.append("                break")
    lines.append("            if tr is None:")
    lines.append('                tr = b""')
    lines.append("            elif type(tr) is bytes and len(tr) == 16:")
    lines.append("                k |= 4096")
    lines.append("            else:")
    lines.append("                break")
    lines.append("            if k != key:")
    lines.append("                sh = shapes.get(k)")
    lines.append("                if sh is None:")
    lines.append(f"                    sh = shapes[k] = _run_shape({n}, k & 255, k >> 8, c0, c1, c2, ({refs[2:]}{',' if n else ''}))")
    lines.append(f"                pack, {consts} = sh")
    lines.append("                key = k")
    stage_args = "".join(f", S{k}, d{k}" for k in range(n)) + (f", S{n}" if n else "")
    lines.append(f"            rec = pack(P, e, d, o, M, r, L, tr{stage_args})")
    lines.append("        except Exception:")
    lines.append("            break")
    lines.append("        size = len(rec)")
    lines.append("        if used + size > room:")
    lines.append("            break")
    lines.append("        append(rec)")
    lines.append("        used += size")
    lines.append("        i += 1")
    lines.append("    return i, used")
    ns: dict[str, Any] = {"_run_shape": _run_shape}
    exec("\n".join(lines), ns)  # only ints go into the source
    run: Callable[..., tuple[int, int]] = ns["run"]
    if len(_RUNS) >= 256:
        _RUNS.clear()
    _RUNS[n] = run
    return run


class Decoder:
    """Decodes frames. Keeps a bounded cache of announced schemas.

    Args:
        max_schemas: schemas remembered across all producers. When full, the
            schema announced longest ago is forgotten; live producers
            re-announce theirs every few seconds, so they come back.
    """

    #: Decode REQUEST and RECORD records on the inlined fast paths. Tests turn
    #: it off on an instance to check that both paths give the same frames.
    _fast = True

    def __init__(self, max_schemas: int = 4096) -> None:
        # (producer_id << 32 | schema_id) -> Schema, in announcement order.
        self._schemas: dict[int, Schema] = {}
        self._max_schemas = max_schemas

    def decode(self, buf: bytes | bytearray | memoryview) -> Frame:
        """Decode one frame.

        Raises:
            WireError: when the frame header or string table is unusable. A
                bad record inside an otherwise good frame does not raise: it
                is skipped and its reason appended to ``Frame.errors``.
        """
        if type(buf) is not bytes:
            try:
                buf = bytes(buf)
            except Exception:
                raise WireError("truncated", "not a bytes-like object") from None
        n = len(buf)
        if n < 32:
            raise WireError("truncated", "shorter than the header")
        magic, ver, _flags, pid, producer, seq, sent, n_str, n_rec = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise WireError("bad_magic")
        if ver != VERSION:
            raise WireError("bad_version", str(ver))
        off = 32
        strings: list[str] = []
        append = strings.append
        try:
            for _ in range(n_str):
                end = off + 1 + buf[off]
                if end > n:
                    raise WireError("truncated", "string table")
                append(buf[off + 1 : end].decode("utf-8"))
                off = end
        except IndexError:
            raise WireError("truncated", "string table") from None
        except UnicodeDecodeError:
            raise WireError("bad_string") from None
        records: list[tuple[Any, ...]] = []
        errors: list[str] = []
        rec_append = records.append
        # Why the fast paths look the way they do (bench/ingest.py measures each choice):
        # - a context is looked up by its 6 raw bytes, which struct hands back as one
        #   object, instead of building an integer key from three refs;
        # - the schema of the previous RECORD is kept in locals, because a frame almost
        #   always carries one producer's records of one schema;
        # - a REQUEST whose stages are all plain (not streams) is read with one
        #   precompiled Struct for its stage count, and its stage tuples are built by
        #   zip() in C.
        # Anything else (a streamed stage, a malformed record) goes to the general
        # per-record decoder, which is the reference the fast paths are tested against.
        ctxs: dict[bytes, tuple[str | None, str | None, str | None]] = {}
        pkey = producer << 32
        schemas = self._schemas
        t_record, t_request = (EV_RECORD, EV_REQUEST) if self._fast else (-1, -1)
        last_sid = -1
        schema: Any = None
        ns = cs = _EMPTY
        nsz = csz = 0
        for _ in range(n_rec):
            try:
                rtype = buf[off]
                end = off + 3 + (buf[off + 1] | buf[off + 2] << 8)
            except IndexError:
                errors.append("truncated")
                break
            if end > n:
                errors.append("truncated")
                break
            start = off
            off = end  # the next record starts here, whatever happens to this one
            try:
                if rtype == t_record:
                    ckb, unix_ns, sid, ln = _RECORD_FAST.unpack_from(buf, start)
                    ctx = ctxs.get(ckb)
                    if ctx is None:
                        ctx = ctxs[ckb] = _ctx(ckb, strings)
                    p = start + 22 + ln
                    rid = buf[start + 22 : p].decode() if ln else None  # UTF-8; no argument is quicker
                    tag = buf[p]
                    if tag == TAG_STRING:
                        pred = strings[buf[p + 1] | buf[p + 2] << 8]
                        p += 3
                    elif tag == TAG_FLOAT:
                        pred = _F64.unpack_from(buf, p + 1)[0]
                        p += 9
                    elif tag == TAG_NONE:
                        pred = None
                        p += 1
                    else:
                        raise WireError("bad_record", "value tag")
                    conf, tag = _F64_U8.unpack_from(buf, p)
                    if conf != conf:
                        conf = None
                    if tag == TAG_NONE:
                        label = None
                        p += 9
                    elif tag == TAG_STRING:
                        label = strings[buf[p + 9] | buf[p + 10] << 8]
                        p += 11
                    elif tag == TAG_FLOAT:
                        label = _F64.unpack_from(buf, p + 9)[0]
                        p += 17
                    else:
                        raise WireError("bad_record", "value tag")
                    if sid:
                        if sid != last_sid:
                            schema = schemas.get(pkey | sid)
                            if schema is None:
                                raise WireError("unknown_schema")
                            last_sid = sid
                            ns = schema.num_struct
                            nsz = ns.size
                            cs = schema.cat_struct
                            csz = cs.size
                        nums = ns.unpack_from(buf, p)
                        p += nsz
                        if csz:
                            cats: tuple[str | None, ...] = tuple(
                                [None if r == NONE_REF else strings[r] for r in cs.unpack_from(buf, p)]
                            )
                            p += csz
                        else:
                            cats = ()
                        if p != end:
                            raise WireError("bad_record", "record length")
                        rec_append((EV_RECORD, ctx, unix_ns, rid, pred, conf, label, (schema, nums, cats)))
                    else:
                        if p != end:
                            raise WireError("bad_record", "record length")
                        rec_append((EV_RECORD, ctx, unix_ns, rid, pred, conf, label, None))
                elif rtype == t_request:
                    ckb, end_ns, dur, outcome, err, nst, ln = _REQUEST_FAST.unpack_from(buf, start)
                    p = start + 30 + ln
                    rid = buf[start + 30 : p].decode() if ln else None
                    ln = buf[p]
                    trace = buf[p + 1 : p + 1 + ln] if ln else None
                    p += 1 + ln
                    if p + 11 * nst != end or outcome > OUTCOME_CANCELLED:
                        # A streamed stage (or a malformed record): the general decoder sorts it out.
                        rec_append(self._record(rtype, buf, start + 3, end, strings, pkey))
                        continue
                    if nst:
                        sst, build = _plain_stages(nst)
                        stages = build(sst.unpack_from(buf, p), strings)
                        if stages is None:  # a stage with flags set
                            rec_append(self._record(rtype, buf, start + 3, end, strings, pkey))
                            continue
                    else:
                        stages = []
                    ctx = ctxs.get(ckb)
                    if ctx is None:
                        ctx = ctxs[ckb] = _ctx(ckb, strings)
                    rec_append(
                        (EV_REQUEST, ctx, end_ns, dur, outcome, None if err == NONE_REF else strings[err],
                         rid, trace, stages)
                    )
                elif rtype == EV_SCHEMA:
                    self._schema(buf, start + 3, end, strings, pkey)
                    last_sid = -1  # it may have replaced or evicted the cached one
                else:
                    rec_append(self._record(rtype, buf, start + 3, end, strings, pkey))
            except WireError as e:
                errors.append(e.reason)
            except (struct.error, IndexError, UnicodeDecodeError, ValueError):
                errors.append("bad_record")
        return Frame(pid, producer, seq, sent, records, errors)

    def _schema(self, buf: bytes, p: int, end: int, strings: list[str], pkey: int) -> None:
        sid, nf = _SCHEMA.unpack_from(buf, p)
        p += _SCHEMA.size
        if p + nf * _SCHEMA_FIELD.size != end or sid == 0:
            raise WireError("bad_record", "schema")
        nums_l: list[str] = []
        cats_l: list[str] = []
        for _ in range(nf):
            nref, kind = _SCHEMA_FIELD.unpack_from(buf, p)
            p += _SCHEMA_FIELD.size
            if kind == KIND_NUMERIC:
                nums_l.append(strings[nref])
            elif kind == KIND_CATEGORICAL:
                cats_l.append(strings[nref])
            else:
                raise WireError("bad_record", "schema kind")
        key = pkey | sid
        old = self._schemas.pop(key, None)
        if old is not None and old.numeric == tuple(nums_l) and old.categorical == tuple(cats_l):
            self._schemas[key] = old  # a repeat: keep the object, refresh its age
            return
        self._schemas[key] = Schema(
            sid, tuple(nums_l), tuple(cats_l), _struct_for("d", len(nums_l)), _struct_for("H", len(cats_l))
        )
        if len(self._schemas) > self._max_schemas:
            del self._schemas[next(iter(self._schemas))]

    def _record(self, rtype: int, buf: bytes, p: int, end: int, strings: list[str], pkey: int) -> tuple[Any, ...]:
        """The general decoder of one record's payload ``buf[p:end]`` (any type but SCHEMA).

        Plain code, one field at a time: the reference the fast paths in
        :meth:`decode` must agree with, and the path for what they hand over.
        """
        if rtype == EV_REQUEST:
            ctx = _ctx(buf[p : p + 6], strings)
            end_ns, dur, outcome, err, nst = _REQUEST_TAIL.unpack_from(buf, p + 6)
            p += 6 + _REQUEST_TAIL.size
            ln = buf[p]
            rid = buf[p + 1 : p + 1 + ln].decode("utf-8") if ln else None
            p += 1 + ln
            ln = buf[p]
            trace = buf[p + 1 : p + 1 + ln] if ln else None
            p += 1 + ln
            stages, p = _stages(buf, p, end, nst, strings)
            if p != end or outcome > OUTCOME_CANCELLED:
                raise WireError("bad_record", "request")
            return (EV_REQUEST, ctx, end_ns, dur, outcome, _s(strings, err), rid, trace, stages)
        if rtype == EV_RECORD:
            ctx = _ctx(buf[p : p + 6], strings)
            unix_ns, sid = _RECORD_TAIL.unpack_from(buf, p + 6)
            p += 6 + _RECORD_TAIL.size
            ln = buf[p]
            rid = buf[p + 1 : p + 1 + ln].decode("utf-8") if ln else None
            p += 1 + ln
            pred, p = _value(buf, p, strings)
            (conf,) = _F64.unpack_from(buf, p)
            if conf != conf:
                conf = None
            p += 8
            label, p = _value(buf, p, strings)
            feats = None
            if sid:
                schema = self._schemas.get(pkey | sid)
                if schema is None:
                    raise WireError("unknown_schema")
                nums = schema.num_struct.unpack_from(buf, p)
                p += schema.num_struct.size
                crefs = schema.cat_struct.unpack_from(buf, p)
                p += schema.cat_struct.size
                feats = (schema, nums, tuple([_s(strings, r) for r in crefs]))
            if p != end:
                raise WireError("bad_record", "record length")
            return (EV_RECORD, ctx, unix_ns, rid, pred, conf, label, feats)
        if rtype == EV_STAGE:
            ctx = _ctx(buf[p : p + 6], strings)
            (end_ns,) = _I64.unpack_from(buf, p + 6)
            p += 14
            ln = buf[p]
            rid = buf[p + 1 : p + 1 + ln].decode("utf-8") if ln else None
            p += 1 + ln
            stages, p = _stages(buf, p, end, 1, strings)
            if p != end:
                raise WireError("bad_record", "stage")
            return (EV_STAGE, ctx, end_ns, rid, stages[0])
        if rtype in (EV_BATCH, EV_QUEUE):
            if end - p != _CTX_U32.size:
                raise WireError("bad_record", "batch/queue")
            (v,) = _U32.unpack_from(buf, p + 6)
            return (rtype, _ctx(buf[p : p + 6], strings), v)
        if rtype == EV_DROPS:
            k = buf[p]
            p += 1
            if p + k * _DROP.size != end:
                raise WireError("bad_record", "drops")
            counts: dict[str, int] = {}
            for _ in range(k):
                code, v = _DROP.unpack_from(buf, p)
                p += _DROP.size
                name = DROP_REASONS.get(code, "unknown")
                counts[name] = counts.get(name, 0) + v
            return (EV_DROPS, counts)
        if rtype == EV_HELLO:
            if end - p != _HELLO.size:
                raise WireError("bad_record", "hello")
            v, lang, host, start = _HELLO.unpack_from(buf, p)
            s = strings
            return (EV_HELLO, _s(s, v), _s(s, lang), _s(s, host), start)
        if rtype == EV_ALLOC:
            if end - p != _ALLOC.size:
                raise WireError("bad_record", "alloc")
            vals = _ALLOC.unpack_from(buf, p)
            return (EV_ALLOC, *vals[:8], bool(vals[8]))
        raise WireError("unknown_record")


_STRUCTS: dict[tuple[str, int], struct.Struct] = {}


def _struct_for(code: str, n: int) -> struct.Struct:
    """A cached ``Struct`` for ``n`` little-endian values of one type."""
    s = _STRUCTS.get((code, n))
    if s is None:
        s = struct.Struct(f"<{n}{code}")
        if len(_STRUCTS) < 4096:
            _STRUCTS[(code, n)] = s
    return s


_PlainStages = tuple[struct.Struct, Callable[[tuple[int, ...], list[str]], "list[tuple[Any, ...]] | None"]]
_PLAIN_STAGES: list[_PlainStages | None] = [None] * 256


def _plain_stages(n: int) -> _PlainStages:
    """The ``Struct`` of ``n`` plain stages back to back, and a function that makes their tuples.

    The function takes the unpacked ``(name_ref, duration, flags) * n`` and the
    string table, and returns the stage tuples, or None when any stage has a
    flag set (a stream, which the general decoder reads). It is generated per
    stage count (as ``collections.namedtuple`` does) because unrolled code is
    about three times faster than a loop or ``zip`` (bench/ingest.py).
    """
    got = _PLAIN_STAGES[n]
    if got is None:
        flags = " or ".join(f"f[{3 * i + 2}]" for i in range(n))
        items = ", ".join(f"(s[f[{3 * i}]], f[{3 * i + 1}], None)" for i in range(n))
        build = eval(f"lambda f, s: None if {flags} else [{items}]", {})  # n is an int < 256
        got = _PLAIN_STAGES[n] = (struct.Struct("<" + "HQB" * n), build)
    return got


def _s(strings: list[str], r: int) -> str | None:
    if r == NONE_REF:
        return None
    return strings[r]  # IndexError -> bad_record


def _ctx(ck: bytes, strings: list[str]) -> tuple[str | None, str | None, str | None]:
    a, b, c = _CTX.unpack(ck)
    return (
        None if a == NONE_REF else strings[a],
        None if b == NONE_REF else strings[b],
        None if c == NONE_REF else strings[c],
    )


def _value(buf: bytes, p: int, strings: list[str]) -> tuple[Any, int]:
    """A tagged *value* at ``p`` and the offset after it."""
    tag = buf[p]
    if tag == TAG_NONE:
        return None, p + 1
    if tag == TAG_FLOAT:
        return _F64.unpack_from(buf, p + 1)[0], p + 9
    if tag == TAG_STRING:
        return strings[_U16.unpack_from(buf, p + 1)[0]], p + 3
    raise WireError("bad_record", "value tag")


def _stages(buf: bytes, p: int, end: int, nst: int, strings: list[str]) -> tuple[list[tuple[Any, ...]], int]:
    out: list[tuple[Any, ...]] = []
    unpack = _STAGE.unpack_from
    for _ in range(nst):
        sref, dur, flags = unpack(buf, p)
        p += 11
        if flags & 1:
            ttft, items, ng = _STREAM.unpack_from(buf, p)
            p += 14
            if p + 4 * ng > end:
                raise WireError("bad_record", "gaps")
            gaps = _struct_for("I", ng).unpack_from(buf, p)
            p += 4 * ng
            out.append((strings[sref], dur, (ttft, items, gaps)))
        else:
            out.append((strings[sref], dur, None))
    return out, p
