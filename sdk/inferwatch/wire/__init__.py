"""The inferwatch wire format, version 1: the public contract between producers and the sidecar.

A *frame* is one datagram: a fixed 32-byte header, a per-frame string table,
then length-prefixed records. Strings (service, model, stage, error type,
categorical values, feature names) are sent once per frame and referenced by
a ``u16`` index. Feature names are not sent with each event: a SCHEMA record
announces the names and kinds once under a producer-unique ``schema_id`` and
RECORD events carry only values. The encoder re-announces every schema it
uses at least every ``schema_repeat_s`` seconds, so a restarted sidecar
recovers on its own. Every record carries its own length, so a decoder skips
record types it does not know and one bad record never costs the rest of the
frame. ``docs/wire-format.md`` describes the bytes; this package is its
executable form and uses the standard library only.

The field table :data:`RECORD_TYPES` lists every record type's fields in wire
order with their kinds, and where each sits in the event tuple. Events are
plain tuples, for speed: ``(EV_REQUEST, ctx, end_unix_ns, duration_ns,
outcome, error_type, request_id, trace_id, stages)`` and so on, as
``RECORD_TYPES[code].event`` names them. ``ctx`` is a ``(service, model,
model_version)`` tuple of str or None; a stage is ``(name, duration_ns,
stream)`` with ``stream`` None or ``(ttft_ns, items, gaps_us)`` (a completed stream) or
``(ttft_ns, items, gaps_us, undelivered)`` (a cancelled one). On encode a
RECORD's ``features`` is a mapping name -> value; on decode it is
``(schema, numeric_values, categorical_values)`` (or None), the tuples lining
up with ``schema.numeric`` and ``schema.categorical``, a missing numeric
value NaN and a missing categorical value None.

Example::

    from inferwatch.wire import EV_BATCH, Decoder, Encoder

    frames = Encoder(pid=1, producer_id=2).encode([(EV_BATCH, ("svc", "model", "v1"), 8)])
    Decoder().decode(frames[0]).records  # [(EV_BATCH, ("svc", "model", "v1"), 8)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferwatch.wire.spec import (
    DROP_CODES,
    DROP_REASONS,
    EV_ALLOC,
    EV_ALLOC_SITE,
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_HTTP,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_SCHEMA,
    EV_STAGE,
    KIND_CATEGORICAL,
    KIND_NUMERIC,
    MAGIC,
    MAX_FEATURES,
    MAX_FRAME,
    MAX_GAPS,
    MAX_REQUEST_ID,
    MAX_STAGES,
    MAX_STRING,
    MAX_TRACE,
    NONE_REF,
    OUTCOME_CANCELLED,
    OUTCOME_CLIENT_ERROR,
    OUTCOME_ERROR,
    OUTCOME_MAX,
    OUTCOME_OK,
    OUTCOME_SHED,
    OUTCOMES,
    RECORD_TYPES,
    SHED_STATUSES,
    STAGE_CANCELLED,
    STAGE_FIELDS,
    STREAM_FIELDS,
    TAG_FLOAT,
    TAG_NONE,
    TAG_STRING,
    VERSION,
    Field,
    Frame,
    Kind,
    RecordType,
    Schema,
    WireError,
    classify,
    outcome_of_status,
)

if TYPE_CHECKING:
    from inferwatch.wire.decoder import Decoder
    from inferwatch.wire.encoder import FAST_PATHS, Encoder

__all__ = [
    # framing
    "MAGIC",
    "VERSION",
    "MAX_FRAME",
    "MAX_STRING",
    "MAX_REQUEST_ID",
    "MAX_TRACE",
    "MAX_STAGES",
    "MAX_FEATURES",
    "MAX_GAPS",
    "NONE_REF",
    # record and event types
    "EV_HELLO",
    "EV_REQUEST",
    "EV_STAGE",
    "EV_SCHEMA",
    "EV_RECORD",
    "EV_BATCH",
    "EV_QUEUE",
    "EV_DROPS",
    "EV_ALLOC",
    "EV_ALLOC_SITE",
    "EV_HTTP",
    # values
    "OUTCOME_OK",
    "OUTCOME_ERROR",
    "OUTCOME_CANCELLED",
    "OUTCOME_CLIENT_ERROR",
    "OUTCOME_SHED",
    "OUTCOME_MAX",
    "OUTCOMES",
    "KIND_NUMERIC",
    "KIND_CATEGORICAL",
    "TAG_NONE",
    "TAG_FLOAT",
    "TAG_STRING",
    "DROP_REASONS",
    "DROP_CODES",
    "classify",
    "outcome_of_status",
    "SHED_STATUSES",
    # the field table
    "RECORD_TYPES",
    "STAGE_CANCELLED",
    "STAGE_FIELDS",
    "STREAM_FIELDS",
    "RecordType",
    "Field",
    "Kind",
    # encoding and decoding
    "Encoder",
    "FAST_PATHS",
    "Decoder",
    "Frame",
    "Schema",
    "WireError",
]

# The codecs load on first access (PEP 562): ``import inferwatch`` needs only the constants above, the
# encoder loads with ``configure()`` and the decoder (the sidecar's half) never in a model server.
_LAZY = {
    "Decoder": "inferwatch.wire.decoder",
    "Encoder": "inferwatch.wire.encoder",
    "FAST_PATHS": "inferwatch.wire.encoder",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferwatch.wire' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
