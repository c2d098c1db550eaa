"""The encoder: SDK events in, wire frames out.

The general path (:meth:`Encoder._general`) walks the field table and writes
one field at a time: it is the reference. Three fast paths write the same
bytes for the common cases, and the tests check that they do:

- ``encode``: an event is packed by its record type's generated encoder
  (:func:`inferwatch.wire._codegen.encoder`: every type but DROPS; a REQUEST
  with up to 32 stages), one ``Struct`` per shape, when its values need no
  conversion (ints in range, finite floats, strings).
- ``run``: after a REQUEST packed that way, the REQUESTs that follow with the
  same context and stage names are packed in a run, one ``pack`` each.
- ``features``: a feature dict whose keys were seen before and whose values
  are all finite numbers is packed by the Struct cached for its key set.

Byte identity of the paths rests on the string table: every path takes its
string refs in wire order (a RECORD's features, whose SCHEMA record goes
before the record, where its schema ID sits), a fast path falls back to the
general one before it has any effect but string refs, and an event that fails
or does not fit takes its strings back out of the frame.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from typing import Any

from inferwatch.wire import _codegen
from inferwatch.wire._frame import _U8_BYTES, _FrameBuilder
from inferwatch.wire.spec import (
    BOOL,
    CONF,
    CTX,
    DEVICE,
    DROP_CODES,
    DROP_STRUCT,
    DROPS,
    EV_REQUEST,
    EV_SCHEMA,
    FEATURES,
    HEADER,
    I64,
    KIND_CATEGORICAL,
    KIND_NUMERIC,
    MAGIC,
    MAX_FEATURES,
    MAX_FRAME,
    MAX_GAPS,
    MAX_STAGES,
    N_STAGES,
    OUTCOME,
    RECORD_HEADER,
    RECORD_TYPES,
    RID,
    SCHEMA_FIELD_STRUCT,
    SCHEMA_HEAD,
    SCHEMA_ID,
    SEGMENTS,
    STAGE,
    STAGE_CANCELLED,
    STAGE_STREAM,
    STAGE_STRUCT,
    STAGES,
    STR,
    STREAM_STRUCT,
    TRACE,
    U32,
    U32_MAX,
    U64,
    U64_MAX,
    UNDELIVERED_STRUCT,
    VALUE,
    VERSION,
    classify,
    rid_bytes,
    trace_bytes,
)

__all__ = ["Encoder", "FAST_PATHS"]

#: The encoder's fast paths, by the names of the ``Encoder`` flags that switch them (``_fast_<name>``).
FAST_PATHS = ("encode", "run", "features")

_F64 = struct.Struct("<d")
_NAN = float("nan")
_STAGES_SLOT = next(f.slot for f in RECORD_TYPES[EV_REQUEST].fields if f.kind is STAGES)
_REQUEST_ARITY = RECORD_TYPES[EV_REQUEST].arity
_CTX_SLOT = next(f.slot for f in RECORD_TYPES[EV_REQUEST].fields if f.kind is CTX)
_FEATURES_SLOT = {code: f.slot for code, rt in RECORD_TYPES.items() for f in rt.fields if f.kind is FEATURES}
#: The record types with a generated fast encoder. Each is generated on first use, so that
#: importing the SDK compiles nothing.
_FAST_TYPES = frozenset(code for code, rt in RECORD_TYPES.items() if _codegen.has_fast_encoder(rt))
#: Record type -> its fast encoder, once generated (REQUEST's, one per stage count, are in _REQUEST_ENCODERS).
_FAST_ENCODERS: dict[int, Any] = {}
_REQUEST_ENCODERS: list[Any] = [None] * (_codegen.MAX_FAST_STAGES + 1)
_U16 = struct.Struct("<H")


_TooLarge = _codegen.TooLarge


def _u64(x: Any) -> int:
    return min(max(int(x), 0), U64_MAX)


def _u32(x: Any) -> int:
    return min(max(int(x), 0), U32_MAX)


class Encoder:
    """Turns SDK events into wire frames. Not thread-safe: one per sender.

    Args:
        pid: the producer's process ID.
        producer_id: a random 64-bit ID for this producer (new after fork).
        clock: wall-clock nanoseconds, injectable for tests.
        schema_repeat_s: re-announce a schema at least this often.
        max_frame: largest frame to emit, in bytes.
        max_schemas: feature schemas remembered; the least recently used is forgotten.
    """

    # The fast paths (see the module docstring). Tests turn them off on an instance to
    # check that every path writes the general path's bytes.
    _fast_encode = True
    _fast_run = True
    _fast_features = True

    def __init__(
        self,
        pid: int,
        producer_id: int,
        clock: Any = None,
        schema_repeat_s: float = 2.0,
        max_frame: int = MAX_FRAME,
        max_schemas: int = 1024,
    ) -> None:
        self.pid = pid & U32_MAX
        self.producer_id = producer_id & U64_MAX
        self._clock = clock or time.time_ns
        self._repeat_ns = int(schema_repeat_s * 1e9)
        self.max_frame = max_frame
        self._max_schemas = max_schemas
        self._seq = 0
        self._next_schema = 1
        # key -> [schema_id, numeric_names, categorical_names, last_announced_ns, numeric Struct]
        self._schemas: OrderedDict[tuple[tuple[str, int], ...], list[Any]] = OrderedDict()
        # The features fast path: names of an all-numeric feature dict -> its schema entry.
        self._feature_keys: dict[tuple[Any, ...], list[Any]] = {}
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
        runs = self._fast_run
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
            if runs and fb.template is ev and i < total:
                # A REQUEST packed whole: the requests after it usually have the same shape
                # (context, stage names, no error), so they are packed in a run.
                nxt = evs[i]
                if nxt.__class__ is tuple and len(nxt) == _REQUEST_ARITY and nxt[0] == EV_REQUEST:
                    j = self._run(fb, ev, evs, i, max_frame)
                    counted += j - i  # a run never contains extra events (HELLO, DROPS)
                    i = j
        if fb.records:
            frames.append((self._finish(fb, now), counted))
        return frames

    def forget_announcements(self) -> None:
        """Re-announce every schema in the next frame.

        The sender calls this when a send fails, because the receiver may have
        restarted and lost its schema cache.
        """
        for entry in self._schemas.values():
            entry[3] = None

    # -- internals ------------------------------------------------------------------

    def _run(self, fb: _FrameBuilder, tmpl: tuple[Any, ...], evs: list[tuple[Any, ...]], i: int, max_frame: int) -> int:
        """Pack the REQUESTs from ``evs[i]`` on that are shaped like ``tmpl`` into ``fb``; return the next index.

        Their strings are all in the frame's table already (the template's), so
        each is one ``Struct.pack`` that adds no string: the bytes are exactly
        what the one-event encoder would write. The run stops at the first
        event that differs or fails to pack, or when the frame is full; the
        general loop takes it from there.
        """
        stages = tmpl[_STAGES_SLOT]
        try:
            template = _codegen.run_template(tmpl, fb.ctx_refs, fb.strings)
            j, used = _codegen.runner(len(stages))(
                evs, i, len(evs), fb.records, max_frame - fb.size - fb.table_len, tmpl[_CTX_SLOT], template,
                [name for name, _, _ in stages],
            )
        except Exception:  # an odd template (it packed, so this is only a guard): no run
            return i
        fb.size += used
        fb.n_records += j - i
        return int(j)

    def _finish(self, fb: _FrameBuilder, now: int) -> bytes:
        self._seq = (self._seq + 1) & U32_MAX
        head = HEADER.pack(MAGIC, VERSION, 0, self.pid, self.producer_id, self._seq, now, len(fb.table), fb.n_records)
        return b"".join([head, *fb.table, *fb.records])

    def _encode_event(self, fb: _FrameBuilder, ev: tuple[Any, ...], now: int, pending: list[Any]) -> bytes | None:
        """The bytes of one event (its SCHEMA records first).

        Raises on malformed content; the caller counts it as ``encode_error``.
        """
        if fb.pre:
            fb.pre = []
        if self._fast_encode:
            try:
                t = ev[0]
                if t == EV_REQUEST:
                    n = len(ev[_STAGES_SLOT])
                    fast = _REQUEST_ENCODERS[n] if n <= _codegen.MAX_FAST_STAGES else None
                    if fast is None and n <= _codegen.MAX_FAST_STAGES:
                        fast = _REQUEST_ENCODERS[n] = _codegen.encoder(t, n)
                else:
                    fast = _FAST_ENCODERS.get(t)
                    if fast is None and t in _FAST_TYPES:
                        fast = _FAST_ENCODERS[t] = _codegen.encoder(t)
                if fast is not None:
                    rec: bytes | None = fast(ev, fb, self, now, pending)
                    if rec is not None:
                        return rec
            except _TooLarge:
                raise  # the general path would reach the same string or length and raise it too
            except Exception:
                pass  # before any effect but string refs: the general path gives the reference result or error
        return self._general(fb, ev, now, pending)

    def _general(self, fb: _FrameBuilder, ev: tuple[Any, ...], now: int, pending: list[Any]) -> bytes:
        """The general path: one field at a time, in the field table's order."""
        rt = RECORD_TYPES.get(ev[0])
        if rt is None or not rt.event:
            raise ValueError(f"unknown event type {ev[0]!r}")
        if len(ev) != rt.arity:
            raise ValueError(f"{rt.name} event of length {len(ev)}")
        stages: Any = ()
        sid = 0
        packed = b""
        for f in rt.fields:  # the field a count is derived from
            if f.kind is STAGES:
                stages = ev[f.slot]
                if len(stages) > MAX_STAGES:
                    stages = stages[:MAX_STAGES]
        parts: list[bytes] = []
        for seg in SEGMENTS[rt.code]:
            st = seg.struct
            if st is not None:
                vals: list[Any] = []
                for f in seg.fields:
                    k = f.kind
                    if k is CTX:
                        vals += fb.ctx(ev[f.slot])
                    elif k is STR:
                        vals.append(fb.ref(ev[f.slot]))
                    elif k is I64 or k is OUTCOME:
                        vals.append(int(ev[f.slot]))  # out of range: struct.error, the event is dropped
                    elif k is U64:
                        vals.append(_u64(ev[f.slot]))
                    elif k is U32:
                        vals.append(_u32(ev[f.slot]))
                    elif k is CONF:
                        vals.append(self._conf(ev[f.slot]))
                    elif k is N_STAGES:
                        vals.append(len(stages))
                    elif k is SCHEMA_ID:
                        # The features, here in wire order; their SCHEMA record goes before this record.
                        feats = ev[_FEATURES_SLOT[rt.code]]
                        if feats:
                            sid, packed = self._features(fb, feats, now, pending)
                        vals.append(sid)
                    elif k is DEVICE:
                        vals.append(int(ev[f.slot]) & 0xFF)
                    elif k is BOOL:
                        vals.append(1 if ev[f.slot] else 0)
                    else:
                        raise AssertionError(f"no general encoder for {k.name}")
                parts.append(st.pack(*vals))
                continue
            f = seg.fields[0]
            k = f.kind
            if k is RID:
                b = rid_bytes(ev[f.slot])
                parts += (_U8_BYTES[len(b)], b)
            elif k is VALUE:
                parts.append(self._value(fb, ev[f.slot]))
            elif k is TRACE:
                b = trace_bytes(ev[f.slot])
                parts += (_U8_BYTES[len(b)], b)
            elif k is STAGES:
                parts += self._stages(fb, stages)
            elif k is STAGE:
                parts += self._stages(fb, (ev[f.slot],))
            elif k is FEATURES:
                parts.append(packed)
            elif k is DROPS:
                parts.append(self._drop_counts(ev[f.slot]))
            else:
                raise AssertionError(f"no general encoder for {k.name}")
        rec = _record(rt.code, b"".join(parts))
        if fb.pre:
            return b"".join((*fb.pre, rec))
        return rec

    @staticmethod
    def _stages(fb: _FrameBuilder, stages: Any) -> list[bytes]:
        out = []
        strings = fb.strings
        for st in stages:
            name, dur, stream = st
            r = strings.get(name)
            if r is None:
                r = fb.ref(name)
            if stream is None:
                try:  # an int in range packs as it is: what _u64() would give it
                    out.append(STAGE_STRUCT.pack(r, dur, 0))
                except struct.error:
                    out.append(STAGE_STRUCT.pack(r, _u64(dur), 0))
                continue
            ttft, items, gaps = stream[:3]
            gaps = gaps[:MAX_GAPS]
            n = len(gaps)
            gs = _struct_for("I", n)
            try:
                g = gs.pack(*gaps)
            except struct.error:
                g = gs.pack(*[_u32(x) for x in gaps])
            cancelled = len(stream) > 3
            out.append(STAGE_STRUCT.pack(r, _u64(dur), STAGE_STREAM | STAGE_CANCELLED if cancelled else STAGE_STREAM))
            out.append(STREAM_STRUCT.pack(_u64(ttft), _u32(items), n))
            out.append(g)
            if cancelled:
                out.append(UNDELIVERED_STRUCT.pack(_u32(stream[3])))
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

    def _conf(self, conf: Any) -> float:
        if conf is None:
            return _NAN
        if type(conf) is float and conf - conf == 0.0:
            return conf
        c = classify(conf)
        if c is None or c[0] != KIND_NUMERIC:
            self._drop("invalid_value")
            return _NAN
        return float(c[1])

    @staticmethod
    def _drop_counts(counts: Any) -> bytes:
        pairs = [(DROP_CODES[k], v) for k, v in counts.items() if k in DROP_CODES and v > 0][:255]
        return _U8_BYTES[len(pairs)] + b"".join(DROP_STRUCT.pack(c, min(v, U64_MAX)) for c, v in pairs)

    def _features(self, fb: _FrameBuilder, features: Any, now: int, pending: list[Any]) -> tuple[int, bytes]:
        """Schema ID and packed values; appends the SCHEMA record to fb when it must be announced."""
        # Fast path: every value a finite number, and a key list seen before.
        if self._fast_features and type(features) is dict:
            entry = self._feature_keys.get(tuple(features))
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
        return entry[0], entry[4].pack(*nums) + _struct_for("H", len(cats)).pack(*[fb.ref(c) for c in cats])

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
            self._next_schema = (self._next_schema % U32_MAX) + 1
            self._schemas[k] = entry
            if len(self._schemas) > self._max_schemas:
                _, old = self._schemas.popitem(last=False)
                self._feature_keys.pop(tuple(old[1]), None)
        else:
            self._schemas.move_to_end(k)
        if clean and not cat_names and type(features) is dict and len(items) == len(features):
            if len(self._feature_keys) >= self._max_schemas:
                self._feature_keys.clear()
            self._feature_keys[tuple(num_names)] = entry
        return entry, nums, cats

    @staticmethod
    def _schema_record(fb: _FrameBuilder, entry: list[Any]) -> bytes:
        sid, num_names, cat_names = entry[0], entry[1], entry[2]
        fields = [(n, KIND_NUMERIC) for n in num_names] + [(n, KIND_CATEGORICAL) for n in cat_names]
        body = SCHEMA_HEAD.pack(sid, len(fields)) + b"".join(SCHEMA_FIELD_STRUCT.pack(fb.ref(n), k) for n, k in fields)
        return _record(EV_SCHEMA, body)


def _record(rtype: int, payload: bytes) -> bytes:
    if len(payload) > 0xFFFF:
        raise _TooLarge("record too large")
    return RECORD_HEADER.pack(rtype, len(payload)) + payload


_STRUCTS: dict[tuple[str, int], struct.Struct] = {}


def _struct_for(code: str, n: int) -> struct.Struct:
    """A cached ``Struct`` for ``n`` little-endian values of one type."""
    s = _STRUCTS.get((code, n))
    if s is None:
        s = struct.Struct(f"<{n}{code}")
        if len(_STRUCTS) < 4096:
            _STRUCTS[(code, n)] = s
    return s
