"""What the wire format says: constants, limits, value rules and the field table.

This module is the executable form of ``docs/wire-format.md``; the two must
agree. :data:`RECORD_TYPES` is the one field table: for every record type, its
fields in wire order with their kinds, and where each field sits in the event
tuple. The encoder's general path, its fast paths, the decoder and its fast
paths are all derived from it, so they cannot disagree on a layout. Event
tuples are plain tuples for speed; ``RecordType.event`` names their elements.
"""

from __future__ import annotations

import math
import struct
from typing import Any, NamedTuple

MAGIC = b"IW"
VERSION = 1
#: Largest frame the encoder writes. Fits a UDP datagram on loopback and the
#: default Linux Unix-datagram limit.
MAX_FRAME = 65000
#: Longest string in the string table, in UTF-8 bytes (longer ones are clipped).
MAX_STRING = 255
#: Longest request ID, in UTF-8 bytes.
MAX_REQUEST_ID = 128
#: Trace IDs are W3C trace IDs: 16 bytes (longer ones are cut).
MAX_TRACE = 16
#: Most stages one REQUEST record carries (its stage count is a ``u8``).
MAX_STAGES = 255
#: Most features one RECORD carries.
MAX_FEATURES = 256
#: Most gaps one streamed stage carries.
MAX_GAPS = 1024
#: The string ref that means "none".
NONE_REF = 0xFFFF

# Record / event types. The same codes are used on the wire and as the first
# element of the event tuples; RECORD_TYPES below gives each tuple's layout.
EV_HELLO = 1
EV_REQUEST = 2
EV_STAGE = 3
EV_SCHEMA = 4  # wire only
EV_RECORD = 5
EV_BATCH = 6
EV_QUEUE = 7
EV_DROPS = 8
EV_ALLOC = 9
EV_HTTP = 10
EV_ALLOC_SITE = 11

OUTCOME_OK = 0
OUTCOME_ERROR = 1
OUTCOME_CANCELLED = 2
#: A 4xx response other than 429 (the client's request was bad).
OUTCOME_CLIENT_ERROR = 3
#: A 429 or 503 the server itself returned: load shed.
OUTCOME_SHED = 4
#: The largest outcome code; a record with a larger one is a bad record.
OUTCOME_MAX = OUTCOME_SHED
OUTCOMES = ("ok", "error", "cancelled", "client_error", "shed")

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
    9: "socket_untrusted",
}
DROP_CODES = {v: k for k, v in DROP_REASONS.items()}

#: The frame header: magic, version, flags, pid, producer ID, seq, sent-at, n_strings, n_records.
HEADER = struct.Struct("<2sBBIQIqHH")
#: Every record starts with its type and its payload length.
RECORD_HEADER = struct.Struct("<BH")

U8_MAX = 0xFF
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


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


# -- the field table --------------------------------------------------------------------

class Kind(NamedTuple):
    """How one kind of field is written.

    Attributes:
        name: the kind's name, used in the table and in the docs.
        code: the ``struct`` code of the field, or "" for a variable-length field.
        doc: what the field holds on the wire.
    """

    name: str
    code: str
    doc: str


#: Three string refs: service, model, model version. The event holds a ``(str | None) * 3`` tuple.
CTX = Kind("ctx", "HHH", "three `str` refs: service, model, model version")
#: A string ref; the event holds a str or None (``NONE_REF``).
STR = Kind("str", "H", "`str` ref")
#: A signed 64-bit int (times). ``int()`` of the value; out of range drops the event.
I64 = Kind("i64", "q", "`i64`")
#: An unsigned 64-bit int (durations, byte counts). ``int()`` of the value, clamped to the range.
U64 = Kind("u64", "Q", "`u64`")
#: An unsigned 32-bit int (sizes, depths, counts). ``int()`` of the value, clamped to the range.
U32 = Kind("u32", "I", "`u32`")
#: An outcome code, ``u8``: ``int()`` of the value; out of range drops the event, over 4 is a bad record.
OUTCOME = Kind("outcome", "B", "`u8` outcome (0 ok, 1 error, 2 cancelled, 3 client_error, 4 shed)")
#: A CUDA device number, ``u8``: ``int()`` of the value, modulo 256.
DEVICE = Kind("device", "B", "`u8` device")
#: A flag, ``u8`` 0 or 1: the value's truth. Decodes as a bool.
BOOL = Kind("bool", "B", "`u8` 0 or 1")
#: The confidence, ``f64``: a number, NaN for none. Decodes as a float or None.
CONF = Kind("conf", "d", "`f64` (NaN = none)")
#: The number of stages in the ``stages`` field that follows; the encoder derives it (at most 255).
N_STAGES = Kind("n_stages", "B", "`u8` number of stages")
#: The schema ID of the ``features`` field; the encoder derives it (0 = no features).
SCHEMA_ID = Kind("schema_id", "I", "`u32` schema ID (0 = no features)")
#: A request ID: ``u8`` length (0 = none), then at most 128 bytes of UTF-8.
RID = Kind("rid", "", "`rid`: `u8` length (0 = none, at most 128), UTF-8 bytes")
#: A trace ID: ``u8`` length (0 or 16), then the bytes.
TRACE = Kind("trace", "", "`u8` length (0 or 16), bytes")
#: A tagged value: ``u8`` tag, then nothing, an ``f64`` or a string ref.
VALUE = Kind("value", "", "*value*: `u8` tag; `0` none, `1` then `f64`, `2` then a `str` ref")
#: ``n_stages`` x *stage* (see STAGE_FIELDS, STREAM_FIELDS).
STAGES = Kind("stages", "", "n_stages x *stage*")
#: Exactly one *stage*.
STAGE = Kind("stage", "", "one *stage*")
#: The values of the schema's features: ``f64`` numeric ones, then ``u16`` categorical refs.
FEATURES = Kind("features", "", "`f64` x numeric features, then `u16` x categorical refs (0xFFFF = missing)")
#: ``u8`` n, then n x (``u8`` reason, ``u64`` count since the producer's last DROPS record that was sent).
DROPS = Kind("drops", "", "`u8` n, then n x (`u8` reason, `u64` count since the last DROPS record sent)")
#: The number of fields in the ``fields`` of a SCHEMA record that follows.
N_FIELDS = Kind("n_fields", "H", "`u16` number of fields")
#: n x (``str`` feature name, ``u8`` kind); SCHEMA records only.
SCHEMA_FIELDS = Kind("schema_fields", "", "n x (`str` name, `u8` kind: 0 numeric, 1 categorical)")

#: Kinds whose values the encoder computes from another field rather than reading them from the event.
DERIVED = frozenset({N_STAGES, SCHEMA_ID, N_FIELDS})


class Field(NamedTuple):
    """One field of a record, in wire order.

    Attributes:
        name: the field's name (also its name in ``RecordType.event``).
        kind: how it is written.
        slot: where its value sits in the event tuple, or -1 for a derived field.
    """

    name: str
    kind: Kind
    slot: int


class RecordType(NamedTuple):
    """One record type: its code, its fields in wire order, and its event tuple's layout.

    Attributes:
        code: the record type on the wire and the first element of the event tuple.
        name: the documented name.
        fields: the payload's fields in wire order.
        event: the event tuple's elements after the type code, by field name.
            Empty for SCHEMA, which the encoder makes and the decoder consumes.
    """

    code: int
    name: str
    fields: tuple[Field, ...]
    event: tuple[str, ...]

    @property
    def arity(self) -> int:
        """Length of the event tuple, type code included."""
        return 1 + len(self.event)


def _record_type(code: int, name: str, fields: list[tuple[str, Kind]], event: tuple[str, ...]) -> RecordType:
    out = []
    for fname, kind in fields:
        slot = -1 if kind in DERIVED else 1 + event.index(fname) if event else -1
        out.append(Field(fname, kind, slot))
    assert sorted(event) == sorted(f.name for f in out if f.slot >= 0), name
    return RecordType(code, name, tuple(out), event)


#: The field table: every record type, its fields in wire order and its event layout.
RECORD_TYPES: dict[int, RecordType] = {
    rt.code: rt
    for rt in (
        _record_type(
            EV_HELLO, "HELLO",
            [("sdk_version", STR), ("language", STR), ("hostname", STR), ("start_unix_ns", I64)],
            ("sdk_version", "language", "hostname", "start_unix_ns"),
        ),
        _record_type(
            EV_REQUEST, "REQUEST",
            [("ctx", CTX), ("end_unix_ns", I64), ("duration_ns", U64), ("outcome", OUTCOME), ("error_type", STR),
             ("n_stages", N_STAGES), ("request_id", RID), ("trace_id", TRACE), ("stages", STAGES)],
            ("ctx", "end_unix_ns", "duration_ns", "outcome", "error_type", "request_id", "trace_id", "stages"),
        ),
        _record_type(
            EV_STAGE, "STAGE",
            [("ctx", CTX), ("end_unix_ns", I64), ("request_id", RID), ("stage", STAGE)],
            ("ctx", "end_unix_ns", "request_id", "stage"),
        ),
        _record_type(
            EV_SCHEMA, "SCHEMA", [("schema_id", U32), ("n_fields", N_FIELDS), ("fields", SCHEMA_FIELDS)], ()
        ),
        _record_type(
            EV_RECORD, "RECORD",
            [("ctx", CTX), ("unix_ns", I64), ("schema_id", SCHEMA_ID), ("request_id", RID), ("prediction", VALUE),
             ("confidence", CONF), ("label", VALUE), ("features", FEATURES)],
            ("ctx", "unix_ns", "request_id", "prediction", "confidence", "label", "features"),
        ),
        _record_type(EV_BATCH, "BATCH", [("ctx", CTX), ("size", U32)], ("ctx", "size")),
        _record_type(EV_QUEUE, "QUEUE", [("ctx", CTX), ("depth", U32)], ("ctx", "depth")),
        _record_type(EV_DROPS, "DROPS", [("counts", DROPS)], ("counts",)),
        _record_type(
            EV_ALLOC, "ALLOC",
            [("unix_ns", I64), ("device", DEVICE), ("allocated", U64), ("reserved", U64), ("active", U64),
             ("inactive_split", U64), ("num_alloc_retries", U64), ("num_ooms", U64), ("expandable_segments", BOOL)],
            ("unix_ns", "device", "allocated", "reserved", "active", "inactive_split", "num_alloc_retries",
             "num_ooms", "expandable_segments"),
        ),
        # One HTTP request as the ASGI middleware saw it: its route template (bounded by the app's
        # routes), status (0 = no response started), outcome, the resend count its headers stated,
        # how long a client that left had waited (0 = it did not leave), whether its path is left out of
        # the request metrics (a probe, the docs), and the ID the client sent
        # (None when the ID was generated: only a client's ID can repeat on a retry).
        _record_type(
            EV_HTTP, "HTTP",
            [("ctx", CTX), ("end_unix_ns", I64), ("route", STR), ("status", U32), ("outcome", OUTCOME),
             ("resend_count", U32), ("client_wait_ns", U64), ("excluded", BOOL), ("request_id", RID)],
            ("ctx", "end_unix_ns", "route", "status", "outcome", "resend_count", "client_wait_ns", "excluded",
             "request_id"),
        ),
        # One allocation site of the torch probe's second stage (a bounded recording of the allocator's
        # history): a Python frame whose allocations made while recording were still live at its end.
        # Every site of one capture carries the capture's time; the sidecar keeps the latest capture.
        _record_type(
            EV_ALLOC_SITE, "ALLOC_SITE",
            [("unix_ns", I64), ("device", DEVICE), ("file", STR), ("line", U32), ("function", STR),
             ("bytes", U64), ("count", U32)],
            ("unix_ns", "device", "file", "line", "function", "bytes", "count"),
        ),
    )
}

#: A *stage*: name, duration, flags. The event holds ``(name, duration_ns, stream)``; flag bit 0 says
#: that STREAM_FIELDS follow, for a ``stream`` that is not None. A stream that completed is
#: ``(ttft_ns, items, gaps_us)``; one that was cancelled (closed early, or its client left) is
#: ``(ttft_ns, items, gaps_us, undelivered)``: flag bit 1, and a ``u32`` undelivered count after the gaps.
STAGE_FIELDS = (Field("name", STR, 0), Field("duration_ns", U64, 1), Field("flags", Kind("flags", "B", "`u8` flags"), -1))
#: A streamed stage's ``(ttft_ns, items, gaps_us)``: then ``u16`` n_gaps and n_gaps x ``u32`` gaps (us).
STREAM_FIELDS = (Field("ttft_ns", U64, 0), Field("items", U32, 1), Field("n_gaps", Kind("n_gaps", "H", "`u16`"), -1))
#: Flag bit 0 of a stage: it was a stream.
STAGE_STREAM = 1
#: Flag bit 1 of a streamed stage: it was cancelled, and a ``u32`` follows its gaps: the items
#: produced after the client had gone (generated but not delivered).
STAGE_CANCELLED = 2


class Segment:
    """A run of fields a decoder or encoder handles together.

    Attributes:
        fields: the fields; one variable-length field, or consecutive fixed-size ones.
        struct: the fixed-size fields' ``Struct`` (None for a variable-length field).
    """

    __slots__ = ("fields", "struct")

    def __init__(self, fields: tuple[Field, ...], st: struct.Struct | None) -> None:
        self.fields = fields
        self.struct = st


def fixed_format(fields: tuple[Field, ...] | list[Field]) -> str:
    """The ``struct`` format (without the byte order) of consecutive fixed-size fields."""
    assert all(f.kind.code for f in fields)
    return "".join(f.kind.code for f in fields)


def segments(rt: RecordType) -> tuple[Segment, ...]:
    """A record type's fields grouped into fixed-size runs and single variable-length fields."""
    out: list[Segment] = []
    run: list[Field] = []
    for f in rt.fields:
        if f.kind.code:
            run.append(f)
            continue
        if run:
            out.append(Segment(tuple(run), struct.Struct("<" + fixed_format(run))))
            run = []
        out.append(Segment((f,), None))
    if run:
        out.append(Segment(tuple(run), struct.Struct("<" + fixed_format(run))))
    return tuple(out)


#: Record type -> its segments, computed once from the table.
SEGMENTS: dict[int, tuple[Segment, ...]] = {code: segments(rt) for code, rt in RECORD_TYPES.items()}
#: A SCHEMA record's fixed part: its schema ID and number of fields.
SCHEMA_HEAD = struct.Struct("<" + fixed_format([f for f in RECORD_TYPES[EV_SCHEMA].fields if f.kind.code]))
STAGE_STRUCT = struct.Struct("<" + fixed_format(STAGE_FIELDS))
STREAM_STRUCT = struct.Struct("<" + fixed_format(STREAM_FIELDS))
#: The undelivered count after a cancelled stream's gaps (flag bit 1).
UNDELIVERED_STRUCT = struct.Struct("<I")
#: One SCHEMA field: name ref and kind.
SCHEMA_FIELD_STRUCT = struct.Struct("<HB")
#: One DROPS entry: reason code and count since the last DROPS record sent.
DROP_STRUCT = struct.Struct("<BQ")


# -- value rules -----------------------------------------------------------------------

#: Status codes a server returns when it sheds load.
SHED_STATUSES = frozenset((429, 503))


def outcome_of_status(status: int) -> int:
    """The outcome code of an HTTP response status: ok below 400, shed for 429 and 503,
    client_error for another 4xx, error for another 5xx."""
    if status < 400:
        return OUTCOME_OK
    if status in SHED_STATUSES:
        return OUTCOME_SHED
    return OUTCOME_CLIENT_ERROR if status < 500 else OUTCOME_ERROR


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


def clip(s: str, limit: int = MAX_STRING) -> bytes:
    """``s`` as UTF-8, cut to at most ``limit`` bytes on a character boundary."""
    b = s.encode("utf-8", "replace")
    if len(b) <= limit:
        return b
    # Cut on a character boundary so the result is still valid UTF-8.
    return b[:limit].decode("utf-8", "ignore").encode("utf-8")


def rid_bytes(rid: Any) -> bytes:
    """A request ID's bytes on the wire (without the length byte): b"" for none, else UTF-8, clipped."""
    if not rid:
        return b""
    if type(rid) is str:
        b = rid.encode("utf-8", "replace")
        if len(b) <= MAX_REQUEST_ID:
            return b
    return clip(str(rid), MAX_REQUEST_ID)


def trace_bytes(trace: Any) -> bytes:
    """A trace ID's bytes on the wire (without the length byte): b"" for none, else at most 16 bytes."""
    if not trace:
        return b""
    if type(trace) is bytes:
        return trace[:MAX_TRACE]
    return bytes(trace)[:MAX_TRACE]
