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
        the caller counts as ``invalid_value`` and drops.
    """
    t = type(value)
    if t is float:
        if value != value:
            return (KIND_NUMERIC, math.nan)
        if value in (math.inf, -math.inf):
            return None
        return (KIND_NUMERIC, value)
    if t is int or t is bool:
        if -(2**63) <= value < 2**63:
            return (KIND_NUMERIC, float(value))
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
    if isinstance(value, (int, float)):  # subclasses
        return classify(float(value))
    if isinstance(value, str):
        return (KIND_CATEGORICAL, str(value))
    return None


class _FrameBuilder:
    """Accumulates records and a string table for one frame."""

    __slots__ = ("strings", "table", "table_len", "records", "size")

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.table: list[bytes] = []
        self.table_len = 0
        self.records: list[bytes] = []
        self.size = _HEADER.size

    def ref(self, s: str | None) -> int:
        if s is None:
            return NONE_REF
        r = self.strings.get(s)
        if r is None:
            r = len(self.table)
            if r >= NONE_REF:
                raise OverflowError("string table full")
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
        self._next_schema = 1
        # key -> [schema_id, numeric_names, categorical_names, last_announced_ns]
        self._schemas: OrderedDict[tuple[tuple[str, int], ...], list[Any]] = OrderedDict()
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
        frames: list[bytes] = []
        fb = _FrameBuilder()
        announced: set[int] = set()
        now = self._clock()
        for ev in (extra or []) + events:
            try:
                rec = self._encode_event(fb, ev, announced, now)
            except OverflowError:
                rec = None
            except Exception:
                self._drop("encode_error")
                continue
            if rec is None or fb.size + fb.table_len + sum(len(r) for r in rec) > self.max_frame:
                # Does not fit in the current frame: flush and retry on a fresh one.
                if fb.records:
                    frames.append(self._finish(fb, now))
                fb = _FrameBuilder()
                announced = set()
                try:
                    rec = self._encode_event(fb, ev, announced, now)
                except Exception:
                    rec = None
                if rec is None or fb.size + fb.table_len + sum(len(r) for r in rec) > self.max_frame:
                    self._drop("event_too_large")
                    fb = _FrameBuilder()
                    announced = set()
                    continue
            for r in rec:
                fb.records.append(r)
                fb.size += len(r)
        if fb.records:
            frames.append(self._finish(fb, now))
        return frames

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
            MAGIC, VERSION, 0, self.pid, self.producer_id, self._seq, now, len(fb.table), len(fb.records)
        )
        return b"".join([head, *fb.table, *fb.records])

    @staticmethod
    def _record(rtype: int, payload: bytes) -> bytes:
        if len(payload) > 0xFFFF:
            raise OverflowError("record too large")
        return _REC.pack(rtype, len(payload)) + payload

    @staticmethod
    def _rid(rid: Any) -> bytes:
        if not rid:
            return b"\x00"
        b = _clip(str(rid), MAX_REQUEST_ID)
        return _U8.pack(len(b)) + b

    def _stage(self, fb: _FrameBuilder, st: tuple[Any, ...]) -> bytes:
        name, dur, stream = st
        dur = min(max(int(dur), 0), _U64_MAX)
        if stream is None:
            return _STAGE.pack(fb.ref(name), dur, 0)
        ttft, items, gaps = stream
        gaps = gaps[:MAX_GAPS]
        n = len(gaps)
        return b"".join(
            (
                _STAGE.pack(fb.ref(name), dur, 1),
                _STREAM.pack(min(max(int(ttft), 0), _U64_MAX), min(int(items), _U32_MAX), n),
                struct.pack(f"<{n}I", *[min(max(int(g), 0), _U32_MAX) for g in gaps]),
            )
        )

    def _value(self, fb: _FrameBuilder, v: Any) -> bytes:
        if v is None:
            return b"\x00"
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

    def _schema_for(self, features: Any) -> tuple[list[Any], list[float], list[str | None]] | None:
        if not isinstance(features, dict):
            try:
                features = dict(features)
            except Exception:
                self._drop("invalid_value")
                return None
        items = list(features.items())
        if len(items) > MAX_FEATURES:
            self._drop("too_many_features", len(items) - MAX_FEATURES)
            items = items[:MAX_FEATURES]
        key: list[tuple[str, int]] = []
        nums: list[float] = []
        cats: list[str | None] = []
        num_names: list[str] = []
        cat_names: list[str] = []
        for name, value in items:
            if type(name) is not str or not name or len(name) > 64:
                self._drop("bad_name")
                continue
            c = classify(value)
            if c is None:
                self._drop("invalid_value")
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
            entry = [self._next_schema, num_names, cat_names, None]
            self._next_schema = (self._next_schema % _U32_MAX) + 1
            self._schemas[k] = entry
            if len(self._schemas) > self._max_schemas:
                self._schemas.popitem(last=False)
        else:
            self._schemas.move_to_end(k)
        return entry, nums, cats

    def _encode_event(
        self, fb: _FrameBuilder, ev: tuple[Any, ...], announced: set[int], now: int
    ) -> list[bytes] | None:
        t = ev[0]
        if t == EV_REQUEST:
            _, ctx, end_ns, dur, outcome, err, rid, trace, stages = ev
            svc, model, ver = ctx
            stages = stages[:255]
            trace_b = bytes(trace)[:16] if trace else b""
            body = b"".join(
                (
                    _REQUEST.pack(
                        fb.ref(svc), fb.ref(model), fb.ref(ver), int(end_ns),
                        min(max(int(dur), 0), _U64_MAX), int(outcome), fb.ref(err), len(stages),
                    ),
                    self._rid(rid),
                    _U8.pack(len(trace_b)) + trace_b,
                    *[self._stage(fb, s) for s in stages],
                )
            )
            return [self._record(EV_REQUEST, body)]
        if t == EV_STAGE:
            _, ctx, end_ns, rid, st = ev
            svc, model, ver = ctx
            body = _STAGE_HDR.pack(fb.ref(svc), fb.ref(model), fb.ref(ver), int(end_ns)) + self._rid(rid) + self._stage(fb, st)
            return [self._record(EV_STAGE, body)]
        if t == EV_RECORD:
            _, ctx, unix_ns, rid, pred, conf, label, features = ev
            svc, model, ver = ctx
            out: list[bytes] = []
            schema_id = 0
            nums: list[float] = []
            cats: list[str | None] = []
            if features:
                got = self._schema_for(features)
                if got is not None:
                    entry, nums, cats = got
                    schema_id = entry[0]
                    if schema_id not in announced and (entry[3] is None or now - entry[3] >= self._repeat_ns):
                        out.append(self._schema_record(fb, entry))
                        entry[3] = now
                    announced.add(schema_id)
            if conf is None:
                conf_f = math.nan
            else:
                c = classify(conf)
                if c is None or c[0] != KIND_NUMERIC:
                    self._drop("invalid_value")
                    conf_f = math.nan
                else:
                    conf_f = c[1]
            body = b"".join(
                (
                    _RECORD.pack(fb.ref(svc), fb.ref(model), fb.ref(ver), int(unix_ns), schema_id),
                    self._rid(rid),
                    self._value(fb, pred),
                    _F64.pack(conf_f),
                    self._value(fb, label),
                    struct.pack(f"<{len(nums)}d", *nums),
                    struct.pack(f"<{len(cats)}H", *[fb.ref(c) for c in cats]),
                )
            )
            out.append(self._record(EV_RECORD, body))
            return out
        if t in (EV_BATCH, EV_QUEUE):
            _, ctx, n = ev
            svc, model, ver = ctx
            n = min(max(int(n), 0), _U32_MAX)
            return [self._record(t, _CTX_U32.pack(fb.ref(svc), fb.ref(model), fb.ref(ver), n))]
        if t == EV_DROPS:
            counts = [(DROP_CODES[k], v) for k, v in ev[1].items() if k in DROP_CODES and v > 0][:255]
            body = _U8.pack(len(counts)) + b"".join(_DROP.pack(c, min(v, _U64_MAX)) for c, v in counts)
            return [self._record(EV_DROPS, body)]
        if t == EV_HELLO:
            _, ver, lang, host, start = ev
            return [self._record(EV_HELLO, _HELLO.pack(fb.ref(ver), fb.ref(lang), fb.ref(host), int(start)))]
        if t == EV_ALLOC:
            _, unix_ns, dev, a, r, act, ins, retries, ooms, exp = ev
            vals = [min(max(int(x), 0), _U64_MAX) for x in (a, r, act, ins, retries, ooms)]
            return [self._record(EV_ALLOC, _ALLOC.pack(int(unix_ns), int(dev) & 0xFF, *vals, 1 if exp else 0))]
        self._drop("encode_error")
        return None

    def _schema_record(self, fb: _FrameBuilder, entry: list[Any]) -> bytes:
        sid, num_names, cat_names, _ = entry
        fields = [(n, KIND_NUMERIC) for n in num_names] + [(n, KIND_CATEGORICAL) for n in cat_names]
        body = _SCHEMA.pack(sid, len(fields)) + b"".join(_SCHEMA_FIELD.pack(fb.ref(n), k) for n, k in fields)
        return self._record(EV_SCHEMA, body)


class Decoder:
    """Decodes frames. Keeps a bounded cache of announced schemas.

    Args:
        max_schemas: schemas remembered across all producers (LRU).
    """

    def __init__(self, max_schemas: int = 4096) -> None:
        self._schemas: OrderedDict[tuple[int, int], Schema] = OrderedDict()
        self._max_schemas = max_schemas

    def decode(self, buf: bytes) -> Frame:
        """Decode one frame.

        Raises:
            WireError: when the frame header or string table is unusable. A
                bad record inside an otherwise good frame does not raise: it
                is skipped and its reason appended to ``Frame.errors``.
        """
        n = len(buf)
        if n < _HEADER.size:
            raise WireError("truncated", "shorter than the header")
        magic, ver, _flags, pid, producer, seq, sent, n_str, n_rec = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise WireError("bad_magic")
        if ver != VERSION:
            raise WireError("bad_version", str(ver))
        off = _HEADER.size
        strings: list[str] = []
        append = strings.append
        for _ in range(n_str):
            if off >= n:
                raise WireError("truncated", "string table")
            ln = buf[off]
            end = off + 1 + ln
            if end > n:
                raise WireError("truncated", "string table")
            try:
                append(bytes(buf[off + 1 : end]).decode("utf-8"))
            except UnicodeDecodeError:
                raise WireError("bad_string") from None
            off = end
        records: list[tuple[Any, ...]] = []
        errors: list[str] = []
        for _ in range(n_rec):
            if off + 3 > n:
                errors.append("truncated")
                break
            rtype, ln = _REC.unpack_from(buf, off)
            start = off + 3
            end = start + ln
            if end > n:
                errors.append("truncated")
                break
            off = end
            try:
                rec = self._record(rtype, buf, start, end, strings, producer)
            except WireError as e:
                errors.append(e.reason)
                continue
            except (struct.error, IndexError, UnicodeDecodeError, ValueError):
                errors.append("bad_record")
                continue
            if rec is not None:
                records.append(rec)
        return Frame(pid, producer, seq, sent, records, errors)

    @staticmethod
    def _s(strings: list[str], r: int) -> str | None:
        if r == NONE_REF:
            return None
        return strings[r]  # IndexError -> bad_record

    @staticmethod
    def _rid(buf: Any, off: int, end: int) -> tuple[str | None, int]:
        ln = buf[off]
        off += 1
        if off + ln > end:
            raise WireError("bad_record", "request id")
        if not ln:
            return None, off
        return bytes(buf[off : off + ln]).decode("utf-8"), off + ln

    def _stage(self, buf: Any, off: int, end: int, strings: list[str]) -> tuple[tuple[Any, ...], int]:
        sref, dur, flags = _STAGE.unpack_from(buf, off)
        off += _STAGE.size
        name = strings[sref]
        if not flags & 1:
            return (name, dur, None), off
        ttft, items, ng = _STREAM.unpack_from(buf, off)
        off += _STREAM.size
        if off + 4 * ng > end:
            raise WireError("bad_record", "gaps")
        gaps = struct.unpack_from(f"<{ng}I", buf, off)
        return (name, dur, (ttft, items, gaps)), off + 4 * ng

    def _value(self, buf: Any, off: int, strings: list[str]) -> tuple[Any, int]:
        tag = buf[off]
        if tag == TAG_NONE:
            return None, off + 1
        if tag == TAG_FLOAT:
            return _F64.unpack_from(buf, off + 1)[0], off + 9
        if tag == TAG_STRING:
            return strings[_U16.unpack_from(buf, off + 1)[0]], off + 3
        raise WireError("bad_record", "value tag")

    def _record(
        self, rtype: int, buf: Any, off: int, end: int, strings: list[str], producer: int
    ) -> tuple[Any, ...] | None:
        s = strings
        if rtype == EV_REQUEST:
            sv, mo, ve, end_ns, dur, outcome, err, nst = _REQUEST.unpack_from(buf, off)
            off += _REQUEST.size
            rid, off = self._rid(buf, off, end)
            tl = buf[off]
            trace = bytes(buf[off + 1 : off + 1 + tl]) if tl else None
            off += 1 + tl
            stages = []
            for _ in range(nst):
                st, off = self._stage(buf, off, end, s)
                stages.append(st)
            if off != end or outcome > OUTCOME_CANCELLED:
                raise WireError("bad_record", "request")
            ctx = (self._s(s, sv), self._s(s, mo), self._s(s, ve))
            return (EV_REQUEST, ctx, end_ns, dur, outcome, self._s(s, err), rid, trace, stages)
        if rtype == EV_RECORD:
            sv, mo, ve, unix_ns, sid = _RECORD.unpack_from(buf, off)
            off += _RECORD.size
            rid, off = self._rid(buf, off, end)
            pred, off = self._value(buf, off, s)
            conf = _F64.unpack_from(buf, off)[0]
            off += 8
            label, off = self._value(buf, off, s)
            feats = None
            if sid:
                schema = self._schemas.get((producer, sid))
                if schema is None:
                    raise WireError("unknown_schema")
                nums = schema.num_struct.unpack_from(buf, off)
                off += schema.num_struct.size
                crefs = schema.cat_struct.unpack_from(buf, off)
                off += schema.cat_struct.size
                cats = tuple(None if r == NONE_REF else s[r] for r in crefs)
                feats = (schema, nums, cats)
            if off != end:
                raise WireError("bad_record", "record length")
            ctx = (self._s(s, sv), self._s(s, mo), self._s(s, ve))
            return (EV_RECORD, ctx, unix_ns, rid, pred, None if conf != conf else conf, label, feats)
        if rtype == EV_SCHEMA:
            sid, nf = _SCHEMA.unpack_from(buf, off)
            off += _SCHEMA.size
            if off + nf * _SCHEMA_FIELD.size != end or sid == 0:
                raise WireError("bad_record", "schema")
            nums_l: list[str] = []
            cats_l: list[str] = []
            for _ in range(nf):
                nref, kind = _SCHEMA_FIELD.unpack_from(buf, off)
                off += _SCHEMA_FIELD.size
                if kind == KIND_NUMERIC:
                    nums_l.append(s[nref])
                elif kind == KIND_CATEGORICAL:
                    cats_l.append(s[nref])
                else:
                    raise WireError("bad_record", "schema kind")
            key = (producer, sid)
            self._schemas[key] = Schema(
                sid, tuple(nums_l), tuple(cats_l),
                struct.Struct(f"<{len(nums_l)}d"), struct.Struct(f"<{len(cats_l)}H"),
            )
            self._schemas.move_to_end(key)
            if len(self._schemas) > self._max_schemas:
                self._schemas.popitem(last=False)
            return None
        if rtype == EV_STAGE:
            sv, mo, ve, end_ns = _STAGE_HDR.unpack_from(buf, off)
            off += _STAGE_HDR.size
            rid, off = self._rid(buf, off, end)
            st, off = self._stage(buf, off, end, s)
            if off != end:
                raise WireError("bad_record", "stage")
            return (EV_STAGE, (self._s(s, sv), self._s(s, mo), self._s(s, ve)), end_ns, rid, st)
        if rtype in (EV_BATCH, EV_QUEUE):
            if end - off != _CTX_U32.size:
                raise WireError("bad_record", "batch/queue")
            sv, mo, ve, v = _CTX_U32.unpack_from(buf, off)
            return (rtype, (self._s(s, sv), self._s(s, mo), self._s(s, ve)), v)
        if rtype == EV_DROPS:
            k = buf[off]
            off += 1
            if off + k * _DROP.size != end:
                raise WireError("bad_record", "drops")
            counts: dict[str, int] = {}
            for _ in range(k):
                code, v = _DROP.unpack_from(buf, off)
                off += _DROP.size
                counts[DROP_REASONS.get(code, "unknown")] = counts.get(DROP_REASONS.get(code, "unknown"), 0) + v
            return (EV_DROPS, counts)
        if rtype == EV_HELLO:
            if end - off != _HELLO.size:
                raise WireError("bad_record", "hello")
            v, lang, host, start = _HELLO.unpack_from(buf, off)
            return (EV_HELLO, self._s(s, v), self._s(s, lang), self._s(s, host), start)
        if rtype == EV_ALLOC:
            if end - off != _ALLOC.size:
                raise WireError("bad_record", "alloc")
            vals = _ALLOC.unpack_from(buf, off)
            return (EV_ALLOC, *vals[:8], bool(vals[8]))
        raise WireError("unknown_record")
