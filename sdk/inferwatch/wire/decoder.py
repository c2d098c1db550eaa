"""The reference decoder: wire frames in, event tuples out.

The general path (:meth:`Decoder._general`) walks the field table and reads
one field at a time: it is the reference. The fast path is a generated
decoder per record type (:func:`inferwatch.wire._codegen.decoder`) for the
common case; whatever it does not read (a streamed stage, a malformed record)
goes to the general path, so both give the same records and the same error
reasons.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from inferwatch.wire import _codegen
from inferwatch.wire.spec import (
    BOOL,
    CONF,
    CTX,
    DEVICE,
    DROP_REASONS,
    DROP_STRUCT,
    DROPS,
    EV_SCHEMA,
    FEATURES,
    HEADER,
    I64,
    KIND_CATEGORICAL,
    KIND_NUMERIC,
    MAGIC,
    MAX_FEATURES,
    N_STAGES,
    NONE_REF,
    OUTCOME,
    OUTCOME_MAX,
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
    TAG_FLOAT,
    TAG_NONE,
    TAG_STRING,
    TRACE,
    U32,
    U64,
    UNDELIVERED_STRUCT,
    VALUE,
    VERSION,
    Frame,
    Schema,
    WireError,
)

__all__ = ["Decoder"]

_F64 = struct.Struct("<d")
_U16 = struct.Struct("<H")


class Decoder:
    """Decodes frames. Keeps a cache of announced schemas, bounded by count and by bytes.

    Args:
        max_schemas: schemas remembered across all producers.
        max_schema_bytes: memory the remembered schemas may hold, as estimated
            by :func:`schema_size` (names, tuples, the schema itself).

    When either bound is passed, the schemas announced longest ago are
    forgotten until both hold again (``evicted["count"]`` or
    ``evicted["bytes"]``); live producers re-announce theirs every few seconds,
    so they come back. A schema larger than ``max_schema_bytes`` on its own is
    refused (``evicted["too_large"]``, and the record's error is
    ``schema_too_large``). A schema of more than ``MAX_FEATURES`` fields, which
    no encoder writes, is a bad record.

    ``max_string_chars`` cuts every string of a frame's string table (names,
    categorical values, error types) to that many characters as it is decoded,
    and counts the strings it cut in ``truncated_strings``: the wire allows 255
    bytes, and a receiver that keeps values for a while (the sidecar) need not
    hold 255 characters of each. ``None`` keeps them whole.
    """

    #: Decode on the generated fast paths. Tests turn it off on an instance to
    #: check that both paths give the same frames.
    _fast = True

    def __init__(self, max_schemas: int = 4096, max_schema_bytes: int = 64 << 20,
                 max_string_chars: int | None = None, loop: Any = None) -> None:
        #: The loop over a frame's records on the fast path: None, the generated one
        #: (:func:`generated_loop`); else a drop-in with its arguments and results, as the
        #: sidecar's compiled one (``inferwatch_sidecar.ingest.fastwire``).
        self._loop = loop
        # (producer_id << 32 | schema_id) -> Schema, in announcement order.
        self._schemas: dict[int, Schema] = {}
        self._sizes: dict[int, int] = {}
        self._max_schemas = max_schemas
        self._max_schema_bytes = max_schema_bytes
        #: Estimated bytes the remembered schemas hold (see :func:`schema_size`).
        self.schema_bytes = 0
        #: Schemas forgotten or refused, by reason: count, bytes, too_large.
        self.evicted = {"count": 0, "bytes": 0, "too_large": 0}
        #: Longest string kept from a string table (a string is at most 255 bytes, so 255 cuts none).
        self.max_string_chars = 255 if max_string_chars is None else max(1, min(255, max_string_chars))
        #: Strings cut to ``max_string_chars``.
        self.truncated_strings = 0

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
        if n < HEADER.size:
            raise WireError("truncated", "shorter than the header")
        magic, ver, _flags, pid, producer, seq, sent, n_str, n_rec = HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise WireError("bad_magic")
        if ver != VERSION:
            raise WireError("bad_version", str(ver))
        off = HEADER.size
        strings: list[str] = []
        append = strings.append
        cap = self.max_string_chars
        try:
            for _ in range(n_str):
                ln = buf[off]
                end = off + 1 + ln
                if end > n:
                    raise WireError("truncated", "string table")
                if ln > cap:  # more bytes than the cap allows characters: decoded whole (it is checked), kept cut
                    s = buf[off + 1 : end].decode("utf-8")
                    if len(s) > cap:
                        s = s[:cap]
                        self.truncated_strings += 1
                    append(s)
                else:
                    append(buf[off + 1 : end].decode("utf-8"))
                off = end
        except IndexError:
            raise WireError("truncated", "string table") from None
        except UnicodeDecodeError:
            raise WireError("bad_string") from None
        if self._fast:
            loop = self._loop or _decode_fast or _generate()
            records, errors = loop(self, buf, off, n_rec, strings, producer << 32)
        else:
            records, errors = self._decode_general(buf, off, n_rec, strings, producer << 32)
        return Frame(pid, producer, seq, sent, records, errors)

    def _decode_general(
        self, buf: bytes, off: int, n_rec: int, strings: list[str], pkey: int
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        """The records of a frame from ``off`` on, each read by the general decoder."""
        records: list[tuple[Any, ...]] = []
        errors: list[str] = []
        n = len(buf)
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
                if rtype == EV_SCHEMA:
                    self._schema(buf, start + 3, end, strings, pkey)
                else:
                    records.append(self._general(rtype, buf, start + 3, end, strings, pkey))
            except WireError as e:
                errors.append(e.reason)
            except (struct.error, IndexError, UnicodeDecodeError, ValueError):
                errors.append("bad_record")
        return records, errors

    def _schema(self, buf: bytes, p: int, end: int, strings: list[str], pkey: int) -> None:
        sid, nf = SCHEMA_HEAD.unpack_from(buf, p)
        p += SCHEMA_HEAD.size
        if p + nf * SCHEMA_FIELD_STRUCT.size != end or sid == 0:
            raise WireError("bad_record", "schema")
        if nf > MAX_FEATURES:
            raise WireError("bad_record", "schema fields")
        nums_l: list[str] = []
        cats_l: list[str] = []
        for _ in range(nf):
            nref, kind = SCHEMA_FIELD_STRUCT.unpack_from(buf, p)
            p += SCHEMA_FIELD_STRUCT.size
            if kind == KIND_NUMERIC:
                nums_l.append(strings[nref])
            elif kind == KIND_CATEGORICAL:
                cats_l.append(strings[nref])
            else:
                raise WireError("bad_record", "schema kind")
        key = pkey | sid
        schemas = self._schemas
        old = schemas.pop(key, None)
        if old is not None and old.numeric == tuple(nums_l) and old.categorical == tuple(cats_l):
            schemas[key] = old  # a repeat: keep the object, refresh its age
            return
        if old is not None:
            self.schema_bytes -= self._sizes.pop(key)
        schema = Schema(
            sid, tuple(nums_l), tuple(cats_l), _struct_for("d", len(nums_l)), _struct_for("H", len(cats_l))
        )
        size = schema_size(schema)
        if size > self._max_schema_bytes:
            self.evicted["too_large"] += 1
            raise WireError("schema_too_large")
        schemas[key] = schema
        self._sizes[key] = size
        self.schema_bytes += size
        while len(schemas) > self._max_schemas or self.schema_bytes > self._max_schema_bytes:
            first = next(iter(schemas))
            self.evicted["count" if len(schemas) > self._max_schemas else "bytes"] += 1
            del schemas[first]
            self.schema_bytes -= self._sizes.pop(first)

    def _general(self, rtype: int, buf: bytes, p: int, end: int, strings: list[str], pkey: int) -> tuple[Any, ...]:
        """The general decoder of one record's payload ``buf[p:end]`` (any type but SCHEMA).

        Plain code, one field at a time in the field table's order: the
        reference the fast paths must agree with, and the path for what they
        hand over.
        """
        rt = RECORD_TYPES.get(rtype)
        if rt is None or not rt.event:
            raise WireError("unknown_record")
        got: dict[str, Any] = {}
        n_stages = 0
        sid = 0
        for seg in SEGMENTS[rtype]:
            st = seg.struct
            if st is not None:
                vals = st.unpack_from(buf, p)
                p += st.size
                j = 0
                for f in seg.fields:
                    k = f.kind
                    if k is CTX:
                        got[f.name] = (_s(strings, vals[j]), _s(strings, vals[j + 1]), _s(strings, vals[j + 2]))
                        j += 3
                        continue
                    v = vals[j]
                    j += 1
                    if k is STR:
                        v = _s(strings, v)
                    elif k is OUTCOME:
                        if v > OUTCOME_MAX:
                            raise WireError("bad_record", "outcome")
                    elif k is CONF:
                        if v != v:
                            v = None
                    elif k is BOOL:
                        v = bool(v)
                    elif k is N_STAGES:
                        n_stages = v
                    elif k is SCHEMA_ID:
                        sid = v
                    else:
                        assert k in (I64, U64, U32, DEVICE), k
                    got[f.name] = v
                continue
            f = seg.fields[0]
            k = f.kind
            if k is RID:
                ln = buf[p]
                got[f.name] = buf[p + 1 : p + 1 + ln].decode("utf-8") if ln else None
                p += 1 + ln
            elif k is TRACE:
                ln = buf[p]
                got[f.name] = buf[p + 1 : p + 1 + ln] if ln else None
                p += 1 + ln
            elif k is VALUE:
                got[f.name], p = _value(buf, p, strings)
            elif k is STAGES:
                got[f.name], p = _stages(buf, p, end, n_stages, strings)
            elif k is STAGE:
                stages, p = _stages(buf, p, end, 1, strings)
                got[f.name] = stages[0]
            elif k is FEATURES:
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
                got[f.name] = feats
            elif k is DROPS:
                got[f.name], p = _drops(buf, p, end)
            else:
                raise AssertionError(f"no general decoder for {k.name}")
        if p != end:
            raise WireError("bad_record", f"{rt.name} record length")
        return (rtype, *[got[name] for name in rt.event])


def schema_size(schema: Schema) -> int:
    """Memory one cached schema holds, estimated from what it alone references.

    Its tuples and each distinct name count in full (a name can be shared with
    another schema, so this overestimates rather than under); the two
    ``Struct`` objects are shared through a bounded cache and are not counted.
    """
    names = {id(n): n for n in (*schema.numeric, *schema.categorical)}
    return (
        sys.getsizeof(schema) + sys.getsizeof(schema.numeric) + sys.getsizeof(schema.categorical)
        + sum(sys.getsizeof(n) for n in names.values())
    )


_STRUCTS: dict[tuple[str, int], struct.Struct] = {}


def _struct_for(code: str, n: int) -> struct.Struct:
    """A cached ``Struct`` for ``n`` little-endian values of one type."""
    s = _STRUCTS.get((code, n))
    if s is None:
        s = struct.Struct(f"<{n}{code}")
        if len(_STRUCTS) < 4096:
            _STRUCTS[(code, n)] = s
    return s


def _s(strings: list[str], r: int) -> str | None:
    if r == NONE_REF:
        return None
    return strings[r]  # IndexError -> bad_record


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


def _stages(buf: bytes, p: int, end: int, nst: int, strings: list[str]) -> tuple[tuple[tuple[Any, ...], ...], int]:
    out: list[tuple[Any, ...]] = []
    unpack = STAGE_STRUCT.unpack_from
    for _ in range(nst):
        sref, dur, flags = unpack(buf, p)
        p += STAGE_STRUCT.size
        if flags & STAGE_STREAM:
            ttft, items, ng = STREAM_STRUCT.unpack_from(buf, p)
            p += STREAM_STRUCT.size
            if p + 4 * ng > end:
                raise WireError("bad_record", "gaps")
            gaps = _struct_for("I", ng).unpack_from(buf, p)
            p += 4 * ng
            if flags & STAGE_CANCELLED:
                if p + 4 > end:
                    raise WireError("bad_record", "undelivered")
                out.append((strings[sref], dur, (ttft, items, gaps, UNDELIVERED_STRUCT.unpack_from(buf, p)[0])))
                p += 4
            else:
                out.append((strings[sref], dur, (ttft, items, gaps)))
        else:
            out.append((strings[sref], dur, None))
    return tuple(out), p


def _drops(buf: bytes, p: int, end: int) -> tuple[dict[str, int], int]:
    k = buf[p]
    p += 1
    if p + k * DROP_STRUCT.size != end:
        raise WireError("bad_record", "drops")
    counts: dict[str, int] = {}
    for _ in range(k):
        code, v = DROP_STRUCT.unpack_from(buf, p)
        p += DROP_STRUCT.size
        name = DROP_REASONS.get(code)
        if name is None:
            raise WireError("unknown_drop_reason", str(code))
        counts[name] = counts.get(name, 0) + v
    return counts, p


#: The generated loop over a frame's records (see :func:`inferwatch.wire._codegen.decoder`),
#: generated on first use, so that importing the SDK compiles nothing.
_decode_fast: Any = None


def generated_loop() -> Any:
    """The generated loop, ``loop(decoder, buf, off, n_rec, strings, producer_id << 32) -> (records, errors)``:
    what a :class:`Decoder`'s ``loop`` must give the same results as, and what it may hand records to."""
    return _decode_fast or _generate()


def _generate() -> Any:
    global _decode_fast
    _decode_fast = _codegen.decoder({"read_stages": _stages, "WireError": WireError})
    return _decode_fast
