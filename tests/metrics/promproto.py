"""An independent decoder for the delimited protobuf exposition: Google's protobuf runtime.

The message types of ``io/prometheus/client/metrics.proto`` (client_model) are declared
here as a descriptor, field by field, and Google's runtime parses what the sidecar's own
encoder wrote, so a wrong field number, wire type or zigzag shows up as a wrong value.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]

F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED

#: message -> [(name, number, type, label, type_name)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "Timestamp": [("seconds", 1, F.TYPE_INT64, _OPT, ""), ("nanos", 2, F.TYPE_INT32, _OPT, "")],
    "LabelPair": [("name", 1, F.TYPE_STRING, _OPT, ""), ("value", 2, F.TYPE_STRING, _OPT, "")],
    "Gauge": [("value", 1, F.TYPE_DOUBLE, _OPT, "")],
    "Exemplar": [("label", 1, F.TYPE_MESSAGE, _REP, "LabelPair"), ("value", 2, F.TYPE_DOUBLE, _OPT, ""),
                 ("timestamp", 3, F.TYPE_MESSAGE, _OPT, "Timestamp")],
    "Counter": [("value", 1, F.TYPE_DOUBLE, _OPT, ""), ("exemplar", 2, F.TYPE_MESSAGE, _OPT, "Exemplar")],
    "Untyped": [("value", 1, F.TYPE_DOUBLE, _OPT, "")],
    "Quantile": [("quantile", 1, F.TYPE_DOUBLE, _OPT, ""), ("value", 2, F.TYPE_DOUBLE, _OPT, "")],
    "Summary": [("sample_count", 1, F.TYPE_UINT64, _OPT, ""), ("sample_sum", 2, F.TYPE_DOUBLE, _OPT, ""),
                ("quantile", 3, F.TYPE_MESSAGE, _REP, "Quantile")],
    "Bucket": [("cumulative_count", 1, F.TYPE_UINT64, _OPT, ""), ("upper_bound", 2, F.TYPE_DOUBLE, _OPT, ""),
               ("exemplar", 3, F.TYPE_MESSAGE, _OPT, "Exemplar")],
    "BucketSpan": [("offset", 1, F.TYPE_SINT32, _OPT, ""), ("length", 2, F.TYPE_UINT32, _OPT, "")],
    "Histogram": [
        ("sample_count", 1, F.TYPE_UINT64, _OPT, ""), ("sample_sum", 2, F.TYPE_DOUBLE, _OPT, ""),
        ("bucket", 3, F.TYPE_MESSAGE, _REP, "Bucket"), ("schema", 5, F.TYPE_SINT32, _OPT, ""),
        ("zero_threshold", 6, F.TYPE_DOUBLE, _OPT, ""), ("zero_count", 7, F.TYPE_UINT64, _OPT, ""),
        ("negative_span", 9, F.TYPE_MESSAGE, _REP, "BucketSpan"), ("negative_delta", 10, F.TYPE_SINT64, _REP, ""),
        ("positive_span", 12, F.TYPE_MESSAGE, _REP, "BucketSpan"), ("positive_delta", 13, F.TYPE_SINT64, _REP, ""),
        ("exemplars", 16, F.TYPE_MESSAGE, _REP, "Exemplar"),
    ],
    "Metric": [
        ("label", 1, F.TYPE_MESSAGE, _REP, "LabelPair"), ("gauge", 2, F.TYPE_MESSAGE, _OPT, "Gauge"),
        ("counter", 3, F.TYPE_MESSAGE, _OPT, "Counter"), ("summary", 4, F.TYPE_MESSAGE, _OPT, "Summary"),
        ("untyped", 5, F.TYPE_MESSAGE, _OPT, "Untyped"), ("histogram", 7, F.TYPE_MESSAGE, _OPT, "Histogram"),
        ("timestamp_ms", 6, F.TYPE_INT64, _OPT, ""),
    ],
    "MetricFamily": [
        ("name", 1, F.TYPE_STRING, _OPT, ""), ("help", 2, F.TYPE_STRING, _OPT, ""),
        ("type", 3, F.TYPE_INT32, _OPT, ""), ("metric", 4, F.TYPE_MESSAGE, _REP, "Metric"),
        ("unit", 5, F.TYPE_STRING, _OPT, ""),
    ],
}


def _build() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="iw_test_prom_client.proto", package="iwtest.client", syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for fname, num, typ, label, tname in fields:
            f = msg.field.add(name=fname, number=num, type=typ, label=label)
            if tname:
                f.type_name = ".iwtest.client." + tname
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("iwtest.client.MetricFamily"))


MetricFamily = _build()


def parse_delimited(data: bytes) -> list[Any]:
    """Every MetricFamily of a delimited exposition, in order."""
    out = []
    pos = 0
    while pos < len(data):
        n, pos = _DecodeVarint(data, pos)
        mf = MetricFamily()
        mf.ParseFromString(data[pos:pos + n])
        out.append(mf)
        pos += n
    return out


def native_buckets(h: Any) -> dict[int, int]:
    """Native bucket index -> count, from a Histogram message's positive spans and deltas."""
    out: dict[int, int] = {}
    idx = 0
    count = 0
    deltas = iter(h.positive_delta)
    for span in h.positive_span:
        idx += span.offset
        for _ in range(span.length):
            count += next(deltas)
            if count:
                out[idx] = count
            idx += 1
    return out
